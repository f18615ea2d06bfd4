"""The admin's search and its request/reply links, through indexes (``admin.search``).

- ``outbox_msg_correlation_idx``, ``inbox_msg_correlation_idx``: a reply's page finds its
  request by correlation id, a request's page its replies by (source, correlation id),
  the search a correlation id; over the rows that have one.
- ``outbox_msg_key_prefix_idx``, ``inbox_msg_key_prefix_idx``: the search by the start
  of a key, over the keyed rows. On PostgreSQL with ``varchar_pattern_ops``: the
  default operator class serves ``LIKE 'prefix%'`` only under the ``C`` collation.
- ``outbox_job_task_idx`` made again with ``varchar_pattern_ops`` on PostgreSQL (it
  serves the search by the start of a task path, and equality as before); the other
  databases' index is unchanged.
- ``outbox_job_unique_lookup_idx``: the search by unique key, whatever the job's state
  (0008's unique index holds the active jobs only). Not on MySQL/MariaDB, where 0008's
  ``outbox_job_unique_key_idx`` on (unique_key, state) serves it.

MySQL/MariaDB ignore index conditions: the four correlation and key indexes are whole
indexes there (their columns are binary since 0002 and 0011, so ``LIKE 'prefix%'`` reads
them as is). None of them is on ``id``, the column 0014 keeps out of secondary indexes
there. SQLite keeps them through later table rebuilds: Django knows them.

On PostgreSQL each is built ``CONCURRENTLY`` (writes go on meanwhile; the migration is
not atomic), and one that exists already is kept: they can be built beforehand (see
docs/operations.md, "Upgrading"). The task index is built under a new name, then takes
the old one's place. MySQL/MariaDB build indexes online (InnoDB), SQLite plainly.
"""

from django.db import migrations, models

OUTBOX_INDEXES = (
    (
        "outboxmessage",
        models.Index(
            condition=models.Q(("correlation_id__isnull", False)),
            fields=["correlation_id"],
            name="outbox_msg_correlation_idx",
        ),
    ),
    (
        "outboxmessage",
        models.Index(
            condition=models.Q(("key__isnull", False)),
            fields=["key"],
            name="outbox_msg_key_prefix_idx",
            opclasses=("varchar_pattern_ops",),
        ),
    ),
    (
        "inboxmessage",
        models.Index(
            condition=models.Q(("correlation_id__isnull", False)),
            fields=["correlation_id", "source"],
            name="inbox_msg_correlation_idx",
        ),
    ),
    (
        "inboxmessage",
        models.Index(
            condition=models.Q(("key__isnull", False)),
            fields=["key"],
            name="inbox_msg_key_prefix_idx",
            opclasses=("varchar_pattern_ops",),
        ),
    ),
)
UNIQUE_LOOKUP_INDEX = models.Index(
    condition=models.Q(("unique_key__isnull", False)),
    fields=["unique_key"],
    name="outbox_job_unique_lookup_idx",
)
TASK_INDEX = models.Index(fields=["task_path", "state"], name="outbox_job_task_idx")
TASK_PATTERN_INDEX = models.Index(
    fields=["task_path", "state"],
    name="outbox_job_task_idx",
    opclasses=("varchar_pattern_ops", "varchar_pattern_ops"),
)


def build(apps, schema_editor, indexes):
    """Create *indexes*: concurrently on PostgreSQL, skipping one that exists."""
    connection = schema_editor.connection
    for model_name, index in indexes:
        model = apps.get_model("django_outbox", model_name)
        if connection.vendor != "postgresql":
            schema_editor.add_index(model, index)
            continue
        with connection.cursor() as cursor:
            present = connection.introspection.get_constraints(cursor, model._meta.db_table)
        if index.name not in present:
            schema_editor.execute(
                index.create_sql(model, schema_editor, concurrently=True), params=None
            )


def unbuild(apps, schema_editor, indexes):
    for model_name, index in indexes:
        schema_editor.remove_index(apps.get_model("django_outbox", model_name), index)


def create(apps, schema_editor):
    build(apps, schema_editor, OUTBOX_INDEXES)
    if schema_editor.connection.vendor != "mysql":
        build(apps, schema_editor, [("job", UNIQUE_LOOKUP_INDEX)])


def drop(apps, schema_editor):
    unbuild(apps, schema_editor, OUTBOX_INDEXES)
    if schema_editor.connection.vendor != "mysql":
        unbuild(apps, schema_editor, [("job", UNIQUE_LOOKUP_INDEX)])


def swap_task_index(apps, schema_editor, old, new):
    """PostgreSQL only: build *new* beside *old*, then put it in *old*'s place."""
    if schema_editor.connection.vendor != "postgresql":
        return
    building = models.Index(
        fields=new.fields, name="outbox_job_task_new_idx", opclasses=new.opclasses
    )
    build(apps, schema_editor, [("job", building)])
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {old.name}")
    schema_editor.execute(f"ALTER INDEX {building.name} RENAME TO {new.name}")


def task_index_for_patterns(apps, schema_editor):
    swap_task_index(apps, schema_editor, TASK_INDEX, TASK_PATTERN_INDEX)


def task_index_back(apps, schema_editor):
    swap_task_index(apps, schema_editor, TASK_PATTERN_INDEX, TASK_INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY; MySQL cannot run DDL in a transaction

    dependencies = [
        ("django_outbox", "0016_health"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name=model_name, index=index)
                for model_name, index in (*OUTBOX_INDEXES, ("job", UNIQUE_LOOKUP_INDEX))
            ],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="outbox_job_task_idx"),
                migrations.AddIndex(model_name="job", index=TASK_PATTERN_INDEX),
            ],
            database_operations=[
                migrations.RunPython(task_index_for_patterns, task_index_back, elidable=False)
            ],
        ),
    ]
