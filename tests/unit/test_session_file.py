"""allocator.session_file: a private, atomically replaced file; a checked folder."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator import session_file
from allocator.errors import ConfigError
from allocator.session_file import SessionRecord

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
