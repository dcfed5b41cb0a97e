"""deploy/: the alert rules parse and name only metrics a node exports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from allocator.metrics import NodeMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def exported_names() -> set[str]:
    metrics = NodeMetrics()
    metrics.job_errors.labels(task="refill")  # labelled metrics appear once used
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def test_alert_rules_use_only_exported_metrics() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "allocator-alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert exprs
    used = {name for expr in exprs for name in re.findall(r"\ballocator_[a-z_]+\b", expr)}
    assert used <= exported_names(), used - exported_names()


def test_systemd_unit_restarts_nodes_but_not_bad_config() -> None:
    unit = (DEPLOY / "systemd" / "allocator@.service").read_text()
    assert "Restart=always" in unit
    assert "RestartPreventExitStatus=78" in unit
    assert "ExecStart=/opt/allocator/bin/allocator run" in unit


def test_systemd_unit_gives_each_node_a_private_state_dir() -> None:
    unit = (DEPLOY / "systemd" / "allocator@.service").read_text()
    assert "StateDirectory=allocator/%i" in unit
    assert "StateDirectoryMode=0700" in unit
    assert "Environment=ALLOCATOR_NODE_STATE_DIR=%S/allocator/%i" in unit


def test_systemd_unit_reaps_a_crashed_nodes_session_after_every_exit() -> None:
    unit = (DEPLOY / "systemd" / "allocator@.service").read_text()
    assert "ExecStopPost=/opt/allocator/bin/allocator reap-session" in unit
