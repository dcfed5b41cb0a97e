"""``allocator local`` in subprocesses: up, status (JSON keys of DESIGN §10), drills, down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from allocator.local.cluster import LocalCluster

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
DESIGN_KEYS = {"state_dir", "zk_hosts", "database_url", "zk_servers", "postgres", "nodes"}


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ALLOCATOR, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def ok(*args: str | Path, env: dict[str, str] | None = None) -> str:
    done = cli(*args, env=env)
    assert done.returncode == 0, f"{args} failed ({done.returncode}): {done.stderr}"
    return done.stdout


def pid_exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)  # whatever the test left behind


def test_up_status_drill_down(state_dir: Path) -> None:
    up: dict[str, Any] = json.loads(
        ok("local", "up", "--zk", "1", "--json", "--no-migrate", "--state-dir", state_dir)
    )
    assert up.keys() >= DESIGN_KEYS
    assert up["state_dir"] == str(state_dir)
    assert up["nodes"] == []
    [server] = up["zk_servers"]
    assert {"id", "pid", "client_port"} <= server.keys()
    assert up["zk_hosts"] == f"127.0.0.1:{server['client_port']}"
    assert {"pid", "port"} <= up["postgres"].keys()
    pids = [server["pid"], up["postgres"]["pid"]]
    assert all(pid_exists(p) for p in pids)

    # status from another process, the state folder given through the environment
    status = json.loads(
        ok("local", "status", "--json", env={"ALLOCATOR_LOCAL_STATE_DIR": str(state_dir)})
    )
    assert status.keys() >= DESIGN_KEYS
    assert [s["pid"] for s in status["zk_servers"]] == [server["pid"]]
    assert status["postgres"]["pid"] == up["postgres"]["pid"]
    assert status["zk_servers"][0]["mode"] == "standalone"
    table = ok("local", "status", "--state-dir", state_dir)
    assert up["database_url"] in table
    assert "standalone" in table

    # drills: PostgreSQL crash and restart, ZooKeeper kill and restart
    ok("local", "pg-stop", "--mode", "immediate", "--state-dir", state_dir)
    assert not pid_exists(up["postgres"]["pid"])
    ok("local", "pg-start", "--state-dir", state_dir)
    with psycopg.connect(up["database_url"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    ok("local", "zk-stop", "1", "--state-dir", state_dir)
    assert not pid_exists(server["pid"])
    ok("local", "zk-start", "1", "--state-dir", state_dir)
    status = json.loads(ok("local", "status", "--json", "--state-dir", state_dir))
    assert status["running"] is True
    pids += [status["zk_servers"][0]["pid"], status["postgres"]["pid"]]

    ok("local", "down", "--state-dir", state_dir)
    assert not any(pid_exists(p) for p in pids)
    status = json.loads(ok("local", "status", "--json", "--state-dir", state_dir))
    assert status["running"] is False
    assert status["postgres"]["pid"] is None
    assert "stopped" in ok("local", "down", "--state-dir", state_dir)  # harmless twice
    ok("local", "down", "--purge", "--state-dir", state_dir)
    assert not state_dir.exists()


def test_errors_are_one_line(state_dir: Path) -> None:
    done = cli("local", "status", "--state-dir", state_dir)
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: no local cluster in ")
    assert "Traceback" not in done.stderr
