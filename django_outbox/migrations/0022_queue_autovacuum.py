# PostgreSQL: the queue tables are vacuumed by a fixed number of dead rows instead of a
# fifth of the table, and their indexes always cleaned (engine/vacuum.py says why). A
# partitioned table takes the settings on each partition. Other databases: nothing.

from django.db import migrations

from django_outbox.engine import vacuum


def tune(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for table in vacuum.QUEUE_TABLES:
            vacuum.tune(cursor, connection.ops.quote_name, table)


def untune(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for table in vacuum.QUEUE_TABLES:
            vacuum.untune(cursor, connection.ops.quote_name, table)


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0021_time_ordered_ids"),
    ]

    operations = [migrations.RunPython(tune, untune, elidable=False)]
