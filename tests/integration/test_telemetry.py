"""What the engine counts as it records outcomes: the per-minute table and the
Prometheus counters, for each part, on every database."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import django_outbox
from django_outbox import metrics
from django_outbox.engine import telemetry
from django_outbox.engine.models import MinuteCount
from django_outbox.inbox.handlers import handler, unregister
from django_outbox.inbox.handling import Inbox
from django_outbox.models import OutboxMessage, OutboxState
from django_outbox.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scripted(configure_outbox):
    return configure_outbox(
        DESTINATIONS={"default": {"TRANSPORT": "tests.support.ScriptedTransport"}},
        MAX_ATTEMPTS=1,
    )


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def table():
    return {
        (row.part, row.event): row.count
        for row in MinuteCount.objects.all()
        if row.minute.timestamp() == telemetry.minute_of(row.minute.timestamp())
    }


def test_a_relayed_group_is_counted_per_event_and_flushed_into_the_minute_table(scripted):
    with transaction.atomic():
        for n in range(3):
            django_outbox.send("order.created", {"n": n})
        django_outbox.send("order.created", {"fail": "permanent"})
    sent_before = sample("django_outbox_outbox_sent_total", destination="default")
    dead_before = sample("django_outbox_outbox_dead_lettered_total", destination="default")

    result = Relay().drain()

    assert result.sent == 3
    assert {key[2]: n for key, n in telemetry.pending().items()} == {"done": 3, "dead": 1}
    assert sample("django_outbox_outbox_sent_total", destination="default") == sent_before + 3
    assert sample("django_outbox_outbox_dead_lettered_total", destination="default") == (
        dead_before + 1
    )
    assert telemetry.flush() == 2
    assert table() == {("outbox", "done"): 3, ("outbox", "dead"): 1}
    assert telemetry.pending() == {}


def test_flushes_of_the_same_minute_add_up_instead_of_overwriting():
    now = time.time()
    telemetry.count("jobs", "done", 5, at=now)
    telemetry.flush()
    telemetry.count("jobs", "done", 2, at=now)
    telemetry.count("jobs", "retried", 1, at=now)
    telemetry.flush()

    assert table() == {("jobs", "done"): 7, ("jobs", "retried"): 1}
    [row] = MinuteCount.objects.filter(event="done")
    assert row.minute == datetime.fromtimestamp(telemetry.minute_of(now), tz=UTC)


def test_per_minute_gives_one_slot_per_minute_with_zeros_where_nothing_was_counted():
    now = time.time()
    telemetry.count("inbox", "done", 4, at=now - 120)
    telemetry.count("inbox", "done", 1, at=now)
    telemetry.count("inbox", "dead", 2, at=now - 60)
    telemetry.flush()

    figures = telemetry.per_minute(minutes=5, now=now)

    assert figures == {"inbox": {"done": [0, 0, 4, 0, 1], "dead": [0, 0, 0, 2, 0]}}


def test_handled_and_failed_inbox_messages_are_counted():
    @handler("telemetry.ok")
    def ok(message):
        return None

    @handler("telemetry.broken")
    def broken(message):
        raise ValueError("bad order")

    try:
        received_before = sample("django_outbox_inbox_received_total", source="payments")
        duplicates_before = sample("django_outbox_inbox_duplicates_total", source="payments")
        django_outbox.receive("telemetry.ok", {}, source="payments", message_id="m-1")
        django_outbox.receive("telemetry.ok", {}, source="payments", message_id="m-1")
        django_outbox.receive("telemetry.broken", {}, source="payments", message_id="m-2")

        Inbox().drain()
    finally:
        unregister("telemetry.ok")
        unregister("telemetry.broken")

    assert sample("django_outbox_inbox_received_total", source="payments") == (received_before + 2)
    assert sample("django_outbox_inbox_duplicates_total", source="payments") == (
        duplicates_before + 1
    )
    assert sample("django_outbox_inbox_handle_duration_seconds_count", source="payments") >= 2
    telemetry.flush()
    assert table() == {("inbox", "done"): 1, ("inbox", "dead"): 1}


def test_a_rolled_back_send_is_not_counted_as_enqueued():
    before = sample("django_outbox_outbox_enqueued_total", destination="default")
    with pytest.raises(RuntimeError), transaction.atomic():
        django_outbox.send("order.created", {})
        raise RuntimeError("rolled back")
    with transaction.atomic():
        django_outbox.send("order.created", {})

    assert sample("django_outbox_outbox_enqueued_total", destination="default") == before + 1


def test_a_receive_outside_a_transaction_is_counted_at_once_one_rolled_back_never():
    before = sample("django_outbox_inbox_received_total", source="counted")
    django_outbox.receive("order.paid", {}, source="counted", message_id="c-1")
    assert sample("django_outbox_inbox_received_total", source="counted") == before + 1
    with pytest.raises(RuntimeError), transaction.atomic():
        django_outbox.receive("order.paid", {}, source="counted", message_id="c-2")
        raise RuntimeError("rolled back")
    with transaction.atomic():
        django_outbox.receive("order.paid", {}, source="counted", message_id="c-3")
        assert sample("django_outbox_inbox_received_total", source="counted") == before + 1
    assert sample("django_outbox_inbox_received_total", source="counted") == before + 2


def test_metrics_off_counts_nothing_in_prometheus_but_the_chart_still_counts(
    configure_outbox,
):
    configure_outbox(METRICS=False)
    assert not metrics.enabled()
    before = sample("django_outbox_outbox_sent_total", destination="default")
    with transaction.atomic():
        django_outbox.send("order.created", {})

    Relay().drain()

    assert sample("django_outbox_outbox_sent_total", destination="default") == before
    assert {key[2]: n for key, n in telemetry.pending().items()} == {"done": 1}


def test_the_metrics_view_answers_in_prometheus_text_format(client):
    with transaction.atomic():
        django_outbox.send("order.created", {})
    Relay().drain()

    response = client.get("/metrics/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'django_outbox_outbox_sent_total{destination="default"}' in text
    assert "django_outbox_outbox_publish_latency_seconds_bucket" in text


def test_scraped_gauges_say_what_the_database_holds(client, configure_outbox, monkeypatch):
    monkeypatch.setattr(metrics, "GAUGE_CACHE_SECONDS", 0.0)
    with transaction.atomic():
        for n in range(3):
            django_outbox.send("order.created", {"n": n})
        for n in range(2):
            django_outbox.send("order.created", {"n": n}, to="held")
    OutboxMessage.objects.filter(destination="held").update(
        available_at=timezone.now() - timedelta(seconds=90)
    )
    OutboxMessage.objects.filter(pk=OutboxMessage.objects.order_by("pk").first().pk).update(
        state=OutboxState.SEND_ERROR, last_error="boom"
    )

    text = client.get("/metrics/").content.decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }

    def gauge(metric, **labels):
        return samples.get((f"django_outbox_{metric}", tuple(sorted(labels.items()))))

    assert gauge("scrape_error") == 0
    assert gauge("backlog", part="outbox", name="default") == 2
    assert gauge("backlog", part="outbox", name="held") == 2
    assert 89 <= gauge("oldest_due_age_seconds", part="outbox") < 120
    assert gauge("dead_letters", part="outbox") == 1
    assert gauge("live_workers", part="outbox") == 0
    assert gauge("dead_letters", part="jobs") == 0
    # The probe's verdicts: rows due 90 s with no live worker.
    assert gauge("health_status", part="outbox", check="oldest_due") == 1
    assert gauge("health_status", part="inbox", check="oldest_due") == 0


def test_a_process_without_heartbeat_flushes_after_a_group_once_flush_seconds_passed(
    monkeypatch, scripted
):
    monkeypatch.setattr(telemetry, "FLUSH_SECONDS", 0.0)
    with transaction.atomic():
        django_outbox.send("order.created", {})

    Relay().drain()

    assert telemetry.pending() == {}
    assert table() == {("outbox", "done"): 1}
