"""What a claim hands the runner on PostgreSQL (where one ``UPDATE … RETURNING``
claims): the rows it made without ``Model.from_db`` and read with psycopg's own
timestamp loader must be the rows Django would have made, for every part's model."""

import datetime
import uuid

import pytest
from django.db import connection
from django.db.models.signals import post_init, pre_init

import django_outbox
from django_outbox.engine import rows as lease
from django_outbox.inbox.models import InboxMessage
from django_outbox.jobs.models import Job
from django_outbox.outbox.models import OutboxMessage
from tests.factories import OutboxMessageFactory

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

MODELS = [OutboxMessage, InboxMessage, Job]


def make_rows():
    OutboxMessageFactory.create_batch(3)
    for n in range(3):
        django_outbox.receive(
            "payment.captured", {"order": n}, source="payments", message_id=f"m-{n}"
        )
        Job.objects.create(
            result_id=uuid.uuid4(),
            task_path="testproject.shop.jobs.bench_noop",
            args=[n],
            kwargs={"n": n},
        )


def fetched(model):
    """Each row of *model* as its claim reads it (every concrete field, in the model's
    order), by primary key."""
    fields = model._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        lease.fast_timestamps(cursor, connection)
        pk = connection.ops.quote_name(model._meta.pk.column)
        cursor.execute(f"SELECT {columns} FROM {table} ORDER BY {pk}")
        records = cursor.fetchall()
    converted = []
    for record in records:
        values = list(record)
        for i, field in enumerate(fields):
            if hasattr(field, "from_db_value"):
                values[i] = field.from_db_value(values[i], None, connection)
        converted.append(values)
    return [f.attname for f in fields], converted


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_built_rows_equal_the_rows_django_makes(model):
    make_rows()
    names, records = fetched(model)
    build = lease.instance_builder(model, "default", names)
    built = [build(values) for values in records]
    django_made = list(model.objects.order_by("pk"))
    assert len(built) == len(django_made) == 3
    for ours, theirs in zip(built, django_made, strict=True):
        assert type(ours) is model
        assert {k: v for k, v in vars(ours).items() if k != "_state"} == {
            k: v for k, v in vars(theirs).items() if k != "_state"
        }
        assert (ours._state.adding, ours._state.db) == (False, "default")
        ours.full_clean(validate_unique=False, validate_constraints=False)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_timestamps_are_aware_utc_like_djangos(model):
    make_rows()
    names, records = fetched(model)
    timestamps = [v for values in records for v in values if isinstance(v, datetime.datetime)]
    assert timestamps
    for value in timestamps:
        assert value.utcoffset() == datetime.timedelta(0)
    theirs = model.objects.order_by("pk").first()
    ours = lease.instance_builder(model, "default", names)(records[0])
    for field in model._meta.concrete_fields:
        mine, django = getattr(ours, field.attname), getattr(theirs, field.attname)
        if isinstance(django, datetime.datetime):
            assert mine == django and mine.tzinfo == django.tzinfo


def test_a_model_with_init_receivers_is_made_by_from_db():
    make_rows()
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=Job)
    try:
        names, records = fetched(Job)
        built = [lease.instance_builder(Job, "default", names)(values) for values in records]
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert seen == built  # each instance went through Model.__init__, receivers told


def test_pre_init_receivers_are_told_too():
    make_rows()
    told = []

    def receiver(sender, **kwargs):
        told.append(sender)

    pre_init.connect(receiver, sender=OutboxMessage)
    try:
        names, records = fetched(OutboxMessage)
        for values in records:
            lease.instance_builder(OutboxMessage, "default", names)(values)
    finally:
        pre_init.disconnect(receiver, sender=OutboxMessage)
    assert told == [OutboxMessage] * 3


def test_a_partial_row_is_made_with_the_rest_deferred():
    make_rows()
    names, records = fetched(Job)
    keep = {"id", "task_path", "state"}
    picked = [i for i, name in enumerate(names) if name in keep]
    row = lease.instance_builder(Job, "default", [names[i] for i in picked])(
        [records[0][i] for i in picked]
    )
    assert row.get_deferred_fields() == {n for n in names if n not in keep}
    django_made = Job.objects.only(*keep).get(pk=row.pk)
    assert vars(row).keys() == vars(django_made).keys()
    assert row.task_path == django_made.task_path
    row.refresh_from_db(fields=["args"])  # a deferred field loads as Django's does
    assert row.args == [0]
