"""``allocator drill`` in a subprocess: the JSON of DESIGN §10 and a clean stop.

Behaviour only: the keys and their types, every round handed over, no violation, and no
process of the drill's cluster left afterwards (the pids it recorded). No timing threshold:
handover times belong to the drill's report, not to tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
DESIGN_KEYS = {
    "scenario",
    "rounds",
    "violations",
    "handover_ms",
    "stale_writes_rejected",
    "claim_errors",
}
DRILL_TIMEOUT_S = 240


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "drill"
    yield state
    LocalCluster(state).down(purge=True)  # whatever a failed drill left behind


def test_sigkill_drill_reports_design_keys_and_stops_everything(
    state_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "drill.json"
    done = subprocess.run(
        [
            ALLOCATOR,
            "drill",
            "--scenario",
            "sigkill",
            "--rounds",
            "2",
            "--zk",
            "1",
            "--session-timeout-ms",
            "2000",
            "--json",
            "--state-dir",
            str(state_dir),
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=DRILL_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"drill failed ({done.returncode}): {done.stderr}"
    data: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(out.read_text()) == data

    assert data.keys() >= DESIGN_KEYS
    assert data["scenario"] == "sigkill"
    assert data["rounds"] == 2
    assert data["failed_rounds"] == 0
    assert data["violations"] == []
    assert data["claim_errors"] == 0
    assert isinstance(data["stale_writes_rejected"], int)
    assert data["session_timeout_ms"] == 2000
    summary = data["handover_ms"]
    assert set(summary) == {"p50", "p90", "p99", "max"}
    assert all(isinstance(summary[key], float) for key in summary)
    assert summary["p50"] <= summary["p90"] <= summary["p99"] <= summary["max"]

    rounds = data["round_results"]
    assert [r["round"] for r in rounds] == [1, 2]
    for result in rounds:
        assert result["ok"] is True
        assert result["new_epoch"] > result["epoch"]
        assert result["new_leader"] != result["leader"]
    # Each round's new leader is the next round's victim.
    assert rounds[1]["leader"] == rounds[0]["new_leader"]

    cluster = data["cluster"]
    assert cluster["state_dir"] == str(state_dir)
    assert cluster["stopped"] is True
    pids = cluster["pids"]
    # 1 ZooKeeper + PostgreSQL + supervisor + 3 nodes, and the 2 restarted victims.
    assert len(pids) >= 8
    assert {r["leader_pid"] for r in rounds} <= set(pids)
    assert cluster["left_running"] == []
    assert not [pid for pid in pids if is_pid_alive(pid)]
