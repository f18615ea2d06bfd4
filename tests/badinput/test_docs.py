"""The bad-input page is what the cases render: it cannot drift from the tests."""

from tests.badinput.cases import ENTRY_POINTS
from tests.badinput.render import COMMAND, PAGE, render


def test_the_committed_page_is_the_rendered_cases():
    committed = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert committed == render(), (
        f"{PAGE.name} is stale: the cases in tests/badinput/cases.py changed. Run "
        f"`{COMMAND}` and commit docs/reference/bad-input.md"
    )


def test_every_entry_point_has_its_test_module_and_unique_case_ids():
    from pathlib import Path

    from tests.badinput.render import ROOT

    for entry in ENTRY_POINTS:
        assert (ROOT / entry.test).exists(), entry.test
        ids = [case.id for case in entry.cases]
        assert len(ids) == len(set(ids)), entry.name
        assert Path(entry.test).name.startswith("test_")
