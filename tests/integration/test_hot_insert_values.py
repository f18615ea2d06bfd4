"""The single-row inserts of send(), enqueue() and receive() (``engine.insert``) store
awkward values as they were given, on every database."""

from datetime import UTC, datetime

import pytest
from django.db import transaction

import django_outbox
from django_outbox.jobs.models import Job
from django_outbox.models import InboxMessage, OutboxMessage
from testproject.shop import jobs

pytestmark = pytest.mark.django_db

#: Text that quoting into a statement's text has to get right: quotes, a percent sign,
#: a backslash, non-ASCII and a JSON-looking string.
AWKWARD = 'it\'s 100% \\ naïve \u2603 {"not": "an object"}'


def test_values_arrive_as_they_were_sent():
    moment = datetime(2026, 11, 28, 12, 30, 15, 123456, tzinfo=UTC)
    payload = {"note": AWKWARD, "n": 12345678901234, "x": 1.5, "none": None, "list": [AWKWARD]}
    with transaction.atomic():
        sent = django_outbox.send("order.created", payload, headers={"h": AWKWARD})
        enqueued = jobs.add.using(run_after=moment).enqueue(AWKWARD, payload)
    stored, _ = django_outbox.receive(
        "payment.captured", payload, message_id=f"m-{AWKWARD}", source="payments"
    )

    message = OutboxMessage.objects.get(pk=sent.pk)
    assert (message.payload, message.headers["h"]) == (payload, AWKWARD)
    job = Job.objects.get(result_id=enqueued.id)
    assert (job.args, job.run_after) == ([AWKWARD, payload], moment)
    row = InboxMessage.objects.get(pk=stored.pk)
    assert (row.payload, row.message_id) == (payload, f"m-{AWKWARD}")


def many(sequence_start=1):
    """Two prepared messages of one key with awkward values, for ``receive_many``."""
    from django_outbox.inbox.api import prepare

    return [
        prepare(
            "payment.captured",
            {"note": AWKWARD, "n": n},
            source="payments",
            message_id=f"many-{n}-{AWKWARD}",
            key=f"k-{AWKWARD}",
            sequence=n,
            headers={"h": AWKWARD},
            correlation_id=None if n % 2 else f"c-{AWKWARD}",
        )
        for n in range(sequence_start, sequence_start + 2)
    ]


def stored_as_sent(prepared):
    from django_outbox.inbox.api import receive_many

    with transaction.atomic():
        new, duplicates = receive_many(prepared)
    assert duplicates == 0 and len(new) == len(prepared)
    for instance, (row, _) in zip(new, prepared, strict=True):
        read = InboxMessage.objects.get(pk=instance.pk)
        for name in ("message_id", "payload", "headers", "key", "sequence", "correlation_id"):
            assert getattr(read, name) == getattr(instance, name) == row[name], name


def test_a_batch_insert_stores_awkward_values_as_they_were_sent():
    stored_as_sent(many())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "session",
    [
        pytest.param({"USE_TZ": False, "TIME_ZONE": "Europe/Paris"}, id="bound-on-the-client"),
        pytest.param("server_side_binding", id="django-binds-on-the-server"),
    ],
)
def test_a_batch_insert_stores_them_whichever_way_its_cursor_binds(settings, session):
    """On PostgreSQL the batch insert's arrays are ``%b`` parameters: sent in binary by
    the cursor that binds on the server, quoted into the statement by Django's when it
    binds on the client (a session not in UTC), and sent by Django's own with its
    ``server_side_binding``."""
    from django.db import connection
    from django.test.utils import override_settings

    if connection.vendor != "postgresql":
        pytest.skip("the binding of the batch insert's arrays is PostgreSQL's")
    options = connection.settings_dict["OPTIONS"]
    if session == "server_side_binding":
        options["server_side_binding"] = True
        connection.close()
        try:
            stored_as_sent(many(10))
        finally:
            del options["server_side_binding"]
            connection.close()
        return
    with override_settings(**session):
        stored_as_sent(many(20))


def test_a_batch_insert_gives_the_same_instances_with_or_without_init_receivers():
    """``run_many`` makes its instances directly (values laid out its own way) unless a
    ``post_init`` receiver must see them made by ``Model.__init__``: both give the same
    instances as reading the rows back."""
    from django.db.models.signals import post_init

    from django_outbox.inbox.api import receive_many

    def instances(prepared):
        with transaction.atomic():
            new, _ = receive_many(prepared)
        return new

    def fields(instance):
        return {f.attname: getattr(instance, f.attname) for f in InboxMessage._meta.fields}

    direct = instances(many(30))
    told = []

    def receiver(sender, instance, **kwargs):
        told.append(instance)

    post_init.connect(receiver, sender=InboxMessage)
    try:
        through_init = instances(many(40))
    finally:
        post_init.disconnect(receiver, sender=InboxMessage)
    assert len(through_init) == 2
    assert all(any(seen is made for seen in told) for made in through_init), "made by __init__"
    for made in [*direct, *through_init]:
        assert fields(made) == fields(InboxMessage.objects.get(pk=made.pk))
        assert made._state.adding is False and made._state.db == "default"


def test_send_gives_the_instance_read_back_with_or_without_init_receivers():
    """``send()``'s single-row insert makes its instance directly unless a ``post_init``
    receiver must see it made by ``Model.__init__``; either way it is the row as stored,
    read back (the clock stamps the database's, the constants their defaults)."""
    from django.db.models.signals import post_init

    def fields(instance):
        return {f.attname: getattr(instance, f.attname) for f in OutboxMessage._meta.fields}

    with transaction.atomic():
        plain = django_outbox.send("order.created", {"n": 1}, key="k", headers={"h": AWKWARD})
        # Without a key or a correlation id: those columns are left to their defaults.
        bare = django_outbox.send("order.created", {"n": 3})
    told = []

    def receiver(sender, instance, **kwargs):
        told.append(instance)

    post_init.connect(receiver, sender=OutboxMessage)
    try:
        with transaction.atomic():
            through_init = django_outbox.send("order.created", {"n": 2}, correlation_id="c")
    finally:
        post_init.disconnect(receiver, sender=OutboxMessage)
    assert any(seen is through_init for seen in told), "made by __init__"
    assert not any(seen is plain for seen in told)
    for made in (plain, bare, through_init):
        assert fields(made) == fields(OutboxMessage.objects.get(pk=made.pk))
        assert made._state.adding is False and made._state.db == "default"
