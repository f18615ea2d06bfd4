# The default of two unique ids becomes a time-ordered UUID (engine/ids.py). A
# callable default lives in Python only, so nothing changes in the database; the
# operations touch the migration state alone, because SQLite would otherwise remake
# each table and lose the indexes that earlier migrations made with SQL of their own
# (the jobs' unique index of active keys).

from django.db import migrations, models

import django_outbox.engine.ids


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0020_inbox_seen"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="result_id",
                    field=models.UUIDField(
                        default=django_outbox.engine.ids.uuid7,
                        editable=False,
                        help_text="The TaskResult id.",
                        unique=True,
                    ),
                ),
                migrations.AlterField(
                    model_name="outboxmessage",
                    name="message_id",
                    field=models.UUIDField(
                        default=django_outbox.engine.ids.uuid7,
                        editable=False,
                        help_text="Idempotency key.",
                        unique=True,
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
