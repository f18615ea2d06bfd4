"""The Prometheus rules and the Grafana dashboard shipped in docs/monitoring name only
metrics we export: a renamed metric cannot leave an alert that never fires."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
METRIC = re.compile(r"\bdjango_outbox_[a-z_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def exported(client):
    """Every series name our metrics endpoint can serve."""
    text = client.get("/metrics/").content.decode()
    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.startswith("django_outbox_"):
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def test_every_alert_rule_names_exported_metrics(exported):
    rules = (MONITORING / "alerts.yml").read_text()
    expressions = re.findall(r"^\s*expr:\s*(.+)$", rules, re.MULTILINE)
    assert len(expressions) >= 5
    for expression in expressions:
        named = set(METRIC.findall(expression))
        assert named, expression
        assert named <= exported, f"{expression}: unknown {sorted(named - exported)}"


def test_every_dashboard_query_names_exported_metrics(exported):
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(queries) >= 10
    for query in queries:
        named = set(METRIC.findall(query))
        assert named, query
        assert named <= exported, f"{query}: unknown {sorted(named - exported)}"


def test_the_exported_set_is_not_empty_of_any_kind(exported):
    """The check above would pass vacuously on an empty scrape."""
    assert "django_outbox_outbox_sent_total" in exported
    assert "django_outbox_outbox_publish_latency_seconds_bucket" in exported
    assert "django_outbox_backlog" in exported


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) makes of a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_every_alert_links_a_runbook_section_that_exists():
    rules = (MONITORING / "alerts.yml").read_text()
    links = re.findall(r'runbook:\s*"docs/([^"#]+)#([^"]+)"', rules)
    assert links
    for page, anchor in links:
        text = (MONITORING.parent / page).read_text()
        headings = {slug(h) for h in re.findall(r"^#+\s+(.+)$", text, re.MULTILINE)}
        assert anchor in headings, f"docs/{page} has no section #{anchor}"
