"""``allocator drill --scenario rolling-upgrade`` in a subprocess, from release 4b4f865 (built
once by scripts/build-release.sh, as for tests/chaos/test_rolling_upgrade.py): its JSON holds
to docs/schemas/drill.schema.json and says what the upgrade did.

Behaviour only: the schema went from 0009 to head, three nodes were replaced (followers
first, the leader last), each stopped cleanly, no claim failed, no violation, nothing left
running. The 1 s bound on the handover is the drill's verdict, not this test's: a step may
fail only for that reason (a loaded machine), and then the drill must exit 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.core.exits import Exit
from allocator.drill.upgrade import STATE_SUBDIR
from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive
from allocator.postgres.migrate import head_revision
from tests import output_schemas
from tests.chaos import release

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
DRILL_TIMEOUT_S = 240


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "drill"
    yield state
    LocalCluster(state / STATE_SUBDIR).down(purge=True)  # whatever a failed drill left behind


@pytest.fixture(scope="module")
def old_release() -> Path:
    try:
        return release.build()
    except release.NotInHistoryError as exc:
        pytest.skip(f"release {release.UPGRADE_FROM} cannot be built here: {exc}")


def test_the_rolling_upgrade_drill_replaces_every_node_and_drops_nothing(
    state_dir: Path, old_release: Path, tmp_path: Path
) -> None:
    out = tmp_path / "drill.json"
    done = subprocess.run(
        [ALLOCATOR, "drill", "--scenario", "rolling-upgrade", "--from-release", str(old_release),
         "--zk", "1", "--state-dir", str(state_dir), "--json", "--json-out", str(out)],
        capture_output=True, text=True, timeout=DRILL_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode in (Exit.OK, Exit.FAILED), done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    output_schemas.assert_valid("drill", data)
    upgrade = data["upgrade"]
    assert (upgrade["schema_before"], upgrade["schema_after"]) == (
        release.UPGRADE_FROM_SCHEMA,
        head_revision(),
    )
    swaps = upgrade["swaps"]
    assert [s["role"] for s in swaps] == ["follower", "follower", "leader"], swaps
    assert sorted(s["old"] for s in swaps) == ["old-1", "old-2", "old-3"], swaps
    assert all(s["old_exit_code"] == 0 for s in swaps), swaps
    assert upgrade["leader_handover_ms"] is not None
    steps = [r["faults"] for r in data["round_results"]]
    assert steps == [["migrate"], ["replace-follower"], ["replace-follower"], ["replace-leader"]]
    assert data["claim_errors"] == 0, data["claim_error_examples"]
    assert data["claims"] > 0
    assert data["verdict"]["violations"] == []
    failed = [r["error"] for r in data["round_results"] if not r["ok"]]
    assert all("handover took" in error for error in failed), failed
    assert done.returncode == (Exit.FAILED if failed else Exit.OK), done.stderr
    assert [p for p in data["cluster"]["pids"] if is_pid_alive(p)] == []
