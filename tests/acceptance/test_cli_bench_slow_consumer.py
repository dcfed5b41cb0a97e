"""``allocator bench slow-consumer`` in a subprocess: its JSON keys, and nothing left running.

Timings are never asserted here (docs/design.md §9): only the shape of the output, what the bench
says about the held claim (a behaviour: it survived the run and came back to the pool after
its rollback), and that the embedded cluster the command brought up is gone afterwards.
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
from allocator.postgres.migrate import head_revision

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
MEASURES = {"pool_status", "requeue_stranded", "claim", "requeue_commit"}


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)  # whatever the command left behind


def test_bench_slow_consumer_json(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    flags = ["--claims", "1000", "--window", "200", "--rate", "1000", "--pool-blocks", "500"]
    flags += ["--json", "--json-out", str(out), "--state-dir", str(state_dir)]
    done = subprocess.run(
        [ALLOCATOR, "bench", "slow-consumer", *flags],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(out.read_text()) == document
    assert document.keys() >= {"results", "plan", "targets", "server", "cluster", "machine"}
    assert document["plan"]["claims"] == 1000
    assert document["plan"]["window_claims"] == 200
    assert document["plan"]["warmup_claims"] == 1000  # twice the pool
    assert document["targets"] == {"p99_ratio_max": 1.5}

    results = document["results"]
    assert [r["functions"] for r in results] == [head_revision(), "0003"]  # new, then the old ones
    for run in results:
        assert run["claims"] == 1000
        assert run["pool_ran_dry"] is False
        assert set(run["measures"]) == MEASURES
        for name, measure in run["measures"].items():
            assert measure.keys() == {"first", "last", "p50_ratio", "p99_ratio"}, name
            for end in ("first", "last"):
                assert measure[end].keys() == {"samples", "p50_ms", "p99_ms"}
                assert isinstance(measure[end]["samples"], int)  # how many: a matter of time
                assert measure[end]["p99_ms"] >= measure[end]["p50_ms"] >= 0
        assert run["measures"]["claim"]["first"]["samples"] == 200
        assert run["measures"]["claim"]["last"]["samples"] == 200
        assert run["load"].keys() == {"first", "last"}
        assert len(run["profile"]) == 10
        held = run["held"]
        assert held["survived"] is True  # the bench lifted the claim's idle bound for itself
        assert held["requeued_after_rollback"] is True
        assert held["claimed_again"] is True
    new, old = results
    assert new["held"]["in_held_tickets"] is True
    assert new["held"]["idle_bound_set_by_claim"] == "1min"
    assert old["held"]["in_held_tickets"] is None  # no such table at 0003
    # 0003's floor stays below the open claim: every claim made since lies above it
    assert old["held"]["floor_lag_tickets"] > old["claims"]

    cluster = document["cluster"]
    assert cluster["started"] is True
    assert cluster["stopped"] is True
    assert cluster["pids"]
    assert not [pid for pid in cluster["pids"] if is_pid_alive(pid)]


def test_bench_slow_consumer_without_comparison_prints_a_table(
    state_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    flags = ["--claims", "400", "--rate", "800", "--pool-blocks", "300", "--no-compare"]
    flags += ["--json-out", str(out), "--state-dir", str(state_dir)]
    done = subprocess.run(
        [ALLOCATOR, "bench", "slow-consumer", *flags],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "requeue_stranded" in done.stdout
    assert "survived the run" in done.stdout
    document = json.loads(out.read_text())
    assert [r["functions"] for r in document["results"]] == [head_revision()]
    assert document["plan"]["window_claims"] == 200  # at most half of the claims
