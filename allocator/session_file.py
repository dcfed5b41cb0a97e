"""The node's session file: its live ZooKeeper session, in a file only the node's user reads.

Rules:

- One file per node, ``<node.state_dir>/session.json``, mode 0600: the session password in
  it lets whoever holds it act as the node's session (close it, or create ephemeral znodes
  in its name), so it never leaves this file: not in ``/status``, a log line or an error.
- The content is one small JSON object (:class:`SessionRecord`): ``version`` (2),
  ``name``, ``host`` and ``pid`` of the node, ``zookeeper_hosts`` (with the chroot),
  ``session_id`` (hex, ``0x…``, as ``/status`` shows it), ``session_password`` (hex),
  ``written_at`` (Unix seconds), and what a reaper needs to prove the node dead
  (:mod:`allocator.reaper`): ``election_path``, the process's ``start_time`` (clock ticks
  since boot) and the host's ``boot_id``. Readers refuse another version.
- Written atomically and rewritten for every new session: a temp file created with
  ``O_CREAT | O_EXCL`` and mode 0600 in the same folder, fsynced, then renamed over the
  file; a reader sees the old session or the new one, never half a file.
- :func:`prepare` runs once at start: it creates the folder (mode 0700, parents as
  needed) and refuses (:class:`~allocator.errors.ConfigError`, one line) a path that is
  not a folder, is owned by another user, is writable by group or others, or cannot be
  written.
- :func:`remove` runs when the node has closed its session (every exit through the node's
  shutdown). A process that dies without it (SIGKILL, a crash, a power cut) leaves the
  file behind, naming a session that lives until ZooKeeper expires it, unless a reaper
  (:mod:`allocator.reaper`: the restarted node, its supervisor, ``allocator
  reap-session``) proves the process dead and closes the session first.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from allocator import files
from allocator.errors import ConfigError

FILE_NAME = "session.json"
VERSION = 2
FILE_MODE = 0o600
DIR_MODE = 0o700


@dataclass(frozen=True)
class SessionRecord:
    """What the session file holds (see the module rules)."""

    name: str
    host: str
    pid: int
    zookeeper_hosts: str
    session_id: int
    session_password: bytes
    written_at: float = 0.0
    election_path: str = ""
    start_time: int | None = None
    """When process ``pid`` started, in clock ticks since boot (with ``pid``, what tells it
    from a later process that reused the pid)."""
    boot_id: str = ""
    """The host's boot id when the file was written (a reboot ends every process)."""

    def __repr__(self) -> str:  # never show the password
        return (
            f"SessionRecord(name={self.name!r}, pid={self.pid}, "
            f"session_id={self.session_id:#x}, session_password=***)"
        )

    def to_json(self) -> dict[str, Any]:
        raw = asdict(self)
        raw["session_id"] = f"{self.session_id:#x}"
        raw["session_password"] = self.session_password.hex()
        return {"version": VERSION, **raw}

    @classmethod
    def from_json(cls, raw: Any) -> SessionRecord:
        """Parse a file's object; raises ValueError when it is not this version's shape."""
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            version = raw.get("version") if isinstance(raw, dict) else None
            raise ValueError(f"not a version {VERSION} session file (version {version!r})")
        try:
            return cls(
                name=str(raw["name"]),
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                zookeeper_hosts=str(raw["zookeeper_hosts"]),
                session_id=int(str(raw["session_id"]), 16),
                session_password=bytes.fromhex(str(raw["session_password"])),
                written_at=float(raw["written_at"]),
                election_path=str(raw["election_path"]),
                start_time=None if raw["start_time"] is None else int(raw["start_time"]),
                boot_id=str(raw["boot_id"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed session file: {type(exc).__name__}") from None


def path_in(state_dir: Path) -> Path:
    """``<state_dir>/session.json``."""
    return state_dir / FILE_NAME


def prepare(state_dir: Path) -> None:
    """Create ``state_dir`` (0700) if missing and check it may hold the file (module rules)."""
    key = "node.state_dir"
    try:
        state_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        info = state_dir.stat()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot create {state_dir}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{key}: {state_dir} is not a folder")
    if info.st_uid != os.geteuid():
        raise ConfigError(f"{key}: {state_dir} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{key}: {state_dir} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); make it 0700 or 0755"
        )
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {state_dir} is not writable by this user")


def write(state_dir: Path, record: SessionRecord) -> Path:
    """Replace the session file atomically with ``record`` (stamped now); returns its path."""
    data = json.dumps(replace(record, written_at=time.time()).to_json()) + "\n"
    return files.write_atomic(path_in(state_dir), data.encode(), mode=FILE_MODE)


def read(state_dir: Path) -> SessionRecord | None:
    """The recorded session; None when there is no file. Raises ValueError if it is garbage."""
    try:
        text = path_in(state_dir).read_text()
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError("session file is not JSON") from None
    return SessionRecord.from_json(raw)


def remove(state_dir: Path) -> bool:
    """Delete the session file; False when there was none."""
    try:
        path_in(state_dir).unlink()
    except FileNotFoundError:
        return False
    return True
