"""``allocator reap-session`` in a subprocess: nothing to reap is said in one line (exit 0);
a node without a configured name cannot reap (exit 78); a reaper that cannot see the
recorded process as it is (another pid namespace, a ``/proc`` not its own or not there)
takes it as alive and leaves a live node's session alone, while a node killed in a pid
namespace of its own is reaped from another one (its lock is free) (issue 19, item 5).
Reaping under the supervisor: tests/chaos/test_reaping.py.

The pid namespace tests need root (``unshare``); CI runs them as root. They write and read
the session file as JSON, so they run unchanged against the release before the fix (whose
reader ignores the new keys) and show what it did wrong."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from allocator.local.processes import start_time
from tests.fixtures import zk
from tests.fixtures.nodes import RunningNode, wait_for
from tests.namespaces import NEW_PID_NAMESPACE, NO_PROC, OUTER_PROC, why_not

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))


def _env(state_dir: Path, name: str, zk_hosts: str, **more: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
        "ALLOCATOR_ZOOKEEPER_HOSTS": zk_hosts,
        "ALLOCATOR_NODE_NAME": name,
        "ALLOCATOR_NODE_STATE_DIR": str(state_dir),
        **more,
    }


def test_reap_session_with_nothing_to_reap_says_so(tmp_path: Path) -> None:
    env = _env(
        tmp_path / "state", "node-1", "127.0.0.1:1/allocator", ALLOCATOR_ZOOKEEPER_INSECURE="true"
    )
    (tmp_path / "state").mkdir(mode=0o700)
    done = subprocess.run(
        [ALLOCATOR, "reap-session"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nothing:")
    unnamed = {k: v for k, v in env.items() if k != "ALLOCATOR_NODE_NAME"}
    refused = subprocess.run(
        [ALLOCATOR, "reap-session"], env=unnamed, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 78
    assert "node.name" in refused.stderr


@pytest.fixture
def unshare() -> None:
    reason = why_not()
    if reason:
        pytest.skip(reason)


def _reap(wrapper: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*wrapper, ALLOCATOR, "reap-session"], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.usefixtures("unshare")
def test_pid_1_of_another_pid_namespace_is_not_the_recorded_pid_1(tmp_path: Path) -> None:
    """A node that is pid 1 of its container (here: this namespace's pid 1, alive, with its
    start time) and a reaper in a new pid namespace, where pid 1 is another process (the
    reaper itself) with another start time: not a reused pid, a pid of another namespace."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    record = {
        "version": 2, "name": "node-1", "host": socket.gethostname(), "pid": 1,
        "zookeeper_hosts": "127.0.0.1:1/allocator", "session_id": "0x1000001",
        "session_password": "01" * 16, "written_at": 1.0, "election_path": "/election",
        "start_time": start_time(1), "boot_id": Path("/proc/sys/kernel/random/boot_id")
        .read_text().strip(), "pid_namespace": os.stat("/proc/self/ns/pid").st_ino,
    }  # fmt: skip
    path = state_dir / "session.json"
    path.write_text(json.dumps(record))
    path.chmod(0o600)
    env = _env(
        state_dir, "node-1", "127.0.0.1:1/allocator",
        ALLOCATOR_ZOOKEEPER_INSECURE="true", ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S="1",
    )  # fmt: skip
    here = _reap([], env)
    assert here.stdout.startswith("alive:"), here.stdout + here.stderr
    elsewhere = _reap(NEW_PID_NAMESPACE, env)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout.startswith("alive:"), elsewhere.stdout + elsewhere.stderr
    assert "pid namespace" in elsewhere.stdout
    assert path.exists()


def _owned_ephemerals(zk_hosts: str, election_path: str, session_id: int) -> list[str]:
    """The election znodes ZooKeeper says ``session_id`` owns now (a closed session owns
    none: they are deleted when it closes)."""
    client = KazooClient(hosts=zk_hosts, auth_data=[("digest", zk.ZK_AUTH)])
    client.start(timeout=30)
    try:
        try:
            children = client.get_children(election_path)
        except NoNodeError:  # no node has joined yet
            return []
        owned = []
        for child in children:
            stat = client.exists(f"{election_path}/{child}")
            if stat is not None and stat.ephemeralOwner == session_id:
                owned.append(child)
        return owned
    finally:
        client.stop()
        client.close()


def _drop_lock(path: Path) -> dict[str, object]:
    """Make the file say its writer holds no lock (as an older release's file says
    nothing of one), so the pid rules decide; returns what it holds now."""
    raw: dict[str, object] = json.loads(path.read_text())
    raw["holds_lock"] = False
    path.write_text(json.dumps(raw))
    return raw


@pytest.mark.integration
@pytest.mark.usefixtures("unshare")
@pytest.mark.parametrize(
    ("wrapper", "lock", "why"),
    [
        pytest.param(NEW_PID_NAMESPACE, True, "holds the state folder's lock", id="lock"),
        pytest.param(NEW_PID_NAMESPACE, False, "another pid namespace", id="own-pid-namespace"),
        pytest.param(OUTER_PROC, False, "cannot see itself", id="outer-proc"),
        pytest.param(NO_PROC, False, "cannot see itself", id="no-proc"),
    ],
)
def test_a_reaper_that_cannot_see_a_live_node_leaves_its_session_alone(
    make_node: Callable[..., RunningNode],
    zk_hosts: str,
    tmp_path: Path,
    wrapper: list[str],
    lock: bool,
    why: str,
) -> None:
    """A live leader with its session file; ``reap-session`` as that node (same name, host,
    state folder, cluster), run where the leader's pid cannot be judged: told by the lock
    the leader holds, or, in a file that does not say its writer holds it, by the pid
    rules alone. Must hold: the reaper says alive and why; the file stays; ZooKeeper still
    has the leader's session (its election znode), and the leader still leads in it."""
    state_dir = tmp_path / "state"
    running = make_node("reaped", **{"node.state_dir": str(state_dir)})
    wait_for(lambda: running.node.snapshot()["role"] == "leader", "the node to lead")
    credentials = running.node.session_credentials()
    assert credentials is not None
    path = state_dir / "session.json"
    recorded = json.loads(path.read_text()) if lock else _drop_lock(path)
    assert int(str(recorded["session_id"]), 16) == credentials[0]

    done = _reap(wrapper, _env(state_dir, "reaped", zk_hosts, ALLOCATOR_ZOOKEEPER_AUTH=zk.ZK_AUTH))

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("alive:"), done.stdout + done.stderr
    assert why in done.stdout
    assert json.loads(path.read_text()) == recorded
    assert _owned_ephemerals(zk_hosts, str(recorded["election_path"]), credentials[0])
    snapshot = running.node.snapshot()
    assert (snapshot["role"], snapshot["session_id"]) == ("leader", recorded["session_id"])


def _child_of(pid: int) -> int | None:
    """The process whose parent is ``pid`` (unshare's forked child), as this namespace
    numbers it."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[1] == str(pid):
                return int(entry.name)
    return None


def _recorded(path: Path) -> dict[str, object] | None:
    try:
        raw: dict[str, object] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return raw


@pytest.mark.integration
@pytest.mark.usefixtures("unshare")
def test_a_node_restarted_in_a_new_pid_namespace_reaps_its_killed_predecessor(
    db_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    """A node in a pid namespace of its own (a container: it is pid 1 there) SIGKILLed,
    then ``reap-session`` from another new pid namespace (the restarted container, or its
    ``ExecStopPost=``): pid 1 there is another process, and the recorded one is not to be
    seen, but the predecessor's lock is free: its session is closed (its election znode
    gone) and its file removed. While it lived, the same reaper left it alone."""
    state_dir = tmp_path / "state"
    env = _env(
        state_dir, "contained", zk_hosts,
        ALLOCATOR_ZOOKEEPER_AUTH=zk.ZK_AUTH, ALLOCATOR_POSTGRES_URL=db_url,
        ALLOCATOR_NODE_ADMIN_ADDRESS="127.0.0.1:0",
    )  # fmt: skip
    path = state_dir / "session.json"
    with (tmp_path / "node.log").open("ab") as log, subprocess.Popen(
        [*NEW_PID_NAMESPACE, "--kill-child", ALLOCATOR, "run"],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    ) as container:  # fmt: skip
        try:
            recorded = wait_for(lambda: _recorded(path), "the contained node's session file")
            session_id = int(str(recorded["session_id"]), 16)
            election_path = str(recorded["election_path"])
            wait_for(
                lambda: _owned_ephemerals(zk_hosts, election_path, session_id),
                "the contained node to join the election",
            )
            assert recorded["pid"] == 1  # its own namespace's pid 1, as in a container
            node = _child_of(container.pid)
            assert node is not None

            beside = _reap(NEW_PID_NAMESPACE, env)  # `docker compose run node-1 reap-session`
            assert beside.stdout.startswith("alive:"), beside.stdout + beside.stderr
            assert _owned_ephemerals(zk_hosts, election_path, session_id)

            # Its namespace outlives it while this is open, so the restarted one is surely
            # another (a dead namespace's number may come back for the next new one).
            namespace = os.open(f"/proc/{node}/ns/pid", os.O_RDONLY)
            os.kill(node, signal.SIGKILL)  # the crash: by the pid of the process we started
            assert container.wait(60) != 0  # unshare has reaped its child: it is gone
        finally:
            if container.poll() is None:
                container.kill()  # --kill-child takes the node with it
                container.wait(60)

    try:
        assert os.fstat(namespace).st_ino == recorded["pid_namespace"]
        restarted = _reap(NEW_PID_NAMESPACE, env)
    finally:
        os.close(namespace)

    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.startswith("reap:"), restarted.stdout + restarted.stderr
    assert "no longer holds the state folder's lock" in restarted.stdout
    assert not _owned_ephemerals(zk_hosts, election_path, session_id)
    assert not path.exists()
