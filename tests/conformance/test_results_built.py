"""A worker builds the ``TaskResult`` of a job it starts directly (``backend.
started_result``), skipping the constructor's normalization of arguments that came
back from JSON. The result must be the one Django's constructor makes of the same job
(``backend.to_result``), field by field, on Django 6.1 and on the 0.x backport, and its
arguments must not be the row's own lists and dicts (the constructor copies them)."""

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from django_outbox.jobs import backend, compat
from django_outbox.jobs.models import Job

ARGUMENTS = [
    ([], {}),
    ([1, 2.5, "three", True, None], {"four": 4}),
    ([[1, [2, {"x": [3]}]], {"nested": {"deep": [None, False]}}], {"k": {"a": [1, {"b": 2}]}}),
    (["ünïcode", "", 0, -1, 1e300], {"": "", "list": []}),
]


def job(args, kwargs, **fields):
    values = {
        "result_id": uuid.uuid4(),
        "task_path": "tests.conformance.tasks.nothing",
        "args": args,
        "kwargs": kwargs,
        "backend": "default",
        "state": "RUNNING",
        "created_at": datetime(2026, 11, 28, 6, 0, tzinfo=UTC),
        "started_at": datetime(2026, 11, 28, 6, 1, tzinfo=UTC),
        "last_attempted_at": datetime(2026, 11, 28, 6, 2, tzinfo=UTC),
        "errors": [],
        "worker_ids": [],
    }
    values.update(fields)
    return Job(**values)


def fields_of(result):
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}


@pytest.mark.parametrize(("args", "kwargs"), ARGUMENTS)
def test_a_started_result_is_the_one_the_constructor_makes(args, kwargs):
    from tests.conformance import tasks

    row = job(
        args,
        kwargs,
        errors=[{"exception_class_path": "builtins.ValueError", "traceback": "tb"}],
        worker_ids=["w1"],
    )
    running = compat.TaskResultStatus.RUNNING
    direct = backend.started_result(row, tasks.nothing, running, ["w1", "w2"])
    built = backend.to_result(row, task=tasks.nothing, status=running, worker_ids=["w1", "w2"])
    assert type(direct) is type(built)
    assert fields_of(direct) == fields_of(built)
    assert direct.errors == [
        compat.TaskError(exception_class_path="builtins.ValueError", traceback="tb")
    ]


def test_its_arguments_are_copies_not_the_rows_own():
    from tests.conformance import tasks

    row = job([[1], {"a": [2]}], {"k": {"v": [3]}})
    result = backend.started_result(row, tasks.nothing, compat.TaskResultStatus.RUNNING, [])
    assert result.args == row.args and result.kwargs == row.kwargs
    assert result.args is not row.args and result.args[0] is not row.args[0]
    assert result.args[1]["a"] is not row.args[1]["a"]
    assert result.kwargs["k"] is not row.kwargs["k"]


def test_values_that_are_not_json_go_through_the_constructor():
    from tests.conformance import tasks

    row = job([(1, 2)], {"when": {3: "int key"}})
    running = compat.TaskResultStatus.RUNNING
    direct = backend.started_result(row, tasks.nothing, running, [])
    built = backend.to_result(row, task=tasks.nothing, status=running, worker_ids=[])
    assert fields_of(direct) == fields_of(built)
    assert direct.args == [[1, 2]]  # the constructor's normalization, applied


def test_this_django_builds_results_directly():
    """The fields are those ``started_result`` knows on every supported Django: if a
    release changes them, this fails and the direct build must be reviewed (it falls
    back to the constructor meanwhile)."""
    assert backend._DIRECT_RESULTS
