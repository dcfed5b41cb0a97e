"""`allocator demo` (what `make demo` runs): judged clean by the invariant checker, and it
leaves no server process behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from allocator.local.processes import is_pid_alive

pytestmark = pytest.mark.integration

DEMO_TIMEOUT_S = 240
ALLOCATOR = (sys.executable, "-m", "allocator.cli")


def test_demo_runs_and_stops_every_process_it_started() -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="allocator-demo-"))
    state_dir.chmod(0o755)
    try:
        result = subprocess.run(
            [*ALLOCATOR, "demo", "--phase", "2s", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT_S,
            check=False,
        )
    finally:
        subprocess.run(
            [*ALLOCATOR, "local", "down", "--purge", "--state-dir", str(state_dir)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(state_dir, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    assert "handover:" in result.stdout
    assert "violations          0 (I1-I5 and I7: allocator.verify)" in result.stdout
    assert "processes left running: 0" in result.stdout
    (stopped,) = [line for line in result.stdout.splitlines() if "stopped pids:" in line]
    pids = [int(pid) for pid in stopped.split("stopped pids:")[1].split(";")[0].split()]
    assert len(pids) == 8  # 3 ZooKeeper servers, 3 nodes, the supervisor, the postmaster
    assert [pid for pid in pids if is_pid_alive(pid)] == []
