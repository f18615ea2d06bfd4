"""The health page: its entry in the admin (a proxy, no table) and the partial indexes its
figures read, so that none of them scans a table.

- ``outbox_msg_parked_idx``, ``outbox_job_parked_idx``: the rows parked behind a failed
  key, and how many keys (the due indexes leave parked rows out);
- ``outbox_msg_uncertain_idx``: failed messages held as uncertain;
- ``outbox_job_failed_idx``: the FAILED jobs, newest first (the failure groups; the
  jobs had no index of their failed rows).

Each holds only rows in a rare state, so the engine's claims and finishes pay nothing
for them. MySQL/MariaDB ignore index conditions: there each would be a whole index,
paid by every row version (and a second index on ``id``, the deadlock migration 0014
removed), so they are not created there; the figures are capped counts over the
state-led indexes instead.
"""

from django.db import migrations, models

INDEXES = (
    (
        "outboxmessage",
        models.Index(
            condition=models.Q(("blocked", True), ("state", "should_be_sent")),
            fields=["destination", "key"],
            name="outbox_msg_parked_idx",
        ),
    ),
    (
        "outboxmessage",
        models.Index(
            condition=models.Q(("state", "send_error"), ("uncertain", True)),
            fields=["id"],
            name="outbox_msg_uncertain_idx",
        ),
    ),
    (
        "job",
        models.Index(
            condition=models.Q(("state", "FAILED")), fields=["id"], name="outbox_job_failed_idx"
        ),
    ),
    (
        "job",
        models.Index(
            condition=models.Q(("blocked", True), ("state", "READY")),
            fields=["serial_key"],
            name="outbox_job_parked_idx",
        ),
    ),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        return
    for model_name, index in INDEXES:
        schema_editor.add_index(apps.get_model("django_outbox", model_name), index)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        return
    for model_name, index in INDEXES:
        schema_editor.remove_index(apps.get_model("django_outbox", model_name), index)


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction

    dependencies = [
        ("django_outbox", "0015_telemetry"),
    ]

    operations = [
        migrations.CreateModel(
            name="Health",
            fields=[],
            options={
                "verbose_name": "health",
                "verbose_name_plural": "health",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_outbox.worker",),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name=model_name, index=index)
                for model_name, index in INDEXES
            ],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        ),
    ]
