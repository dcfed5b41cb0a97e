"""``allocator bench sustained`` in a subprocess: its JSON's shape, a standby that was
synchronous, and nothing left running.

Timings are never asserted here (docs/design.md §9): only the shape of the output, what the
bench says about the cluster it measured (three nodes, a leader, a standby streaming
``sync``), and that the embedded cluster the command brought up is gone afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.bench.sustained import report
from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
LATENCIES = {"p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"}


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)  # whatever the command left behind


def test_bench_sustained_json(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    flags = ["--clients", "1", "--duration", "2s", "--burst-duration", "1s"]
    flags += ["--json", "--json-out", str(out), "--state-dir", str(state_dir)]
    done = subprocess.run(
        [ALLOCATOR, "bench", "sustained", *flags],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(out.read_text()) == document
    assert document["plan"]["clients"] == [1]
    assert document["plan"]["nodes"] == 3
    assert document["machine"]["cpus"] >= 1

    for when in ("before", "after"):  # the standby was synchronous throughout
        standby = document["standby"][when]
        assert standby["synchronous_standby_names"]
        assert standby["synchronous_commit"] == "on"
        assert [s["sync_state"] for s in standby["standbys"]] == ["sync"]

    (run,) = document["sustained"]
    assert run["clients"] == 1
    assert run["claims"] > 0
    assert run["ids_per_claim"] > 0
    assert run.keys() >= LATENCIES | {"claims_per_s", "ids_per_s", "claim_errors"}
    assert run["p999_ms"] >= run["p99_ms"] >= run["p50_ms"] >= 0
    assert run["claim_errors"] == {"pool_empty": 0, "aborted_clients": 0}
    assert run["pool_ran_dry"] is False
    assert run["age_bound_in_force"] is True  # a serving leader keeps one
    assert run["pool"]["leader"] is not None
    assert run["pool"]["samples"] == len(run["series"]["pool"]) >= 2
    assert run["standby"]["samples"] >= 2
    assert run["standby"]["sync_samples"] == run["standby"]["samples"]
    assert run["wal"]["delta"]["wal_records"] > 0
    assert run["wal"]["wal_bytes_per_claim"] > 0
    assert run["cpu"]["seconds"].keys() >= {"primary: claim backends", "standby", "nodes"}
    assert run["wait_samples"] > 0
    assert all(w.keys() == {"who", "what", "mean_sessions"} for w in run["wait_events"])

    assert {(r["method"], r["clients"]) for r in document["burst"]} == {
        ("claim_blocks", 1),
        ("durable_commit", 1),
    }
    for watched in document["burst_evidence"]:  # each burst run watched as a sustained one
        assert (watched["method"], watched["clients"]) in {
            ("claim_blocks", 1),
            ("durable_commit", 1),
        }
        assert watched.keys() >= {"wal", "standby", "cpu", "wait_events", "other_xacts_per_s"}
        assert watched["standby"]["sync_samples"] == watched["standby"]["samples"]
        assert watched["age_bound_in_force"] is True  # the claims' path on a serving cluster
    (ratio,) = document["ratios"]
    assert ratio["clients"] == 1
    assert isinstance(ratio["vs_burst"], float)
    assert isinstance(ratio["vs_durable_commit"], float)

    table = "\n".join(report.table(document))  # the table the command prints without --json
    assert "SUSTAINED claims on a live 3-node cluster" in table
    assert "burst claim_blocks (same server, for comparison)" in table

    cluster = document["cluster"]
    assert cluster["started"] is True
    assert cluster["stopped"] is True
    assert len(cluster["pids"]) >= 7  # ZooKeeper, primary, standby, supervisor, 3 nodes
    assert not [pid for pid in cluster["pids"] if is_pid_alive(pid)]
