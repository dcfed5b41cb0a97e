"""The node's session file: its live ZooKeeper session, in a file only the node's user
reads.

One file per node, ``<node.state_dir>/session.json``, mode 0600: its session password lets
whoever holds it act as the node's session (close it, or create ephemeral znodes in its
name), so it never leaves this file: not in ``/status``, a log line or an error. A node that
dies without removing it leaves a session a reaper (:mod:`allocator.session.reaper`) may
close.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from allocator.core import files
from allocator.core.errors import ConfigError

FILE_NAME = "session.json"
VERSION = 2
FILE_MODE = 0o600
DIR_MODE = 0o700
PID_LIMIT = 2**31
"""Pids are positive C ints (0 and below would name a process group to a signal)."""
LOCK_WAIT_S = 2.0
"""How long a write waits for the folder's lock: a reaper holds it for a moment (a read and
an unlink); only another live node holds it for longer."""
_LOCK_RETRY_S = 0.01

# The folders whose lock this process holds (write with hold), by real path: the open
# folder whose flock it is. Closing it (release, or the process's exit) lets go.
_held: dict[str, int] = {}
_held_guard = threading.Lock()


@dataclass(frozen=True)
class SessionRecord:
    """What the session file holds: one small JSON object, ``version`` 2.

    ``name``, ``host`` and ``pid`` of the node, ``zookeeper_hosts`` (with the chroot),
    ``session_id`` (hex ``0x…``, as ``/status`` shows it), ``session_password`` (hex),
    ``written_at`` (Unix seconds), and what a reaper needs to prove the node dead:
    ``election_path``, the process's ``start_time`` (clock ticks since boot), the host's
    ``boot_id``, ``pid_namespace`` (the inode of the writer's ``/proc/self/ns/pid``; null
    when it could not see itself) and ``holds_lock`` (whether the writer holds the folder's
    lock).

    ``pid_namespace`` and ``holds_lock`` are optional keys of version 2, not a version 3: a
    file without them (an older release's) reads as "namespace unknown, no lock held", and
    the older reader, which ignores keys it does not know, still reads the new file, so both
    releases can share a state folder during a rolling upgrade.
    """

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
    pid_namespace: int | None = None
    """The pid namespace ``pid`` is a pid of (the inode of the writer's
    ``/proc/self/ns/pid``); None: not known (a file from before it was recorded, or a writer
    that could not see itself in ``/proc``)."""
    holds_lock: bool = False
    """The writer holds the state folder's lock for as long as it lives with this file
    (:func:`write` with ``hold``): a lock nobody holds proves it gone, in any namespace."""

    def __repr__(self) -> str:  # never show the password
        return (
            f"SessionRecord(name={self.name!r}, pid={self.pid}, "
            f"session_id={self.session_id:#x}, session_password=***)"
        )

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object."""
        raw = asdict(self)
        raw["session_id"] = f"{self.session_id:#x}"
        raw["session_password"] = self.session_password.hex()
        return {"version": VERSION, **raw}

    @classmethod
    def from_json(cls, raw: Any) -> SessionRecord:
        """Parse a file's object; raises ValueError when it is not this version's shape.

        Another version is refused, and so is a ``pid`` that is not a process id (below 1,
        or beyond a C int).
        """
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            version = raw.get("version") if isinstance(raw, dict) else None
            raise ValueError(f"not a version {VERSION} session file (version {version!r})")
        try:
            # absent in files of older releases: unknown, not held
            pid_namespace = raw.get("pid_namespace")
            holds_lock = raw.get("holds_lock", False)
            if not isinstance(holds_lock, bool):
                raise TypeError("holds_lock")
            record = cls(
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
                pid_namespace=None if pid_namespace is None else int(pid_namespace),
                holds_lock=holds_lock,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed session file: {type(exc).__name__}") from None
        if not 0 < record.pid < PID_LIMIT:
            raise ValueError("malformed session file: pid is not a process id")
        return record


def path_in(state_dir: Path) -> Path:
    """``<state_dir>/session.json``."""
    return state_dir / FILE_NAME


def prepare(state_dir: Path) -> None:
    """Create ``state_dir`` (0700, parents as needed) if missing and check it may hold the
    file; runs once at start.

    Refuses (:class:`~allocator.core.errors.ConfigError`, one line) a path that is not a
    folder, is owned by another user, is writable by group or others, or cannot be written.
    """
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


_NO_FLOCK = frozenset({errno.ENOLCK, errno.EBADF, errno.EINVAL, errno.EOPNOTSUPP})
"""What ``flock`` on a folder answers where the file system has no such lock (NFS)."""


class _LockUnsupportedError(OSError):
    """The state folder's file system cannot lock it (:data:`_NO_FLOCK`)."""


def _try_lock(fd: int) -> bool:
    """Take the lock of the open folder ``fd`` if nobody holds it; False if somebody does.
    The one place a lock is taken (a test replaces it to see a writer wait). Raises
    :class:`_LockUnsupportedError` where the file system has no lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in _NO_FLOCK:
            raise _LockUnsupportedError(exc.errno, exc.strerror) from exc
        raise
    return True


def _lock_within(fd: int, wait_s: float) -> bool:
    """Take the lock, waiting up to ``wait_s`` for a reaper that holds it for a moment."""
    deadline = time.monotonic() + wait_s
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_LOCK_RETRY_S)
    return True


def _open_folder(state_dir: Path) -> int:
    return os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)


def _holds(state_dir: Path) -> bool:
    with _held_guard:
        return os.path.realpath(state_dir) in _held


@contextlib.contextmanager
def _exclusive(state_dir: Path, wait_s: float) -> Iterator[bool]:
    """True while this process has the folder's lock (it holds it, or took it now, within
    ``wait_s``); False when another process holds it."""
    if _holds(state_dir):
        yield True
        return
    fd = _open_folder(state_dir)
    try:
        yield _lock_within(fd, wait_s)
    finally:
        os.close(fd)  # releases the lock, if taken


def _busy(state_dir: Path) -> OSError:
    return OSError(
        errno.EBUSY,
        "another live process holds the state folder's lock (a second node with this "
        "node.state_dir?)",
        str(state_dir),
    )


def _hold(state_dir: Path) -> None:
    """Take the folder's lock for this process, to keep until :func:`release`."""
    fd = _open_folder(state_dir)
    try:
        if not _lock_within(fd, LOCK_WAIT_S):
            raise _busy(state_dir)
    except BaseException:
        os.close(fd)
        raise
    with _held_guard:
        _held[os.path.realpath(state_dir)] = fd


def write(state_dir: Path, record: SessionRecord, *, hold: bool = False) -> Path:
    """Replace the session file atomically with ``record`` (stamped now); returns its path.

    Rewritten for every new session: a temporary file (``O_CREAT | O_EXCL``, mode 0600, same
    folder), fsynced, then renamed over the file, so a reader sees the old session or the
    new one. The folder's lock is ``flock`` on the folder itself (no lock file to own or
    clean up); ``hold``: the writer is the process ``record`` names and keeps the lock from
    now until :func:`release` or its exit (``holds_lock`` in the file); the kernel lets go
    of it when the process dies, never while it is paused. A write waits up to
    :data:`LOCK_WAIT_S` for the lock (a reaper holds it for a moment), then raises OSError
    (EBUSY: another live node holds this folder, a configuration error) rather than wait
    forever. Where the file system has no ``flock`` (NFS) the file is written without it,
    ``holds_lock`` false: the pid rules decide, as for an older release's file.
    """
    locks = True
    if hold and not _holds(state_dir):
        try:
            _hold(state_dir)
        except _LockUnsupportedError:  # a file system without flock: the pid rules decide
            hold = locks = False
    stamped = replace(record, written_at=time.time(), holds_lock=hold)
    data = (json.dumps(stamped.to_json()) + "\n").encode()
    if not locks:
        return files.write_atomic(path_in(state_dir), data, mode=FILE_MODE)
    with _exclusive(state_dir, LOCK_WAIT_S) as mine:
        if not mine:
            raise _busy(state_dir)
        return files.write_atomic(path_in(state_dir), data, mode=FILE_MODE)


def release(state_dir: Path) -> None:
    """Let go of the folder's lock this process holds (:func:`write` with ``hold``), if it
    does; after its file is removed."""
    with _held_guard:
        fd = _held.pop(os.path.realpath(state_dir), None)
    if fd is not None:
        os.close(fd)


def lock_held(state_dir: Path) -> bool | None:
    """Whether a live process holds the folder's lock (this one, or another); None when it
    cannot be told (the folder cannot be opened or locked).

    This tells a reaper whether the writer lives, in any pid namespace.
    """
    if _holds(state_dir):
        return True
    try:
        fd = _open_folder(state_dir)
    except OSError:
        return None
    try:
        return not _try_lock(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # releases it, if this took it


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


Check = Callable[[SessionRecord], bool]
"""Whether the file (as read now) is the one to remove."""


def remove(state_dir: Path, *, only_if: Check | None = None) -> bool:
    """Delete the session file; False when there was none, when another live process holds
    the folder's lock (the file is that process's, or will be), or when ``only_if`` says
    it is not the one.

    Takes the lock without waiting. ``only_if`` (the reaper's "still names the session I
    closed", the node's "written by this process") and the unlink are one step under the
    lock, so a file written meanwhile by a restarted node is never the one removed; a file
    the check cannot read is never the one. The node calls it once it has closed its session
    (every exit through its shutdown); a process that dies without it leaves the file, and
    its session lives until ZooKeeper expires it unless a reaper closes it first.
    """
    try:
        with _exclusive(state_dir, 0.0) as mine:
            return mine and _remove_unlocked(state_dir, only_if)
    except _LockUnsupportedError:  # a file system without flock: check and unlink as before
        return _remove_unlocked(state_dir, only_if)
    except FileNotFoundError:  # no folder
        return False


def _remove_unlocked(state_dir: Path, only_if: Check | None) -> bool:
    if only_if is not None:
        try:
            record = read(state_dir)
        except ValueError:
            return False
        if record is None or not only_if(record):
            return False
    try:
        path_in(state_dir).unlink()
    except FileNotFoundError:
        return False
    return True
