"""The Grafana dashboard's queries against a live node (issue 12, must-show 1 and 2): a real
node in a thread on the real ensemble and PostgreSQL leads and fills the pool; its
``/metrics``, read over its admin HTTP server, passes ``promtool check metrics``, holds every
metric and label the dashboard (deploy/grafana/allocator.json) reads, and Prometheus' engine
(``promtool test rules``) finds data for every query over those series.

``promtool`` comes from Debian's ``prometheus`` package (scripts/install-system-deps.sh);
without it the test fails, never skips.
"""

from __future__ import annotations

import math
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import grafana_dashboard as gd
from tests.fixtures.nodes import MakeNode, wait_for

pytestmark = pytest.mark.integration


def _scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:  # noqa: S310
        assert response.status == 200
        return str(response.read().decode())


def test_a_live_nodes_metrics_pass_promtool_and_hold_what_the_dashboard_reads(
    make_node: MakeNode, tmp_path: Path
) -> None:
    leader = make_node("a").node
    registry = leader.metrics.registry

    def settled() -> bool:
        # It leads, has refilled, scanned the election and read the pool at least once.
        value = registry.get_sample_value
        available = value("allocator_pool_available_blocks")
        return (
            value("allocator_is_leader") == 1
            and (value("allocator_refill_duration_seconds_count") or 0) > 0
            and (value("allocator_election_queue_length") or 0) >= 1
            and available is not None
            and not math.isnan(available)
        )

    wait_for(settled, "the node to lead, refill and read the pool")
    url = wait_for(lambda: leader.snapshot()["admin_url"], "the admin server")
    text = _scrape(str(url))

    lint = subprocess.run(
        [gd.promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr

    exported: dict[str, set[str]] = {}
    samples: list[gd.Sample] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
            samples.append((sample.name, sample.labels, sample.value))
    dashboard = gd.load()
    queries = list(gd.queries(dashboard))
    assert gd.problems(queries, exported) == []
    for variable, metric, label in gd.label_values(dashboard):
        assert metric in exported, variable
        assert label in exported[metric] | gd.TARGET_LABELS, variable
    assert gd.empty_queries(queries, samples, tmp_path) == ""
