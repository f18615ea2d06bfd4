"""Indexes for MySQL/MariaDB, which have no partial indexes.

On PostgreSQL and SQLite the model's partial indexes already serve the hot
queries by state. MySQL builds them without their condition, so the relay's
"due" scan would walk through every sent row; these composite indexes lead
with ``state`` instead. A plain unique index stands in for the partial unique
constraint on (destination, key, sequence): MySQL lets NULLs repeat in it.
"""

from django.db import migrations

INDEXES = (
    ("outbox_msg_state_due_idx", "state, available_at, id", False),
    ("outbox_msg_state_lease_idx", "state, locked_until", False),
    ("outbox_msg_state_finished_idx", "state, finished_at", False),
    ("outbox_msg_key_seq_uniq", "destination, `key`, sequence", True),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for name, columns, unique in INDEXES:
        kind = "UNIQUE INDEX" if unique else "INDEX"
        schema_editor.execute(f"CREATE {kind} {name} ON django_outbox_message ({columns})")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for name, _, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX {name} ON django_outbox_message")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_outbox", "0001_initial")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
