"""Reaping a dead node's ZooKeeper session, so its successor does not wait for the timeout.

When a node dies without closing its session (SIGKILL, an OOM kill, a crash) its election
znode lives on until ZooKeeper expires it. Its replacement or supervisor can end that wait:
attach with the id and password the dead node kept in its session file
(:mod:`allocator.session.file`) and close the session, once :func:`decide` proves it dead.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from allocator.config import Config
from allocator.core import logs
from allocator.core.zookeeper_hosts import servers_of
from allocator.session import file as session_file
from allocator.session.file import SessionRecord

log = logs.get_logger(__name__)

_KAZOO_LOG = logging.getLogger("allocator.session.reaper.kazoo")
_KAZOO_LOG.setLevel(logging.WARNING)  # its connect/close chatter is not news here
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
PROC: Final = Path("/proc")
DEFAULT_TIMEOUT_S: Final = 5.0


class Action(Enum):
    """What :func:`decide` concluded about a session file."""

    NOTHING = "nothing"
    """No session file: nothing to reap."""
    IGNORE = "ignore"
    """A file that is not ours to act on (another cluster, name, host; unreadable)."""
    ALIVE = "alive"
    """The recorded process still runs (perhaps paused): never reaped."""
    REAP = "reap"
    """Proved dead: close its session and remove its file."""


@dataclass(frozen=True)
class Decision:
    """An :class:`Action` and the one-line reason logged with it."""

    action: Action
    reason: str


@dataclass(frozen=True)
class Self:
    """Who is asking: the cluster, this node's name and this host."""

    zookeeper_hosts: str
    election_path: str
    name: str
    host: str


def self_of(config: Config, host: str | None = None) -> Self:
    """Who a node of ``config`` is (``host``: this host's name by default)."""
    return Self(
        zookeeper_hosts=config.zookeeper.hosts,
        election_path=config.zookeeper.election_path,
        name=config.node.resolved_name(),
        host=host or socket.gethostname(),
    )


def boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The host's boot id ("" where the kernel does not say)."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def own_start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), for the session file; None
    when ``/proc`` cannot say."""
    try:
        return start_time_of(pid)
    except OSError:
        return None


def pid_namespace(proc: Path = PROC) -> int | None:
    """This process's pid namespace (the inode of ``/proc/self/ns/pid``), for the session
    file and the reaper; None when this process cannot see itself in ``proc``: not mounted,
    unreadable, or the ``/proc`` of another pid namespace (there, its ``NSpid`` is not its
    own pid alone). Then no pid read from that ``/proc`` proves anything."""
    try:
        status = (proc / "self" / "status").read_text()
        namespace = (proc / "self" / "ns" / "pid").stat().st_ino
    except OSError:
        return None
    nspid = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
    return namespace if nspid == [[str(os.getpid())]] else None


def start_time_of(pid: int, proc: Path = PROC) -> int | None:
    """When ``pid`` (of this pid namespace) started; None when no such process runs (or
    only its zombie). Raises OSError when ``proc`` cannot say: unreadable, or not showing a
    pid that runs (``kill(pid, 0)`` finds it). Judge only when :func:`pid_namespace` is not
    None for the same ``proc``."""
    if pid <= 0:  # kill() would take it for a process group
        raise OSError(errno.EINVAL, f"not a process id: {pid}")
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # it runs, as another user
        raise OSError(errno.ENOENT, f"pid {pid} runs but {proc} does not show it") from None
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def decide(
    record: SessionRecord | None,
    me: Self,
    *,
    boot_id_now: str,
    pid_namespace_now: int | None,
    lock_held: bool | None = None,
    started: Callable[[int], int | None] = start_time_of,
    exited_pid: int | None = None,
) -> Decision:
    """What to do with ``record`` (pure but for ``started``).

    Attaching takes a live session away from its owner, so nothing is reaped before the
    process is proved dead *on this host*:

    - The file must name this cluster (ZooKeeper hosts with the chroot, election path), this
      node's name and this host; another cluster's, name's or host's file, or one that does
      not parse, is ignored and reported, never removed. A node whose ``node.name`` is not
      configured gets ``<hostname>-<pid>``, a new name at every start, so it never reaps.
    - Then one proof: the caller's child handle saw the process exit (``exited_pid``); or
      nobody holds the state folder's lock the writer took with the file (``holds_lock``:
      the kernel drops it when the process dies, in any pid namespace, never while it is
      paused; a held lock proves it alive); or the host's boot id changed (a reboot ends
      every process, but a held lock wins: a reaper that reads another boot id may run on
      another kernel); or, where the lock cannot be probed or the file does not say its
      writer held it (an older release, no ``flock``), the recorded pid is gone or has
      another start time (a reused pid). Liveness is never judged from
      ``/proc/<pid>/cmdline`` (empty for a moment right after an exec).
    - The pid rules: a pid means something only in its pid namespace, and "I cannot see that
      pid" is never death. Pid and start time are judged only by a reaper that sees itself
      in a ``/proc`` of its own pid namespace and runs in the namespace the file names;
      otherwise (another namespace, as ``docker compose run node-1 reap-session`` or a
      ``kubectl debug`` container; a missing or foreign ``/proc``; a file that names no
      namespace) the process counts as alive. A pid whose ``/proc/<pid>`` cannot be read
      (``hidepid``) is alive too: "gone" takes both ``/proc`` and ``kill(pid, 0)`` saying
      so. The child handle does not hold when the file names another pid namespace than the
      caller's, or the caller cannot see its own.
    - A paused process (SIGSTOP, a frozen VM) still runs with its start time: never reaped;
      it is left to its session timeout, and to the fence.

    ``pid_namespace_now``: :func:`pid_namespace` of the caller (None: it cannot see itself).
    ``lock_held``: :func:`allocator.session.file.lock_held` of the state folder (None: not
    known). ``started``: :func:`start_time_of`, None for a pid that is gone, OSError when it
    cannot say.
    """
    if record is None:
        return Decision(Action.NOTHING, "no session file")
    if (record.zookeeper_hosts, record.election_path) != (me.zookeeper_hosts, me.election_path):
        return Decision(
            Action.IGNORE,
            f"written for another cluster ({record.zookeeper_hosts} {record.election_path})",
        )
    if record.name != me.name:
        return Decision(Action.IGNORE, f"written by another node ({record.name})")
    if record.host != me.host:
        return Decision(Action.IGNORE, f"written on another host ({record.host})")
    pid = record.pid
    ours = record.pid_namespace is None or record.pid_namespace == pid_namespace_now
    if exited_pid is not None and exited_pid == pid and ours:
        return Decision(Action.REAP, f"pid {pid} exited (the supervisor saw it)")
    if record.holds_lock and lock_held:  # before the boot id: a held lock is a live kernel's
        return Decision(
            Action.ALIVE,
            f"pid {pid} still holds the state folder's lock: it runs (perhaps paused), not reaped",
        )
    if record.boot_id and boot_id_now and record.boot_id != boot_id_now:
        return Decision(Action.REAP, "the host rebooted since the file was written")
    if record.holds_lock and lock_held is not None:
        return Decision(Action.REAP, f"pid {pid} no longer holds the state folder's lock")
    if pid_namespace_now is None:
        return Decision(
            Action.ALIVE,
            f"this process cannot see itself in /proc (not mounted, unreadable, or another "
            f"pid namespace's), so pid {pid} cannot be judged: not reaped",
        )
    if record.pid_namespace is None:
        return Decision(
            Action.ALIVE,
            f"the file does not name the pid namespace of pid {pid} (written by an older "
            f"release, or a process that could not see itself), so it cannot be judged "
            f"here: not reaped",
        )
    if record.pid_namespace != pid_namespace_now:
        return Decision(
            Action.ALIVE,
            f"pid {pid} is a pid of another pid namespace ({record.pid_namespace}, this is "
            f"{pid_namespace_now}): it cannot be judged here, not reaped",
        )
    try:
        now = started(pid)
    except OSError as exc:
        return Decision(Action.ALIVE, f"cannot read /proc for pid {pid} ({exc}): not reaped")
    if now is None:
        return Decision(Action.REAP, f"pid {pid} no longer runs")
    if record.start_time is None:
        return Decision(Action.ALIVE, f"pid {pid} runs and the file has no start time")
    if now != record.start_time:
        return Decision(Action.REAP, f"pid {pid} is another process now")
    return Decision(Action.ALIVE, f"pid {pid} still runs (perhaps paused): not reaped")


def close_session(hosts: str, credentials: tuple[int, bytes], timeout_s: float) -> bool:
    """Attach to the session ``credentials`` and close it; True if it was alive.

    Connects without the chroot (closing needs no path). If the session had already
    expired the server hands out a new one instead, which is closed at once."""
    servers = servers_of(hosts)
    client = KazooClient(hosts=servers, client_id=credentials, timeout=timeout_s, logger=_KAZOO_LOG)
    try:
        client.start(timeout=timeout_s)
        attached = client.client_id is not None and client.client_id[0] == credentials[0]
    finally:
        client.stop()  # closes the session we are attached to (ephemerals deleted)
        client.close()
    return attached


def reap(
    state_dir: Path,
    me: Self,
    *,
    exited_pid: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Decision:
    """Read the session file in ``state_dir``, :func:`decide`, and reap if allowed; logs one
    line.

    A session already gone is a no-op. Safe even if the proof were wrong: the "dead" process
    would see its session closed and stop itself at once (docs/design.md §4), and anything
    it still tried to write carries its old token, which the fence rejects once the
    successor has taken it (§3). Reaping can cost a live node its session; it can never make
    two writers.
    """
    try:
        record = session_file.read(state_dir)
    except (OSError, ValueError) as exc:
        decision = Decision(Action.IGNORE, f"unreadable session file: {exc}")
        _report(me, decision, None)
        return decision
    decision = decide(
        record,
        me,
        boot_id_now=boot_id(),
        pid_namespace_now=pid_namespace(),
        lock_held=session_file.lock_held(state_dir),
        exited_pid=exited_pid,
    )
    if decision.action is Action.REAP and record is not None:
        credentials = (record.session_id, record.session_password)
        try:
            alive = close_session(me.zookeeper_hosts, credentials, timeout_s)
        except (KazooException, KazooTimeoutError, OSError) as exc:
            failed = Decision(Action.IGNORE, f"could not reach ZooKeeper to reap: {exc!r}")
            _report(me, failed, record)
            return failed
        if not alive:
            decision = Decision(Action.REAP, f"{decision.reason}; the session was gone already")
        decision = _remove_reaped(state_dir, record.session_id, decision)
    _report(me, decision, record)
    return decision


def _remove_reaped(state_dir: Path, session_id: int, decision: Decision) -> Decision:
    """Remove the file only while it names ``session_id``; says if it stays.

    The check and the unlink are one step under the state folder's lock, which every write
    of the file takes too, so a successor that recorded its own session meanwhile (while
    this reaper connected, up to its timeout) keeps its file.
    """
    try:
        removed = session_file.remove(state_dir, only_if=lambda now: now.session_id == session_id)
    except OSError as exc:
        return Decision(Action.REAP, f"{decision.reason}; the file could not be removed: {exc}")
    if removed:
        return decision
    return Decision(
        Action.REAP,
        f"{decision.reason}; the file was kept (it names another session now, or a live node "
        f"holds the state folder)",
    )


def _report(me: Self, decision: Decision, record: SessionRecord | None) -> None:
    session = f"{record.session_id:#x}" if record is not None else "-"
    if decision.action is Action.REAP:
        log.info("session_reaped", name=me.name, session_id=session, reason=decision.reason)
    elif decision.action is Action.IGNORE:
        log.warning(
            "session_file_ignored", name=me.name, session_id=session, reason=decision.reason
        )
    elif decision.action is Action.ALIVE:
        log.info("session_not_reaped", name=me.name, session_id=session, reason=decision.reason)
