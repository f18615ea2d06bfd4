"""MySQL/MariaDB: every identifier column compares byte for byte (guarantee 9).

MySQL's and MariaDB's default collations ignore case, and MariaDB's (like
every PAD SPACE collation, ``utf8mb4_general_ci`` among them) trailing spaces
too: the inbox took ``evt_abc`` and ``evt_abc `` for duplicates of
``evt_AbC`` and discarded them, keys differing only so shared
one ordering cursor, and jobs with unique or serial keys differing only so
were held or ordered together. Migration 0002 fixed the outbox's destination
and key; this does the same, with the same binary NO PAD collations, for the
other columns that decide dedup, uniqueness, routing, ordering or what an
operator's selection matches (``outbox_requeue --type``, the admin's queue
filter, reply matching by correlation id). PostgreSQL and SQLite already
compare bytes: nothing is done there.

Left alone: ``state`` and ``resolution`` (values the code writes, all lower
case), free text (errors, tracebacks, bodies, a worker's ``host:pid`` name,
the sweep's ``ran_by``), the sweep's ``part`` (three names the code writes),
a batch's ``callback_path`` (never compared in the database), and UUID
columns (native ``uuid`` on MariaDB 10.7+; lower-case hex written by Django
elsewhere).

Each table is altered once, all its columns in one ``ALTER TABLE`` (one
rebuild of the table and its indexes, unique ones included). Sizes and
NULL-ness come from the migration state, so the columns stay as the models
define them. A case-blind unique index cannot hold two values differing only
in case, so the forward step never meets duplicates; the reverse step
(back to the table's default collation) fails with a duplicate-key error if
such rows exist by then. A later ``AlterField`` of one of these columns on
MySQL resets its collation to the table's default: reapply it there.
"""

from django.db import IntegrityError, migrations

#: Model → the fields whose columns become binary.
IDENTIFIERS = {
    "OutboxMessage": ("type", "correlation_id"),
    "InboxMessage": ("source", "message_id", "type", "key", "correlation_id"),
    "InboxCursor": ("source", "key"),
    "Job": ("task_path", "backend", "queue_name", "unique_key", "serial_key"),
    "JobKey": ("serial_key",),
}


def alter(apps, schema_editor, charset):
    """One ``ALTER TABLE`` per table: its identifier columns with *charset* (``""``: the
    table's default character set and collation)."""
    connection = schema_editor.connection
    quote = schema_editor.quote_name
    for model_name, field_names in IDENTIFIERS.items():
        model = apps.get_model("django_outbox", model_name)
        table = model._meta.db_table
        clauses = []
        for name in field_names:
            field = model._meta.get_field(name)
            null = "NULL" if field.null else "NOT NULL"
            column = f"{quote(field.column)} {field.db_type(connection)}"
            clauses.append(f"MODIFY {column} {charset} {null}".replace("  ", " "))
        try:
            schema_editor.execute(f"ALTER TABLE {quote(table)} {', '.join(clauses)}")
        except IntegrityError as exc:
            # Only the way back can merge rows: a case-blind collation sees duplicates.
            raise IntegrityError(
                f"cannot give {table}'s {', '.join(field_names)} the table's case-blind "
                f"collation: rows that differ only in case or trailing spaces would collide "
                f"({exc}). Tables before it in 0011's list are reverted already; delete or "
                "rename those rows and migrate back again, or stay on 0011"
            ) from exc


def to_binary(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    # NO PAD: a trailing space makes a different value too.
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    alter(apps, schema_editor, f"CHARACTER SET utf8mb4 COLLATE {collation}")


def to_table_default(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    # No character set or collation: MODIFY gives the column the table's defaults,
    # which is what the columns had before (Django names none when it creates them).
    alter(apps, schema_editor, "")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_outbox", "0010_job_leaner_indexes")]

    operations = [migrations.RunPython(to_binary, to_table_default, elidable=False)]
