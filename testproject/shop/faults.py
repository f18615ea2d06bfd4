"""Fault injection for crash tests and the demo (never installed unless asked)."""

import time
from pathlib import Path
from typing import Any

from django_outbox.signals import inbox_batch_stored, outbox_batch_published


def install_freeze_after_publish(marker: str) -> None:
    """After the first published batch, write *marker* and hang before recording outcomes.

    The test then SIGKILLs the process: the broker has the messages, the
    database still says ``sending``.
    """

    def freeze(*, messages: Any, **kwargs: Any) -> None:
        Path(marker).write_text("\n".join(str(m.message_id) for m in messages))
        while True:
            time.sleep(3600)

    outbox_batch_published.connect(freeze, weak=False, dispatch_uid="freeze-after-publish")


def install_freeze_after_store(marker: str) -> None:
    """After ``inbox_consume`` committed its first batch, write *marker* and hang before
    acknowledging: the test SIGKILLs the process, the broker redelivers stored messages."""

    def freeze(*, ids: Any, **kwargs: Any) -> None:
        Path(marker).write_text("\n".join(str(pk) for pk in ids))
        while True:
            time.sleep(3600)

    inbox_batch_stored.connect(freeze, weak=False, dispatch_uid="freeze-after-store")


def freeze_in_handler_once(marker: str) -> None:
    """Called by a handler: the first time, write *marker* and hang inside the handler's
    transaction (the test SIGKILLs the process); later calls return at once."""
    path = Path(marker)
    if path.exists():
        return
    path.write_text("in handler")
    while True:
        time.sleep(3600)


def install_pause_after_publish(marker: str, seconds: float) -> None:
    """After the first published batch, write *marker* and wait *seconds* before the
    relay records the outcomes: the test cuts the database meanwhile."""
    paused: list[bool] = []

    def pause(*, messages: Any, **kwargs: Any) -> None:
        if paused:
            return
        paused.append(True)
        Path(marker).write_text("\n".join(str(m.message_id) for m in messages))
        time.sleep(seconds)

    outbox_batch_published.connect(pause, weak=False, dispatch_uid="pause-after-publish")


#: The chaos harness's switch file (tests/chaos): the middleware below is installed only
#: when this environment variable names a file, and acts only while that file exists.
CHAOS_WEBHOOK_FAULTS_ENV = "TESTPROJECT_CHAOS_WEBHOOK_FAULTS"


class ChaosWebhookFaultsMiddleware:
    """Test-only: make the server slow or unavailable while the harness says so.

    The file named by ``TESTPROJECT_CHAOS_WEBHOOK_FAULTS`` holds one line: ``slow
    <seconds>`` (every request waits that long first) or ``503`` (every request is
    answered 503 Service Unavailable). No file (the normal case): requests pass
    untouched. Read on every request (one stat), so the harness toggles it live.
    """

    def __init__(self, get_response: Any) -> None:
        import os

        self.get_response = get_response
        self.switch = Path(os.environ[CHAOS_WEBHOOK_FAULTS_ENV])

    def __call__(self, request: Any) -> Any:
        try:
            words = self.switch.read_text().split()
        except OSError:
            words = []
        if words[:1] == ["503"]:
            from django.http import HttpResponse

            return HttpResponse("chaos: unavailable", status=503)
        if words[:1] == ["slow"] and len(words) > 1:
            time.sleep(float(words[1]))
        return self.get_response(request)
