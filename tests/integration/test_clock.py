"""One clock: hosts whose clocks disagree miss no trigger and take no healthy lease."""

from datetime import timedelta

import pytest
from django.utils import timezone

import django_outbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.maintenance import rescue_stuck_messages, sweep
from django_outbox.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)

real_now = timezone.now


def host_clock(monkeypatch, skew_seconds):
    """This process's clock runs *skew_seconds* ahead of the database's (behind if < 0)."""
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=skew_seconds))


@pytest.mark.parametrize("skew", [2.0, -2.0])
def test_a_web_host_with_a_skewed_clock_misses_no_trigger(monkeypatch, skew):
    host_clock(monkeypatch, skew)
    message = django_outbox.send("order.created", {"id": 1})
    # The on-commit trigger finds its own row due at once, whichever way the clock is off.
    assert Relay().deliver([message.pk]).sent == 1


@pytest.mark.parametrize("skew", [60.0, -60.0])
def test_a_sweep_on_a_skewed_host_takes_no_healthy_lease(configure_outbox, monkeypatch, skew):
    # The skew is longer than the lease: a sweep judging by the host's clock would take it.
    configure_outbox(LEASE_SECONDS=30)
    django_outbox.send("order.created", {"id": 1})
    rows, _lease = Relay().claim_batch()
    assert len(rows) == 1
    host_clock(monkeypatch, skew)  # the sweep runs on another host
    assert rescue_stuck_messages().resent == 0
    assert sweep(time_budget=0)["resent"] == 0
    assert OutboxMessage.objects.get().state == OutboxState.SENDING


def test_a_lease_expires_by_the_databases_clock(configure_outbox):
    configure_outbox(LEASE_SECONDS=0.2)
    django_outbox.send("order.created", {"id": 1})
    Relay().claim_batch()
    import time

    time.sleep(0.4)
    assert rescue_stuck_messages().resent == 1
