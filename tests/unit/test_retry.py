import pytest
from django.db import OperationalError

from django_outbox.engine.retry import is_transient, retry_transient


class PgError(Exception):
    def __init__(self, sqlstate):
        super().__init__("pg")
        self.sqlstate = sqlstate


def wrapped(cause):
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("cause", "transient"),
    [
        (PgError("40P01"), True),  # deadlock_detected
        (PgError("40001"), True),  # serialization_failure
        (PgError("23505"), False),  # unique_violation
        (Exception(1213, "Deadlock found"), True),
        (Exception(1205, "Lock wait timeout exceeded"), True),
        (Exception(2006, "MySQL server has gone away"), False),
    ],
)
def test_deadlocks_and_serialization_failures_are_transient(cause, transient):
    assert is_transient(wrapped(cause)) is transient


def test_a_deadlock_victim_is_run_again():
    calls = []

    def operation():
        calls.append(1)
        if len(calls) < 3:
            raise wrapped(PgError("40P01"))
        return "done"

    assert retry_transient(operation) == "done"
    assert len(calls) == 3


def test_other_errors_and_exhausted_retries_propagate():
    with pytest.raises(OperationalError):
        retry_transient(lambda: (_ for _ in ()).throw(wrapped(PgError("23505"))))
    calls = []

    def always_deadlocked():
        calls.append(1)
        raise wrapped(PgError("40P01"))

    with pytest.raises(OperationalError):
        retry_transient(always_deadlocked, attempts=2)
    assert len(calls) == 2


class MysqlLost(Exception):
    def __init__(self):
        super().__init__(2013, "Lost connection to MySQL server during query")


@pytest.mark.django_db
def test_a_lost_connection_is_replaced_and_the_operation_run_again(monkeypatch):
    from django.db import connections

    closed = []
    monkeypatch.setattr(connections["default"], "close", lambda: closed.append(1))
    monkeypatch.setattr(connections["default"], "in_atomic_block", False)
    calls = []

    def operation():
        calls.append(1)
        if len(calls) == 1:
            raise wrapped(MysqlLost())
        return "recorded"

    assert retry_transient(operation, reconnect="default") == "recorded"
    assert (len(calls), len(closed)) == (2, 1)


@pytest.mark.django_db
def test_a_lost_connection_inside_the_callers_transaction_is_theirs(monkeypatch):
    from django.db import connections

    monkeypatch.setattr(connections["default"], "in_atomic_block", True)
    with pytest.raises(OperationalError):
        retry_transient(lambda: (_ for _ in ()).throw(wrapped(MysqlLost())), reconnect="default")
