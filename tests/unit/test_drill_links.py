"""The drill's links (:mod:`allocator.drill.links`) and node command (:mod:`allocator.drill.shim`).

Rules: the environment rewriting is checked as a pure function; the shim itself runs in a
subprocess with :mod:`tests.fakes.env_child` as the "node", which prints the environment
and the command line it was given;
:class:`Links` runs against a tiny TCP echo server on 127.0.0.1, no ZooKeeper or PostgreSQL.
Reachability is judged by a round trip through the proxy with a bounded socket timeout.
"""

from __future__ import annotations

import contextlib
import json
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.core.errors import PrerequisiteError, UsageError
from allocator.drill import links as links_mod
from allocator.drill import shim
from allocator.drill.links import Links, NodeLinks

ZK_HOSTS = "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183/allocator"
PG_URL = (
    "postgresql://allocator_node_login@127.0.0.1:5432,127.0.0.1:54321/allocator"
    "?target_session_attrs=read-write"
)
LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# The stand-in node: prints the environment it was given and its wall clock.
ROUND_TRIP_TIMEOUT_S = 1.0
HALF_AN_HOUR_S = 1800


def base_env() -> dict[str, str]:
    return {
        "ALLOCATOR_ZOOKEEPER_HOSTS": ZK_HOSTS,
        "ALLOCATOR_POSTGRES_URL": PG_URL,
        "ALLOCATOR_NODE_NAME": "node-1",
        "ALLOCATOR_NODE_ADMIN_ADDRESS": "127.0.0.1:2181",
    }


# -- the pure rewriting -----------------------------------------------------------------


def test_mapped_ports_point_at_the_proxies_and_the_chroot_stays() -> None:
    links = NodeLinks(ports={2181: 40001, 2183: 40003, 5432: 40010})
    env = shim.node_env(base_env(), links, libfaketime=None)
    assert env["ALLOCATOR_ZOOKEEPER_HOSTS"] == (
        "127.0.0.1:40001,127.0.0.1:2182,127.0.0.1:40003/allocator"
    )
    assert env["ALLOCATOR_POSTGRES_URL"] == (
        "postgresql://allocator_node_login@127.0.0.1:40010,127.0.0.1:54321/allocator"
        "?target_session_attrs=read-write"
    )


def test_only_the_two_link_variables_change() -> None:
    links = NodeLinks(ports={2181: 40001})
    env = shim.node_env(base_env(), links, libfaketime=None)
    assert env["ALLOCATOR_NODE_ADMIN_ADDRESS"] == "127.0.0.1:2181"
    assert set(env) == set(base_env())


def test_a_port_matches_whole_never_inside_a_longer_one() -> None:
    assert shim.rewrite_addresses(PG_URL, {54321: 40002}) == PG_URL.replace("54321", "40002")
    assert shim.rewrite_addresses(PG_URL, {5432: 40001}) == PG_URL.replace(":5432,", ":40001,")
    assert shim.rewrite_addresses("127.0.0.1:5432", {543: 1, 4321: 2}) == "127.0.0.1:5432"
    assert shim.rewrite_addresses("10.127.0.0.1:5432", {5432: 1}) == "10.127.0.0.1:5432"


def test_a_multi_host_url_has_every_host_rewritten() -> None:
    links = NodeLinks(ports={5432: 40001, 54321: 40002})
    env = shim.node_env(base_env(), links, libfaketime=None)
    assert env["ALLOCATOR_POSTGRES_URL"] == (
        "postgresql://allocator_node_login@127.0.0.1:40001,127.0.0.1:40002/allocator"
        "?target_session_attrs=read-write"
    )


def test_a_clock_offset_preloads_libfaketime_with_a_true_monotonic_clock() -> None:
    links = NodeLinks(ports={}, faketime="-1m")
    env = shim.node_env(base_env(), links, libfaketime=LIB)
    assert env["LD_PRELOAD"] == str(LIB)
    assert env["FAKETIME"] == "-1m"
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    kept = shim.node_env({**base_env(), "LD_PRELOAD": "/x.so"}, links, libfaketime=LIB)
    assert kept["LD_PRELOAD"] == f"{LIB}:/x.so"


def test_no_clock_offset_and_no_links_leave_the_environment_alone() -> None:
    assert "LD_PRELOAD" not in shim.node_env(base_env(), NodeLinks(ports={}), libfaketime=None)
    assert shim.node_env(base_env(), None, libfaketime=None) == base_env()


def test_libfaketime_lookup_names_where_it_looked(tmp_path: Path) -> None:
    lib = tmp_path / "libfaketime.so.1"
    missing = tmp_path / "missing.so"
    with pytest.raises(PrerequisiteError, match=r"missing\.so"):
        shim.find_libfaketime([missing])
    lib.write_bytes(b"")
    assert shim.find_libfaketime([missing, lib]) == lib


@pytest.mark.parametrize("offset", ["+1h", "-1m", "+60y", "-30s", "+2d", None])
def test_valid_clock_offsets(offset: str | None) -> None:
    assert links_mod.validate_offset(offset) == offset


@pytest.mark.parametrize("offset", ["1h", "+1", "+1.5h", "+h", "+1w", "+1h ", "", "--1h"])
def test_invalid_clock_offsets_are_refused(offset: str) -> None:
    with pytest.raises(UsageError, match="clock offset"):
        links_mod.validate_offset(offset)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"ports": {}},
        {"ports": {}, "faketime": None, "extra": 1},
        {"ports": [], "faketime": None},
        {"ports": {"x": 1}, "faketime": None},
        {"ports": {"2181": "40001"}, "faketime": None},
        {"ports": {"2181": 0}, "faketime": None},
        {"ports": {"2181": True}, "faketime": None},
        {"ports": {"70000": 1}, "faketime": None},
        {"ports": {}, "faketime": "soon"},
        {"ports": {}, "faketime": 3600},
    ],
)
def test_malformed_links_are_refused(data: object) -> None:
    with pytest.raises(ValueError, match=r"expected|must be|is not"):
        links_mod.parse_node_links(data)


def test_links_survive_a_round_trip_through_the_file(tmp_path: Path) -> None:
    written = NodeLinks(ports={2181: 40001, 5432: 40002}, faketime="+1h")
    path = links_mod.write_node_links(tmp_path, "node-1", written)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "ports": {"2181": 40001, "5432": 40002},
        "faketime": "+1h",
    }
    assert links_mod.read_node_links(tmp_path, "node-1") == written
    assert links_mod.read_node_links(tmp_path, "node-2") is None
    assert [p.name for p in tmp_path.iterdir()] == ["node-1.json"]  # no temp file left


# -- the shim as the node command -------------------------------------------------------


CHILD = [sys.executable, "-m", "tests.fakes.env_child"]


def run_shim(
    links_dir: Path, env: dict[str, str], node: list[str] = CHILD
) -> subprocess.CompletedProcess[str]:
    argv = shim.command(links_dir, node)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_the_shim_runs_the_node_with_its_links(tmp_path: Path) -> None:
    links_mod.write_node_links(tmp_path, "node-1", NodeLinks(ports={2182: 40002}))
    done = run_shim(tmp_path, base_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The node shows the command line the supervisor started (its liveness check).
    assert report["cmdline"] == shim.command(tmp_path, CHILD)
    child = report["env"]
    assert child["ALLOCATOR_ZOOKEEPER_HOSTS"] == ZK_HOSTS.replace(":2182", ":40002")
    assert child["ALLOCATOR_POSTGRES_URL"] == PG_URL
    assert "FAKETIME" not in child


def test_without_a_links_file_the_shim_runs_the_node_unchanged(tmp_path: Path) -> None:
    done = run_shim(tmp_path / "gone", base_env())
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)["env"]
    assert {key: child[key] for key in base_env()} == base_env()
    assert "LD_PRELOAD" not in child


@pytest.mark.skipif(not LIB.exists(), reason="Debian package faketime not installed")
def test_the_shim_runs_the_node_under_libfaketime(tmp_path: Path) -> None:
    links_mod.write_node_links(tmp_path, "node-1", NodeLinks(ports={}, faketime="+1h"))
    done = run_shim(tmp_path, base_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["time"] > time.time() + HALF_AN_HOUR_S  # its wall clock is an hour ahead
    child = report["env"]
    assert (child["LD_PRELOAD"], child["FAKETIME"]) == (str(LIB), "+1h")
    assert child["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    # libfaketime fails Python's own sleep there (EINVAL); kazoo's reconnect loop sleeps.
    assert report["sleep_error"] is None


def test_a_malformed_links_file_stops_the_node_with_exit_78(tmp_path: Path) -> None:
    (tmp_path / "node-1.json").write_text('{"ports": {"2181": "x"}, "faketime": null}')
    done = run_shim(tmp_path, base_env())
    assert done.returncode == 78
    assert done.stdout == ""  # the node never ran
    assert len(done.stderr.splitlines()) == 1
    assert "node-1.json" in done.stderr


def test_the_node_exit_code_is_the_shims(tmp_path: Path) -> None:
    links_mod.write_node_links(tmp_path, "node-1", NodeLinks(ports={2182: 40002}))
    assert run_shim(tmp_path, base_env(), [*CHILD, "3"]).returncode == 3
    assert run_shim(tmp_path / "gone", base_env(), [*CHILD, "4"]).returncode == 4


def test_a_node_command_that_is_not_a_python_module_is_refused(tmp_path: Path) -> None:
    done = run_shim(tmp_path, base_env(), [sys.executable, "-c", "print(1)"])
    assert done.returncode == 78
    assert done.stdout == ""
    assert "-m <module>" in done.stderr


def test_a_node_without_a_name_stops_with_exit_78(tmp_path: Path) -> None:
    env = {k: v for k, v in base_env().items() if k != "ALLOCATOR_NODE_NAME"}
    done = run_shim(tmp_path, env)
    assert done.returncode == 78
    assert "ALLOCATOR_NODE_NAME" in done.stderr


# -- Links against an echo server -------------------------------------------------------


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    """A TCP echo server on 127.0.0.1 (one thread per connection); yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # the accept loop notices ``stop`` soon
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        acceptor.join()
        listener.close()


@pytest.fixture
def echo_port() -> Iterator[int]:
    with echo_server() as port:
        yield port


def round_trips(port: int) -> bool:
    """True if a new connection to ``127.0.0.1:port`` echoes a message back in time."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=ROUND_TRIP_TIMEOUT_S) as s:
            s.sendall(b"ping")
            return s.recv(4) == b"ping"
    except OSError:
        return False


def test_each_node_gets_its_own_proxy_per_port_in_its_file(tmp_path: Path, echo_port: int) -> None:
    links_dir = tmp_path / "links"
    with Links(links_dir, ["node-1", "node-2"], zk_ports=[echo_port], pg_ports=[]) as links:
        assert stat.S_IMODE(links_dir.stat().st_mode) == 0o700
        files = {name: json.loads(links.path(name).read_text()) for name in links.names}
        proxy_ports = {name: data["ports"][str(echo_port)] for name, data in files.items()}
        assert proxy_ports["node-1"] != proxy_ports["node-2"]
        assert all(data["faketime"] is None for data in files.values())
        assert all(round_trips(port) for port in proxy_ports.values())
        assert links.ports("node-1") == {echo_port: proxy_ports["node-1"]}


def test_a_black_hole_cuts_one_node_until_healed(tmp_path: Path, echo_port: int) -> None:
    with Links(tmp_path, ["node-1", "node-2"], zk_ports=[], pg_ports=[echo_port]) as links:
        one, two = links.ports("node-1")[echo_port], links.ports("node-2")[echo_port]
        links.blackhole_postgres("node-1")
        assert links.is_cut("node-1")
        assert not links.is_cut("node-2")
        assert not round_trips(one)
        assert round_trips(two)
        links.heal("node-1")
        assert not links.is_cut("node-1")
        assert round_trips(one)


def test_zookeeper_faults_leave_postgres_alone(tmp_path: Path, echo_port: int) -> None:
    with (
        echo_server() as pg_port,
        Links(tmp_path, ["node-1"], zk_ports=[echo_port], pg_ports=[pg_port]) as links,
    ):
        zk, pg = links.ports("node-1")[echo_port], links.ports("node-1")[pg_port]
        links.cut_zookeeper("node-1")
        assert links.is_cut("node-1")
        assert not round_trips(zk)
        assert round_trips(pg)
        links.heal("node-1")
        assert round_trips(zk)
        links.blackhole_zookeeper("node-1")
        assert not round_trips(zk)
        assert round_trips(pg)
        links.heal("node-1")
        assert not links.is_cut("node-1")
        assert round_trips(zk)


def test_set_clock_rewrites_the_file_and_refuses_bad_offsets(
    tmp_path: Path, echo_port: int
) -> None:
    with Links(tmp_path, ["node-1"], zk_ports=[echo_port], pg_ports=[]) as links:
        links.set_clock("node-1", "+1h")
        assert links_mod.read_node_links(tmp_path, "node-1") == NodeLinks(
            ports=links.ports("node-1"), faketime="+1h"
        )
        with pytest.raises(UsageError):
            links.set_clock("node-1", "1 hour")
        assert links.clock("node-1") == "+1h"
        links.set_clock("node-1", None)
        read = links_mod.read_node_links(tmp_path, "node-1")
        assert read is not None
        assert read.faketime is None


def test_close_removes_the_files_and_the_empty_folder(tmp_path: Path, echo_port: int) -> None:
    kept, emptied = tmp_path / "kept", tmp_path / "emptied"
    kept.mkdir()
    (kept / "other").write_text("not ours")
    for links_dir in (kept, emptied):
        links = Links(links_dir, ["node-1", "node-2"], zk_ports=[echo_port], pg_ports=[])
        links.open()
        proxy = links.ports("node-1")[echo_port]
        links.close()
        assert not round_trips(proxy)
        links.close()  # twice is harmless
    assert [p.name for p in kept.iterdir()] == ["other"]
    assert not emptied.exists()


def test_unknown_nodes_and_unsafe_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        Links(tmp_path, ["../node-1"], zk_ports=[], pg_ports=[])
    with (
        Links(tmp_path, ["node-1"], zk_ports=[], pg_ports=[]) as links,
        pytest.raises(UsageError, match="node-9"),
    ):
        links.heal("node-9")
