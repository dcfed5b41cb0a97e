"""``allocator local`` in subprocesses: up, status (JSON keys of docs/design.md §10), drills, down.

The node tests run a stand-in for ``allocator run`` (a Python one-liner that sleeps), given
with ``--node-command``: what is tested here is the supervision, not the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
STABLE_KEYS = {"state_dir", "zk_hosts", "database_url", "zk_servers", "postgres", "nodes"}
NODE_KEYS = {"name", "pid", "admin_url", "restarts", "last_exit_code", "state"}
STAND_IN = f"{sys.executable} -c 'import time; time.sleep(600)'"


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


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)  # whatever the test left behind


def test_up_status_drill_down(state_dir: Path) -> None:
    flags = ("--zk", "1", "--nodes", "0", "--json", "--no-migrate", "--state-dir", state_dir)
    up: dict[str, Any] = json.loads(ok("local", "up", *flags))
    assert up.keys() >= STABLE_KEYS
    assert up["state_dir"] == str(state_dir)
    assert up["nodes"] == []
    [server] = up["zk_servers"]
    assert {"id", "pid", "client_port"} <= server.keys()
    assert up["zk_hosts"] == f"127.0.0.1:{server['client_port']}"
    assert {"pid", "port"} <= up["postgres"].keys()
    pids = [server["pid"], up["postgres"]["pid"]]
    assert all(is_pid_alive(p) for p in pids)

    # status from another process, the state folder given through the environment
    status = json.loads(
        ok("local", "status", "--json", env={"ALLOCATOR_LOCAL_STATE_DIR": str(state_dir)})
    )
    assert status.keys() >= STABLE_KEYS
    assert [s["pid"] for s in status["zk_servers"]] == [server["pid"]]
    assert status["postgres"]["pid"] == up["postgres"]["pid"]
    assert status["zk_servers"][0]["mode"] == "standalone"
    table = ok("local", "status", "--state-dir", state_dir)
    assert up["database_url"] in table
    assert "standalone" in table

    # drills: PostgreSQL crash and restart, ZooKeeper kill and restart
    ok("local", "pg-stop", "--mode", "immediate", "--state-dir", state_dir)
    assert not is_pid_alive(up["postgres"]["pid"])
    ok("local", "pg-start", "--state-dir", state_dir)
    with psycopg.connect(up["database_url"]) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    ok("local", "zk-stop", "1", "--state-dir", state_dir)
    assert not is_pid_alive(server["pid"])
    ok("local", "zk-start", "1", "--state-dir", state_dir)
    status = json.loads(ok("local", "status", "--json", "--state-dir", state_dir))
    assert status["running"] is True
    pids += [status["zk_servers"][0]["pid"], status["postgres"]["pid"]]

    ok("local", "down", "--state-dir", state_dir)
    assert not any(is_pid_alive(p) for p in pids)
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


def test_nodes_under_the_supervisor(state_dir: Path) -> None:
    flags = ("--zk", "1", "--nodes", "2", "--json", "--no-migrate", "--state-dir", state_dir)
    node_flags = ("--node-command", STAND_IN, "--node-env", "ALLOCATOR_POOL_MIN_BLOCKS=8")
    up: dict[str, Any] = json.loads(
        ok("local", "up", *flags, *node_flags, "--session-timeout", "6s")
    )
    assert up.keys() >= STABLE_KEYS | {"node_database_url", "consumer_database_url"}
    assert [n["name"] for n in up["nodes"]] == ["node-1", "node-2"]
    assert all(n.keys() >= NODE_KEYS for n in up["nodes"])
    assert all(n["state"] == "running" and is_pid_alive(n["pid"]) for n in up["nodes"])
    assert up["session_timeout_ms"] == 6000
    # The token is never printed (not even with --json); the 0600 record holds it.
    record = state_dir / "cluster.json"
    assert record.stat().st_mode & 0o077 == 0
    token = json.loads(record.read_text())["admin_token"]
    assert len(token) >= 24
    assert "admin_token" not in up
    assert token not in json.dumps(up)
    first = {n["name"]: n["pid"] for n in up["nodes"]}
    pids = [
        *first.values(),
        up["supervisor_pid"],
        up["postgres"]["pid"],
        up["zk_servers"][0]["pid"],
    ]

    table = ok("local", "status", "--state-dir", state_dir)
    assert "node-1" in table
    assert up["nodes"][0]["admin_url"] in table
    assert token not in table

    # A crash (SIGKILL): restarted by the supervisor with a new pid.
    assert "SIGKILL sent to node-1" in ok(
        "local", "node-signal", "node-1", "SIGKILL", "--state-dir", state_dir
    )
    node1 = wait_for_node(state_dir, "node-1", lambda n: n["restarts"] == 1 and n["pid"])
    assert node1["pid"] != first["node-1"]
    assert node1["last_exit_code"] == -9
    pids.append(node1["pid"])

    # Stopped on request: stays stopped; started again on request.
    assert "node-2 stopped (SIGKILL)" in ok(
        "local", "node-stop", "node-2", "--kill", "--state-dir", state_dir
    )
    node2 = status_node(state_dir, "node-2")
    assert (node2["state"], node2["pid"], node2["restarts"]) == ("stopped", None, 0)
    assert not is_pid_alive(first["node-2"])
    table = ok("local", "status", "--state-dir", state_dir)
    assert "SIGKILL" in table  # node-2's last exit
    done = cli("local", "node-signal", "node-2", "SIGSTOP", "--state-dir", state_dir)
    assert done.returncode == 1
    assert "node-2 is not running" in done.stderr
    assert "node-2 running" in ok("local", "node-start", "node-2", "--state-dir", state_dir)
    node2 = status_node(state_dir, "node-2")
    assert node2["state"] == "running"
    assert node2["restarts"] == 0
    pids.append(node2["pid"])

    ok("local", "down", "--state-dir", state_dir)
    assert [p for p in pids if is_pid_alive(p)] == []
    status = json.loads(ok("local", "status", "--json", "--state-dir", state_dir))
    assert {n["state"] for n in status["nodes"]} == {"down"}
    assert status["supervisor_pid"] is None


def status_node(state_dir: Path, name: str) -> dict[str, Any]:
    status = json.loads(ok("local", "status", "--json", "--state-dir", state_dir))
    node: dict[str, Any] = next(n for n in status["nodes"] if n["name"] == name)
    return node


def wait_for_node(
    state_dir: Path, name: str, check: Callable[[dict[str, Any]], object], timeout_s: float = 20.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        node = status_node(state_dir, name)
        if check(node):
            return node
        assert time.monotonic() < deadline, f"{name} never got there: {node}"
        time.sleep(0.1)
