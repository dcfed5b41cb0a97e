"""Issue 12, must-show 8 against a real embedded cluster: ``eval "$(allocator local env)"``
points ``status``, ``claim`` and ``step-down`` at it; the ``local`` actions, ``watch`` and
``migrate`` print JSON; kazoo's reconnect warnings never come before a one-line error.

One cluster for the module (1 ZooKeeper server, PostgreSQL, 1 real node). The shell test runs
``bash`` and the CLI in subprocesses (the ``eval`` is the point); the rest runs in-process
through click's ``CliRunner``, except where what reaches stderr is the point (kazoo's log).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from allocator import cli
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo
from tests import output_schemas

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ALLOCATOR = str(BIN / "allocator")
DEADLINE_S = 90.0


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``ALLOCATOR_*``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    return {**env, **extra}


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=env, catch_exceptions=False)


def exports(state_dir: Path) -> dict[str, str]:
    result = invoke("local", "env", "--json", "--state-dir", str(state_dir))
    assert result.exit_code == 0, result.output
    variables: dict[str, str] = json.loads(result.stdout)["variables"]
    return variables


def wait_for_pool(env: dict[str, str]) -> dict[str, Any]:
    """``status --json`` once a leader has cut blocks (it matches its schema)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = invoke("status", "--json", env=env)
        if result.exit_code == 0:
            data: dict[str, Any] = json.loads(result.stdout)
            if data["leader"] and data["pool"]["available_blocks"] > 0:
                output_schemas.assert_valid("status", data)
                return data
        assert time.monotonic() < deadline, f"no leader with a pool in time: {result.output}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterInfo]:
    state_dir = tmp_path_factory.mktemp("local-env") / "state"
    manager = LocalCluster(state_dir, zk_servers=1)
    try:
        info = manager.up(migrate=True, nodes=1)
        yield info
    finally:
        manager.down(purge=True)


@pytest.fixture(autouse=True)
def no_allocator_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ALLOCATOR_")]:
        monkeypatch.delenv(name)


def test_eval_of_local_env_points_the_cli_at_the_cluster(
    local_cluster: ClusterInfo, tmp_path: Path
) -> None:
    wait_for_pool(exports(local_cluster.state_dir))
    script = f"""
        set -e
        allocator local env --state-dir '{local_cluster.state_dir}' > '{tmp_path}/env.sh'
        eval "$(cat '{tmp_path}/env.sh')"
        cd /
        allocator status --json > '{tmp_path}/status.json'
        allocator claim --consumer local-env-test --count 2 --json > '{tmp_path}/claim.json'
        allocator step-down --json > '{tmp_path}/step-down.json'
    """
    # What eval must clear: a config file that does not exist, a secret's value variable.
    stale = {"ALLOCATOR_CONFIG": "/nonexistent.toml", "ALLOCATOR_NODE_ADMIN_TOKEN": "stale"}
    done = subprocess.run(
        ["bash", "-c", script],
        env=clean_env(**stale),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["leader"]["name"] == "node-1"
    assert status["contenders"][0]["name"] == "node-1"
    output_schemas.assert_valid("status", status)
    claim = json.loads((tmp_path / "claim.json").read_text())
    assert claim["consumer"] == "local-env-test"
    assert len(claim["blocks"]) == 2
    step_down = json.loads((tmp_path / "step-down.json").read_text())
    assert step_down["leader"] == "node-1"
    assert step_down["stepping_down"] is True
    assert step_down["admin_url"] == local_cluster.nodes[0].admin_url

    printed = (tmp_path / "env.sh").read_text()
    assert "export ALLOCATOR_NODE_ADMIN_TOKEN_FILE=" in printed
    password = local_cluster.zk_auth.partition(":")[2]
    for secret in (local_cluster.admin_token, local_cluster.zk_auth, password):
        assert secret
        assert secret not in printed


def test_watch_migrate_and_the_local_actions_print_json(local_cluster: ClusterInfo) -> None:
    env = exports(local_cluster.state_dir)
    wait_for_pool(env)

    watched = invoke("watch", "--json", "--duration", "1s", env=env)
    assert watched.exit_code == 0, watched.output
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert {line["event"] for line in lines} >= {"leader", "fence", "pool"}
    leader = next(line for line in lines if line["event"] == "leader")
    assert leader["queue"] == ["node-1"]

    check = invoke(
        "migrate", "--check", "--json", "--database-url", local_cluster.database_url, env=env
    )
    assert check.exit_code == 0, check.output
    revision = json.loads(check.stdout)
    assert revision["action"] == "check"
    assert revision["up_to_date"] is True
    assert revision["current_revision"] == revision["head_revision"]
    upgrade = invoke("migrate", "--json", "--database-url", local_cluster.database_url, env=env)
    assert upgrade.exit_code == 0, upgrade.output
    assert json.loads(upgrade.stdout)["previous_revision"] == revision["head_revision"]

    fence = invoke("fence", "status", "--json", env=env)
    assert fence.exit_code == 0, fence.output
    assert json.loads(fence.stdout)["ahead_of_zookeeper"] is False

    # ALLOCATOR_LOCAL_STATE_DIR, exported too, makes the local actions act on this cluster.
    status = invoke("local", "status", "--json", env=env)
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["state_dir"] == str(local_cluster.state_dir)
    signalled = invoke("local", "node-signal", "node-1", "SIGCONT", "--json", env=env)
    assert signalled.exit_code == 0, signalled.output
    document = json.loads(signalled.stdout)
    assert document["action"] == "node-signal"
    assert document["name"] == "node-1"
    assert document["signal"] == "SIGCONT"
    assert document["pid"] == local_cluster.nodes[0].pid


@pytest.fixture
def not_zookeeper() -> Iterator[str]:
    """``127.0.0.1:<port>`` of a server that accepts and hangs up: kazoo's retry loop warns
    about every attempt (``Connection dropped``) until its timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


def test_kazoo_warns_nothing_before_the_one_error_line(
    local_cluster: ClusterInfo, not_zookeeper: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The server makes kazoo warn (what the CLI must keep off its stderr).
    with caplog.at_level(logging.WARNING, logger="kazoo"):
        client = KazooClient(hosts=not_zookeeper, timeout=4.0)
        with pytest.raises(KazooTimeoutError):
            client.start(timeout=1.0)
        client.stop()
        client.close()
    assert any(r.name.startswith("kazoo") and r.levelno == logging.WARNING for r in caplog.records)

    env = clean_env(
        **{
            **exports(local_cluster.state_dir),
            "ALLOCATOR_ZOOKEEPER_HOSTS": not_zookeeper + "/allocator",
            "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": "1",
        }
    )
    # Side by side: each waits out its connect timeout.
    commands = {
        "status": ["status", "--json"],
        "step-down": ["step-down"],
        "watch": ["watch", "--json", "--duration", "1500ms"],
    }
    running = {
        name: subprocess.Popen(
            [ALLOCATOR, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    done = {name: (proc.communicate(timeout=60), proc.returncode) for name, proc in running.items()}
    for name in ("status", "step-down"):
        (stdout, stderr), code = done[name]
        assert code == 75, (name, stderr)
        assert stdout == ""
        [line] = stderr.splitlines()
        assert line.startswith(f"error: no ZooKeeper server answered at {not_zookeeper}")

    (stdout, stderr), code = done["watch"]
    assert code == 0, stderr
    assert stderr == ""
    events = [json.loads(line) for line in stdout.splitlines()]
    assert events
    assert {event["event"] for event in events} == {"unavailable"}
