"""The reaper never removes its successor's session file (issue 19, item 6): it removes
``session.json`` only while the file still names the session it closed, and that check and
the unlink are one step with respect to the node's write (the state folder's lock), so a
node that records its new session while a reaper is still connecting keeps its file.

Only the version 2 fields of the session file are used here (no pid namespace), so these
tests read the same against the release before the fix; the reaper takes such a file as
its child's through the supervisor's child handle (``exited_pid``)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from allocator.local import supervisor
from allocator.session import file as session_file
from allocator.session import reaper
from allocator.session.file import SessionRecord
from allocator.session.reaper import Action, Self

ME = Self(zookeeper_hosts="127.0.0.1:1/allocator", election_path="/election",
          name="node-1", host="host-a")  # fmt: skip
DEADLINE_S = 30.0
"""How long a thread is waited for before the test gives up (a hang), never a bound the
behaviour is measured against."""


def _record(pid: int, session_id: int) -> SessionRecord:
    return SessionRecord(
        name=ME.name,
        host=ME.host,
        pid=pid,
        zookeeper_hosts=ME.zookeeper_hosts,
        session_id=session_id,
        session_password=b"\x01" * 16,
        election_path=ME.election_path,
        start_time=777,
        boot_id=reaper.boot_id(),
    )


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


DEAD_SESSION = 0x1000001
NEW_SESSION = 0x2000002


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    session_file.prepare(path)
    return path


def test_a_file_rewritten_while_the_reaper_connects_is_not_removed(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By the time the reaper's connect is done, the restarted node has written its own
    session: that file stays, and only the dead node's session was closed."""
    dead = _dead_pid()
    session_file.write(state_dir, _record(dead, DEAD_SESSION))
    closed: list[int] = []

    def slow_close(_hosts: str, credentials: tuple[int, bytes], _timeout_s: float) -> bool:
        session_file.write(state_dir, _record(dead + 1, NEW_SESSION))  # the new node, meanwhile
        closed.append(credentials[0])
        return True

    monkeypatch.setattr(reaper, "close_session", slow_close)
    decision = reaper.reap(state_dir, ME, exited_pid=dead, timeout_s=0.1)
    assert decision.action is Action.REAP
    assert closed == [DEAD_SESSION]
    kept = session_file.read(state_dir)
    assert kept is not None
    assert kept.session_id == NEW_SESSION
    assert "kept" in decision.reason


def test_the_reaped_sessions_own_file_is_still_removed(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = _dead_pid()
    session_file.write(state_dir, _record(dead, DEAD_SESSION))
    monkeypatch.setattr(reaper, "close_session", lambda *_args: True)
    assert reaper.reap(state_dir, ME, exited_pid=dead, timeout_s=0.1).action is Action.REAP
    assert session_file.read(state_dir) is None


def test_the_supervisors_reap_thread_leaves_the_restarted_nodes_file(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's reap path itself (``_reap_exited`` in its own thread), with a
    connect that lasts until the restarted node (another thread) has recorded its session."""
    dead = _dead_pid()
    env = {
        "ALLOCATOR_ZOOKEEPER_HOSTS": ME.zookeeper_hosts,
        "ALLOCATOR_ZOOKEEPER_INSECURE": "true",
        "ALLOCATOR_NODE_NAME": ME.name,
        "ALLOCATOR_NODE_STATE_DIR": str(state_dir),
    }
    self_of = reaper.self_of
    monkeypatch.setattr(reaper, "self_of", lambda config: self_of(config, ME.host))
    session_file.write(state_dir, _record(dead, DEAD_SESSION))
    connecting = threading.Event()
    recorded = threading.Event()
    closed: list[int] = []

    def slow_close(_hosts: str, credentials: tuple[int, bytes], _timeout_s: float) -> bool:
        connecting.set()
        assert recorded.wait(DEADLINE_S), "the restarted node never recorded its session"
        closed.append(credentials[0])
        return True

    def restarted_node() -> None:
        assert connecting.wait(DEADLINE_S), "the reaper never connected"
        session_file.write(state_dir, _record(dead + 1, NEW_SESSION))
        recorded.set()

    monkeypatch.setattr(reaper, "close_session", slow_close)
    threads = [
        threading.Thread(target=supervisor._reap_exited, args=(env, dead)),
        threading.Thread(target=restarted_node),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
        assert not thread.is_alive()
    assert closed == [DEAD_SESSION]  # the dead node's session, never the new one
    kept = session_file.read(state_dir)
    assert kept is not None
    assert kept.session_id == NEW_SESSION
