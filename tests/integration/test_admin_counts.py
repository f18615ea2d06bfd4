"""How the lists count (``admin.shared.LargeTableChangeList``, ``EstimatedCountPaginator``):
a page that holds the last match gives the count, so a filter matching nothing is read
once; a longer list is counted up to a cap, on PostgreSQL within a time budget, and the
page says so ("more than")."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_outbox.admin import shared
from django_outbox.models import OutboxMessage, OutboxState
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_outbox_outboxmessage_changelist")


def statements(captured):
    """The statements that read the outbox table (any quoting)."""
    table = connection.ops.quote_name("django_outbox_message")
    return [q["sql"] for q in captured.captured_queries if f"FROM {table}" in q["sql"]]


def many(count, **fields):
    OutboxMessage.objects.bulk_create(
        OutboxMessage(type="t", destination="default", payload={}, **fields) for _ in range(count)
    )


@pytest.fixture(autouse=True)
def sweeps_run():
    """The sweeps run: the list does not look for rows a stale sweep left behind."""
    from django.utils import timezone

    from django_outbox.engine.models import SweepMark

    SweepMark.objects.create(part="outbox", last_run_at=timezone.now(), ran_by="test:1")


@pytest.mark.parametrize("filters", [{"uncertain__exact": "1"}, {"attempts": "6+"}])
def test_a_filter_that_matches_nothing_is_read_once(admin_client, filters):
    many(30)
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST, filters)
    assert list(response.context["cl"].result_list) == []
    [page] = statements(captured)
    assert "COUNT(" not in page.upper()
    assert '<span class="outbox-count">0</span> outbox messages' in response.text


def test_a_page_with_the_last_match_is_its_own_count(admin_client, monkeypatch):
    monkeypatch.setattr(shared, "COUNT_CAP", 5)
    many(3, state=OutboxState.SEND_ERROR, last_error="boom")
    many(20)
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST, {"state": "send_error"})
    assert len(response.context["cl"].result_list) == 3
    assert len(statements(captured)) == 1
    assert '<span class="outbox-count">3</span> outbox messages' in response.text


def test_a_list_longer_than_its_page_is_counted_up_to_the_cap(admin_client, monkeypatch):
    monkeypatch.setattr(shared, "COUNT_CAP", 150)
    many(120, state=OutboxState.SEND_ERROR, last_error="boom")
    response = admin_client.get(CHANGELIST, {"state": "send_error"})
    assert '<span class="outbox-count">120</span> outbox messages' in response.text
    assert response.context["cl"].multi_page
    second = admin_client.get(CHANGELIST, {"state": "send_error", "p": "2"})
    assert len(second.context["cl"].result_list) == 20
    many(100, state=OutboxState.SEND_ERROR, last_error="boom")
    response = admin_client.get(CHANGELIST, {"state": "send_error"})
    assert '<span class="outbox-count">more than 150</span> outbox messages' in response.text
    # The last page found the end: its count is exact.
    third = admin_client.get(CHANGELIST, {"state": "send_error", "p": "3"})
    assert len(third.context["cl"].result_list) == 20
    assert '<span class="outbox-count">220</span>' in third.text


def test_a_page_past_the_end_is_django_s_error_page(admin_client):
    many(3)
    response = admin_client.get(CHANGELIST, {"p": "9"})
    assert response.status_code == 302 and "e=1" in response["Location"]


def test_the_list_s_rows_are_the_page_django_would_show(admin_client):
    many(250)
    ids = list(OutboxMessage.objects.order_by("-id").values_list("pk", flat=True))
    for page in (1, 2, 3):
        response = admin_client.get(CHANGELIST, {"p": str(page), "o": ""})
        shown = [row.pk for row in response.context["cl"].result_list]
        assert shown == ids[(page - 1) * 100 : page * 100]


@pytest.mark.postgres
@pytest.mark.parametrize("outer_transaction", [False, True])
def test_a_count_that_overruns_its_budget_is_given_up(outer_transaction):
    """Given a count that takes longer than COUNT_BUDGET_MS (each row sleeps 20 ms),
    it is cancelled and reported as unknown; the connection's timeout is restored and
    the transaction around it (ATOMIC_REQUESTS) stays usable."""
    for _ in range(10):
        OutboxMessageFactory()
    slow = OutboxMessage.objects.extra(where=["pg_sleep(0.02) IS NOT NULL"])

    def check():
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            before = cursor.fetchone()[0]
        assert shared.count_within_budget(slow[:100]) is None
        assert shared.count_within_budget(OutboxMessage.objects.all()[:100]) == 10
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            assert cursor.fetchone()[0] == before

    if outer_transaction:
        with transaction.atomic():
            check()
            assert OutboxMessage.objects.count() == 10
    else:
        check()


def test_an_unfiltered_large_table_is_shown_as_about(admin_client, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the estimate is PostgreSQL's statistics")
    monkeypatch.setattr(shared, "COUNT_CAP", 50)
    many(300)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_message")
    response = admin_client.get(CHANGELIST)
    assert '<span class="outbox-count">about 300</span>' in response.text
