"""The whole cluster as one node sees it, for its status page: who leads and since when, the
election queue, the pool and the last handovers (``/status``'s ``cluster`` object).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from kazoo.exceptions import KazooException

from allocator.cluster_status import cluster_json
from allocator.core import logs
from allocator.core.errors import AllocatorError
from allocator.core.records import BlockAgeStatus, PoolStatus, TermRecord
from allocator.zookeeper.election import Contender, Ignored, Queue

log = logs.get_logger(__name__)

INTERVAL_S = 1.0
DEMAND_S = 30.0
"""A look keeps the view reading this long."""
HANDOVERS = 10
"""Terms shown, newest first."""
STOP_TIMEOUT_S = 5.0


class ClusterStore(Protocol):
    """What the view reads from the database (:class:`allocator.postgres.store.NodeDatabase` has
    it)."""

    def pool_status(self) -> PoolStatus: ...

    def block_age_status(self) -> BlockAgeStatus: ...

    def leader_history(self, limit: int) -> list[TermRecord]: ...


class ClusterView:
    """The last view of the cluster, and the thread that keeps it while someone looks.

    One background thread reads; HTTP handlers only take the last view (:meth:`to_json`) and
    never wait on ZooKeeper or PostgreSQL. A source that fails keeps its last good answer on
    show: the view says why in ``problems`` and ``observed_at`` stays that of the last
    complete read, so the page can say how stale it is.
    """

    def __init__(
        self,
        read_queue: Callable[[], Queue | None],
        store: ClusterStore,
        *,
        interval_s: float = INTERVAL_S,
        demand_s: float = DEMAND_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``read_queue`` gives the election queue, or None when there is no session to ask."""
        self._read_queue = read_queue
        self._store = store
        self._interval_s = interval_s
        self._demand_s = demand_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._contenders: list[Contender] = []
        self._ignored: list[Ignored] = []
        self._pool: PoolStatus | None = None
        self._block_age: BlockAgeStatus | None = None
        self._terms: list[TermRecord] = []
        self._observed_at: float | None = None
        self._problems: list[str] = []
        self._looked_at: float | None = None
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the reading thread."""
        self._thread = threading.Thread(target=self._run, name="cluster-view", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop the reading thread, waiting at most ``timeout_s``."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def to_json(self) -> dict[str, Any]:
        """The last view (a look: keeps or wakes the reading thread).

        The keys (docs/schemas/cluster.schema.json) are ``allocator status --json``'s but
        the fence (:func:`allocator.cluster_status.cluster_json`), plus ``observed_at``
        (Unix seconds of the last complete read, null before one), ``age_s`` (its age when
        shown), ``problems`` (one line per source that failed at the last read) and ``now``
        (this node's Unix time, for the page's "how long ago").
        """
        now = self._clock()
        with self._lock:
            idle = not self._demanded(now)
            self._looked_at = now
            view = cluster_json(
                self._contenders, self._pool, self._terms, self._ignored, self._block_age
            )
            observed_at = self._observed_at
            problems = list(self._problems)
        if idle:
            self._wake.set()
        wall = self._wall_clock()
        age = None if observed_at is None else max(0.0, wall - observed_at)
        return {**view, "observed_at": observed_at, "age_s": age, "problems": problems, "now": wall}

    def refresh(self) -> None:
        """One read of every source (the thread's; tests call it directly).

        The election queue from the node's own ZooKeeper session (none while not connected),
        then the pool, the last ``HANDOVERS`` terms and the bound on an ID's age
        (``block_age_status``) from the database.
        """
        problems: list[str] = []
        queue: Queue | None = None
        try:
            queue = self._read_queue()
            if queue is None:
                problems.append("election: no ZooKeeper session")
        except (KazooException, AllocatorError) as exc:
            problems.append(f"election: {_one_line(exc)}")
        pool: PoolStatus | None = None
        terms: list[TermRecord] | None = None
        try:
            pool = self._store.pool_status()
            terms = self._store.leader_history(HANDOVERS)
        except AllocatorError as exc:
            problems.append(f"database: {_one_line(exc)}")
        block_age: BlockAgeStatus | None = None
        if pool is not None:
            try:
                block_age = self._store.block_age_status()
            except AllocatorError as exc:
                problems.append(f"block age: {_one_line(exc)}")
        with self._lock:
            if block_age is not None:
                self._block_age = block_age
            if queue is not None:
                self._contenders, self._ignored = queue.contenders, queue.ignored
            if pool is not None and terms is not None:
                self._pool, self._terms = pool, terms
            if not problems:
                self._observed_at = self._wall_clock()
            self._problems = problems

    def _demanded(self, now: float) -> bool:
        return self._looked_at is not None and now - self._looked_at < self._demand_s

    def _run(self) -> None:
        """Read every ``interval_s`` while someone looked within ``DEMAND_S``; otherwise
        wait.

        A node nobody watches makes no extra calls; the first look after a pause wakes the
        thread at once (that look still gets the older view).
        """
        while not self._closing.is_set():
            self._wake.clear()  # before the check: a look after it wakes the wait below
            with self._lock:
                demanded = self._demanded(self._clock())
            if not demanded:
                self._wake.wait()
                continue
            try:
                self.refresh()
            except Exception:  # a bug: say so, and keep the node's page alive
                log.exception("cluster_view_failed")
            self._closing.wait(self._interval_s)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
