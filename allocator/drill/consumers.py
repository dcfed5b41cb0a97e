"""The consumer recorder: threads that claim blocks the way an application does, and remember
every block that came back, for :mod:`allocator.core.verify` to judge (demo, drill, chaos suite).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from allocator.client.base import CLAIM_BLOCKS, POOL_EMPTY_SQLSTATE
from allocator.core.errors import AllocatorError
from allocator.core.verify import Claim

DEFAULT_PAUSE_S = 0.02
ERROR_PAUSE_FACTOR = 5
CONNECT_TIMEOUT_S = 3
STOP_TIMEOUT_S = 10.0
MAX_EXAMPLES = 5
APPLICATION_NAME = "allocator-consumer-recorder"


class StuckConsumersError(AllocatorError):
    """A consumer thread did not stop within :data:`STOP_TIMEOUT_S` (a claim hung)."""


@dataclass
class ConsumerStats:
    """One consumer's counters (or, from :meth:`Consumers.totals`, everyone's)."""

    claims: int = 0
    """Blocks received."""
    calls: int = 0
    pool_empty: int = 0
    errors: int = 0
    """Failed calls other than pool-empty."""
    error_kinds: dict[str, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)

    def copy(self) -> ConsumerStats:
        """An independent copy (the error maps included)."""
        return ConsumerStats(
            self.claims,
            self.calls,
            self.pool_empty,
            self.errors,
            dict(self.error_kinds),
            list(self.error_examples),
        )

    def add(self, other: ConsumerStats) -> None:
        """Adds ``other``'s counters to these."""
        self.claims += other.claims
        self.calls += other.calls
        self.pool_empty += other.pool_empty
        self.errors += other.errors
        for kind, n in other.error_kinds.items():
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + n
        room = MAX_EXAMPLES - len(self.error_examples)
        self.error_examples.extend(other.error_examples[: max(0, room)])

    def since(self, earlier: ConsumerStats) -> ConsumerStats:
        """What happened after ``earlier`` (a copy of these counters taken before)."""
        kinds = {
            kind: n - earlier.error_kinds.get(kind, 0)
            for kind, n in self.error_kinds.items()
            if n > earlier.error_kinds.get(kind, 0)
        }
        return ConsumerStats(
            self.claims - earlier.claims,
            self.calls - earlier.calls,
            self.pool_empty - earlier.pool_empty,
            self.errors - earlier.errors,
            kinds,
            [e for e in self.error_examples if e not in earlier.error_examples],
        )


def named(prefix: str, count: int, blocks: int = 1) -> dict[str, int]:
    """``{"<prefix>-1": blocks, …, "<prefix>-<count>": blocks}``."""
    return {f"{prefix}-{i}": blocks for i in range(1, count + 1)}


class Consumers:
    """Claiming threads and their records.

    Each consumer is a daemon thread with its own autocommit connection to ``url`` (role
    ``allocator_app``: it may only claim) calling ``allocator.claim_blocks(name, n)`` every
    ``pause_s``; ``names`` maps each name to its ``n``; ``options`` are libpq ``options``
    (``-c synchronous_commit=off``, say). A block is recorded (with the wall clock of the
    return) only when the call returned it: a call that failed after its commit leaves a
    claim in the ledger no record shows, which the checker allows. Errors never stop a
    consumer: "pool empty" (AL003) is counted apart; any other counts by kind (SQLSTATE, else
    the exception's type), keeps its first few messages, closes the connection, and the
    consumer waits ``ERROR_PAUSE_FACTOR x pause_s`` before claiming again. Loops are bounded
    by ``max_calls`` and ``deadline_s`` when given (None: until :meth:`stop`).

    Use as a context manager, or :meth:`start` and :meth:`stop` (always call it: it joins).
    """

    def __init__(
        self,
        url: str,
        names: Mapping[str, int],
        *,
        pause_s: float = DEFAULT_PAUSE_S,
        max_calls: int | None = None,
        deadline_s: float | None = None,
        options: Mapping[str, str] | None = None,
    ) -> None:
        if not names or any(n < 1 for n in names.values()):
            raise ValueError("at least one consumer, each claiming at least one block a call")
        self._url = url
        self._names = dict(names)
        self._options = dict(options or {})
        self._pause_s = pause_s
        self._max_calls = max_calls
        self._deadline_s = deadline_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._records: list[Claim] = []
        self._stats = {name: ConsumerStats() for name in self._names}
        self._threads = [
            threading.Thread(target=self._run, args=(name, n), name=f"consumer-{name}", daemon=True)
            for name, n in self._names.items()
        ]

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def start(self) -> Consumers:
        """Starts every consumer thread."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Claim]:
        """Stop and join every consumer; the records. Safe to call more than once.

        The joins are bounded by :data:`STOP_TIMEOUT_S`; a thread still running raises
        :class:`StuckConsumersError` (a daemon, so it never keeps the process alive)."""
        self._stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for thread in self._threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            raise StuckConsumersError(f"consumer threads did not stop: {', '.join(stuck)}")
        return self.records()

    def __enter__(self) -> Consumers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what they got ------------------------------------------------------------------------

    def records(self) -> list[Claim]:
        """Every block that returned so far, in the order the calls returned."""
        with self._lock:
            return list(self._records)

    def record_count(self) -> int:
        with self._lock:
            return len(self._records)

    def count(self, since: float = 0.0, until: float = float("inf")) -> int:
        """Blocks that returned in ``[since, until)`` (``time.time()``)."""
        with self._lock:
            return sum(since <= r.returned_at < until for r in self._records)

    def stats(self) -> dict[str, ConsumerStats]:
        """A copy of each consumer's counters."""
        with self._lock:
            return {name: s.copy() for name, s in self._stats.items()}

    def totals(self) -> ConsumerStats:
        """Everyone's counters added up (a copy)."""
        total = ConsumerStats()
        for stats in self.stats().values():
            total.add(stats)
        return total

    def describe(self) -> str:
        """One line: each consumer's blocks, pool-empty answers and errors."""
        return ", ".join(
            f"{name}: {s.claims} blocks, {s.pool_empty} pool-empty, {s.errors} errors "
            f"{s.error_kinds or ''}".rstrip()
            for name, s in self.stats().items()
        )

    # -- the threads ------------------------------------------------------------------------

    def _run(self, name: str, n: int) -> None:
        deadline = None if self._deadline_s is None else time.monotonic() + self._deadline_s
        calls = 0
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self._stop.is_set():
                if self._max_calls is not None and calls >= self._max_calls:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                calls += 1
                try:
                    if conn is None or conn.closed:
                        conn = self._connect(name)
                    rows = conn.execute(CLAIM_BLOCKS, {"consumer": name, "n": n}).fetchall()
                except psycopg.Error as exc:
                    self._failed(name, exc)
                    if exc.sqlstate != POOL_EMPTY_SQLSTATE and conn is not None:
                        with contextlib.suppress(psycopg.Error):
                            conn.close()
                        conn = None
                    self._stop.wait(self._pause_s * ERROR_PAUSE_FACTOR)
                    continue
                returned_at = time.time()
                with self._lock:
                    self._records.extend(
                        Claim(int(b), int(f), int(last), name, returned_at) for b, f, last in rows
                    )
                    stats = self._stats[name]
                    stats.calls += 1
                    stats.claims += len(rows)
                self._stop.wait(self._pause_s)
        finally:
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    conn.close()

    def _connect(self, name: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self._url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=APPLICATION_NAME,
            options=self._options.get(name, ""),
        )

    def _failed(self, name: str, exc: psycopg.Error) -> None:
        with self._lock:
            stats = self._stats[name]
            stats.calls += 1
            if exc.sqlstate == POOL_EMPTY_SQLSTATE:
                stats.pool_empty += 1
                return
            stats.errors += 1
            kind = exc.sqlstate or type(exc).__name__
            stats.error_kinds[kind] = stats.error_kinds.get(kind, 0) + 1
            if len(stats.error_examples) < MAX_EXAMPLES:
                text = str(exc).strip()
                message = text.splitlines()[0] if text else repr(exc)
                stats.error_examples.append(f"{name}: {kind} {message}")
