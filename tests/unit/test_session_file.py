"""allocator.session.file: a private, atomically replaced file; a checked folder; a removal
that only takes the file it was asked about, never one written meanwhile (issue 19)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.core.errors import ConfigError
from allocator.session import file as session_file
from allocator.session.file import SessionRecord

RECORD = SessionRecord(
    name="node-1",
    host="host-a",
    pid=4242,
    zookeeper_hosts="127.0.0.1:2181/allocator",
    session_id=0x1000ABCDEF,
    session_password=bytes(range(16)),
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("permissive_umask")
def test_prepare_creates_a_private_folder_and_write_a_private_file(tmp_path: Path) -> None:
    state_dir = tmp_path / "a" / "b"
    session_file.prepare(state_dir)
    assert _mode(state_dir) == 0o700
    path = session_file.write(state_dir, RECORD)
    assert path == state_dir / "session.json"
    assert _mode(path) == 0o600
    assert [p.name for p in state_dir.iterdir()] == ["session.json"]  # no temp file left


def test_the_file_is_a_small_versioned_json_object_that_reads_back(tmp_path: Path) -> None:
    session_file.write(tmp_path, RECORD)
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    assert raw["version"] == 2
    assert raw["session_id"] == "0x1000abcdef"
    assert raw["session_password"] == RECORD.session_password.hex()
    assert raw["written_at"] > 0
    read = session_file.read(tmp_path)
    assert read is not None
    assert read.session_id == RECORD.session_id
    assert read.session_password == RECORD.session_password
    assert (read.name, read.host, read.pid) == ("node-1", "host-a", 4242)


def test_a_new_session_replaces_the_old_one(tmp_path: Path) -> None:
    session_file.write(tmp_path, RECORD)
    newer = SessionRecord(**{**RECORD.__dict__, "session_id": 7, "session_password": b"\x01"})
    session_file.write(tmp_path, newer)
    read = session_file.read(tmp_path)
    assert read is not None
    assert (read.session_id, read.session_password) == (7, b"\x01")


def test_a_temp_file_left_by_a_crash_does_not_block_the_next_write(tmp_path: Path) -> None:
    (tmp_path / f".session.json.{os.getpid()}.tmp").write_text("half")
    session_file.write(tmp_path, RECORD)
    assert session_file.read(tmp_path) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json"]


def test_remove_deletes_the_file_once(tmp_path: Path) -> None:
    session_file.write(tmp_path, RECORD)
    assert session_file.remove(tmp_path) is True
    assert session_file.read(tmp_path) is None
    assert session_file.remove(tmp_path) is False


@pytest.mark.parametrize(
    "content",
    ["not json", "[]", '{"version": 2}', '{"version": 1, "name": "x"}', '{"version": 1}'],
)
def test_a_file_of_another_shape_is_refused(tmp_path: Path, content: str) -> None:
    session_file.path_in(tmp_path).write_text(content)
    with pytest.raises(ValueError, match="session file"):
        session_file.read(tmp_path)


def test_the_password_never_shows_in_the_repr() -> None:
    assert RECORD.session_password.hex() not in repr(RECORD)
    assert "***" in repr(RECORD)


def test_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o770)
    with pytest.raises(ConfigError, match=r"^node.state_dir: .* writable by group or others"):
        session_file.prepare(tmp_path)


def test_a_file_where_the_folder_should_be_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(ConfigError, match=r"^node.state_dir: cannot create .*file"):
        session_file.prepare(target)
    with pytest.raises(ConfigError, match=r"^node.state_dir: cannot create"):
        session_file.prepare(target / "below")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_folder_this_user_cannot_write_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"^node.state_dir: .* not writable"):
            session_file.prepare(tmp_path)
        with pytest.raises(ConfigError, match=r"^node.state_dir: cannot create"):
            session_file.prepare(tmp_path / "new")
    finally:
        tmp_path.chmod(0o700)


# -- the pid namespace and the lock (issue 19, item 5) -----------------------------------------

VERSION_2_KEYS = {
    "version", "name", "host", "pid", "zookeeper_hosts", "session_id", "session_password",
    "written_at", "election_path", "start_time", "boot_id",
}  # fmt: skip
"""What the release before the pid namespace reads (and, by name, only that: it ignores
other keys), and writes."""


def test_the_pid_namespace_and_the_lock_are_more_keys_of_a_version_2_file(
    tmp_path: Path,
) -> None:
    """Nodes of both releases may share a state folder during a rolling upgrade: the older
    reader still reads the file (it is version 2 and has every key it asks for)."""
    session_file.write(tmp_path, dataclasses.replace(RECORD, pid_namespace=4026531836))
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    assert raw["version"] == 2
    assert set(raw) - VERSION_2_KEYS == {"pid_namespace", "holds_lock"}
    assert set(raw) >= VERSION_2_KEYS
    read = session_file.read(tmp_path)
    assert read is not None
    assert read.pid_namespace == 4026531836


def test_an_older_file_without_a_pid_namespace_reads_as_unknown(tmp_path: Path) -> None:
    session_file.write(tmp_path, RECORD)
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    del raw["pid_namespace"]
    session_file.path_in(tmp_path).write_text(json.dumps(raw))
    read = session_file.read(tmp_path)
    assert read is not None
    assert read.pid_namespace is None


@pytest.mark.parametrize(
    ("key", "value"), [("pid", 0), ("pid", -1), ("pid", 2**31), ("pid_namespace", "x")]
)
def test_a_pid_or_namespace_that_names_nothing_is_malformed(
    tmp_path: Path, key: str, value: object
) -> None:
    """A pid of 0 or below would name a process group (or all processes) to a signal."""
    session_file.write(tmp_path, RECORD)
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    raw[key] = value
    session_file.path_in(tmp_path).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="malformed session file"):
        session_file.read(tmp_path)


# -- removing only the file asked about (issue 19, item 6) ------------------------------------

NEWER = dataclasses.replace(RECORD, session_id=0x2000002)


def _names(session_id: int) -> session_file.Check:
    return lambda record: record.session_id == session_id


def test_remove_only_while_the_file_names_that_session(tmp_path: Path) -> None:
    session_file.write(tmp_path, NEWER)
    assert session_file.remove(tmp_path, only_if=_names(RECORD.session_id)) is False
    kept = session_file.read(tmp_path)
    assert kept is not None
    assert kept.session_id == NEWER.session_id
    assert session_file.remove(tmp_path, only_if=_names(NEWER.session_id)) is True
    assert session_file.read(tmp_path) is None
    assert session_file.remove(tmp_path, only_if=_names(NEWER.session_id)) is False


def test_remove_with_a_check_keeps_a_file_it_cannot_read(tmp_path: Path) -> None:
    session_file.path_in(tmp_path).write_text('{"version": 3}')
    assert session_file.remove(tmp_path, only_if=_names(RECORD.session_id)) is False
    assert session_file.path_in(tmp_path).exists()


def test_remove_in_a_folder_that_is_not_there_is_false(tmp_path: Path) -> None:
    assert session_file.remove(tmp_path / "gone") is False
    assert session_file.remove(tmp_path / "gone", only_if=_names(1)) is False


@pytest.fixture
def released(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, whose lock this process lets go of after the test (a held one)."""
    yield tmp_path
    session_file.release(tmp_path)


def test_a_write_cannot_land_between_the_check_and_the_unlink(
    released: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reaper's remove (check, then unlink) and a node's write, in two real threads, the
    write started while the check runs: it waits for the unlink (the folder's lock), so
    the new file is written after it and stays."""
    session_file.write(released, RECORD)
    contended = threading.Event()
    written = threading.Event()
    real_try = session_file._try_lock

    def try_lock(fd: int) -> bool:  # the real lock, saying when it had to wait
        taken = real_try(fd)
        if not taken:
            contended.set()
        return taken

    def node_writes() -> None:
        session_file.write(released, NEWER, hold=True)
        written.set()

    writer = threading.Thread(target=node_writes)

    def check(record: SessionRecord) -> bool:  # runs between the read and the unlink
        writer.start()
        give_up = time.monotonic() + 30  # a hang guard only
        while not (contended.is_set() or written.is_set()) and time.monotonic() < give_up:
            time.sleep(0.001)
        return record.session_id == RECORD.session_id

    monkeypatch.setattr(session_file, "_try_lock", try_lock)
    assert session_file.remove(released, only_if=check) is True
    writer.join(30)
    assert not writer.is_alive()
    kept = session_file.read(released)
    assert kept is not None, "the node's new file was removed"
    assert kept.session_id == NEWER.session_id
    assert contended.is_set()  # the write waited for the remove


# -- the writer's lock: held while it lives -------------------------------------------------

HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def other_holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another live process holding ``tmp_path``'s lock until the test ends (or kills it)."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline() == "held\n"
        yield proc
        proc.kill()  # by its pid: ours
        proc.wait(30)


def test_a_writer_that_holds_the_lock_says_so_and_keeps_it_until_released(
    released: Path,
) -> None:
    session_file.write(released, RECORD, hold=True)
    raw = json.loads(session_file.path_in(released).read_text())
    assert raw["holds_lock"] is True
    assert session_file.lock_held(released) is True
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from allocator.session import file as session_file; "
         "print(session_file.lock_held(Path(sys.argv[1])))", str(released)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "True"  # what another process (a reaper) sees
    session_file.write(released, NEWER, hold=True)  # a new session: still held
    assert session_file.lock_held(released) is True
    assert session_file.remove(released) is True  # the holder's own removal
    session_file.release(released)
    assert session_file.lock_held(released) is False


def test_a_file_written_without_holding_says_so(tmp_path: Path) -> None:
    session_file.write(tmp_path, RECORD)
    assert json.loads(session_file.path_in(tmp_path).read_text())["holds_lock"] is False
    assert session_file.lock_held(tmp_path) is False
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    del raw["holds_lock"]  # an older release's file
    session_file.path_in(tmp_path).write_text(json.dumps(raw))
    read = session_file.read(tmp_path)
    assert read is not None
    assert read.holds_lock is False


def test_a_lock_that_cannot_be_probed_is_unknown(tmp_path: Path) -> None:
    assert session_file.lock_held(tmp_path / "gone") is None


def test_the_lock_dies_with_its_holder(tmp_path: Path, other_holder: subprocess.Popen[str]) -> None:
    assert session_file.lock_held(tmp_path) is True
    other_holder.kill()  # no clean-up of its own: the kernel lets go
    other_holder.wait(30)
    assert session_file.lock_held(tmp_path) is False


def test_nothing_is_removed_from_a_folder_another_live_process_holds(
    tmp_path: Path, other_holder: subprocess.Popen[str]
) -> None:
    path = session_file.path_in(tmp_path)
    path.write_text(json.dumps(RECORD.to_json()))
    assert session_file.remove(tmp_path) is False
    assert session_file.remove(tmp_path, only_if=_names(RECORD.session_id)) is False
    assert path.exists()


def test_a_second_holder_is_refused_not_kept_waiting(
    tmp_path: Path, other_holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another live process holds the folder (a second node with this state folder): the
    write fails (the node logs it and runs without a file) instead of waiting forever."""
    monkeypatch.setattr(session_file, "LOCK_WAIT_S", 0.0)
    with pytest.raises(OSError, match="another live process holds"):
        session_file.write(tmp_path, RECORD, hold=True)
    with pytest.raises(OSError, match="another live process holds"):
        session_file.write(tmp_path, RECORD)
    assert not session_file.path_in(tmp_path).exists()
    assert session_file.lock_held(tmp_path) is True  # still the other's, none of ours


def test_holds_lock_must_be_true_or_false(tmp_path: Path) -> None:
    session_file.write(tmp_path, RECORD)
    raw = json.loads(session_file.path_in(tmp_path).read_text())
    raw["holds_lock"] = "yes"
    session_file.path_in(tmp_path).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="malformed session file"):
        session_file.read(tmp_path)


def test_a_folder_that_cannot_be_locked_still_gets_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without ``flock`` on folders (NFS answers ENOLCK): the node still
    records its session, saying it holds no lock (the reaper's pid rules decide then), and
    removes it as before."""
    session_file.prepare(tmp_path)

    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(session_file.fcntl, "flock", no_flock)
    session_file.write(tmp_path, RECORD, hold=True)
    written = session_file.read(tmp_path)
    assert written is not None
    assert written.session_id == RECORD.session_id
    assert written.holds_lock is False
    assert session_file.lock_held(tmp_path) is None  # cannot be told
    assert session_file.remove(tmp_path, only_if=lambda r: r.session_id == RECORD.session_id)
    assert session_file.read(tmp_path) is None
