"""The search box of the three lists (``admin.search``): an id is looked up alone and
exactly, other terms by a correlation id or the start of a key (outbox, inbox) or of a
task path (jobs), ``type:`` by the start of a type; on every database."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_outbox.jobs.models import Job, JobState
from django_outbox.models import InboxMessage, OutboxMessage
from tests.factories import OutboxMessageFactory

pytestmark = pytest.mark.django_db


#: SQLite's LIKE ignores ASCII case: the start of a key or a task path matches any case.
CASE_BLIND_PREFIXES = connection.vendor == "sqlite"


def found(client, model, term, **filters):
    changelist = reverse(f"admin:django_outbox_{model._meta.model_name}_changelist")
    response = client.get(changelist, {"q": term, **filters})
    assert response.status_code == 200
    return sorted(row.pk for row in response.context["cl"].result_list)


def inbox(message_id, *, source="billing", **fields):
    fields.setdefault("type", "invoice.paid")
    return InboxMessage.objects.create(
        source=source, message_id=message_id, payload={}, **fields
    ).pk


def job(**fields):
    fields.setdefault("task_path", "testproject.shop.jobs.noop")
    return Job.objects.create(**fields).pk


# -- outbox ---------------------------------------------------------------------------


def test_an_outbox_message_id_is_looked_up_alone(admin_client):
    named = OutboxMessageFactory(key="order:1", sequence=1)
    # Another row whose key starts with the id's text and one with it as correlation id.
    OutboxMessageFactory(key=f"{named.message_id}:x", sequence=1)
    OutboxMessageFactory(correlation_id=str(named.message_id))
    assert found(admin_client, OutboxMessage, str(named.message_id)) == [named.pk]
    # Any spelling of the UUID.
    upper = str(named.message_id).upper()
    assert found(admin_client, OutboxMessage, f"  {upper}  ") == [named.pk]


def test_a_uuid_that_is_no_message_id_is_read_as_a_key_or_a_correlation_id(admin_client):
    customer = str(uuid.uuid4())
    keyed = OutboxMessageFactory(key=customer, sequence=1).pk
    reply = OutboxMessageFactory(correlation_id=customer).pk
    OutboxMessageFactory()
    assert found(admin_client, OutboxMessage, customer) == sorted([keyed, reply])


def test_outbox_terms_match_a_correlation_id_exactly_or_the_start_of_a_key(admin_client):
    order = OutboxMessageFactory(key="order:4711", sequence=1).pk
    longer = OutboxMessageFactory(key="order:47110", sequence=1).pk
    other = OutboxMessageFactory(key="invoice:4711", sequence=1).pk
    request = OutboxMessageFactory(correlation_id="order:47").pk
    OutboxMessageFactory(correlation_id="order:470")
    assert found(admin_client, OutboxMessage, "order:4711") == sorted([order, longer])
    assert found(admin_client, OutboxMessage, "order:47") == sorted([order, longer, request])
    assert found(admin_client, OutboxMessage, "invoice:") == [other]
    assert found(admin_client, OutboxMessage, "4711") == []  # a key's start, not its middle
    assert found(admin_client, OutboxMessage, "order%") == []  # LIKE's wildcards are text
    assert found(admin_client, OutboxMessage, "order_4711") == []


def test_outbox_type_prefix_is_asked_for_by_name(admin_client):
    created = OutboxMessageFactory(type="order.created").pk
    OutboxMessageFactory(type="invoice.sent")
    OutboxMessageFactory(key="order.cr", sequence=1, type="invoice.sent")
    assert found(admin_client, OutboxMessage, "type:order.cr") == [created]
    assert found(admin_client, OutboxMessage, "type: order.") == [created]
    failed = OutboxMessageFactory(type="order.paid", state="send_error").pk
    assert found(admin_client, OutboxMessage, "type:order.", state__exact="send_error") == [failed]


def test_the_search_box_says_what_it_searches(admin_client):
    for model in (OutboxMessage, InboxMessage, Job):
        page = admin_client.get(reverse(f"admin:django_outbox_{model._meta.model_name}_changelist"))
        assert 'id="searchbar"' in page.text
        assert "case-sensitive" in page.text, model
    outbox = admin_client.get(reverse("admin:django_outbox_outboxmessage_changelist"))
    assert "type:&lt;start of a type&gt;" in outbox.text


def test_an_empty_or_blank_term_searches_nothing_away(admin_client):
    rows = sorted(OutboxMessageFactory().pk for _ in range(2))
    assert found(admin_client, OutboxMessage, "   ") == rows


# -- inbox ----------------------------------------------------------------------------


def test_a_sender_s_message_id_is_looked_up_alone_in_every_source(admin_client):
    """Given "evt-1" as a message id in two sources and as a key prefix and a correlation
    id elsewhere, the search for it shows the two messages with that id, only."""
    ids = sorted([inbox("evt-1", source="billing"), inbox("evt-1", source="partner")])
    inbox("evt-10", key="evt-1:a", sequence=1)
    inbox("evt-11", correlation_id="evt-1")
    assert found(admin_client, InboxMessage, "evt-1") == ids
    if not CASE_BLIND_PREFIXES:
        assert found(admin_client, InboxMessage, "EVT-1") == []  # exact: case and all
    assert found(admin_client, InboxMessage, "evt-1", source="partner") == ids[1:]


def test_inbox_terms_match_a_correlation_id_exactly_or_the_start_of_a_key(admin_client):
    keyed = inbox("a", key="customer:42", sequence=1)
    reply = inbox("b", correlation_id="req-9")
    inbox("c", correlation_id="req-90", type="order.paid")
    assert found(admin_client, InboxMessage, "customer:4") == [keyed]
    assert found(admin_client, InboxMessage, "req-9") == [reply]
    if not CASE_BLIND_PREFIXES:
        assert found(admin_client, InboxMessage, "Customer:4") == []
    assert found(admin_client, InboxMessage, "type:order.") == [
        InboxMessage.objects.get(message_id="c").pk
    ]


# -- jobs -----------------------------------------------------------------------------


def test_a_result_id_or_a_unique_key_is_looked_up_alone(admin_client):
    named = Job.objects.create(task_path="testproject.shop.jobs.noop")
    unique = job(unique_key="testproject.shop", state=JobState.FAILED, finished_at=timezone.now())
    other = job(task_path="testproject.shop.jobs.add")
    assert found(admin_client, Job, str(named.result_id)) == [named.pk]
    # A unique key wins over the task paths it starts.
    assert found(admin_client, Job, "testproject.shop") == [unique]
    assert found(admin_client, Job, "testproject.shop.jobs.a") == [other]
    # A UUID that is a unique key.
    key = str(uuid.uuid4())
    keyed = job(unique_key=key)
    assert found(admin_client, Job, key) == [keyed]


@pytest.mark.skipif(CASE_BLIND_PREFIXES, reason="SQLite's LIKE ignores ASCII case")
def test_a_task_path_s_start_is_case_sensitive(admin_client):
    noop = job(task_path="testproject.shop.jobs.noop")
    assert found(admin_client, Job, "TestProject.") == []
    assert found(admin_client, Job, "testproject.") == [noop]
