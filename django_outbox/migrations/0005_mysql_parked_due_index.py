"""MySQL/MariaDB: the due index leads with (state, blocked), as the partial index does
elsewhere, so parked messages of a failed key stay out of the relay's scan."""

from django.db import migrations


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "CREATE INDEX outbox_msg_state_ready_idx "
        "ON django_outbox_message (state, blocked, available_at, id)"
    )
    schema_editor.execute("DROP INDEX outbox_msg_state_due_idx ON django_outbox_message")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "CREATE INDEX outbox_msg_state_due_idx ON django_outbox_message (state, available_at, id)"
    )
    schema_editor.execute("DROP INDEX outbox_msg_state_ready_idx ON django_outbox_message")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_outbox", "0004_parked_keys")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
