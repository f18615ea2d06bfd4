"""MySQL/MariaDB: drop the outbox's and the inbox's "failed rows" indexes.

On PostgreSQL and SQLite they are partial (``id`` over the failed rows only: the admin's
list of failures reads them). MySQL/MariaDB ignore index conditions, so there each was a
second, whole index on ``id``: it served nothing the primary key does not, cost a write
per row version, and InnoDB sometimes chose it for ``WHERE id IN (…)``. A statement
that locks rows through it takes its entry first and the row second, while one that
goes through the primary key takes them the other way round: two workers on ordered
inbox keys deadlocked on that. The model keeps the index (the other databases have it);
only the MySQL/MariaDB table loses it. A later migration that alters these indexes must
skip MySQL/MariaDB the same way."""

from django.db import migrations

INDEXES = {
    "outbox_msg_error_idx": "django_outbox_message",
    "inbox_msg_error_idx": "django_outbox_inbox",
}


def drop_on_mysql(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    connection = schema_editor.connection
    for name, table in INDEXES.items():
        with connection.cursor() as cursor:
            present = connection.introspection.get_constraints(cursor, table)
        if name in present:
            schema_editor.execute(f"DROP INDEX {name} ON {table}")


def create_on_mysql(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for name, table in INDEXES.items():
        schema_editor.execute(f"CREATE INDEX {name} ON {table} (id)")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_outbox", "0013_worker_attempts")]

    operations = [migrations.RunPython(drop_on_mysql, create_on_mysql, elidable=False)]
