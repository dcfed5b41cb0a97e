"""The alert rules (deploy/prometheus): valid, unit-tested with promtool, and consistent with
the metrics a node exports and the runbook (issue 12): every ``runbook_url`` is the published
runbook's absolute URL plus a section docs/operations.md has (issue 21).

``promtool`` comes from Debian's ``prometheus`` package (scripts/install-system-deps.sh);
these tests fail, not skip, without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import generate_latest

from allocator.alert_rules import DEFAULT_RUNBOOK, check_runbook, runbook_links
from allocator.metrics import NodeMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "allocator-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "allocator-alerts.test.yml"
RUNBOOK = ROOT / "docs" / "operations.md"
SEVERITIES = {"page", "ticket"}
# Series the rules read that no node exports: Prometheus' own.
PROMETHEUS_SERIES = {"up"}


def _promtool() -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run scripts/install-system-deps.sh (package prometheus)"
    return promtool


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [_promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in _rules()}
    assert alerts - fired == set(), "never shown firing"
    assert alerts - quiet == set(), "never shown quiet"


def _runbook_anchors() -> set[str]:
    """The anchors of docs/operations.md's headings, as GitHub makes them."""
    headings = re.findall(r"^#+ (.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("rule", _rules(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_severity_and_a_runbook_section(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in SEVERITIES
    url = urlsplit(rule["annotations"]["runbook_url"])
    # Absolute, so that Alertmanager's link leads somewhere: the published runbook.
    assert url.scheme == "https"
    assert url.netloc
    assert url._replace(fragment="").geturl() == DEFAULT_RUNBOOK
    assert url.fragment == rule["alert"].lower()
    assert url.fragment in _runbook_anchors(), f"docs/operations.md has no section {rule['alert']}"


def test_the_published_runbook_is_docs_operations_md() -> None:
    assert DEFAULT_RUNBOOK.endswith("/docs/operations.md")
    assert check_runbook(DEFAULT_RUNBOOK) == DEFAULT_RUNBOOK
    assert DEFAULT_RUNBOOK in RUNBOOK.read_text()  # "Alert links" names it
    # The rules' own unit tests expect the same links.
    expected = {url for url, _anchor in runbook_links(RULE_TESTS.read_text())}
    assert expected == {DEFAULT_RUNBOOK}


def test_every_metric_the_rules_read_is_one_a_node_exports() -> None:
    names = set()
    for line in generate_latest(NodeMetrics().registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            names |= {name, f"{name}_total"} if kind == "counter" else {name}
    used = set()
    for rule in _rules():
        used |= set(re.findall(r"\b(allocator_[a-z_]+|up)\b(?=\s*[{\[)])", rule["expr"]))
    assert used - PROMETHEUS_SERIES, "no metric found in the rules: the pattern is wrong"
    assert used - PROMETHEUS_SERIES - names == set()
