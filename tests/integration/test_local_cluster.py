"""The embedded-cluster manager against real ZooKeeper and PostgreSQL servers.

One 3-server cluster is shared by the tests that need an ensemble (each leaves it as it
found it); the others use ``zk_servers=1`` or start nothing at all. State folders come from
pytest's ``tmp_path`` (parents are mode 0700), so the PostgreSQL relocation path is always
exercised. No fixed sleeps: every wait is a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError
from kazoo.handlers.threading import KazooTimeoutError

from allocator.core.errors import (
    LocalClusterError,
    PortInUseError,
    PrerequisiteError,
    ServerStartError,
)
from allocator.local import postgres, processes, tcp_ports, zookeeper
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo
from allocator.local.processes import is_pid_alive
from allocator.zookeeper import client as zkclient

pytestmark = pytest.mark.integration

T = TypeVar("T")
WAIT_S = 30.0
STABLE_KEYS = {"state_dir", "zk_hosts", "database_url", "zk_servers", "postgres", "nodes"}


def eventually(check: Callable[[], T], timeout_s: float = WAIT_S, what: str = "") -> T:
    """Call ``check`` until it returns a truthy value without raising; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Exception as exc:
            last = exc
        else:
            if result:
                return result
        time.sleep(0.05)
    pytest.fail(f"not true within {timeout_s}s: {what or check} (last error: {last!r})")


@contextlib.contextmanager
def kazoo_client(hosts: str, timeout_s: float = 4.0, auth: str = "") -> Iterator[KazooClient]:
    client = KazooClient(
        hosts=hosts, timeout=timeout_s, auth_data=[("digest", auth)] if auth else None
    )
    try:
        client.start(timeout=WAIT_S)
        yield client
    finally:
        client.stop()
        client.close()


def write_read(client: KazooClient, timeout_s: float = 2.0) -> bool:
    path = f"/local-cluster-test/{uuid.uuid4().hex}"
    client.ensure_path_async("/local-cluster-test").get(timeout=timeout_s)
    client.create_async(path, b"payload").get(timeout=timeout_s)
    data, _stat = client.get_async(path).get(timeout=timeout_s)
    return bool(data == b"payload")


def processes_mentioning(*needles: Path) -> list[str]:
    """Command lines of live processes that contain one of ``needles``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(str(n) in cmdline for n in needles):
            found.append(f"{entry.name}: {cmdline}")
    return found


def recorded_pids(info: ClusterInfo) -> list[int]:
    pids = [s.pid for s in info.zk_servers] + [info.postgres.pid]
    return [p for p in pids if p is not None]


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state = tmp_path_factory.mktemp("lc3") / "state"
    with LocalCluster(state, 3, migrate_on_enter=False, purge_on_exit=True) as cluster:
        yield cluster


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh state folder; whatever a test leaves running there is stopped and purged."""
    state = tmp_path / "state"
    yield state
    LocalCluster(state).down(purge=True)


# -- building blocks ------------------------------------------------------------------------


def test_picked_ports_are_distinct_and_a_taken_port_is_named() -> None:
    picked = tcp_ports.pick_free_ports(8)
    assert len(set(picked)) == 8
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert not tcp_ports.is_free(port)
        with pytest.raises(PortInUseError, match=rf"port {port} .*PostgreSQL port"):
            tcp_ports.ensure_free(port, "PostgreSQL port")
    assert tcp_ports.is_free(port)


def test_a_pid_is_only_signalled_while_it_runs_what_we_started(tmp_path: Path) -> None:
    argv = ["sleep", "300"]
    daemon = processes.start(argv, log_path=tmp_path / "sleep.log")
    assert list(tmp_path.iterdir()) == [tmp_path / "sleep.log"]  # no pid file: the record is
    assert processes.is_alive(daemon.pid, argv)
    assert os.getsid(daemon.pid) == daemon.pid  # its own session
    # Same pid, other argv: as if the pid had been recycled. Never signalled.
    assert not processes.is_alive(daemon.pid, ["sleep", "301"])
    assert not processes.stop(daemon.pid, ["sleep", "301"], sig=signal.SIGKILL)
    # An empty argv matches nothing (kernel threads have an empty cmdline).
    assert not processes.is_alive(daemon.pid, [])
    assert not processes.send_signal(daemon.pid, [], signal.SIGKILL)
    # Same pid and argv, another start time: a recycled pid running the same command.
    started = processes.start_time(daemon.pid)
    assert started is not None
    assert processes.is_alive(daemon.pid, argv, started)
    assert not processes.is_alive(daemon.pid, argv, started + 1)
    assert not processes.stop_all([(daemon.pid, argv, started + 1)], sig=signal.SIGKILL)
    assert processes.is_alive(daemon.pid, argv)
    assert processes.stop(daemon.pid, argv)
    assert not is_pid_alive(daemon.pid)


def test_kernel_threads_are_never_ours() -> None:
    kernel_threads = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _empty_cmdline(entry)
    ]
    if not kernel_threads:
        pytest.skip("no kernel thread visible in this PID namespace")
    for pid in kernel_threads[:5]:
        assert not processes.is_alive(pid, [])
        assert not processes.is_alive(pid, ())
        assert not processes.is_pid_alive(pid)
        assert not processes.send_signal(pid, [], signal.SIGSTOP)


def _empty_cmdline(entry: Path) -> bool:
    try:
        state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        return state not in ("Z", "X") and (entry / "cmdline").read_bytes() == b""
    except OSError:
        return False


def test_a_zombie_counts_as_dead() -> None:
    proc = subprocess.Popen(["sleep", "300"])
    try:
        os.kill(proc.pid, signal.SIGKILL)
        eventually(
            lambda: Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z",
            what="the child is a zombie",
        )
        assert not processes.is_alive(proc.pid, ["sleep", "300"])
    finally:
        proc.wait()


def test_stop_escalates_to_sigkill_of_the_process_group(tmp_path: Path) -> None:
    argv = ["sh", "-c", "trap '' TERM; sleep 300 & wait"]
    daemon = processes.start(argv, log_path=tmp_path / "stubborn.log")
    child = eventually(
        lambda: [
            int(p)
            for p in Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
        ],
        what="the shell has started sleep",
    )[0]
    assert processes.stop(daemon.pid, argv, timeout_s=0.3)
    assert not is_pid_alive(daemon.pid)
    eventually(lambda: not is_pid_alive(child), what="the group member is gone too")
    assert "starting sh -c" in processes.tail(daemon.log_path)
    assert processes.tail(daemon.log_path, offset=daemon.log_offset) == ""


# -- the shared 3-server ensemble -------------------------------------------------------------


def test_ensemble_serves_on_loopback(cluster3: LocalCluster) -> None:
    info = cluster3.status()
    assert info.to_json().keys() >= STABLE_KEYS
    assert {"id", "pid", "client_port"} <= info.to_json()["zk_servers"][0].keys()
    assert {"pid", "port"} <= info.to_json()["postgres"].keys()
    assert info.to_json()["nodes"] == []
    assert info.zk_hosts == ",".join(f"127.0.0.1:{s.client_port}" for s in info.zk_servers)
    assert sorted(s.mode or "" for s in info.zk_servers) == ["follower", "follower", "leader"]
    with kazoo_client(info.zk_hosts) as client:
        assert write_read(client)
    # The nodes' chroot, even with no node: the cluster's identity only (ZooKeeper ACLs).
    with kazoo_client(info.node_zk_hosts, auth=info.zk_auth) as client:
        assert write_read(client)
        assert client.get_acls("/")[0] == zkclient.digest_acl(info.zk_auth)
    with kazoo_client(info.node_zk_hosts) as client, pytest.raises(NoAuthError):
        client.create(f"/intruder-{uuid.uuid4().hex}", b"")
    assert stat.S_IMODE(cluster3.state_file.stat().st_mode) == 0o600  # it holds the identity
    assert "zk_auth" not in info.to_json()
    # Every listening socket on a recorded port is bound to 127.0.0.1 only.
    recorded = {info.postgres.port}
    for s in info.zk_servers:
        recorded |= {s.client_port, s.peer_port, s.election_port}
    listening = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, port_hex = fields[1].split(":")
        if fields[3] == "0A" and int(port_hex, 16) in recorded:
            listening[int(port_hex, 16)] = address
    assert listening, "no listening sockets found"
    assert set(listening.values()) == {"0100007F"}  # 127.0.0.1
    assert not any(
        line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) in recorded
        for line in Path("/proc/net/tcp6").read_text().splitlines()[1:]
    )


def test_a_ten_second_session_timeout_is_granted(cluster3: LocalCluster) -> None:
    info = cluster3.status()
    with kazoo_client(info.zk_hosts, timeout_s=10.0) as client:
        session = f"sid=0x{client.client_id[0]:x},"
        replies = [zookeeper.four_letter_word(s.client_port, "cons") for s in info.zk_servers]
        line = next(ln for reply in replies for ln in reply.splitlines() if session in ln)
        assert "to=10000," in line


def test_up_twice_is_harmless(cluster3: LocalCluster) -> None:
    before = cluster3.status()
    again = LocalCluster(cluster3.state_dir).up(migrate=False)
    assert recorded_pids(again) == recorded_pids(before)
    assert again.zk_hosts == before.zk_hosts
    with pytest.raises(LocalClusterError, match="has 3 ZooKeeper server"):
        LocalCluster(cluster3.state_dir, zk_servers=1).up(migrate=False)
    assert recorded_pids(cluster3.status()) == recorded_pids(before)


def test_one_server_down_keeps_quorum(cluster3: LocalCluster) -> None:
    info = cluster3.status()
    leader = next(s for s in info.zk_servers if s.mode == "leader")
    with kazoo_client(info.zk_hosts) as client:
        cluster3.stop_zk(leader.id)  # SIGKILL
        assert leader.pid is not None
        assert not is_pid_alive(leader.pid)
        after = {s.id: s for s in cluster3.status().zk_servers}
        assert not after[leader.id].running
        assert after[leader.id].pid is None
        eventually(lambda: write_read(client), what="a write with one server down")
        cluster3.start_zk(leader.id)
        restarted = {s.id: s for s in cluster3.status().zk_servers}[leader.id]
        assert restarted.running
        assert restarted.mode in ("leader", "follower")
        assert restarted.pid != leader.pid
        assert write_read(client)


def test_two_servers_down_lose_quorum_and_one_back_restores_it(cluster3: LocalCluster) -> None:
    info = cluster3.status()
    first, second, survivor = info.zk_servers
    with kazoo_client(info.zk_hosts) as client:
        cluster3.stop_zk(first.id)
        cluster3.stop_zk(second.id)
        eventually(lambda: zookeeper.mode(survivor.client_port) is None, what="no quorum")
        with pytest.raises((KazooException, KazooTimeoutError)):
            write_read(client, timeout_s=1.0)
        newcomer = KazooClient(hosts=f"127.0.0.1:{survivor.client_port}", timeout=4.0)
        try:
            with pytest.raises(KazooTimeoutError):
                newcomer.start(timeout=1.0)
        finally:
            newcomer.stop()
            newcomer.close()
        cluster3.start_zk(first.id)  # waits until it serves: quorum is back
        eventually(lambda: write_read(client), what="a write after quorum came back")
        cluster3.start_zk(second.id)
    modes = sorted(s.mode or "" for s in cluster3.status().zk_servers)
    assert modes == ["follower", "follower", "leader"]


def test_postgres_answers_and_recovers_from_an_immediate_stop(cluster3: LocalCluster) -> None:
    info = cluster3.status()
    assert info.database_url == f"postgresql://postgres@127.0.0.1:{info.postgres.port}/allocator"
    with psycopg.connect(info.database_url, autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SHOW max_connections").fetchone() == ("200",)
        expected = {
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "commit_delay": "500",
            "commit_siblings": "5",
            "shared_buffers": "256MB",
            "wal_buffers": "16MB",
            "max_wal_size": "1GB",
            "checkpoint_timeout": "5min",
            "wal_writer_delay": "10ms",
            "autovacuum_naptime": "10s",
        }
        for name, value in expected.items():
            assert conn.execute(f"SHOW {name}").fetchone() == (value,), name
        conn.execute("CREATE TABLE IF NOT EXISTS probe (note text)")
        conn.execute("INSERT INTO probe VALUES ('committed before the crash')")
    cluster3.stop_postgres("immediate")
    assert info.postgres.pid is not None
    assert not is_pid_alive(info.postgres.pid)
    assert not cluster3.status().postgres.running
    cluster3.start_postgres()
    after = cluster3.status().postgres
    assert after.running
    assert after.port == info.postgres.port
    assert after.pid != info.postgres.pid
    with psycopg.connect(info.database_url) as conn:
        notes = conn.execute("SELECT note FROM probe").fetchall()
    assert ("committed before the crash",) in notes


# -- whole lifecycles on one server -----------------------------------------------------------


def test_down_stops_everything_and_up_restarts_with_the_data(state_dir: Path) -> None:
    cluster = LocalCluster(state_dir, zk_servers=1)
    info = cluster.up(migrate=False)
    assert [s.mode for s in info.zk_servers] == ["standalone"]
    data_dir = info.postgres.data_dir
    with kazoo_client(info.zk_hosts) as client:
        client.create("/kept", b"across restarts")
    with psycopg.connect(info.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('across restarts')")

    LocalCluster(state_dir).down()  # another manager object, as from another process
    for pid in recorded_pids(info):
        assert not is_pid_alive(pid), f"pid {pid} still runs"
    assert processes_mentioning(state_dir, data_dir) == []
    status = cluster.status()
    assert not status.running
    assert all(s.pid is None for s in status.zk_servers)
    cluster.down()  # harmless when nothing runs

    # A recorded port taken meanwhile: a clear error, nothing started.
    with socket.socket() as squatter:
        # Like any server: the stopped postmaster may have left TIME_WAIT on its port.
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", info.postgres.port))
        squatter.listen()
        with pytest.raises(PortInUseError, match=rf"port {info.postgres.port} .*PostgreSQL"):
            cluster.up(migrate=False)
    assert processes_mentioning(state_dir, data_dir) == []

    again = cluster.up(migrate=False)
    assert again.zk_hosts == info.zk_hosts
    assert again.postgres.port == info.postgres.port
    with kazoo_client(again.zk_hosts) as client:
        assert client.get("/kept")[0] == b"across restarts"
    with psycopg.connect(again.database_url) as conn:
        assert conn.execute("SELECT note FROM kept").fetchone() == ("across restarts",)

    cluster.down(purge=True)
    assert processes_mentioning(state_dir, data_dir) == []
    assert not state_dir.exists()
    assert not data_dir.exists()


def test_context_manager_form_stops_everything(state_dir: Path) -> None:
    with LocalCluster(state_dir, 1, migrate_on_enter=False) as cluster:
        pids = recorded_pids(cluster.status())
        assert len(pids) == 2
    assert not any(is_pid_alive(p) for p in pids)


def test_a_requested_port_that_is_taken_is_named(state_dir: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(PortInUseError, match=rf"port {port} on 127.0.0.1 \(PostgreSQL port\)"):
            LocalCluster(state_dir, 1, pg_port=port).up(migrate=False)
    assert processes_mentioning(state_dir) == []


def test_a_requested_zookeeper_client_port_that_is_taken_is_named(state_dir: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(
            PortInUseError, match=rf"port {port} on 127.0.0.1 \(ZooKeeper server 1 client port\)"
        ):
            LocalCluster(state_dir, zk_client_ports=[port]).up(migrate=False)
    assert processes_mentioning(state_dir) == []
    assert not LocalCluster(state_dir).exists()  # checked before anything was recorded


def test_a_recorded_zookeeper_client_port_taken_meanwhile_is_named(state_dir: Path) -> None:
    cluster = LocalCluster(state_dir, 1)
    info = cluster.up(migrate=False)
    [server] = info.zk_servers
    cluster.stop_zk(server.id)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", server.client_port))
        squatter.listen()
        with pytest.raises(
            PortInUseError, match=rf"port {server.client_port} .*ZooKeeper server 1 client port"
        ):
            cluster.start_zk(server.id)
        with pytest.raises(PortInUseError, match=rf"port {server.client_port} "):
            cluster.up(migrate=False)
    assert not cluster.status().zk_servers[0].running
    assert cluster.status().postgres.pid == info.postgres.pid  # left alone


def test_missing_postgres_binaries_name_the_fix(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-postgres"
    empty.mkdir()
    with pytest.raises(PrerequisiteError, match=r"apt-get install postgresql-15"):
        LocalCluster(state_dir, 1, pg_bin_dir=empty).up(migrate=False)
    monkeypatch.setenv(postgres.BIN_DIR_ENV, str(empty))
    with pytest.raises(
        PrerequisiteError, match=rf"no initdb and postgres in {empty}.*postgresql-15"
    ):
        LocalCluster(state_dir, 1).up(migrate=False)
    # Checked before anything started: no ZooKeeper server was left behind either.
    assert processes_mentioning(state_dir) == []


def test_a_failed_stop_keeps_the_pid_recorded_and_down_retries(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = LocalCluster(state_dir, 1)
    info = cluster.up(migrate=False)
    pg_pid, zk_pid = info.postgres.pid, info.zk_servers[0].pid

    def refuse(*args: object, **kwargs: object) -> bool:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(postgres, "stop", refuse)
    with pytest.raises(LocalClusterError, match=r"could not stop PostgreSQL: .*not permitted"):
        cluster.down()
    # Everything else was still stopped; PostgreSQL runs on, and stays recorded.
    assert not is_pid_alive(zk_pid)
    status = cluster.status()
    assert status.postgres.pid == pg_pid
    assert status.postgres.running
    assert status.zk_servers[0].pid is None
    monkeypatch.undo()
    cluster.down()  # the retry
    assert not is_pid_alive(pg_pid)
    assert cluster.status().postgres.pid is None


def test_missing_zookeeper_package_names_the_fix(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "no-jars"
    empty.mkdir()
    with pytest.raises(PrerequisiteError, match=r"apt-get install zookeeper"):
        LocalCluster(state_dir, 1, zk_java_dir=empty).up(migrate=False)
    monkeypatch.setenv(zookeeper.JAVA_DIR_ENV, str(empty))
    with pytest.raises(PrerequisiteError, match=r"zookeeper\.jar.*apt-get install zookeeper"):
        LocalCluster(state_dir, 1).up(migrate=False)
    assert processes_mentioning(state_dir) == []


def test_missing_java_names_the_fix(
    state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PrerequisiteError, match=r"apt-get install default-jre-headless"):
        LocalCluster(state_dir, 1).up(migrate=False)


def test_a_server_that_fails_to_start_shows_its_log(state_dir: Path) -> None:
    cluster = LocalCluster(state_dir, 1, zk_jvm_options=["-XX:+NoSuchAllocatorTestOption"])
    with pytest.raises(ServerStartError) as caught:
        cluster.up(migrate=False)
    message = str(caught.value)
    assert "ZooKeeper server 1" in message
    assert "zookeeper.log" in message
    assert "NoSuchAllocatorTestOption" in message  # the JVM's own words, from the log tail
    # The failed up stopped what it had started (PostgreSQL too).
    status = cluster.status()
    assert not status.postgres.running
    assert not any(s.running for s in status.zk_servers)
    assert processes_mentioning(state_dir, status.postgres.data_dir) == []
