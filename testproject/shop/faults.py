"""Fault injection for crash tests and the demo (never installed unless asked)."""

import time
from pathlib import Path
from typing import Any

from django_outbox.signals import outbox_batch_published


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
