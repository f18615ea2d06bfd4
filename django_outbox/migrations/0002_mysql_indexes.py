"""MySQL/MariaDB: binary collation for keys, and indexes (no partial indexes there).

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


#: Keys and destinations compare byte for byte, as on PostgreSQL and SQLite:
#: MySQL's default collation would merge "Order:1", "order:1" and "order:1 ".
BINARY_COLUMNS = (
    ("django_outbox_message", "destination", "varchar(100)", "NOT NULL"),
    ("django_outbox_message", "`key`", "varchar(255)", "NULL"),
    ("django_outbox_key", "destination", "varchar(100)", "NOT NULL"),
    ("django_outbox_key", "`key`", "varchar(255)", "NOT NULL"),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    # NO PAD collations: a trailing space makes a different key too.
    collation = (
        "utf8mb4_nopad_bin" if schema_editor.connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    )
    for table, column, kind, null in BINARY_COLUMNS:
        schema_editor.execute(
            f"ALTER TABLE {table} MODIFY {column} {kind} "
            f"CHARACTER SET utf8mb4 COLLATE {collation} {null}"
        )
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
