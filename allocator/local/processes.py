"""Background server processes of the embedded cluster: start, check, stop, read their logs.

Rules:

- A daemon starts in its own session (``start_new_session=True``): stdin from /dev/null,
  stdout and stderr appended to its log file, a pid file next to it. It survives the manager
  process and a terminal hang-up, so ``allocator local up`` can exit and leave it running.
- A pid alone proves nothing, pids are recycled. Every check and every signal carries the
  argv we started, compared with ``/proc/<pid>/cmdline``: a pid that now runs something else
  is "not alive" and is never signalled. The check and the signal go through one pidfd, so
  the process cannot be swapped in between.
- Zombies count as dead. Children of this process are reaped when checked: their ``Popen``
  objects live in a registry until they exit, so none is garbage-collected while running.
- :func:`stop` sends one signal (SIGTERM unless told otherwise), waits up to a timeout for
  the exit, then SIGKILLs that process, its process group and its direct children only
  (PostgreSQL's children each ``setsid()``, so a group kill alone would miss them).
- Commands that must not run as root (PostgreSQL) run as an :class:`OsUser`: the child drops
  to that user's uid, gid and groups before ``exec`` (subprocess ``user``/``group``/
  ``extra_groups``), in a working directory that user can reach.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from allocator.errors import LocalClusterError, ServerStartError

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.02
TAIL_LINES = 20
_TAIL_READ_BYTES = 64 * 1024

# Popen objects of daemons this process started and that have not been reaped yet.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class OsUser:
    """An OS account a command runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def lookup(cls, name: str) -> OsUser:
        """The account ``name``; ``KeyError`` if there is none."""
        entry = pwd.getpwnam(name)
        return cls(name, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(name, entry.pw_gid)))

    @classmethod
    def current(cls) -> OsUser:
        """The account this process runs as."""
        entry = pwd.getpwuid(os.geteuid())
        return cls(entry.pw_name, entry.pw_uid, os.getegid(), tuple(os.getgroups()))

    @property
    def is_switch(self) -> bool:
        """True if running as this user means dropping privileges from ours."""
        return self.uid != os.geteuid()


@dataclass(frozen=True)
class Daemon:
    """A process started by :func:`start`; its output starts at ``log_offset`` in the log."""

    pid: int
    argv: tuple[str, ...]
    log_path: Path
    log_offset: int


def start(
    argv: Sequence[str],
    *,
    log_path: Path,
    pid_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: OsUser | None = None,
) -> Daemon:
    """Start ``argv`` detached in its own session, output appended to ``log_path``."""
    argv = tuple(argv)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    switch = user is not None and user.is_switch
    with log_path.open("ab") as log_file:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
        log_file.write(f"--- {stamp} allocator local: starting {shlex.join(argv)}\n".encode())
        log_file.flush()
        offset = log_file.tell()  # tails of this run show the process's own words only
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                user=user.uid if switch and user else None,
                group=user.gid if switch and user else None,
                extra_groups=list(user.groups) if switch and user else None,
            )
        except OSError as exc:
            raise ServerStartError(f"could not start {argv[0]}") from exc
    _children[proc.pid] = proc
    if pid_path is not None:
        write_pid_file(pid_path, proc.pid)
    log.debug("process_started pid=%d argv=%s", proc.pid, shlex.join(argv))
    return Daemon(proc.pid, argv, log_path, offset)


def run(
    argv: Sequence[str],
    *,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: OsUser | None = None,
    timeout_s: float = 120.0,
) -> int:
    """Run ``argv`` in the foreground (as ``user``), output appended to ``log_path``."""
    switch = user is not None and user.is_switch
    with contextlib.ExitStack() as stack:
        log_file: IO[bytes] | int = subprocess.DEVNULL
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = stack.enter_context(log_path.open("ab"))
            log_file.write(f"--- allocator local: running {shlex.join(argv)}\n".encode())
            log_file.flush()
        try:
            done = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                user=user.uid if switch and user else None,
                group=user.gid if switch and user else None,
                extra_groups=list(user.groups) if switch and user else None,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServerStartError(f"could not run {argv[0]}") from exc
    return done.returncode


def is_alive(pid: int | None, argv: Sequence[str]) -> bool:
    """True if ``pid`` runs, is not a zombie, and still runs ``argv``."""
    if pid is None or pid <= 0:
        return False
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        del _children[pid]
        return False
    return _runs(pid, tuple(argv))


def is_pid_alive(pid: int | None) -> bool:
    """True if some process that is not a zombie has ``pid``, whatever it runs.

    For "is it gone?" checks only; never decide on a signal with it (use :func:`is_alive`).
    """
    if pid is None or pid <= 0:
        return False
    proc = _children.get(pid)
    if proc is not None and proc.poll() is not None:
        del _children[pid]
        return False
    return _read_cmdline(pid) is not None


def stop(
    pid: int | None,
    argv: Sequence[str],
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout_s: float = 10.0,
    pid_path: Path | None = None,
) -> bool:
    """Stop one process; True if it was running. See :func:`stop_all`."""
    targets = [] if pid is None else [(pid, tuple(argv))]
    stopped = stop_all(targets, sig=sig, timeout_s=timeout_s)
    if pid_path is not None:
        remove_pid_file(pid_path)
    return bool(stopped)


def stop_all(
    targets: Sequence[tuple[int, Sequence[str]]],
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout_s: float = 10.0,
    kill_timeout_s: float = 5.0,
) -> list[int]:
    """Signal every live target at once, wait for all, SIGKILL the ones left; return those hit.

    Raises :class:`LocalClusterError` if a process survives SIGKILL (it would have to be
    stuck in the kernel), naming the pid.
    """
    with contextlib.ExitStack() as stack:
        live: list[tuple[int, tuple[str, ...], int | None]] = []
        for pid, argv in targets:
            pidfd = _pidfd_open(pid)
            if pidfd is not None:
                stack.callback(os.close, pidfd)
            if is_alive(pid, argv):
                live.append((pid, tuple(argv), pidfd))
        for pid, _argv, pidfd in live:
            if sig == signal.SIGKILL:
                _kill_hard(pid, pidfd)
            else:
                _signal(pid, pidfd, sig)
        deadline = time.monotonic() + timeout_s
        stubborn = [t for t in live if not _wait_exit(t[0], t[1], t[2], deadline)]
        for pid, _argv, pidfd in stubborn:
            log.warning(
                "process_kill_escalated pid=%d after=%.1fs signal=%s", pid, timeout_s, sig.name
            )
            _kill_hard(pid, pidfd)
        deadline = time.monotonic() + kill_timeout_s
        for pid, argv, pidfd in stubborn:
            if not _wait_exit(pid, argv, pidfd, deadline):
                raise LocalClusterError(f"process {pid} did not exit after SIGKILL")
        return [pid for pid, _argv, _fd in live]


def tail(log_path: Path, n: int = TAIL_LINES, offset: int = 0) -> str:
    """The last ``n`` lines of ``log_path`` written after byte ``offset`` ("" if none)."""
    try:
        with log_path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, size - _TAIL_READ_BYTES, 0))
            data = handle.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()
    return "\n".join(lines[-n:])


def write_pid_file(path: Path, pid: int) -> None:
    """Write ``pid`` to ``path`` atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def remove_pid_file(path: Path) -> None:
    """Remove a pid file if present."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _read_cmdline(pid: int) -> tuple[str, ...] | None:
    """argv of ``pid``, or None if it does not exist or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    state = stat.rpartition(")")[2].split()[0]
    if state in ("Z", "X"):
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return tuple(os.fsdecode(part) for part in parts)


def _runs(pid: int, argv: tuple[str, ...]) -> bool:
    return _read_cmdline(pid) == argv


def _pidfd_open(pid: int) -> int | None:
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _signal(pid: int, pidfd: int | None, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)


def _kill_hard(pid: int, pidfd: int | None) -> None:
    """SIGKILL the process, then its own process group and its direct children."""
    children = list(_children_of(pid))
    _signal(pid, pidfd, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        # Started with start_new_session, our daemon leads its group; never kill another.
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def _children_of(pid: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid):
            yield int(entry.name)


def _wait_exit(pid: int, argv: tuple[str, ...], pidfd: int | None, deadline: float) -> bool:
    """Wait until ``pid`` no longer runs ``argv`` or ``deadline`` passes; True if it exited."""
    proc = _children.get(pid)
    if proc is not None:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        _children.pop(pid, None)
        return True
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll(max(0, int((deadline - time.monotonic()) * 1000)))
    while is_alive(pid, argv):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL_S)
    return True
