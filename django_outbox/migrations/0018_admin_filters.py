"""The admin's filters that few rows match, through partial indexes of the rows that
failed at least once (``attempts > 1``, an error recorded, or for the outbox held as
uncertain): ``outbox_msg_troubled_idx``, ``inbox_msg_troubled_idx``,
``outbox_job_troubled_idx``, each on ``id`` (the list's order).

"Has an error", "attempts 2 to 5", "6 or more" and "uncertain" imply the index's
condition, so PostgreSQL reads these rows only, not the history: a filter that matches
nothing read the whole table (0.3 s at 5 million rows, twice: for the page and its
count). A healthy row never enters them; a failing one pays one small entry.

MySQL/MariaDB ignore index conditions: there each would be a second whole index on
``id``, the deadlock 0014 removed, so they are not created there, and these filters
read the table. On PostgreSQL they are built ``CONCURRENTLY`` (writes go on), and one
built beforehand is kept (docs/operations.md, "Upgrading").
"""

from django.db import migrations, models

INDEXES = (
    (
        "outboxmessage",
        models.Index(
            condition=models.Q(
                ("attempts__gt", 1),
                models.Q(("last_error", ""), _negated=True),
                ("uncertain", True),
                _connector="OR",
            ),
            fields=["id"],
            name="outbox_msg_troubled_idx",
        ),
    ),
    (
        "inboxmessage",
        models.Index(
            condition=models.Q(
                ("attempts__gt", 1), models.Q(("last_error", ""), _negated=True), _connector="OR"
            ),
            fields=["id"],
            name="inbox_msg_troubled_idx",
        ),
    ),
    (
        "job",
        models.Index(
            condition=models.Q(
                ("attempts__gt", 1), models.Q(("last_error", ""), _negated=True), _connector="OR"
            ),
            fields=["id"],
            name="outbox_job_troubled_idx",
        ),
    ),
)


def create(apps, schema_editor):
    """Concurrently on PostgreSQL, skipping one built beforehand; plainly on SQLite."""
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        return
    for model_name, index in INDEXES:
        model = apps.get_model("django_outbox", model_name)
        if connection.vendor != "postgresql":
            schema_editor.add_index(model, index)
            continue
        with connection.cursor() as cursor:
            present = connection.introspection.get_constraints(cursor, model._meta.db_table)
        if index.name not in present:
            schema_editor.execute(
                index.create_sql(model, schema_editor, concurrently=True), params=None
            )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        return
    for model_name, index in INDEXES:
        schema_editor.remove_index(apps.get_model("django_outbox", model_name), index)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY

    dependencies = [
        ("django_outbox", "0017_admin_search"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name=model_name, index=index)
                for model_name, index in INDEXES
            ],
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
        ),
    ]
