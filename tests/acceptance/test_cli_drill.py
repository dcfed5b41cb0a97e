"""``allocator drill`` in a subprocess: every scenario once, the report and a clean stop; a
drill against a running cluster and through a config file, with the scenarios they cannot run
refused; and a drill that must fail, on nodes whose fence is broken. Every JSON the drills
print is checked against docs/schemas/drill.schema.json.

Behaviour only: the keys and their types, every round passed, no violation, and no
process of the drill's cluster left afterwards (the pids it recorded). No timing threshold:
handover times belong to the drill's report, not to tests. The broken nodes are built in
``tests/`` (:mod:`tests.chaos.unsafe_node`) and run through ``allocator local up
--node-command``; the product has no switch for them.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.core.exits import Exit
from allocator.drill import report_png
from allocator.drill.scenarios import SCENARIOS
from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive
from tests import output_schemas

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
STABLE_KEYS = {
    "scenario",
    "rounds",
    "violations",
    "handover_ms",
    "stale_writes_rejected",
    "claim_errors",
}
DRILL_TIMEOUT_S = 240
ALL_SCENARIOS_TIMEOUT_S = 270
"""Under pytest's own timeout (300 s), so a stuck drill is stopped here and shows where."""
LOCAL_TIMEOUT_S = 120
STACK_DUMP_TIMEOUT_S = 10
STUCK_LINES_SHOWN = 150
LINGER_S = 5
"""How long a broken node keeps writing with its old token after it stepped down: past the
end of the drill's rounds."""
BROKEN_NODE_ENV = (
    "ALLOCATOR_POOL_REFILL_INTERVAL_S=0.2",
    "ALLOCATOR_POOL_RUNWAY_S=1",
    "ALLOCATOR_POOL_MIN_BLOCKS=64",
    "ALLOCATOR_POOL_HANDOVER_MARGIN_S=0",
)
"""Small, frequent refills: the successor tops the pool up several times a second, so its
first write comes soon after the takeover and the broken ex-leader's stale cuts, which wait
for it, interleave with its writes (the shipped floor of 16,384 blocks would rarely need a
refill)."""
BROKEN_NODE_COMMAND = shlex.join(
    [sys.executable, "-m", "tests.chaos.unsafe_node", "--linger-s", str(LINGER_S)]
)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "drill"
    yield state
    LocalCluster(state).down(purge=True)  # whatever a failed drill left behind


def test_every_scenario_once_passes_writes_a_report_and_stops_everything(
    state_dir: Path, tmp_path: Path
) -> None:
    """Every fault of the drill, one round each, on its own cluster (1 ZooKeeper server, so
    killing one is losing quorum): every round passes, no violation, claims fail only
    while PostgreSQL itself is down; the report is written; nothing is left running."""
    out = tmp_path / "drill.json"
    report_dir = tmp_path / "report"
    done = allocator(
        "drill", "--scenario", "all", "--rounds", "1", "--zk", "1",
        "--session-timeout", "2s", "--json", "--state-dir", str(state_dir),
        "--json-out", str(out), "--report", str(report_dir),
        timeout_s=ALL_SCENARIOS_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, f"drill failed ({done.returncode}): {done.stderr}"
    data: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(out.read_text()) == data
    output_schemas.assert_valid("drill", data)
    assert "scenario" not in data  # a scenario's own keys on top only when there is one
    assert data["verdict"]["ok"] is True
    assert data["verdict"]["violations"] == []
    assert data["session_timeout_ms"] == 2000
    assert data["refused"] == {}

    by_name = {s["scenario"]: s for s in data["scenarios"]}
    assert set(by_name) == set(SCENARIOS)
    for name, result in by_name.items():
        assert result.keys() >= STABLE_KEYS
        assert result["rounds"] == 1
        assert result["failed_rounds"] == 0, result["round_results"]
        assert result["violations"] == []
        assert isinstance(result["stale_writes_rejected"], int)
        if not name.startswith("pg-"):
            assert result["claim_errors"] == 0, (name, result["claim_error_examples"])
        summary = result["handover_ms"]
        assert set(summary) == {"p50", "p90", "p99", "max"}
        if SCENARIOS[name].must_hand_over:
            [round_result] = result["round_results"]
            assert round_result["new_epoch"] > round_result["epoch"]
            assert round_result["new_leader"] != round_result["leader"]
            assert isinstance(summary["p50"], float)

    cluster = data["cluster"]
    assert cluster["state_dir"] == str(state_dir)
    assert cluster["stopped"] is True
    pids = cluster["pids"]
    assert len(pids) >= 8  # ZooKeeper, 2 PostgreSQL servers, supervisor, 3+ nodes
    assert cluster["left_running"] == []
    assert not [pid for pid in pids if is_pid_alive(pid)]

    # The report: the same document, a Markdown summary, a PNG timeline of a fixed size.
    assert json.loads((report_dir / "drill.json").read_text()) == data
    summary_md = (report_dir / "drill.md").read_text()
    assert "| kill |" in summary_md
    assert "![timeline](drill.png)" in summary_md
    assert png_size(report_dir / "drill.png") == (report_png.PNG_WIDTH_PX, report_png.PNG_HEIGHT_PX)
    timeline = data["timeline"]
    assert [f["scenario"] for f in timeline["faults"]] == list(SCENARIOS)
    assert timeline["leadership"]
    assert timeline["samples"]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def allocator(*args: str, timeout_s: float = LOCAL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run the CLI; one that overruns ``timeout_s`` is made to print every thread's stack
    (faulthandler, on SIGABRT) and the test fails with the end of what it printed."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen(
        [ALLOCATOR, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            try:
                _, stderr = process.communicate(timeout=STACK_DUMP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
            tail = "\n".join(stderr.splitlines()[-STUCK_LINES_SHOWN:])
            pytest.fail(f"allocator {shlex.join(args)} still running after {timeout_s} s:\n{tail}")
    return subprocess.CompletedProcess([ALLOCATOR, *args], process.returncode, stdout, stderr)


def test_step_down_drill_on_nodes_with_a_broken_fence_fails_and_names_the_violation(
    state_dir: Path, tmp_path: Path
) -> None:
    """Nodes that keep writing with their old token after a step-down (and bypass the
    database's fence) make two leaders write at once: the drill must exit non-zero and
    name the stale writes (I3) in its JSON and its error line."""
    common = ["--state-dir", str(state_dir), "--session-timeout", "2s"]
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
    output_schemas.assert_valid("drill", data)
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


def test_drill_against_a_running_cluster_and_through_a_config_file(
    state_dir: Path, tmp_path: Path
) -> None:
    """``--against`` drills a running local cluster and leaves it running; ``--config``
    drills it as a deployed cluster (step-down only). A scenario the target cannot run is
    refused before anything happens, with the reason (exit 2)."""
    common = ["--state-dir", str(state_dir), "--session-timeout", "2s"]
    started = allocator("local", "up", "--zk", "1", "--nodes", "3", *common)
    assert started.returncode == 0, started.stderr
    info = LocalCluster(state_dir).status()
    against = ["--against", str(state_dir)]

    refused = allocator("drill", *against, "--scenario", "pg-partition")
    assert refused.returncode == Exit.USAGE, refused.stderr
    assert "proxies" in refused.stderr.strip().splitlines()[-1]

    out = tmp_path / "against.json"
    done = allocator(
        "drill", *against, "--scenario", "expire", "--rounds", "1", "--json",
        "--json-out", str(out), timeout_s=DRILL_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    output_schemas.assert_valid("drill", data)
    output_schemas.assert_required_keys_matter("drill", data)
    assert (data["scenario"], data["failed_rounds"], data["violations"]) == ("expire", 0, [])
    assert data["round_results"][0]["new_leader"] != data["round_results"][0]["leader"]
    assert data["cluster"]["stopped"] is False
    assert LocalCluster(state_dir).status().running  # never stopped by the drill

    config = tmp_path / "allocator.toml"
    config.write_text(
        "[zookeeper]\n"
        f'hosts = "{info.node_zk_hosts}"\n'
        f'auth = "{info.zk_auth}"\n'
        "session_timeout_ms = 2000\n"
        "[node]\n"
        f'admin_token = "{info.admin_token}"\n'
        "[postgres]\n"
        f'url = "{info.database_url}"\n'
    )
    config.chmod(0o600)
    refused = allocator("drill", "--config", str(config), "--scenario", "kill")
    assert refused.returncode == Exit.USAGE, refused.stderr
    assert "signals" in refused.stderr.strip().splitlines()[-1]

    done = allocator(
        "drill", "--config", str(config), "--scenario", "step-down", "--rounds", "2",
        "--json", "--json-out", str(tmp_path / "config.json"), timeout_s=DRILL_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    output_schemas.assert_valid("drill", data)
    assert (data["scenario"], data["failed_rounds"], data["violations"]) == ("step-down", 0, [])
    assert [r["ok"] for r in data["round_results"]] == [True, True]
