"""``allocator bench claims`` in a subprocess: the JSON of docs/design.md §10, and nothing
left running.

Timings are never asserted here (docs/design.md §9): only the shape of the output, and that the
embedded cluster the command brought up is gone afterwards.
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
METHODS = {"claim_blocks", "skip_locked", "segment_update", "nextval", "durable_commit"}
STABLE_KEYS = {"method", "clients", "claims_per_s", "ids_per_s", "p50_ms", "p99_ms"}


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)  # whatever the command left behind


def test_bench_claims_json(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    flags = [
        "--clients",
        "1",
        "--duration",
        "1s",
        "--pool-blocks",
        "20000",
        "--json",
        "--json-out",
        str(out),
    ]
    done = subprocess.run(
        [ALLOCATOR, "bench", "claims", *flags, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(out.read_text()) == document

    assert document["plan"]["age_bound"] is True  # the path a serving cluster's claims take
    assert document["template"]["age_bound"] is True
    results = document["results"]
    assert {(r["method"], r["clients"]) for r in results} == {
        (method, clients) for method in METHODS for clients in (1,)
    }
    for row in results:
        assert row.keys() >= STABLE_KEYS | {"batch", "ratio_vs", "prior_claims"}
        assert isinstance(row["clients"], int)
        assert isinstance(row["batch"], int)
        assert row["prior_claims"] == 0
        for key in ("claims_per_s", "ids_per_s", "p50_ms", "p99_ms"):
            assert isinstance(row[key], int | float), key
            assert row[key] >= 0, key
        assert row["claims"] > 0, row
        assert 0 <= row["generator_cpu_share"] <= 1, row  # pgbench's own CPU share
        assert isinstance(row["ratio_vs"], dict)
        if row["method"] == "claim_blocks":
            assert set(row["ratio_vs"]) == METHODS - {"claim_blocks"}
            assert all(isinstance(v, float) for v in row["ratio_vs"].values())
        elif row["method"] == "durable_commit":  # the reference: how close any durable claim gets
            assert set(row["ratio_vs"]) == {"nextval"}
            assert row["ids_per_s"] == 0
        else:
            assert row["ratio_vs"] == {}

    cluster = document["cluster"]
    assert cluster["started"] is True
    assert cluster["stopped"] is True
    assert cluster["pids"]
    assert not [pid for pid in cluster["pids"] if is_pid_alive(pid)]
