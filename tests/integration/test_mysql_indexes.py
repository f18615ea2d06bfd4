"""MySQL/MariaDB ignore the conditions of partial indexes: an index that is partial
elsewhere is whole there. None of ours may end up as a second index on the primary key
alone (migration 0014): InnoDB sometimes locks rows through it, entry first and row
second, against statements that go through the primary key, and ordered inbox keys
deadlocked on that (``tests/acceptance/test_ordered_keys.py``)."""

import pytest
from django.apps import apps
from django.db import connection

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "mysql", reason="index conditions are ignored only on MySQL/MariaDB"
    ),
]


def test_no_table_of_ours_has_a_second_index_on_its_primary_key_alone():
    found = []
    with connection.cursor() as cursor:
        for model in apps.get_app_config("django_outbox").get_models():
            table = model._meta.db_table
            pk = model._meta.pk.column
            constraints = connection.introspection.get_constraints(cursor, table)
            for name, info in constraints.items():
                if info["index"] and not info["primary_key"] and info["columns"] == [pk]:
                    found.append((table, name))
    assert found == []
