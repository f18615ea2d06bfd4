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

Each is built with a plain ``CREATE INDEX``, which blocks writes to its table while it is
built (seconds to a minute at millions of rows): see the upgrade notes in
docs/operations.md to build them beforehand, concurrently, on PostgreSQL.
"""

from django.db import migrations, models

TASK_INDEX = models.Index(fields=["task_path", "state"], name="outbox_job_task_idx")
TASK_PATTERN_INDEX = models.Index(
    fields=["task_path", "state"],
    name="outbox_job_task_idx",
    opclasses=("varchar_pattern_ops", "varchar_pattern_ops"),
)
UNIQUE_LOOKUP_INDEX = models.Index(
    condition=models.Q(("unique_key__isnull", False)),
    fields=["unique_key"],
    name="outbox_job_unique_lookup_idx",
)


def task_index_for_patterns(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    job = apps.get_model("django_outbox", "Job")
    schema_editor.remove_index(job, TASK_INDEX)
    schema_editor.add_index(job, TASK_PATTERN_INDEX)


def task_index_back(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    job = apps.get_model("django_outbox", "Job")
    schema_editor.remove_index(job, TASK_PATTERN_INDEX)
    schema_editor.add_index(job, TASK_INDEX)


def unique_lookup(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        return
    schema_editor.add_index(apps.get_model("django_outbox", "Job"), UNIQUE_LOOKUP_INDEX)


def unique_lookup_back(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        return
    schema_editor.remove_index(apps.get_model("django_outbox", "Job"), UNIQUE_LOOKUP_INDEX)


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction

    dependencies = [
        ("django_outbox", "0016_health"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("correlation_id__isnull", False)),
                fields=["correlation_id"],
                name="outbox_msg_correlation_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="outboxmessage",
            index=models.Index(
                condition=models.Q(("key__isnull", False)),
                fields=["key"],
                name="outbox_msg_key_prefix_idx",
                opclasses=("varchar_pattern_ops",),
            ),
        ),
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("correlation_id__isnull", False)),
                fields=["correlation_id", "source"],
                name="inbox_msg_correlation_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("key__isnull", False)),
                fields=["key"],
                name="inbox_msg_key_prefix_idx",
                opclasses=("varchar_pattern_ops",),
            ),
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
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="job", index=UNIQUE_LOOKUP_INDEX)],
            database_operations=[
                migrations.RunPython(unique_lookup, unique_lookup_back, elidable=False)
            ],
        ),
    ]
