"""How the drill sees a cluster: the fence (the truth about who leads), the election, the
nodes' own view, their logs. Every wait has a deadline; nothing sleeps except between polls.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psycopg
from kazoo.exceptions import KazooException

from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.drill import sql
from allocator.local import nodes as nodes_mod
from allocator.local.info import ClusterInfo
from allocator.local.processes import is_pid_alive
from allocator.zookeeper.election import Contender

log = logs.get_logger(__name__)

FENCE_POLL_INTERVAL_S: Final = 0.01
CONNECT_TIMEOUT_S: Final = 5
HTTP_TIMEOUT_S: Final = 5.0
STATUS_TIMEOUT_S: Final = 0.3
FENCED_WRITE_EVENTS: Final = (b"event=fenced_write_rejected", b'"event": "fenced_write_rejected"')
"""The event in a text log line and in a JSON one (:mod:`allocator.core.logs`)."""


class DrillError(AllocatorError):
    """The drill could not run, or found what it must not (violations, failed rounds)."""


@dataclass(frozen=True)
class FenceState:
    """The fence row: the epoch, and the node and pid that hold it (None: nobody)."""

    epoch: int
    holder: str | None
    pid: int | None


@dataclass(frozen=True)
class Leader:
    """The node the next fault hits: fence holder, first contender, running with ``pid``."""

    name: str
    pid: int
    epoch: int
    admin_url: str


@dataclass(frozen=True)
class PoolState:
    """The pool's level, runway and the epoch of the newest cut (``allocator.pool_status``)."""

    available_blocks: int
    runway_s: float | None
    last_cut_epoch: int | None

    def at_work(self, epoch: int, cover_s: float) -> tuple[bool, str]:
        """Whether the leader of ``epoch`` is at work, and why not: the pool is not empty, and
        the leader has cut in its term or the runway covers ``cover_s`` (two session timeouts:
        the longest handover a fault may cause). Faults hit a leader at work, not one still
        taking over, so rounds back to back never drain a pool no leader lived to refill."""
        if self.available_blocks == 0:
            return False, "the pool is empty"
        if self.last_cut_epoch == epoch:
            return True, ""
        if self.runway_s is not None and self.runway_s >= cover_s:
            return True, ""
        return False, (
            f"the leader of epoch {epoch} has not cut yet and the pool's runway "
            f"({self.runway_s} s) is under {cover_s:.0f} s"
        )


class FenceReader:
    """A dedicated autocommit connection that reads the fence row (no pool, no retries); a
    failed read drops the connection, the next read reconnects."""

    def __init__(self, url: str, application_name: str = "allocator-drill") -> None:
        self._url = url
        self._application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None

    def read(self) -> FenceState:
        """The fence row now: the truth about who leads."""
        row = self._fetch(sql.READ_FENCE)
        if row is None:
            raise DrillError("the fence row is missing (schema not migrated?)")
        return FenceState(int(row[0]), row[1], row[2])

    def available_blocks(self) -> int:
        """Unclaimed blocks in the pool (``allocator.pool_status``)."""
        row = self._fetch(sql.READ_AVAILABLE_BLOCKS)
        return 0 if row is None else int(row[0])

    def pool(self) -> PoolState:
        """The pool's level, runway and the epoch of the newest cut."""
        row = self._fetch(sql.READ_POOL)
        if row is None:
            return PoolState(0, None, None)
        runway = None if row[1] is None else float(row[1])
        return PoolState(int(row[0]), runway, None if row[2] is None else int(row[2]))

    def _fetch(self, statement: str) -> Any:
        try:
            return self._connection().execute(statement).fetchone()
        except psycopg.Error:
            self.close()  # reconnect at the next read
            raise

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name=self._application_name,
            )
        return self._conn

    def close(self) -> None:
        """Closes the connection; the next read would reopen it."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def running_pids(state_dir: Path, names: Iterable[str]) -> dict[str, int]:
    """Node name → pid of every node in ``names`` that the supervisor's records show alive."""
    runtime = nodes_mod.read_runtime(state_dir)
    found: dict[str, int] = {}
    if runtime is None:
        return found
    for name in names:
        record = runtime.node(name)
        if record is not None and record.pid is not None and record.alive():
            found[name] = record.pid
    return found


def ready_leader(
    fence: FenceState,
    contenders: Sequence[Contender],
    pids: Mapping[str, int],
    names: Sequence[str],
    admin_urls: Mapping[str, str],
) -> tuple[Leader | None, str]:
    """The leader when the cluster is ready for a round, else why not.

    Ready: every node runs (``pids``: from the supervisor's records, or any pid for a
    deployed cluster), the election holds exactly one znode per node with that pid, and the
    fence is held by the first of them with that pid (the caller also checks it is at work:
    :meth:`PoolState.at_work`)."""
    missing = [n for n in names if n not in pids]
    if missing:
        return None, f"not running: {', '.join(missing)}"
    queued = [(c.identity.name, c.identity.pid) for c in contenders]
    if sorted(queued) != sorted(pids.items()):
        shown = ", ".join(f"{n}/{p}" for n, p in queued) or "none"
        return None, f"election holds {shown}; running: {dict(pids)}"
    first = queued[0][0]
    if fence.holder != first or fence.pid != pids[first]:
        return None, f"fence held by {fence.holder}/{fence.pid}, election led by {first}"
    return Leader(first, pids[first], fence.epoch, admin_urls.get(first, "")), ""


def wait_until(
    check: Callable[[], tuple[Any, str]], timeout_s: float, interval_s: float, what: str
) -> Any:
    """Call ``check`` (→ (result or None, reason)) until it returns a result; bounded."""
    deadline = time.monotonic() + timeout_s
    reason = ""
    while True:
        try:
            result, reason = check()
        except (psycopg.Error, KazooException) as exc:
            result, reason = None, f"{type(exc).__name__}: {exc}"
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise DrillError(f"{what}: not within {timeout_s:.0f} s ({reason})")
        time.sleep(interval_s)


def newer_epoch(fence: FenceReader, old: Leader) -> FenceState | None:
    """The fence if it shows a newer epoch held by another node than ``old``; else None."""
    try:
        state = fence.read()
    except psycopg.Error as exc:
        log.debug("fence_read_failed", error=str(exc))
        return None
    if state.epoch > old.epoch and state.holder != old.name:
        return state
    return None


def request_step_down(admin_url: str, token: str) -> None:
    """POST /step-down to one node; raises :class:`DrillError` unless it accepted (202)."""
    if not admin_url.startswith("http://"):
        raise DrillError(f"no admin URL to ask for a step-down ({admin_url!r})")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{admin_url}/step-down", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310
            code = response.status
    except urllib.error.HTTPError as exc:
        raise DrillError(f"step-down refused by {admin_url}: HTTP {exc.code}") from exc
    except OSError as exc:
        raise DrillError(f"cannot reach {admin_url}") from exc
    if code != 202:
        raise DrillError(f"step-down at {admin_url} answered HTTP {code}, not 202")


def node_serves(admin_url: str, timeout_s: float = STATUS_TIMEOUT_S) -> bool:
    """True if the node's own ``/status`` says it leads, may write and reaches the
    database; False when it says otherwise or does not answer in time.

    ``may_write`` because a leader cut off from ZooKeeper stops writing at once; not
    ``database_reachable: false`` because one cut off from PostgreSQL cannot cut; a paused
    or unreachable node answers nothing and so serves nothing."""
    if not admin_url.startswith("http://"):
        return False
    try:
        with urllib.request.urlopen(f"{admin_url}/status", timeout=timeout_s) as response:  # noqa: S310
            body = json.loads(response.read(65536))
    except (OSError, ValueError):
        return False
    if not isinstance(body, dict):
        return False
    leads = body.get("role") == "leader" and body.get("may_write") is True
    return leads and body.get("database_reachable") is not False


class LogCounter:
    """Counts ``fenced_write_rejected`` events appended to the node logs (text or JSON)
    since a mark.

    The nodes' ``/metrics`` counters restart from zero with every restarted node; their
    logs do not."""

    def __init__(self, paths: Iterable[Path]) -> None:
        self._paths = list(paths)
        self._offsets: dict[Path, int] = {}

    def mark(self) -> None:
        """Count from the logs' current ends."""
        self._offsets = {path: _size(path) for path in self._paths}

    def count(self) -> int:
        """Events appended since :meth:`mark`."""
        total = 0
        for path in self._paths:
            try:
                with path.open("rb") as handle:
                    handle.seek(self._offsets.get(path, 0))
                    total += sum(
                        any(event in line for event in FENCED_WRITE_EVENTS) for line in handle
                    )
            except OSError:
                continue
        return total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def cluster_pids(info: ClusterInfo) -> list[int]:
    """The processes of a local cluster: its servers, its supervisor and its nodes."""
    pids = [s.pid for s in info.zk_servers] + [p.pid for p in info.pg_servers]
    pids += [info.postgres.pid, info.supervisor_pid, *(n.pid for n in info.nodes)]
    return sorted({p for p in pids if p is not None})


def left_running(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` still alive (after the cluster was stopped)."""
    return [p for p in pids if is_pid_alive(p)]
