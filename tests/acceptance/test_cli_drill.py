"""``allocator drill`` in a subprocess: the JSON of DESIGN §10 and a clean stop; and a drill
that must fail, on nodes whose fence is broken.

Behaviour only: the keys and their types, every round handed over, no violation, and no
process of the drill's cluster left afterwards (the pids it recorded). No timing threshold:
handover times belong to the drill's report, not to tests. The broken nodes are built in
``tests/`` (:mod:`tests.chaos.unsafe_node`) and run through ``allocator local up
--node-command``; the product has no switch for them.
"""

from __future__ import annotations

import json
import shlex
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
LOCAL_TIMEOUT_S = 120
LINGER_S = 5
"""How long a broken node keeps writing with its old token after it stepped down: past the
end of the drill's rounds."""
BROKEN_NODE_ENV = (
    "ALLOCATOR_POOL_REFILL_INTERVAL_S=0.2",
    "ALLOCATOR_POOL_RUNWAY_S=1",
)
"""Small, frequent refills: the old and the new leader each top the pool up several times a
second, so their writes interleave (one large refill each would mostly collide instead)."""
BROKEN_NODE_COMMAND = shlex.join(
    [sys.executable, "-m", "tests.chaos.unsafe_node", "--linger-s", str(LINGER_S)]
)


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


def allocator(*args: str, timeout_s: float = LOCAL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ALLOCATOR, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def test_step_down_drill_on_nodes_with_a_broken_fence_fails_and_names_the_violation(
    state_dir: Path, tmp_path: Path
) -> None:
    """Nodes that keep writing with their old token after a step-down (and bypass the
    database's fence) make two leaders write at once: the drill must exit non-zero and
    name the stale writes (I3) in its JSON and its error line."""
    common = ["--state-dir", str(state_dir), "--session-timeout-ms", "2000"]
    started = allocator("local", "up", "--zk", "1", "--nodes", "0", "--json", *common)
    assert started.returncode == 0, started.stderr
    superuser_url = json.loads(started.stdout)["database_url"]
    broken = allocator(
        "local",
        "up",
        "--nodes",
        "3",
        "--node-command",
        BROKEN_NODE_COMMAND,
        "--node-env",
        f"ALLOCATOR_POSTGRES_URL={superuser_url}",
        *(arg for pair in BROKEN_NODE_ENV for arg in ("--node-env", pair)),
        *common,
    )
    assert broken.returncode == 0, broken.stderr

    out = tmp_path / "drill.json"
    done = allocator(
        "drill",
        "--scenario",
        "step-down",
        "--rounds",
        "3",
        "--zk",
        "1",
        "--json",
        "--json-out",
        str(out),
        *common,
        timeout_s=DRILL_TIMEOUT_S,
    )

    assert done.returncode == 1, f"the drill passed a broken fence: {done.stdout}"
    data: dict[str, Any] = json.loads(done.stdout)
    assert data["failed_rounds"] == 0  # the handovers themselves worked
    stale = [
        v
        for v in data["violations"]
        if v["invariant"] == "I3" and "a stale write committed" in v["message"]
    ]
    assert stale, f"no stale write named: {data['violations']}"
    error = done.stderr.strip().splitlines()[-1]
    assert "violation(s)" in error
    assert "I3:" in error
    assert data["cluster"]["left_running"] == []
