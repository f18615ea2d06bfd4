"""DJANGO_OUTBOX: each bad value is a system check error, and get_settings() raises
ConfigurationError with the same text."""

import json

import pytest
from django.core import checks

from django_outbox.conf import get_settings
from django_outbox.exceptions import ConfigurationError
from tests.badinput.cases import CHECK, SETTINGS
from tests.badinput.support import params, table_counts
from tests.conftest import BASE_OUTBOX

pytestmark = pytest.mark.django_db


def value_of(given):
    if "value" in given:
        return given["value"]
    value = json.loads(json.dumps(BASE_OUTBOX))
    value.update(given.get("set", {}))
    if "destinations" in given:
        value["OUTBOX"]["DESTINATIONS"] = given["destinations"]
    if "sources" in given:
        value["INBOX"] = {"SOURCES": given["sources"]}
    return value


@pytest.mark.parametrize("case", params(SETTINGS))
def test_settings(case, settings):
    expect = case.expect
    assert expect.kind == CHECK
    before = table_counts()
    settings.DJANGO_OUTBOX = value_of(case.given)
    errors = [
        problem
        for problem in checks.run_checks(tags=["django_outbox"])
        if problem.is_serious() and problem.id.startswith("django_outbox.")
    ]
    assert [(e.id, expect.says in e.msg) for e in errors] == [(expect.what, True)], errors
    if expect.what == "django_outbox.E001":
        with pytest.raises(ConfigurationError) as raised:
            get_settings()
        assert str(raised.value) == errors[0].msg
    assert table_counts() == before
