"""Background server processes of the embedded cluster: start, check, stop, read their logs
(docs/design.md §8). No pid files: the caller records pid and argv (``cluster.json``,
``nodes.json``), and a pid is trusted only while it still runs the argv recorded with it.
"""

from __future__ import annotations

import contextlib
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

from allocator.core import logs
from allocator.core.errors import LocalClusterError, ServerStartError

log = logs.get_logger(__name__)

POLL_INTERVAL_S = 0.02
# How long an empty cmdline of a live user process is re-read before it counts as "not ours":
# an exec takes well under a millisecond of CPU, this leaves room for a loaded machine.
EXEC_GRACE_S = 0.2
_EXEC_REREAD_S = 0.002
# Bits of /proc/<pid>/stat field 9 ("flags"), include/linux/sched.h.
_PF_EXITING = 0x00000004
_PF_KTHREAD = 0x00200000
TAIL_LINES = 20
_TAIL_READ_BYTES = 64 * 1024

# Popen objects of daemons this process started and that have not been reaped yet.
_children: dict[int, subprocess.Popen[bytes]] = {}

# What :func:`stop_all` stops: (pid, argv) or (pid, argv, start time); see :func:`is_alive`.
Target = tuple[int, Sequence[str]] | tuple[int, Sequence[str], int | None]


@dataclass(frozen=True)
class OsUser:
    """An OS account a command runs as (PostgreSQL must not run as root): the child drops to
    its uid, gid and groups before ``exec``, in a working directory that user can reach."""

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
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: OsUser | None = None,
) -> Daemon:
    """Start ``argv`` detached in its own session, output appended to ``log_path``.

    Its own session, stdin from /dev/null: it survives this process and a terminal hang-up,
    so ``allocator local up`` can exit and leave it running. The ``Popen`` stays in a
    registry until the process is reaped (by a check), so none is garbage-collected while
    running."""
    argv = tuple(argv)
    proc, offset = _popen(argv, log_path=log_path, env=env, cwd=cwd, user=user)
    _children[proc.pid] = proc
    log.debug("process_started", pid=proc.pid, argv=shlex.join(argv))
    return Daemon(proc.pid, argv, log_path, offset)


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Like :func:`start`, but the caller owns the ``Popen`` and must reap it (``poll``): the
    node supervisor, which needs the exit codes."""
    proc, _offset = _popen(tuple(argv), log_path=log_path, env=env, cwd=cwd, user=None)
    log.debug("process_spawned", pid=proc.pid, argv=shlex.join(argv))
    return proc


def _popen(
    argv: tuple[str, ...],
    *,
    log_path: Path,
    env: Mapping[str, str] | None,
    cwd: Path | None,
    user: OsUser | None,
) -> tuple[subprocess.Popen[bytes], int]:
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
    return proc, offset


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


def is_alive(pid: int | None, argv: Sequence[str], started: int | None = None) -> bool:
    """True if ``pid`` runs, is not a zombie, and still runs ``argv`` (non-empty).

    A pid alone proves nothing (pids are recycled): an empty argv never matches, a pid that
    now runs something else is "not alive". With ``started`` (see :func:`start_time`), the
    process must also have started then: where several processes share one argv (the
    nodes), a recycled pid cannot repeat that. Our own unreaped child cannot have had its
    pid recycled: it is alive while ``Popen.poll()`` is None, and ours if ``Popen.args`` is
    ``argv``; no cmdline is read, since right after ``Popen`` returns it may still read
    empty (the exec is in progress). Any other pid is compared with ``/proc/<pid>/cmdline``
    (:func:`_read_proc`). A zombie counts as dead; our child is reaped when checked.
    """
    if pid is None or pid <= 0 or not argv:
        return False
    proc = _children.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _children[pid]
            return False
        # Our unreaped child keeps its pid; Popen.args is the argv tuple _popen passed.
        if proc.args != tuple(argv):
            return False
        return started is None or start_time(pid) == started
    found = _read_proc(pid)
    if found is None or found[0] != tuple(argv):
        return False
    return started is None or found[1] == started


def is_pid_alive(pid: int | None) -> bool:
    """True if some process that is not a zombie has ``pid``, whatever it runs.

    For "is it gone?" checks only; never decide on a signal with it (use :func:`is_alive`).
    A kernel thread does not count: it cannot be a process we started.
    """
    if pid is None or pid <= 0:
        return False
    proc = _children.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            del _children[pid]
            return False
        return True  # our unreaped child, maybe still inside execve
    return _read_proc(pid) is not None


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None if it is gone (or a zombie)."""
    stat = _read_stat(pid)
    return None if stat is None or stat.state in ("Z", "X") else stat.started


def is_paused(pid: int | None) -> bool:
    """True if ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP: state ``T``)."""
    stat = None if pid is None or pid <= 0 else _read_stat(pid)
    return stat is not None and stat.state == "T"


def cmdline(pid: int) -> tuple[str, ...] | None:
    """argv of ``pid`` as ``/proc`` shows it; None if gone, a zombie or a kernel thread.

    Right after a start the argv may not be set up yet: this waits for it (up to
    :data:`EXEC_GRACE_S`) rather than answer None for a process that is running.
    """
    found = _read_proc(pid)
    return None if found is None else found[0]


def send_signal(
    pid: int | None, argv: Sequence[str], sig: signal.Signals, started: int | None = None
) -> bool:
    """Send ``sig`` to ``pid`` only while it runs ``argv`` (and started then); True if sent.

    The check and the signal go through one pidfd, so the process cannot be swapped in
    between."""
    if pid is None:
        return False
    pidfd = _pidfd_open(pid)
    try:
        if not is_alive(pid, argv, started):
            return False
        _signal(pid, pidfd, sig)
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def stop(
    pid: int | None,
    argv: Sequence[str],
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout_s: float = 10.0,
) -> bool:
    """Stop one process; True if it was running. See :func:`stop_all`."""
    targets: list[Target] = [] if pid is None else [(pid, tuple(argv))]
    stopped = stop_all(targets, sig=sig, timeout_s=timeout_s)
    return bool(stopped)


def stop_all(
    targets: Sequence[Target],
    *,
    sig: signal.Signals = signal.SIGTERM,
    timeout_s: float = 10.0,
    kill_timeout_s: float = 5.0,
) -> list[int]:
    """Signal every live target at once, wait for all, SIGKILL the ones left; return those hit.

    A signal other than SIGKILL is followed by SIGCONT (as systemd does), so a paused process
    sees it now. SIGKILL goes to the process, its group and its direct children
    (:func:`_kill_hard`).
    Raises :class:`LocalClusterError` if a process survives SIGKILL (it would have to be
    stuck in the kernel), naming the pid. A signal we may not send (``PermissionError``)
    propagates: the caller keeps that process recorded.
    """
    with contextlib.ExitStack() as stack:
        live: list[tuple[int, tuple[str, ...], int | None]] = []
        for target in targets:
            pid, argv = target[0], tuple(target[1])
            started = target[2] if len(target) == 3 else None
            pidfd = _pidfd_open(pid)
            if pidfd is not None:
                stack.callback(os.close, pidfd)
            if is_alive(pid, argv, started):
                live.append((pid, argv, pidfd))
        for pid, _argv, pidfd in live:
            if sig == signal.SIGKILL:
                _kill_hard(pid, pidfd)
            else:
                _signal(pid, pidfd, sig)
                if sig != signal.SIGCONT:
                    _signal(pid, pidfd, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        stubborn = [t for t in live if not _wait_exit(t[0], t[1], t[2], deadline)]
        for pid, _argv, pidfd in stubborn:
            log.warning("process_kill_escalated", pid=pid, after_s=timeout_s, signal=sig.name)
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


@dataclass(frozen=True)
class _Stat:
    """The fields of ``/proc/<pid>/stat`` this module reads."""

    state: str  # field 3
    flags: int  # field 9, PF_* bits
    started: int  # field 22, clock ticks since boot

    @property
    def is_zombie(self) -> bool:
        """Exited, not reaped yet (or being reaped): dead, whatever it ran."""
        return self.state in ("Z", "X")

    @property
    def is_kernel_thread(self) -> bool:
        """Never started by us; its cmdline is always empty, so never worth re-reading."""
        return bool(self.flags & _PF_KTHREAD)

    @property
    def is_exiting(self) -> bool:
        """In ``do_exit``: once its memory is released, its cmdline stays empty for good."""
        return bool(self.flags & _PF_EXITING)


def _read_stat(pid: int) -> _Stat | None:
    """Fields 3, 9 and 22 of ``/proc/<pid>/stat``; None if the process is gone (reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return _Stat(fields[0], int(fields[6]), int(fields[19]))


def _read_cmdline(pid: int) -> bytes | None:
    """Raw ``/proc/<pid>/cmdline`` (NUL-separated); None if the process is gone.

    The single place the cmdline is read, so that a test can replace it (monkeypatch) and
    show what an exec in progress (an empty read) does to the callers.
    """
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _read_proc(pid: int) -> tuple[tuple[str, ...], int] | None:
    """(argv, start time) of ``pid``; None if gone, a zombie or a kernel thread (``PF_KTHREAD``),
    or if its cmdline reads empty while it exits (``PF_EXITING``: its memory is gone).

    An empty cmdline of a process that is not exiting is an exec in progress (the new argv is
    not set up yet): read again for up to :data:`EXEC_GRACE_S`, then give up (None). An
    exiting process's cmdline never comes back, so it is not waited for. The stat is read
    after the cmdline too, so a pid recycled between the two reads is never paired with the
    other process's start time.
    """
    deadline = time.monotonic() + EXEC_GRACE_S
    while True:
        before = _read_stat(pid)
        if before is None or before.is_zombie or before.is_kernel_thread:
            return None
        raw = _read_cmdline(pid)
        if raw is None:
            return None
        if raw:
            after = _read_stat(pid)
            if after is None or after.started != before.started:
                return None
            break
        if before.is_exiting or time.monotonic() >= deadline:
            return None
        time.sleep(_EXEC_REREAD_S)
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return tuple(os.fsdecode(part) for part in parts), before.started


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
    """SIGKILL the process, then its own process group and its direct children (PostgreSQL's
    children each ``setsid()``, so a group kill alone would miss them)."""
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
