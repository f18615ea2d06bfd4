"""Management commands: bad arguments are a CommandError naming the value, before
anything runs."""

import re

import pytest
from django.core.management import CommandError, call_command
from django.utils.connection import ConnectionDoesNotExist

from tests.badinput.cases import COMMANDS, RAISES
from tests.badinput.support import params, table_counts

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def sources(configure_outbox):
    configure_outbox(
        INBOX={"SOURCES": {"shop": {"TRANSPORT": "kombu", "URL": "memory://", "QUEUE": "q"}}}
    )


@pytest.mark.parametrize("case", params(COMMANDS))
def test_command(case):
    expect = case.expect
    assert expect.kind == RAISES
    error = {"CommandError": CommandError, "ConnectionDoesNotExist": ConnectionDoesNotExist}
    before = table_counts()
    with pytest.raises(error[expect.what], match=re.escape(expect.says)):
        call_command(*case.given["argv"])
    assert table_counts() == before
