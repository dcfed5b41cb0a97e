"""Reaping a dead node's ZooKeeper session, so its successor does not wait for the timeout.

When a node process dies without closing its session (SIGKILL, an OOM kill, a crash), its
session (and so its election znode) lives on until ZooKeeper expires it: nobody can lead
until then. The process that replaces it, or its supervisor, can end that wait at once:
attach to the session with the id and password the dead node kept in its session file
(:mod:`allocator.session.file`) and close it, which deletes its ephemeral znodes.

Rules:

- Attaching takes a live session away from its owner, so nothing attaches before
  :func:`decide` has proved the recorded process dead *on this host*: the file names this
  cluster (ZooKeeper hosts with the chroot, election path), this node's name and this
  host, and then either the caller holds the child handle that saw the process exit
  (``exited_pid``), or the host's boot id changed since the file was written, or the
  process no longer holds the state folder's lock it took with the file, or (a file
  without that lock) the recorded pid is gone, or it now has another start time (a reused
  pid), both judged in the pid namespace the file names. Liveness is never judged from
  ``/proc/<pid>/cmdline`` (empty for a moment right after an exec): the child handle, the
  lock, or pid plus start time.
- The lock: a node holds its state folder's lock (``flock`` on the folder) from its first
  write of the file until it has removed it at a clean exit (``holds_lock`` in the file,
  :mod:`allocator.session.file`). The kernel lets go of it when the process dies, in
  whatever pid namespace or container it ran, and never while it is paused. So a lock
  nobody holds proves the writer gone (or done with its session), and a held one proves
  it alive, where a pid cannot tell: a container restarted in a new pid namespace
  (Kubernetes, Compose) reaps its predecessor, ``docker compose run node-1 reap-session``
  beside a live node leaves it alone. Where the lock cannot be probed, or the file does
  not say its writer held it (an older release), the pid rules below decide.
- The pid rules: a pid means something only in its pid namespace, and "I cannot see that
  pid" is never taken as death. The file records the writer's pid namespace (the inode of
  ``/proc/self/ns/pid``, :func:`pid_namespace`), and the pid and its start time are judged
  only by a reaper that sees itself in a ``/proc`` of its own pid namespace (its
  ``NSpid`` there is its own pid, alone) and runs in the namespace the file names.
  Otherwise the process counts as alive: a reaper in another pid namespace (``docker
  compose run node-1 reap-session``, a ``kubectl debug`` container, where the pid is
  missing or is some other process, pid 1 say), one whose ``/proc`` is missing, unreadable
  or another namespace's, and a file that does not name its namespace (an older release's,
  or a writer's that could not see itself: its pid may be another namespace's). A pid
  that runs but whose ``/proc/<pid>`` this reaper cannot read (hidden by ``hidepid``,
  refused) is alive too: "gone" takes both ``/proc`` and ``kill(pid, 0)`` saying so.
- Proofs that need no pid hold across namespaces: the lock, a changed boot id (a reboot
  ends every process; but a held lock wins over it: a reaper that reads another boot id
  may run on another kernel, a sandbox's), and the supervisor's child handle, unless the
  file names another pid namespace than the supervisor's own (its child runs in its
  namespace, and a process never changes its own, so such a file is not its child's) or
  the supervisor cannot see its own.
- A paused process (SIGSTOP, a frozen VM) still runs with its start time: it is never
  reaped. It is left to its session timeout, and to the fence.
- Names must be stable: a node whose ``node.name`` is not configured gets
  ``<hostname>-<pid>``, a new name at every start, so its successor cannot recognise it:
  such a node never reaps, and says so.
- A file from another cluster, name or host, or one that does not parse (another
  version), is ignored and reported, never removed. A session already gone is a no-op. A
  reaped or already-gone session's file is removed, but only while it still names that
  session and no live process holds the state folder's lock: the check and the unlink are
  one step under that lock, which every write of the file takes too, so a successor that
  recorded its own session meanwhile (while this reaper connected, up to its timeout)
  keeps its file.
- Why this is safe even if the proof were wrong: the "dead" process would see its session
  expire (closed) and stop itself at once (DESIGN §4), and anything it still tried to
  write carries its old token, which the fence in PostgreSQL rejects once the successor
  has taken it (DESIGN §3). Reaping can cost a live node its session; it can never make
  two writers.
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
    NOTHING = "nothing"
    """No session file: nothing to reap."""
    IGNORE = "ignore"
    """A file that is not ours to act on (another cluster, name, host; unreadable)."""
    ALIVE = "alive"
    """The recorded process still runs (perhaps paused): never reaped."""
    REAP = "reap"


@dataclass(frozen=True)
class Decision:
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
    """What to do with ``record`` (pure but for ``started``); see the module rules.

    ``pid_namespace_now``: :func:`pid_namespace` of the caller (None: it cannot see
    itself). ``lock_held``: :func:`allocator.session.file.lock_held` of the state folder
    (None: not known). ``started``: :func:`start_time_of`, None for a pid that is gone,
    OSError when it cannot say."""
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
    """Read the session file in ``state_dir``, decide, and reap if allowed; logs one line.

    Never raises for a ZooKeeper problem (the old session then just expires on its own)."""
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
    """Remove the file only while it names ``session_id`` (module rules); says if it stays."""
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
