"""A node removes only the session file it wrote (issue 19): at its clean exit, a file
that another process wrote meanwhile in its state folder (names another session) stays.
While it has a session file it holds its state folder's lock (the reaper's proof that it
lives), and lets go of it at a clean exit. The node's own file going away at a clean exit:
test_node."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from allocator.node import EXIT_OK
from allocator.session import file as session_file
from allocator.session import reaper
from tests.fixtures.nodes import RunningNode, wait_for

pytestmark = pytest.mark.integration


def test_a_node_leaves_a_session_file_it_did_not_write(
    make_node: Callable[..., RunningNode], tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    running = make_node("owner", **{"node.state_dir": str(state_dir)})
    wait_for(lambda: running.node.snapshot()["role"] == "leader", "the node to lead")
    own = session_file.read(state_dir)
    assert own is not None
    other = subprocess.Popen(["true"])
    other.wait()
    theirs = session_file.SessionRecord(
        name=own.name,
        host=own.host,
        pid=other.pid,
        zookeeper_hosts=own.zookeeper_hosts,
        session_id=own.session_id + 1,
        session_password=b"\x02" * 16,
        election_path=own.election_path,
        start_time=1,
        boot_id=reaper.boot_id(),
    )
    session_file.write(state_dir, theirs)
    assert running.stop() == EXIT_OK
    kept = session_file.read(state_dir)
    assert kept is not None
    assert (kept.pid, kept.session_id) == (other.pid, own.session_id + 1)
    assert session_file.lock_held(state_dir) is False


def test_a_node_holds_its_state_folders_lock_while_its_file_names_it(
    make_node: Callable[..., RunningNode], tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    running = make_node("holder", **{"node.state_dir": str(state_dir)})
    wait_for(lambda: running.node.snapshot()["role"] == "leader", "the node to lead")
    own = session_file.read(state_dir)
    assert own is not None
    assert own.holds_lock is True
    assert own.pid_namespace == reaper.pid_namespace()
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from allocator.session import file as session_file; "
         "print(session_file.lock_held(Path(sys.argv[1])))", str(state_dir)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "True"  # what a reaper in another process sees
    assert running.stop() == EXIT_OK
    assert session_file.read(state_dir) is None
    assert session_file.lock_held(state_dir) is False
