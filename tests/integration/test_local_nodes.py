"""Nodes under the embedded cluster's supervisor, with a stand-in for ``allocator run``.

The stand-in is a small Python program: it writes its ``ALLOCATOR_*`` environment to
``<out>/<name>.<pid>.json`` and then idles; when ``<out>/<name>.exit`` appears it exits with
the code written there. So these tests check what the supervisor does (environment,
restarts, stop/start on request, signals, cleanup), not what a node does. Real servers
(one ZooKeeper server, PostgreSQL) because the manager needs them. Waits are conditions
with deadlines; the only bounded observations are "it did not come back", watched for
longer than the first restart backoff.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from kazoo.client import KazooClient

from allocator.core.errors import LocalClusterError, UsageError
from allocator.local import nodes, processes
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo, NodeInfo
from allocator.local.processes import is_pid_alive
from allocator.local.supervisor import BACKOFF_MAX_S, BACKOFF_MIN_S, Supervisor, _Node

pytestmark = pytest.mark.integration

T = TypeVar("T")
WAIT_S = 20.0
# Longer than the first restart backoff (0.2 s) plus a supervisor pass (0.1 s), twice over.
STAYS_DOWN_S = 0.7
NODE_KEYS = {"name", "pid", "admin_url", "restarts", "last_exit_code", "state"}

STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    out = Path(os.environ["STAND_IN_DIR"])
    name = os.environ["ALLOCATOR_NODE_NAME"]
    env = {k: v for k, v in os.environ.items() if k.startswith("ALLOCATOR_")}
    tmp = out / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(env))
    tmp.replace(out / f"{name}.{os.getpid()}.json")
    exit_file = out / f"{name}.exit"
    while True:
        if exit_file.exists():
            code = int(exit_file.read_text())
            exit_file.unlink()
            sys.exit(code)
        time.sleep(0.02)
    """
)


def request_exit(out: Path, name: str, code: int) -> None:
    """Tell the stand-in ``name`` to exit with ``code``. Written whole, then renamed into
    place: the stand-in polls for the file and would read it half written (an empty file
    made it exit 1 on a ValueError instead of ``code``)."""
    tmp = out / f".{name}.exit.tmp"
    tmp.write_text(str(code))
    tmp.replace(out / f"{name}.exit")


def eventually(check: Callable[[], T], timeout_s: float = WAIT_S, what: str = "") -> T:
    """Call ``check`` until it returns a truthy value; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            pytest.fail(f"not true within {timeout_s}s: {what or check}")
        time.sleep(0.05)


def node(cluster: LocalCluster, name: str) -> NodeInfo:
    return next(n for n in cluster.status().nodes if n.name == name)


def wait_running(cluster: LocalCluster, name: str, other_than: int | None = None) -> NodeInfo:
    """Wait until ``name`` runs (with a pid other than ``other_than``)."""

    def check() -> NodeInfo | None:
        info = node(cluster, name)
        ok = info.state == "running" and info.pid is not None and info.pid != other_than
        return info if ok else None

    return eventually(check, what=f"{name} running (not as pid {other_than})")


def env_of(out: Path, name: str, pid: int) -> dict[str, str]:
    path = out / f"{name}.{pid}.json"
    eventually(path.exists, what=f"{path} written")
    data: dict[str, str] = json.loads(path.read_text())
    return data


def pids_of(info: ClusterInfo) -> list[int]:
    pids = [n.pid for n in info.nodes] + [info.supervisor_pid, info.postgres.pid]
    pids += [s.pid for s in info.zk_servers]
    return [p for p in pids if p is not None]


def processes_in(state_dir: Path) -> list[str]:
    """Live processes whose command line or working folder is inside ``state_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not is_pid_alive(int(entry.name)):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if str(state_dir) in cmdline or cwd.startswith(str(state_dir)):
            found.append(f"{entry.name}: {cmdline}")
    return found


def make_cluster(state_dir: Path, out: Path, **kwargs: Any) -> LocalCluster:
    out.mkdir(exist_ok=True)
    return LocalCluster(
        state_dir,
        1,
        node_command=[sys.executable, "-c", STAND_IN],
        node_env={"STAND_IN_DIR": str(out), "ALLOCATOR_POOL_MIN_BLOCKS": "8"},
        **kwargs,
    )


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stand-in")


@pytest.fixture(scope="module")
def cluster(out_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three stand-in nodes, schema migrated; every test leaves them all running."""
    state = tmp_path_factory.mktemp("nodes") / "state"
    manager = make_cluster(state, out_dir, purge_on_exit=True)
    with pytest.MonkeyPatch.context() as env:
        # Never passed on to a node: the nodes are configured by the manager alone.
        env.setenv("ALLOCATOR_CONFIG", "/nonexistent/allocator.toml")
        env.setenv("ALLOCATOR_NODE_NAME", "not-this-one")
        info = manager.up(migrate=True, nodes=3)
    try:
        yield manager
    finally:
        manager.down(purge=True)
        assert [p for p in pids_of(info) if is_pid_alive(p)] == []


# -- the supervisor's restart policy (no servers) ---------------------------------------------


def test_restart_backoff_grows_to_two_seconds_and_resets_after_ten_seconds_up(
    tmp_path: Path,
) -> None:
    supervisor = Supervisor(tmp_path)
    spec = nodes.NodeSpec("node-1", 1, ["true"], {})
    stand_in = _Node(spec)
    delays = []
    for _ in range(6):
        supervisor._schedule_restart(stand_in, now=100.0, uptime_s=0.5)
        delays.append(stand_in.backoff_s)
    assert delays == [BACKOFF_MIN_S, 0.4, 0.8, 1.6, BACKOFF_MAX_S, BACKOFF_MAX_S]
    supervisor._schedule_restart(stand_in, now=100.0, uptime_s=10.0)
    assert stand_in.backoff_s == BACKOFF_MIN_S
    assert stand_in.restart_at == 100.0 + BACKOFF_MIN_S


# -- one cluster, three nodes ---------------------------------------------------------------


def test_nodes_start_with_their_environment(cluster: LocalCluster, out_dir: Path) -> None:
    info = cluster.status()
    as_json = info.to_json()
    assert [n["name"] for n in as_json["nodes"]] == ["node-1", "node-2", "node-3"]
    assert all(n.keys() >= NODE_KEYS for n in as_json["nodes"])
    assert as_json["node_database_url"] == info.node_database_url
    assert as_json["consumer_database_url"] == info.consumer_database_url
    assert info.supervisor_pid is not None
    assert len(info.admin_token) >= 24
    ports = set()
    for n in info.nodes:
        assert n.state == "running"
        assert n.pid is not None
        env = env_of(out_dir, n.name, n.pid)
        assert env == {
            "ALLOCATOR_ZOOKEEPER_HOSTS": f"{info.zk_hosts}/allocator",
            "ALLOCATOR_POSTGRES_URL": info.node_database_url,
            "ALLOCATOR_NODE_NAME": n.name,
            "ALLOCATOR_NODE_ADMIN_ADDRESS": n.admin_address,
            "ALLOCATOR_NODE_ADMIN_TOKEN": info.admin_token,
            "ALLOCATOR_ZOOKEEPER_AUTH": info.zk_auth,
            "ALLOCATOR_ZOOKEEPER_SESSION_TIMEOUT_MS": str(nodes.DEFAULT_SESSION_TIMEOUT_MS),
            "ALLOCATOR_NODE_STATE_DIR": str(nodes.node_state_dir(cluster.state_dir, n.name)),
            "ALLOCATOR_POOL_MIN_BLOCKS": "8",
        }
        assert n.admin_url == f"http://{n.admin_address}"
        ports.add(n.admin_address)
        assert os.getsid(n.pid) == n.pid  # its own session: a group kill stays inside it
        assert os.readlink(f"/proc/{n.pid}/cwd") == str(cluster.state_dir)
    assert len(ports) == 3
    # The chroot the nodes use exists.
    client = KazooClient(hosts=info.zk_hosts)
    client.start(timeout=WAIT_S)
    try:
        assert client.exists(nodes.DEFAULT_CHROOT) is not None
    finally:
        client.stop()
        client.close()


def test_login_roles_for_nodes_and_applications(cluster: LocalCluster) -> None:
    info = cluster.status()
    with psycopg.connect(info.node_database_url) as conn:
        row = conn.execute(
            "SELECT current_user, pg_has_role('allocator_node', 'MEMBER')"
            ", pg_has_role('allocator_consumer', 'MEMBER')"
        ).fetchone()
        assert row == ("allocator_node_login", True, False)
    with psycopg.connect(info.consumer_database_url) as conn:
        row = conn.execute(
            "SELECT current_user, pg_has_role('allocator_consumer', 'MEMBER')"
            ", pg_has_role('allocator_node', 'MEMBER')"
        ).fetchone()
        assert row == ("allocator_app", True, False)
        conn.execute("SELECT * FROM allocator.pool_status").fetchall()
    # Idempotent: `up` again keeps the roles (and everything else) as they are.
    again = cluster.up(migrate=True)
    assert [n.pid for n in again.nodes] == [n.pid for n in info.nodes]
    assert again.supervisor_pid == info.supervisor_pid
    with psycopg.connect(info.database_url) as conn:
        roles = conn.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname IN ('allocator_node_login', "
            "'allocator_app') AND rolcanlogin"
        ).fetchone()
    assert roles == (2,)


def test_a_node_that_exits_is_restarted(cluster: LocalCluster, out_dir: Path) -> None:
    before = node(cluster, "node-1")
    assert before.pid is not None
    assert cluster.signal_node("node-1", "SIGKILL") == before.pid
    after = wait_running(cluster, "node-1", other_than=before.pid)
    assert not is_pid_alive(before.pid)
    assert after.restarts == before.restarts + 1
    assert after.last_exit_code == -signal.SIGKILL
    env_of(out_dir, "node-1", after.pid)  # a fresh process, started with its environment

    # An exit of its own, with any code, is restarted the same way.
    assert after.pid is not None
    request_exit(out_dir, "node-1", 3)
    again = wait_running(cluster, "node-1", other_than=after.pid)
    assert again.restarts == after.restarts + 1
    assert again.last_exit_code == 3


def test_a_node_stopped_on_request_stays_stopped_until_started(
    cluster: LocalCluster, out_dir: Path
) -> None:
    before = node(cluster, "node-2")
    assert before.pid is not None
    stopped = cluster.stop_node("node-2")
    assert (stopped.state, stopped.pid) == ("stopped", None)
    assert stopped.last_exit_code == -signal.SIGTERM
    assert not is_pid_alive(before.pid)
    time.sleep(STAYS_DOWN_S)  # it must not come back by itself
    assert node(cluster, "node-2") == stopped
    with pytest.raises(LocalClusterError, match="node-2 is not running"):
        cluster.signal_node("node-2", "SIGKILL")

    started = cluster.start_node("node-2")
    assert started.state == "running"
    assert started.pid is not None
    assert started.restarts == before.restarts  # started on request: not a restart
    env_of(out_dir, "node-2", started.pid)

    # --kill: SIGKILL, and still not restarted.
    killed = cluster.stop_node("node-2", kill=True)
    assert (killed.state, killed.last_exit_code) == ("stopped", -signal.SIGKILL)
    time.sleep(STAYS_DOWN_S)
    assert node(cluster, "node-2").pid is None
    # `up` starts nodes that were stopped on request.
    assert node_pid(cluster.up(migrate=False), "node-2") is not None


def node_pid(info: ClusterInfo, name: str) -> int | None:
    return next(n.pid for n in info.nodes if n.name == name)


def test_sigstop_pauses_a_node_until_sigcont(cluster: LocalCluster) -> None:
    before = wait_running(cluster, "node-3")
    assert before.pid is not None
    cluster.signal_node("node-3", signal.SIGSTOP)
    paused = eventually(
        lambda: (n := node(cluster, "node-3")).state == "paused" and n, what="node-3 paused"
    )
    assert paused.pid == before.pid
    time.sleep(STAYS_DOWN_S)  # alive, so never "restarted"
    assert node(cluster, "node-3").pid == before.pid
    assert node(cluster, "node-3").restarts == before.restarts
    cluster.signal_node("node-3", "SIGCONT")
    resumed = eventually(
        lambda: (n := node(cluster, "node-3")).state == "running" and n, what="node-3 resumed"
    )
    assert resumed.pid == before.pid

    # A paused node still stops on request (SIGTERM is followed by SIGCONT).
    cluster.signal_node("node-3", "SIGSTOP")
    eventually(lambda: node(cluster, "node-3").state == "paused", what="node-3 paused again")
    assert cluster.stop_node("node-3").last_exit_code == -signal.SIGTERM
    assert not is_pid_alive(before.pid)
    cluster.start_node("node-3")


def test_bad_node_requests_are_one_clear_error(cluster: LocalCluster, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no node 'node-9' .*node-1, node-2, node-3"):
        cluster.stop_node("node-9")
    with pytest.raises(UsageError, match="node signals are SIGSTOP, SIGCONT, SIGKILL, SIGTERM"):
        cluster.signal_node("node-1", "SIGHUP")
    too_short = make_cluster(cluster.state_dir, tmp_path, session_timeout_ms=100)
    with pytest.raises(UsageError, match=r"100 ms is outside .* grants \(400\.\.20000 ms"):
        too_short.up(migrate=False)
    # The refused request changed nothing.
    assert all(n.state == "running" for n in cluster.status().nodes)
    assert cluster.status().session_timeout_ms == nodes.DEFAULT_SESSION_TIMEOUT_MS


# -- whole lifecycles -------------------------------------------------------------------------


def test_down_leaves_nothing_running_even_after_the_supervisor_was_killed(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    out = tmp_path / "out"
    cluster = make_cluster(state, out)
    try:
        first = cluster.up(migrate=False, nodes=2)
        seen = pids_of(first)

        # A plain down: the supervisor stops its nodes, then the servers stop.
        cluster.down()
        assert [p for p in seen if is_pid_alive(p)] == []
        assert {n.state for n in cluster.status().nodes} == {"down"}

        # up restarts the recorded nodes on their recorded admin ports.
        second = cluster.up(migrate=False)
        assert [n.admin_url for n in second.nodes] == [n.admin_url for n in first.nodes]
        seen += pids_of(second)

        # The supervisor killed: its nodes run on, unsupervised; `up` replaces them.
        assert second.supervisor_pid is not None
        os.kill(second.supervisor_pid, signal.SIGKILL)
        eventually(lambda: cluster.status().supervisor_pid is None, what="supervisor gone")
        assert {n.state for n in cluster.status().nodes} == {"orphaned"}
        with pytest.raises(LocalClusterError, match="not supervised"):
            cluster.stop_node("node-1")
        third = cluster.up(migrate=False)
        assert third.supervisor_pid not in (None, second.supervisor_pid)
        assert all(not is_pid_alive(n.pid) for n in second.nodes if n.pid)
        assert {n.state for n in third.nodes} == {"running"}
        seen += pids_of(third)

        # Killed again, then `down`: it stops the orphans itself.
        assert third.supervisor_pid is not None
        os.kill(third.supervisor_pid, signal.SIGKILL)
        eventually(lambda: cluster.status().supervisor_pid is None, what="supervisor gone")
        cluster.down()
        assert [p for p in seen if is_pid_alive(p)] == []
        assert processes_in(state) == []
    finally:
        cluster.down(purge=True)
    assert not state.exists()


def test_nodes_zero_runs_no_supervisor_and_changing_the_count_restarts_them(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    cluster = make_cluster(state, tmp_path / "out")
    try:
        info = cluster.up(migrate=False)  # a new cluster: no nodes unless asked
        assert info.nodes == ()
        assert info.supervisor_pid is None
        assert not nodes.runtime_path(state).exists()
        two = cluster.up(migrate=False, nodes=2)
        assert [n.name for n in two.nodes] == ["node-1", "node-2"]
        one = cluster.up(migrate=False, nodes=1)
        assert [n.name for n in one.nodes] == ["node-1"]
        assert one.nodes[0].admin_url == two.nodes[0].admin_url
        assert all(not is_pid_alive(n.pid) for n in two.nodes if n.pid)
        none = cluster.up(migrate=False, nodes=0)
        assert none.nodes == ()
        assert not processes.is_pid_alive(one.supervisor_pid)
        assert not processes.is_pid_alive(one.nodes[0].pid)
    finally:
        cluster.down(purge=True)
