"""Jobs: fewer index entries per job. Every claim and every finish writes a new row
version, with an entry in each index whose condition it meets, so on PostgreSQL and
SQLite the two extra indexes over RUNNING jobs (by lease token, by worker) go (the lease
index serves those lookups: it holds only the RUNNING jobs), and the batch index becomes
partial (most jobs have no batch; the plain one kept a NULL entry for each of their
row versions).

MySQL/MariaDB ignore index conditions (every index is whole), so there nothing is
gained and the old shape stays: plain token and worker indexes, and the foreign key's
index on ``batch_id``, renamed to the name the model now gives it. (Django's own
operations for the batch index do not reverse on MySQL: removing the last index of a
foreign key column makes it create one first.)"""

import django.db.models.deletion
from django.db import migrations, models

TABLE = "django_outbox_job"
WHOLE = {"outbox_job_token_idx": "lock_token", "outbox_job_worker_idx": "claimed_by"}
BATCH = "outbox_job_batch_idx"
#: The plain batch index's name when this migration is reversed.
PLAIN_BATCH = "django_outbox_job_batch_id_idx"


def _plain_batch_indexes(schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, TABLE)
    return [
        name
        for name, info in found.items()
        if info["columns"] == ["batch_id"]
        and info["index"]
        and not info["unique"]
        and not info["primary_key"]
        and name != BATCH
    ]


def keep_whole_on_mysql(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        for name, column in WHOLE.items():
            schema_editor.execute(f"CREATE INDEX {name} ON {TABLE} ({column})")


def drop_whole_on_mysql(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        for name in WHOLE:  # the reverse of RemoveIndex creates them again
            schema_editor.execute(f"DROP INDEX {name} ON {TABLE}")


def partial_batch_index(apps, schema_editor):
    plain = _plain_batch_indexes(schema_editor)
    if schema_editor.connection.vendor == "mysql":
        for name in plain[:1]:
            schema_editor.execute(f"ALTER TABLE {TABLE} RENAME INDEX {name} TO {BATCH}")
        return
    for name in plain:
        schema_editor.execute(f"DROP INDEX {name}")
    schema_editor.execute(f"CREATE INDEX {BATCH} ON {TABLE} (batch_id) WHERE batch_id IS NOT NULL")


def plain_batch_index(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"ALTER TABLE {TABLE} RENAME INDEX {BATCH} TO {PLAIN_BATCH}")
        return
    schema_editor.execute(f"DROP INDEX {BATCH}")
    schema_editor.execute(f"CREATE INDEX {PLAIN_BATCH} ON {TABLE} (batch_id)")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_outbox", "0009_job_due_all_index")]

    operations = [
        migrations.RemoveIndex(model_name="job", name="outbox_job_token_idx"),
        migrations.RemoveIndex(model_name="job", name="outbox_job_worker_idx"),
        migrations.RunPython(keep_whole_on_mysql, drop_whole_on_mysql, elidable=False),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="batch",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        help_text=(
                            "The batch this job belongs to (its callback runs when all "
                            "have finished)."
                        ),
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="jobs",
                        to="django_outbox.jobbatch",
                    ),
                ),
                migrations.AddIndex(
                    model_name="job",
                    index=models.Index(
                        condition=models.Q(("batch__isnull", False)),
                        fields=["batch"],
                        name=BATCH,
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(partial_batch_index, plain_batch_index, elidable=False)
            ],
        ),
    ]
