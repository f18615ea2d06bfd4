"""Jobs: a due index in claim order without the queue, for workers of every queue
(their claims sorted the whole READY backlog). MySQL/MariaDB, which have no partial
indexes, get a plain one led by the state."""

from django.db import migrations, models


def mysql_index(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(
            "CREATE INDEX outbox_job_state_due_all_idx ON django_outbox_job "
            "(state, blocked, priority DESC, available_at, id)"
        )


def drop_mysql_index(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute("DROP INDEX outbox_job_state_due_all_idx ON django_outbox_job")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_outbox", "0008_jobs")]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("blocked", False), ("state", "READY")),
                fields=["-priority", "available_at", "id"],
                name="outbox_job_due_all_idx",
            ),
        ),
        migrations.RunPython(mysql_index, drop_mysql_index, elidable=False),
    ]
