"""The Grafana dashboard (deploy/grafana/allocator.json, issue 12): a well-formed dashboard
model, every query valid PromQL and reading only metrics and labels a node exports.

No Grafana server runs here and Grafana publishes no JSON schema of its dashboard model, so the
model is checked structurally (what Grafana needs to load and lay out the panels), the queries
by promtool (``promtool check rules`` on a rule file made of them) and against
:class:`NodeMetrics`' registry; tests/integration/test_grafana_dashboard_live.py checks them
against a live node's ``/metrics``. ``promtool`` comes from Debian's ``prometheus`` package
(scripts/install-system-deps.sh); these tests fail, not skip, without it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.metrics import NodeMetrics
from tests import grafana_dashboard as gd

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24
PANEL_TYPES = {"row", "stat", "timeseries", "state-timeline"}
# What issue 12 asks the dashboard to show, and a metric that shows each.
REQUIRED = {
    "who leads": "allocator_is_leader",
    "handovers": "allocator_terms_total",
    "election queue length": "allocator_election_queue_length",
    "pool level": "allocator_pool_available_blocks",
    "runway": "allocator_pool_runway_seconds",
    "runway a handover needs": "allocator_pool_runway_needed_seconds",
    "claims/s": "allocator_pool_claim_rate_blocks_per_second",
    "refill duration": "allocator_refill_duration_seconds_bucket",
    "fenced writes": "allocator_fenced_writes_rejected_total",
    "clock skew": "allocator_clock_offset_seconds",
    "time bits left": "allocator_layout_time_left_seconds",
}


def _exported() -> dict[str, set[str]]:
    """Series name -> label names, as a fresh node's registry exports them."""
    exported: dict[str, set[str]] = {}
    for family in NodeMetrics().registry.collect():
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return gd.load()


def test_the_model_has_what_grafana_needs_to_load_it(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "allocator-overview"
    assert dashboard["title"]
    assert dashboard["id"] is None  # Grafana assigns it; a fixed id clashes on import
    assert isinstance(dashboard["schemaVersion"], int)
    assert 36 <= dashboard["schemaVersion"] <= 41  # Grafana 9 to 11
    assert dashboard["time"]["from"]
    assert dashboard["time"]["to"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["type"] == "query"
    assert variables["job"]["datasource"] == DATASOURCE
    assert list(gd.label_values(dashboard)) == [("job", "allocator_is_leader", "job")]


def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping(
    dashboard: dict[str, Any],
) -> None:
    panels = list(gd.panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:  # collapsed rows' panels are laid out when expanded
        assert panel["type"] in PANEL_TYPES, panel["type"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), panel["title"]
        assert min(grid["w"], grid["h"]) > 0, panel["title"]
        assert min(grid["x"], grid["y"]) >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, f"{panel['title']} overflows the grid"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_query_uses_the_datasource_variable_and_no_fixed_uid(
    dashboard: dict[str, Any],
) -> None:
    for panel in gd.panels(dashboard):
        if panel["type"] == "row":
            assert not panel.get("targets"), f"row {panel['title']} has queries"
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), f"{panel['title']}: duplicate refIds"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]
            assert target["refId"], panel["title"]
    # The only other data source: Grafana's own, for its built-in annotations.
    text = gd.DASHBOARD.read_text(encoding="utf-8")
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', text)) - {dashboard["uid"]}
    assert uids <= {"${datasource}", "-- Grafana --"}


def test_every_selector_filters_on_the_job_variable(dashboard: dict[str, Any]) -> None:
    for query in gd.queries(dashboard):
        reading = gd.read(query.expr)
        selected = {metric for metric, label, *_ in reading.matchers}
        assert selected == set(reading.metrics), f"{query.where}: a metric without a selector"
        for metric in reading.metrics:
            assert (metric, "job", "=", "$job") in reading.matchers, f"{query.where}: {metric}"


def test_every_aggregation_says_what_it_keeps(dashboard: dict[str, Any]) -> None:
    for query in gd.queries(dashboard):
        aggregations = len(re.findall(rf"\b({'|'.join(gd.AGGREGATIONS)})\s*\(", query.expr))
        assert aggregations == 0, f"{query.where}: an aggregation without by (...)"


def test_the_dashboard_shows_what_the_issue_asks_for(dashboard: dict[str, Any]) -> None:
    read = set()
    for query in gd.queries(dashboard):
        read |= set(gd.read(query.expr).metrics)
    missing = {what: metric for what, metric in REQUIRED.items() if metric not in read}
    assert missing == {}


def test_every_query_is_valid_promql(dashboard: dict[str, Any], tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": gd.substitute(query.expr)}
        for i, query in enumerate(gd.queries(dashboard))
    ]
    where = [query.where for query in gd.queries(dashboard)]
    assert rules
    rule_file = tmp_path / "dashboard-queries.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [gd.promtool(), "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    # promtool names the rule that fails by its position; show which panel that is.
    assert done.returncode == 0, done.stdout + done.stderr + "\n".join(where)


def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    """The check above is real: promtool does parse what it is given."""
    rule_file = tmp_path / "broken.yml"
    broken = {"record": "dashboard:broken", "expr": "sum by (job) (rate(allocator_terms_total[1m]"}
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [broken]}]}))
    done = subprocess.run(
        [gd.promtool(), "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0


def test_every_metric_and_label_a_query_uses_is_exported(dashboard: dict[str, Any]) -> None:
    exported = _exported()
    assert gd.problems(list(gd.queries(dashboard)), exported) == []
    for variable, metric, label in gd.label_values(dashboard):
        assert metric in exported, variable
        assert label in exported[metric] | gd.TARGET_LABELS, variable


def test_every_query_finds_data_in_the_series_a_node_exports(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    """Prometheus' engine (promtool) runs every query over the registry's series, each at 1 (a
    node that leads, is connected and ready; a runway that is finite)."""
    samples = [
        (sample.name, sample.labels, 1.0)
        for family in NodeMetrics().registry.collect()
        for sample in family.samples
    ]
    assert gd.empty_queries(list(gd.queries(dashboard)), samples, tmp_path) == ""


def test_a_query_that_finds_nothing_is_reported(tmp_path: Path) -> None:
    queries = [
        gd.Query("fine", 'max by (job) (allocator_is_leader{job="$job"})'),
        gd.Query("wrong value", 'allocator_zookeeper_session{allocator_zookeeper_session="up"}'),
    ]
    samples = [
        ("allocator_is_leader", {}, 1.0),
        ("allocator_zookeeper_session", {"allocator_zookeeper_session": "connected"}, 1.0),
    ]
    report = gd.empty_queries(queries, samples, tmp_path)
    assert "wrong value" in report
    assert "fine" not in report


@pytest.mark.parametrize(
    ("expr", "legend", "problem"),
    [
        ('allocator_nothing{job="$job"}', "", "allocator_nothing is not exported"),
        ('allocator_terms{job="$job"}', "", "allocator_terms is not exported"),
        ('allocator_is_leader{job="$job",role="x"}', "", "has no label ['role']"),
        ('sum by (le) (allocator_is_leader{job="$job"})', "", "groups by 'le'"),
        ('sum by (job) (allocator_is_leader{job="$job"})', "{{instance}}", "prints 'instance'"),
        ('sumx(allocator_is_leader{job="$job"})', "", "unknown functions ['sumx']"),
    ],
)
def test_the_reader_catches_what_a_node_does_not_export(
    expr: str, legend: str, problem: str
) -> None:
    (found,) = gd.problems([gd.Query("q", expr, legend)], _exported())
    assert problem in found
