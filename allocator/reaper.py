"""Reaping a dead node's ZooKeeper session, so its successor does not wait for the timeout.

When a node process dies without closing its session (SIGKILL, an OOM kill, a crash), its
session (and so its election znode) lives on until ZooKeeper expires it: nobody can lead
until then. The process that replaces it, or its supervisor, can end that wait at once:
attach to the session with the id and password the dead node kept in its session file
(:mod:`allocator.session_file`) and close it, which deletes its ephemeral znodes.

Rules:

- Attaching takes a live session away from its owner, so nothing attaches before
  :func:`decide` has proved the recorded process dead *on this host*: the file names this
  cluster (ZooKeeper hosts with the chroot, election path), this node's name and this
  host, and then either the caller holds the child handle that saw the process exit
  (``exited_pid``), or the host's boot id changed since the file was written, or the
  recorded pid is gone, or it now has another start time (a reused pid). Liveness is never
  judged from ``/proc/<pid>/cmdline`` (empty for a moment right after an exec): pid plus
  start time, or the child handle.
- A paused process (SIGSTOP, a frozen VM) still runs with its start time: it is never
  reaped. It is left to its session timeout, and to the fence.
- Names must be stable: a node whose ``node.name`` is not configured gets
  ``<hostname>-<pid>``, a new name at every start, so its successor cannot recognise it:
  such a node never reaps, and says so.
- A file from another cluster, name or host, or one that does not parse (another
  version), is ignored and reported, never removed. A session already gone is a no-op. A
  reaped or already-gone session's file is removed.
- Why this is safe even if the proof were wrong: the "dead" process would see its session
  expire (closed) and stop itself at once (DESIGN §4), and anything it still tried to
  write carries its old token, which the fence in PostgreSQL rejects once the successor
  has taken it (DESIGN §3). Reaping can cost a live node its session; it can never make
  two writers.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from allocator import logs, session_file
from allocator.config import Config
from allocator.local.processes import start_time
from allocator.session_file import SessionRecord

log = logs.get_logger(__name__)

_KAZOO_LOG = logging.getLogger("allocator.reaper.kazoo")
_KAZOO_LOG.setLevel(logging.WARNING)  # its connect/close chatter is not news here
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
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
    """When process ``pid`` started (clock ticks since boot), for the session file."""
    return start_time(pid)


def decide(
    record: SessionRecord | None,
    me: Self,
    *,
    boot_id_now: str,
    started: Callable[[int], int | None] = start_time,
    exited_pid: int | None = None,
) -> Decision:
    """What to do with ``record`` (pure but for ``started``); see the module rules."""
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
    if exited_pid is not None and exited_pid == record.pid:
        return Decision(Action.REAP, f"pid {record.pid} exited (the supervisor saw it)")
    if record.boot_id and boot_id_now and record.boot_id != boot_id_now:
        return Decision(Action.REAP, "the host rebooted since the file was written")
    now = started(record.pid)
    if now is None:
        return Decision(Action.REAP, f"pid {record.pid} no longer runs")
    if record.start_time is None:
        return Decision(Action.ALIVE, f"pid {record.pid} runs and the file has no start time")
    if now != record.start_time:
        return Decision(Action.REAP, f"pid {record.pid} is another process now")
    return Decision(Action.ALIVE, f"pid {record.pid} still runs (perhaps paused): not reaped")


def close_session(hosts: str, credentials: tuple[int, bytes], timeout_s: float) -> bool:
    """Attach to the session ``credentials`` and close it; True if it was alive.

    Connects without the chroot (closing needs no path). If the session had already
    expired the server hands out a new one instead, which is closed at once."""
    servers = hosts.split("/", 1)[0]
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
    decision = decide(record, me, boot_id_now=boot_id(), exited_pid=exited_pid)
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
        session_file.remove(state_dir)
    _report(me, decision, record)
    return decision


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
