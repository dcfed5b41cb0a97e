"""``allocator bench client`` in a subprocess: its JSON, and nothing left running.

Timings are never asserted here (docs/design.md §9): only the shape of the output, that every ID
the client handed out was counted, and that the embedded cluster is gone afterwards.
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


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)  # whatever the command left behind


def test_bench_client_json(state_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    flags = [
        "--duration",
        "500ms",
        "--threads",
        "1,2",
        "--pool-blocks",
        "512",
        "--batch-blocks",
        "4",
    ]
    flags += ["--json", "--json-out", str(out), "--state-dir", str(state_dir)]
    done = subprocess.run(
        [ALLOCATOR, "bench", "client", *flags],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(out.read_text()) == document

    assert [r["threads"] for r in document["results"]] == [1, 2]
    for row in document["results"]:
        assert row["ids"] > 0, row
        assert row["errors"] == [], row

    latency = document["latency"]
    assert latency["calls"] > 0
    assert latency["errors"] == []
    assert 0 <= latency["over_1ms"] <= latency["calls"]
    for key in ("over_1ms_sending_prefetch", "over_1ms_collecting_prefetch"):
        assert 0 <= latency[key] <= latency["over_1ms"], key
    assert latency["claims"] >= 1
    assert latency["noise_floor"]["calls"] > 0

    cluster = document["cluster"]
    assert cluster["started"] is True
    assert cluster["stopped"] is True
    assert cluster["pids"]
    assert not [pid for pid in cluster["pids"] if is_pid_alive(pid)]
