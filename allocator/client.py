"""Claim ID blocks in the background and hand their IDs out from memory.

:class:`IdClient` (threads) and :class:`AsyncIdClient` (asyncio) give a Python application
Snowflake IDs at memory speed; ``allocator claim`` and the bench use :func:`claim_once`.

Rules:

- Every ID comes from a block claimed with ``allocator.claim_blocks`` (docs/sql.md), which
  is durable on return (I4). Nothing here cuts or invents IDs.
- Double buffer, like Leaf's segments: a *segment* is the blocks one claim returned (up to
  ``batch_blocks``). IDs are handed out from the current segment, block by block, ascending
  within each block. When ``refill_at`` (a fraction, by ID count) of the current segment is
  left, the next segment is claimed while the IDs keep flowing, so that ``next_id()``
  normally never waits on the database: :class:`IdClient` sends that claim from the
  caller's own thread without waiting and collects its answer at a later block boundary
  (see Latency); otherwise (asyncio, a pool, a custom claimer, the first claim, retries) a
  background claimer (thread or task) claims it. At most one claim is out and at most one
  segment prefetched; the claimer is otherwise idle.
- Sizing: at the peak rate, ``refill_at`` of a segment must outlast a claim (a durable
  commit: milliseconds, more on a busy server). The thread client collects a prefetch at
  the first block boundary after its answer arrived (with one block per segment: the
  segment's end); when that answer is late, the caller hands the claim to the claimer
  thread and also waits for that thread to get the GIL (up to
  ``sys.getswitchinterval()``, 5 ms, twice). With ``max_batch_blocks`` above
  ``batch_blocks`` the client doubles its claims, up to that bound, whenever a caller had
  to wait for a late prefetch (Leaf's dynamic step, growing only); it never shrinks them,
  so at most about two segments are lost at close.
- Hot path: ``next_id()`` is a lock acquire, an integer increment, two comparisons and a
  release; it allocates nothing but the returned int. Switching blocks or segments, asking
  for a refill, waiting and failing all happen on the slow path.
- Order: IDs of one block ascend; blocks are used in the order they were claimed (the
  database hands out the oldest first), so one client's IDs normally increase, but nothing
  promises it (a block requeued after someone's rolled-back claim is older). Uniqueness is
  the guarantee, order is not. An ID's timestamp says when its block was cut, not when the
  ID was handed out.
- No hidden I/O: constructors only record and validate settings. The claimer starts on
  first use (``next_id``/``take``) or on ``start()``; ``with``/``async with`` start and
  close. ``start(wait=True)`` also waits for the first segment.
- Waiting: a caller that finds no ID left waits at most ``wait_timeout_s`` for the claimer.
  Then it raises :class:`PoolEmptyError` when the pool stayed empty (AL003), or
  :class:`~allocator.errors.DatabaseUnavailableError` when PostgreSQL could not be reached
  or the claim is still running. Errors that waiting will not cure fail waiting callers at
  once: AL001/AL002 (:class:`ClaimArgumentError`; the claimer then stops for good) and any
  other database error (permissions, missing schema: the claimer keeps retrying, so the
  client recovers once it is fixed). A call never hangs.
- Retries: the claimer retries failed claims with capped exponential backoff and jitter
  (:func:`backoff_delay`: from ``backoff_initial_s``, doubling, capped at ``backoff_max_s``,
  each delay drawn from its upper half); a success resets it.
- Errors are translated at the boundary (:func:`translate_claim_error`, keeping
  ``__cause__``): AL003 → :class:`PoolEmptyError`, AL001/AL002 → :class:`ClaimArgumentError`,
  connection failures and timeouts → :class:`~allocator.errors.DatabaseUnavailableError`
  (retryable), anything else → :class:`~allocator.errors.DatabaseError`.
- Unused IDs are lost: ``close()`` stops the claimer and reports the IDs claimed but not
  handed out (:class:`UnusedIds`: count and ranges). They stay recorded as claimed by this
  consumer and are never handed to anyone again, this client included. The same holds for
  a claim whose answer never arrived (connection lost after commit), for a claim still
  running when ``close()`` stopped waiting for it (``complete=False``; what it returns is
  logged as ``client_blocks_lost_after_close``), and for the IDs a ``take()`` had gathered
  when ``close()`` interrupted it. A claim that lands while ``close()`` waits is reported
  (one a caller's thread began included: ``close()`` has the claimer thread finish it).
- Latency: no GIL hand-over in the steady state. A claimer thread that wakes (for the
  trigger, and again when its query's answer arrives) needs the GIL; a ``next_id()``
  spinning in another thread is made to drop it and gets it back only when the OS runs it
  again, on a busy machine milliseconds later. So :class:`IdClient` keeps that thread
  asleep: the caller that hands out the trigger ID sends the claim itself
  (:meth:`NonBlockingClaimer.begin`: libpq's non-blocking send, microseconds), and callers
  look for the answer at each block boundary (``poll()``: one non-blocking read) and buffer
  it. It does so with its own connection from a conninfo string (or any
  :class:`NonBlockingClaimer`), once that connection is open, while no claim is out and
  the last one did not fail. The claimer thread does everything cold: the first claim and
  connecting, claims over a ``psycopg_pool`` pool or a plain :class:`Claimer`, retries with
  backoff after any failure (a failed begun claim included), and a begun claim whose answer
  is late: a caller that finds nothing buffered hands it over, and so does ``close()``;
  the thread waits in ``finish()`` on the socket (GIL released), for at most the statement
  timeout plus ``connect_timeout_s``, then carries on as after its own claims. One thread at
  a time uses the connection: the claimer thread from setting ``_claim_in_flight`` until
  clearing it (both under the client's lock) and never while a begun claim is out; a
  caller only under that lock, to begin (no claim in flight) or poll (a begun claim not
  yet handed over); after the hand-over only the claimer thread. Python code on another
  thread (a hand-over, a retry, an application thread) still costs the spinning caller the
  GIL. ``allocator bench client`` measures the worst calls next to the machine's own noise
  floor. ``get_stats()`` counts waits, times claims (a claim a caller collected: until
  collected) and says who ran them (``claims_begun``, ``claims_on_caller_thread``,
  ``claims_handed_over``, ``claims_on_claimer_thread``).
- Sharing: :class:`IdClient` is safe to share among threads. :class:`AsyncIdClient` belongs
  to one event loop. Neither survives ``fork()``: in a child process every client inherited
  from the parent drops its buffered IDs (the parent keeps handing them out), leaves a
  claim the parent had out and the parent's connection alone, and refuses to work
  (:class:`ClientClosedError`); create clients after forking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import selectors
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed

from allocator import db
from allocator.errors import (
    AllocatorError,
    DatabaseError,
    DatabaseUnavailableError,
    UsageError,
)

log = logging.getLogger(__name__)

DEFAULT_BATCH_BLOCKS = 1
MAX_BATCH_BLOCKS = 1000
"""The most blocks one ``claim_blocks`` call may ask for (docs/sql.md)."""
DEFAULT_REFILL_AT = 0.5
DEFAULT_WAIT_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_STATEMENT_TIMEOUT_MS = 5000
DEFAULT_BACKOFF_INITIAL_S = 0.05
DEFAULT_BACKOFF_MAX_S = 2.0
DEFAULT_CLOSE_TIMEOUT_S = 10.0
MAX_CONSUMER_CHARS = 128
APPLICATION_NAME = "allocator-client"

# The client's statements. They live here rather than in allocator.sql, which holds the
# node's: the client is the consumer side and needs nothing else.
CLAIM_BLOCKS: Final = (
    "SELECT block_id, first_id, last_id FROM allocator.claim_blocks(%(consumer)s, %(n)s)"
)
SET_STATEMENT_TIMEOUT: Final = "SELECT set_config('statement_timeout', %(ms)s, false)"
CLAIM_BLOCKS_PQ: Final = b"SELECT block_id, first_id, last_id FROM allocator.claim_blocks($1, $2)"
""":data:`CLAIM_BLOCKS` for libpq's own placeholders (:meth:`PostgresClaimer.begin`)."""
_TEXT_OID: Final = 25
_INT4_OID: Final = 23

_ARGUMENT_SQLSTATES = frozenset({"AL001", "AL002"})
_POOL_EMPTY_SQLSTATE = "AL003"
_NO_ID = -1  # never a valid trigger: IDs are >= 0


class PoolEmptyError(AllocatorError):
    """No ID block could be claimed: the pool is empty (AL003), or stayed empty for as long
    as a caller was willing to wait. Retry later; check ``allocator.pool_status``."""

    exit_code = 75  # EX_TEMPFAIL
    sqlstate = _POOL_EMPTY_SQLSTATE


class ClaimArgumentError(UsageError):
    """AL001 (bad consumer name) or AL002 (bad block count): the call itself is wrong."""

    def __init__(self, message: str, *, sqlstate: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ClientClosedError(AllocatorError):
    """The client was closed, or was inherited across ``fork()``."""


class Block(NamedTuple):
    """One claimed block: every ID in ``[first_id, last_id]`` belongs to the claimer."""

    block_id: int
    first_id: int
    last_id: int

    @property
    def size(self) -> int:
        return self.last_id - self.first_id + 1

    def to_json(self) -> dict[str, int]:
        return {
            "block_id": self.block_id,
            "first_id": self.first_id,
            "last_id": self.last_id,
            "size": self.size,
        }


@dataclass(frozen=True, slots=True)
class UnusedIds:
    """IDs a client had claimed but not handed out when it closed. They are lost: recorded
    as claimed, never handed out again by anyone."""

    count: int
    ranges: tuple[tuple[int, int], ...]
    """Inclusive ``(first, last)`` ranges, in the order the client would have used them;
    adjacent ranges merged."""
    complete: bool = True
    """False when a claim was still running at close: what it returns is lost too (logged)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "ranges": [list(r) for r in self.ranges],
            "complete": self.complete,
        }


class Claimer(Protocol):
    """The I/O seam of :class:`IdClient`: claim up to ``n`` blocks, or raise one of the
    translated errors (:class:`PoolEmptyError`, :class:`ClaimArgumentError`,
    :class:`DatabaseUnavailableError`, :class:`DatabaseError`). Called from one thread."""

    def claim(self, consumer: str, n: int) -> list[Block]: ...

    def close(self) -> None: ...


@runtime_checkable
class NonBlockingClaimer(Claimer, Protocol):
    """A :class:`Claimer` that can also claim without blocking its caller, so that
    :class:`IdClient` can send its prefetch from the thread that asked for it and collect
    the answer later, with no other thread involved (module docstring, Latency).

    One claim at a time: ``begin`` it, then ``poll`` until it returns the blocks (or raises),
    or ``finish`` it. Nothing else (``claim`` included) may use the claimer in between. The
    calls may come from different threads, never at the same time.
    """

    def begin(self, consumer: str, n: int) -> bool:
        """Send a claim of up to ``n`` blocks without waiting for it; False (nothing sent)
        when this claimer cannot right now (no connection open yet, a pool, a connection
        not idle, a send that failed): use :meth:`claim` then. Never blocks, never raises."""
        ...

    def poll(self) -> list[Block] | None:
        """The begun claim's blocks if its answer is in, else None; never blocks. Raises the
        translated errors, as :meth:`claim`; the claim is over once this returns blocks or
        raises."""
        ...

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        """Wait for the begun claim's answer (at most ``timeout_s``; None: the claimer's own
        bound), as :meth:`poll` but blocking. Past the bound the claim is abandoned (what it
        claimed is lost) and :class:`~allocator.errors.DatabaseUnavailableError` raised."""
        ...


class AsyncClaimer(Protocol):
    """The I/O seam of :class:`AsyncIdClient`; as :class:`Claimer`, awaited."""

    async def claim(self, consumer: str, n: int) -> list[Block]: ...

    async def close(self) -> None: ...


# -- errors and retries ------------------------------------------------------------------------


def translate_claim_error(exc: psycopg.Error) -> AllocatorError:
    """The project's error for a driver error raised by a claim (the caller chains it)."""
    state = exc.sqlstate or ""
    primary = exc.diag.message_primary or str(exc).strip().partition("\n")[0]
    if state == _POOL_EMPTY_SQLSTATE:
        return PoolEmptyError(f"claim ID blocks: {primary}")
    if state in _ARGUMENT_SQLSTATES:
        return ClaimArgumentError(f"claim ID blocks: {primary}", sqlstate=state)
    if isinstance(exc, PoolClosed):
        return DatabaseError("claim ID blocks: the connection pool is closed")
    return db.translate(exc, "claim ID blocks")


def backoff_delay(
    attempt: int,
    *,
    initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
    max_s: float = DEFAULT_BACKOFF_MAX_S,
    rng: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): capped exponential backoff,
    drawn from the upper half of the step ("equal jitter"), so it never spins and
    clients that failed together spread out."""
    step = min(max_s, initial_s * 2.0 ** min(attempt, 62))
    return step / 2 + rng(0.0, step / 2)


def check_consumer(consumer: str) -> str:
    """``consumer`` if it is a name ``claim_blocks`` accepts (the database is the authority;
    this only catches mistakes before any I/O). Raises :class:`ClaimArgumentError`."""
    if not isinstance(consumer, str) or not consumer.strip():
        raise ClaimArgumentError("consumer must be a non-empty name", sqlstate="AL001")
    if len(consumer) > MAX_CONSUMER_CHARS:
        raise ClaimArgumentError(
            f"consumer name is {len(consumer)} characters long; the maximum is "
            f"{MAX_CONSUMER_CHARS}",
            sqlstate="AL001",
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in consumer):
        raise ClaimArgumentError("consumer name contains control characters", sqlstate="AL001")
    return consumer


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``ranges`` with each range that starts right after the previous one merged into it."""
    merged: list[tuple[int, int]] = []
    for first, last in ranges:
        if merged and merged[-1][1] + 1 == first:
            merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return tuple(merged)


def _blocks_of(rows: Sequence[TupleRow]) -> list[Block]:
    return [Block(int(row[0]), int(row[1]), int(row[2])) for row in rows]


def _connect_timeout(seconds: float) -> int:
    return max(2, math.ceil(seconds))  # libpq counts whole seconds; below 2 it misbehaves


# -- PostgreSQL claimers -----------------------------------------------------------------------


@dataclass(slots=True)
class _SentClaim:
    """A claim :meth:`PostgresClaimer.begin` sent: its connection, whether libpq has flushed
    it all to the socket yet, and the results read so far."""

    conn: psycopg.Connection[TupleRow]
    flushed: bool
    results: list[PGresult]


class PostgresClaimer:
    """Claims over one connection of its own (opened on first claim, reopened after a
    failure) from a conninfo string, or over connections borrowed from a ``psycopg_pool``
    pool (whose settings are then the pool owner's business).

    It is a :class:`NonBlockingClaimer` over its own connection once that is open (the first
    :meth:`claim` opens it; ``begin`` never connects): ``begin`` sends the claim with libpq's
    non-blocking calls (psycopg keeps its connections in non-blocking mode), ``poll`` reads
    what has arrived, ``finish`` waits on the socket with the GIL released, for at most the
    statement timeout plus ``connect_timeout_s``. Over a pool ``begin`` always declines.
    """

    def __init__(
        self,
        source: str | ConnectionPool[Any],
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        application_name: str = APPLICATION_NAME,
    ) -> None:
        self._source = source
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_ms = statement_timeout_ms
        self._application_name = application_name
        self._answer_timeout_s = statement_timeout_ms / 1000 + connect_timeout_s
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._sent: _SentClaim | None = None

    def claim(self, consumer: str, n: int) -> list[Block]:
        if self._sent is not None:  # a begun claim nobody finished: abandon it (lost)
            self.close()
        params = {"consumer": consumer, "n": n}
        try:
            if isinstance(self._source, ConnectionPool):
                with self._source.connection() as conn:
                    rows = conn.execute(CLAIM_BLOCKS, params).fetchall()
            else:
                rows = self._connection().execute(CLAIM_BLOCKS, params).fetchall()
        except psycopg.Error as exc:
            if (exc.sqlstate or "") not in _ARGUMENT_SQLSTATES | {_POOL_EMPTY_SQLSTATE}:
                self.close()  # the connection may be broken: the next claim reconnects
            raise translate_claim_error(exc) from exc
        return _blocks_of(rows)

    def _connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed:
            assert isinstance(self._source, str)
            conn = psycopg.connect(
                self._source,
                autocommit=True,
                connect_timeout=_connect_timeout(self._connect_timeout_s),
                application_name=self._application_name,
            )
            try:
                conn.execute(SET_STATEMENT_TIMEOUT, {"ms": str(self._statement_timeout_ms)})
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def begin(self, consumer: str, n: int) -> bool:
        """Send a claim over the own connection without waiting (see
        :class:`NonBlockingClaimer`). libpq writes the few hundred bytes into the socket
        buffer at once; the rare rest is flushed by :meth:`poll`."""
        conn = self._conn
        if self._sent is not None or conn is None or conn.closed:
            return False  # also: a pool source, which never opens a connection of its own
        pgconn = conn.pgconn
        if pgconn.transaction_status != TransactionStatus.IDLE:
            return False
        try:
            params = [consumer.encode(conn.info.encoding), str(n).encode()]
        except (UnicodeError, LookupError):
            return False  # claim() reports it
        try:
            pgconn.send_query_params(CLAIM_BLOCKS_PQ, params, param_types=[_TEXT_OID, _INT4_OID])
            flushed = pgconn.flush() == 0
        except psycopg.Error:
            # Broken connection: claim() reconnects. Had the server read the whole claim, its
            # blocks are lost, like any claim whose answer never arrives.
            self.close()
            return False
        self._sent = _SentClaim(conn, flushed, [])
        return True

    def poll(self) -> list[Block] | None:
        """The begun claim's blocks once its answer is in (see :class:`NonBlockingClaimer`):
        ``consume_input`` reads what the socket holds, ``is_busy`` tells whether libpq can
        hand out the next result without waiting."""
        sent = self._sent
        if sent is None:
            raise RuntimeError("PostgresClaimer.poll() without a claim begun")
        pgconn = sent.conn.pgconn
        try:
            if not sent.flushed:
                pgconn.consume_input()  # libpq: read whatever is readable, then flush again
                if pgconn.flush() != 0:
                    return None
                sent.flushed = True
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    break
                sent.results.append(result)
            else:
                return None
        except psycopg.Error as exc:  # the connection failed (OperationalError)
            self._sent = None
            self.close()
            raise translate_claim_error(exc) from exc
        self._sent = None
        return self._blocks_from(sent)

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        """Wait for the begun claim's answer (see :class:`NonBlockingClaimer`); the default
        bound is the statement timeout plus ``connect_timeout_s``."""
        sent = self._sent
        if sent is None:
            raise RuntimeError("PostgresClaimer.finish() without a claim begun")
        limit = self._answer_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        blocks = self.poll()
        if blocks is not None:
            return blocks
        try:
            fd = sent.conn.pgconn.socket
        except psycopg.Error as exc:
            self._sent = None
            self.close()
            raise translate_claim_error(exc) from exc
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._sent = None
                    self.close()  # abandons the claim: whatever it claimed is lost
                    raise DatabaseUnavailableError(
                        f"claim ID blocks: no answer from PostgreSQL within {limit:g} s"
                    )
                events = selectors.EVENT_READ | (0 if sent.flushed else selectors.EVENT_WRITE)
                selector.modify(fd, events)
                selector.select(remaining)
                blocks = self.poll()
                if blocks is not None:
                    return blocks

    def _blocks_from(self, sent: _SentClaim) -> list[Block]:
        """The blocks in a finished claim's results, or its translated error (the connection
        closed unless it was AL001..AL003, as :meth:`claim` does)."""
        for result in sent.results:
            if result.status == ExecStatus.FATAL_ERROR:
                exc = psycopg.errors.error_from_result(result, encoding=sent.conn.info.encoding)
                if (exc.sqlstate or "") not in _ARGUMENT_SQLSTATES | {_POOL_EMPTY_SQLSTATE}:
                    self.close()
                raise translate_claim_error(exc) from exc
        rows = [r for r in sent.results if r.status == ExecStatus.TUPLES_OK]
        blocks: list[Block] = []
        if len(rows) == 1 and rows[0].nfields == 3:
            result = rows[0]
            for row in range(result.ntuples):
                block_id, first_id, last_id = (result.get_value(row, column) for column in range(3))
                if block_id is None or first_id is None or last_id is None:
                    break
                blocks.append(Block(int(block_id), int(first_id), int(last_id)))
            else:
                return blocks
        self.close()
        statuses = ",".join(ExecStatus(r.status).name for r in sent.results) or "none"
        raise DatabaseError(f"claim ID blocks: unexpected answer from PostgreSQL ({statuses})")

    def close(self) -> None:
        """Close the own connection (a borrowed pool stays open); a begun claim is
        abandoned (what it claimed is lost)."""
        self._sent = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class AsyncPostgresClaimer:
    """:class:`PostgresClaimer` for asyncio: an own ``AsyncConnection`` or an
    ``AsyncConnectionPool``."""

    def __init__(
        self,
        source: str | AsyncConnectionPool[Any],
        *,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        application_name: str = APPLICATION_NAME,
    ) -> None:
        self._source = source
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_ms = statement_timeout_ms
        self._application_name = application_name
        self._conn: psycopg.AsyncConnection[TupleRow] | None = None

    async def claim(self, consumer: str, n: int) -> list[Block]:
        params = {"consumer": consumer, "n": n}
        try:
            if isinstance(self._source, AsyncConnectionPool):
                async with self._source.connection() as conn:
                    cursor = await conn.execute(CLAIM_BLOCKS, params)
                    rows = await cursor.fetchall()
            else:
                conn = await self._connection()
                rows = await (await conn.execute(CLAIM_BLOCKS, params)).fetchall()
        except psycopg.Error as exc:
            if (exc.sqlstate or "") not in _ARGUMENT_SQLSTATES | {_POOL_EMPTY_SQLSTATE}:
                await self.close()
            raise translate_claim_error(exc) from exc
        return _blocks_of(rows)

    async def _connection(self) -> psycopg.AsyncConnection[TupleRow]:
        if self._conn is None or self._conn.closed:
            assert isinstance(self._source, str)
            conn = await psycopg.AsyncConnection.connect(
                self._source,
                autocommit=True,
                connect_timeout=_connect_timeout(self._connect_timeout_s),
                application_name=self._application_name,
            )
            try:
                await conn.execute(SET_STATEMENT_TIMEOUT, {"ms": str(self._statement_timeout_ms)})
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


class InMemoryClaimer:
    """A fake pool for tests (yours and ours): consecutive blocks of ``block_size`` IDs from
    ``first_id``; after ``blocks`` blocks (None: never) it answers like an empty pool.
    Thread-safe; usable as a :class:`Claimer` and, through :meth:`as_async`, an
    :class:`AsyncClaimer`.

    With ``non_blocking`` it also plays a :class:`NonBlockingClaimer`: ``begin`` records the
    claim, which is made (through :meth:`claim`, errors included) when its answer is
    collected; :meth:`hold_answers` keeps answers out (``poll`` returns None, ``finish``
    waits) until :meth:`release_answers`. Without it ``begin`` always declines."""

    def __init__(
        self,
        *,
        block_size: int = 4096,
        first_id: int = 1 << 22,
        blocks: int | None = None,
        non_blocking: bool = False,
    ) -> None:
        if block_size < 1 or first_id < 0 or (blocks is not None and blocks < 0):
            raise ValueError("block_size must be >= 1, first_id and blocks >= 0")
        self._lock = threading.Lock()
        self._block_size = block_size
        self._next_first = first_id
        self._left = blocks
        self._next_block_id = 1
        self.claims: list[tuple[str, int]] = []
        """Every call, as ``(consumer, n)``."""
        self.handed_out: list[Block] = []
        self.non_blocking = non_blocking
        self.begun: list[tuple[str, int]] = []
        """Every claim ``begin`` accepted, as ``(consumer, n)``."""
        self._sent: tuple[str, int] | None = None
        self._answers = threading.Event()
        self._answers.set()

    def add_blocks(self, count: int) -> None:
        """Stock the pool with ``count`` more blocks (when it is limited)."""
        with self._lock:
            self._left = (self._left or 0) + count

    def claim(self, consumer: str, n: int) -> list[Block]:
        check_consumer(consumer)
        if not 1 <= n <= MAX_BATCH_BLOCKS:
            raise ClaimArgumentError(
                f"block count must be between 1 and {MAX_BATCH_BLOCKS}, got {n}", sqlstate="AL002"
            )
        with self._lock:
            self.claims.append((consumer, n))
            count = n if self._left is None else min(n, self._left)
            if count == 0:
                raise PoolEmptyError("claim ID blocks: pool empty: no ID block is available")
            if self._left is not None:
                self._left -= count
            blocks = []
            for _ in range(count):
                first = self._next_first
                blocks.append(Block(self._next_block_id, first, first + self._block_size - 1))
                self._next_first += self._block_size
                self._next_block_id += 1
            self.handed_out.extend(blocks)
            return blocks

    def hold_answers(self) -> None:
        """Keep begun claims unanswered until :meth:`release_answers`."""
        self._answers.clear()

    def release_answers(self) -> None:
        self._answers.set()

    @property
    def claim_begun(self) -> bool:
        """Whether a begun claim awaits collection."""
        return self._sent is not None

    def begin(self, consumer: str, n: int) -> bool:
        with self._lock:
            if not self.non_blocking or self._sent is not None:
                return False
            self._sent = (consumer, n)
            self.begun.append((consumer, n))
            return True

    def poll(self) -> list[Block] | None:
        with self._lock:
            sent = self._sent
            if sent is None:
                raise RuntimeError("InMemoryClaimer.poll() without a claim begun")
            if not self._answers.is_set():
                return None
            self._sent = None
        return self.claim(*sent)

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        limit = DEFAULT_STATEMENT_TIMEOUT_MS / 1000 if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while (blocks := self.poll()) is None:
            if not self._answers.wait(max(0.0, deadline - time.monotonic())):
                with self._lock:
                    self._sent = None
                raise DatabaseUnavailableError(f"claim ID blocks: no answer within {limit:g} s")
        return blocks

    def close(self) -> None:
        pass

    def as_async(self) -> AsyncClaimer:
        return _AsyncAdapter(self)


class _AsyncAdapter:
    def __init__(self, claimer: Claimer) -> None:
        self._claimer = claimer

    async def claim(self, consumer: str, n: int) -> list[Block]:
        return self._claimer.claim(consumer, n)

    async def close(self) -> None:
        self._claimer.close()


def claim_once(
    url: str,
    consumer: str,
    n: int = 1,
    *,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
    application_name: str = APPLICATION_NAME,
) -> list[Block]:
    """Claim up to ``n`` blocks (1..1000) in one call over a short-lived connection; fewer
    when the pool runs short. Raises :class:`PoolEmptyError` when none could be claimed."""
    check_consumer(consumer)
    if not 1 <= n <= MAX_BATCH_BLOCKS:
        raise ClaimArgumentError(
            f"block count must be between 1 and {MAX_BATCH_BLOCKS}, got {n}", sqlstate="AL002"
        )
    claimer = PostgresClaimer(
        url,
        connect_timeout_s=connect_timeout_s,
        statement_timeout_ms=statement_timeout_ms,
        application_name=application_name,
    )
    try:
        return claimer.claim(consumer, n)
    finally:
        claimer.close()


# -- the buffer both clients share ---------------------------------------------------------------

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class _Settings:
    consumer: str
    batch_blocks: int
    max_batch_blocks: int
    refill_at: float
    wait_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    close_timeout_s: float


def _settings(
    consumer: str,
    *,
    batch_blocks: int,
    max_batch_blocks: int | None,
    refill_at: float,
    wait_timeout_s: float,
    backoff_initial_s: float,
    backoff_max_s: float,
    close_timeout_s: float,
) -> _Settings:
    """Every client setting validated in one place (ValueError, or ClaimArgumentError for a
    consumer name the database would refuse)."""
    check_consumer(consumer)
    if not 1 <= batch_blocks <= MAX_BATCH_BLOCKS:
        raise ValueError(f"batch_blocks must be in 1..{MAX_BATCH_BLOCKS} (got {batch_blocks})")
    if max_batch_blocks is None:
        max_batch_blocks = batch_blocks
    if not batch_blocks <= max_batch_blocks <= MAX_BATCH_BLOCKS:
        raise ValueError(
            f"max_batch_blocks must be in batch_blocks..{MAX_BATCH_BLOCKS} (got {max_batch_blocks})"
        )
    if not 0.0 < refill_at <= 1.0:
        raise ValueError(f"refill_at must be in (0, 1] (got {refill_at})")
    for name, value in (
        ("wait_timeout_s", wait_timeout_s),
        ("backoff_initial_s", backoff_initial_s),
        ("backoff_max_s", backoff_max_s),
        ("close_timeout_s", close_timeout_s),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds (got {value})")
    if backoff_max_s < backoff_initial_s:
        raise ValueError("backoff_max_s must be >= backoff_initial_s")
    return _Settings(
        consumer,
        batch_blocks,
        max_batch_blocks,
        refill_at,
        wait_timeout_s,
        backoff_initial_s,
        backoff_max_s,
        close_timeout_s,
    )


class _Buffer:
    """State and slow-path logic shared by both clients; no locking here (the sync client
    holds its lock around every method, the async one runs on one event loop).

    The current block is ``[_next, _last]`` (empty when ``_next > _last``); ``_rest`` holds
    the current segment's other blocks; ``_prefetched`` the next segment; ``_trigger`` the ID
    whose hand-out asks for a refill (``_NO_ID`` when none is pending).
    """

    def __init__(self, settings: _Settings) -> None:
        self._settings = settings
        self._consumer = settings.consumer
        self._next = 1
        self._last = 0
        self._trigger = _NO_ID
        self._rest: deque[Range] = deque()
        self._prefetched: list[Range] | None = None
        self._refill_wanted = False
        self._claim_in_flight = False
        self._batch_blocks = settings.batch_blocks
        self._grown_after_claims = 0
        self._closing = False
        self._closed_error: ClientClosedError | None = None
        self._fatal: AllocatorError | None = None
        self._last_error: AllocatorError | None = None
        self._report: UnusedIds | None = None
        self._stats = {
            "claims": 0,
            "claim_failures": 0,
            "pool_empty_answers": 0,
            "blocks_claimed": 0,
            "ids_claimed": 0,
            "waits": 0,
            "wait_timeouts": 0,
            "last_claim_us": 0,
            "max_claim_us": 0,
        }
        _LIVE.add(self)

    # All of these run with the client's lock held (or on its event loop).

    def _advance(self) -> bool:
        """Make the next block current; False (and a refill wanted) when none is buffered."""
        if self._rest:
            self._next, self._last = self._rest.popleft()
            return True
        segment = self._prefetched
        if segment:
            self._prefetched = None
            self._install(segment)
            return True
        self._refill_wanted = True
        return False

    def _install(self, segment: list[Range]) -> None:
        total = sum(last - first + 1 for first, last in segment)
        offset = min(total - 1, math.floor(total * (1.0 - self._settings.refill_at)))
        self._trigger = _NO_ID
        self._rest = deque(segment)
        self._next, self._last = self._rest.popleft()
        if offset <= 0:  # refill_at = 1: ask for the next segment as this one starts
            self._refill_due()
            return
        for first, last in segment:
            if offset <= last - first:
                self._trigger = first + offset
                return
            offset -= last - first + 1

    def _refill_due(self) -> None:
        """The trigger ID went out: the claimer should fetch the next segment now."""
        self._trigger = _NO_ID
        self._refill_wanted = True
        self._wake_claimer()

    def _wake_claimer(self) -> None:
        raise NotImplementedError

    def _take(self, need: int, ranges: list[Range]) -> int:
        """Move up to ``need`` IDs into ``ranges``; returns how many are still missing."""
        while need:
            available = self._last - self._next + 1
            if available <= 0:
                if not self._advance():
                    break
                continue
            count = min(need, available)
            first = self._next
            last = first + count - 1
            self._next = last + 1
            if first <= self._trigger <= last:
                self._refill_due()
            ranges.append((first, last))
            need -= count
        return need

    def _give_back(self, ranges: list[Range]) -> None:
        """Return a failed ``take``'s ranges; used before anything else. The current block
        is exhausted and nothing is buffered, or the take would not have had to wait."""
        if ranges and self._closed_error is None:
            self._rest.extendleft(reversed(ranges))
            ranges.clear()

    def _note_wait(self) -> None:
        """A caller found nothing buffered. After the first claim that means the prefetch
        came too late for this rate: claim bigger segments (doubling, up to
        ``max_batch_blocks``; once per claim however many callers wait)."""
        self._stats["waits"] += 1
        claims = self._stats["claims"]
        limit = self._settings.max_batch_blocks
        if claims and claims != self._grown_after_claims and self._batch_blocks < limit:
            self._batch_blocks = min(limit, self._batch_blocks * 2)
            self._grown_after_claims = claims
            log.info(
                "event=client_batch_grown consumer=%s batch_blocks=%d",
                self._consumer,
                self._batch_blocks,
            )

    def _timed(self, started_ns: int) -> None:
        took_us = (time.perf_counter_ns() - started_ns) // 1000
        self._stats["last_claim_us"] = took_us
        self._stats["max_claim_us"] = max(self._stats["max_claim_us"], took_us)

    def _wants_claim(self) -> bool:
        return (
            self._refill_wanted
            and self._prefetched is None
            and not self._closing
            and self._fatal is None
        )

    def _accept(self, blocks: list[Block]) -> list[Range]:
        """Buffer a claimed segment (also while closing: the report will include it);
        returns it instead when the client's report is already out (the IDs are lost)."""
        segment = [(b.first_id, b.last_id) for b in sorted(blocks, key=lambda b: b.first_id)]
        if not segment:  # claim_blocks raises AL003 instead; a custom claimer might not
            raise PoolEmptyError("claim ID blocks: the claim returned no block")
        if any(first > last for first, last in segment):
            raise DatabaseError("claim ID blocks: the database returned a block with last < first")
        self._stats["claims"] += 1
        self._stats["blocks_claimed"] += len(segment)
        self._stats["ids_claimed"] += sum(last - first + 1 for first, last in segment)
        self._last_error = None
        if self._closed_error is not None:  # the report is out: nobody will use these
            return segment
        if segment:
            self._prefetched = segment
            self._refill_wanted = False
        return []

    def _failed(self, error: AllocatorError) -> None:
        self._stats["claim_failures"] += 1
        if isinstance(error, PoolEmptyError):
            self._stats["pool_empty_answers"] += 1
        if isinstance(error, ClaimArgumentError):
            self._fatal = error
        self._last_error = error

    def _check_usable(self) -> None:
        """Raise what a caller who found no ID left must raise at once, if anything."""
        if self._closed_error is not None:
            raise ClientClosedError(str(self._closed_error))
        if self._closing:
            raise ClientClosedError(f"ID client for consumer {self._consumer!r} is closing")
        fatal = self._fatal
        if fatal is not None:
            raise ClaimArgumentError(
                f"no ID block for consumer {self._consumer!r}: {fatal}",
                sqlstate=getattr(fatal, "sqlstate", ""),
            ) from fatal
        last = self._last_error
        if last is not None and not isinstance(last, PoolEmptyError | DatabaseUnavailableError):
            raise DatabaseError(f"no ID block for consumer {self._consumer!r}: {last}") from last

    def _timeout_error(self) -> AllocatorError:
        self._stats["wait_timeouts"] += 1
        last = self._last_error
        base = (
            f"no ID block for consumer {self._consumer!r} within "
            f"{self._settings.wait_timeout_s:g} s"
        )
        error: AllocatorError
        if isinstance(last, PoolEmptyError):
            error = PoolEmptyError(
                f"{base}: the pool is empty (the leader refills it; check allocator.pool_status)"
            )
        elif last is None:
            error = DatabaseUnavailableError(f"{base}: the claim is still running")
        else:
            error = DatabaseUnavailableError(f"{base}: {last}")
        error.__cause__ = last
        return error

    def _close_buffers(self) -> UnusedIds:
        """Take every unused range out of the client (no ID can be handed out after this)."""
        ranges: list[Range] = []
        if self._next <= self._last:
            ranges.append((self._next, self._last))
        ranges.extend(self._rest)
        ranges.extend(self._prefetched or [])
        self._next, self._last, self._trigger = 1, 0, _NO_ID
        self._rest.clear()
        self._prefetched = None
        return UnusedIds(
            count=sum(last - first + 1 for first, last in ranges),
            ranges=merge_ranges(ranges),
            complete=not self._claim_in_flight,
        )

    def _available(self) -> int:
        current = max(0, self._last - self._next + 1)
        rest = sum(last - first + 1 for first, last in self._rest)
        ahead = sum(last - first + 1 for first, last in self._prefetched or [])
        return current + rest + ahead

    def _stats_snapshot(self) -> dict[str, int]:
        return {
            **self._stats,
            "ids_available": self._available(),
            "prefetched_blocks": len(self._prefetched or []),
            "batch_blocks": self._batch_blocks,
            "claim_in_flight": int(self._claim_in_flight),
        }

    def _after_fork_in_child(self) -> None:
        self._next, self._last, self._trigger = 1, 0, _NO_ID
        self._rest = deque()
        self._prefetched = None
        self._closed_error = ClientClosedError(
            f"ID client for consumer {self._consumer!r} was inherited across fork(); "
            "create a new client in the child process"
        )


_LIVE: weakref.WeakSet[_Buffer] = weakref.WeakSet()


def _forget_buffers_after_fork() -> None:
    # The parent keeps handing out these IDs; the child must never use them (I1).
    for client in list(_LIVE):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_forget_buffers_after_fork)


def _log_unused(consumer: str, report: UnusedIds) -> None:
    if report.count or not report.complete:
        log.info(
            "event=client_closed consumer=%s unused_ids=%d unused_ranges=%s complete=%s",
            consumer,
            report.count,
            ",".join(f"{first}-{last}" for first, last in report.ranges) or "-",
            report.complete,
        )


def _log_lost(consumer: str, segment: list[Range]) -> None:
    log.warning(
        "event=client_blocks_lost_after_close consumer=%s ids=%d ranges=%s",
        consumer,
        sum(last - first + 1 for first, last in segment),
        ",".join(f"{first}-{last}" for first, last in merge_ranges(segment)),
    )


def _log_claim_failed(consumer: str, error: AllocatorError, delay_s: float | None) -> None:
    if isinstance(error, PoolEmptyError):
        log.debug("event=client_pool_empty consumer=%s retry_in_s=%.3f", consumer, delay_s or 0)
    elif delay_s is None:
        log.error("event=client_claim_refused consumer=%s error=%s", consumer, error)
    else:
        log.warning(
            "event=client_claim_failed consumer=%s error=%s retry_in_s=%.3f",
            consumer,
            error,
            delay_s,
        )


def _as_allocator_error(exc: Exception) -> AllocatorError:
    if isinstance(exc, AllocatorError):
        return exc
    log.error("event=client_claimer_bug error=%r", exc, exc_info=exc)
    error = DatabaseError(f"claim ID blocks: unexpected {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


# -- the threaded client ----------------------------------------------------------------------


class IdClient(_Buffer):
    """Thread-safe Snowflake IDs from claimed blocks, handed out from memory.

    ``IdClient(url_or_pool_or_claimer, consumer, batch_blocks=1, refill_at=0.5,
    wait_timeout_s=5.0)``: ``url_or_pool_or_claimer`` is a conninfo string (the client opens
    one connection of its own, in its claimer thread), a ``psycopg_pool.ConnectionPool``
    (borrowed per claim, never closed by the client) or any :class:`Claimer`.
    ``batch_blocks`` (1..1000) is how many blocks one claim asks for: raise it when one
    block lasts less than a few claim round trips. The module docstring has the rules;
    the short form:

    - ``next_id()`` / ``take(n)`` / ``take_ranges(n)`` hand out IDs; they wait at most
      ``wait_timeout_s`` when nothing is buffered, then raise :class:`PoolEmptyError` (or
      :class:`DatabaseUnavailableError`).
    - The claimer thread starts on first use or :meth:`start`; the constructor does no I/O.
    - The prefetch normally involves no other thread: the caller that hands out the trigger
      ID sends the claim without waiting (over the client's own connection, or any
      :class:`NonBlockingClaimer`), and callers collect its answer at block boundaries. The
      claimer thread connects, makes the first claim, retries, waits for a late answer and
      finishes a claim out at close (module docstring, Latency).
    - :meth:`close` stops it and returns the :class:`UnusedIds`: claimed, never handed out,
      and lost for good (never reused by anyone).
    """

    def __init__(
        self,
        conninfo_or_pool: str | ConnectionPool[Any] | Claimer,
        consumer: str,
        *,
        batch_blocks: int = DEFAULT_BATCH_BLOCKS,
        max_batch_blocks: int | None = None,
        refill_at: float = DEFAULT_REFILL_AT,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
    ) -> None:
        super().__init__(
            _settings(
                consumer,
                batch_blocks=batch_blocks,
                max_batch_blocks=max_batch_blocks,
                refill_at=refill_at,
                wait_timeout_s=wait_timeout_s,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                close_timeout_s=close_timeout_s,
            )
        )
        self._owns_claimer = isinstance(conninfo_or_pool, str | ConnectionPool)
        self._claimer: Claimer
        if isinstance(conninfo_or_pool, str | ConnectionPool):
            self._claimer = PostgresClaimer(
                conninfo_or_pool,
                connect_timeout_s=connect_timeout_s,
                statement_timeout_ms=statement_timeout_ms,
                application_name=f"{APPLICATION_NAME}:{consumer}"[:63],
            )
        else:
            self._claimer = conninfo_or_pool
        self._non_blocking: NonBlockingClaimer | None = (
            self._claimer if isinstance(self._claimer, NonBlockingClaimer) else None
        )
        self._begun = False
        """A claim a caller's thread began is out (``_claim_in_flight`` is set too)."""
        self._begun_handed_over = False
        """...and the claimer thread owns it now: callers no longer poll it."""
        self._begun_ns = 0
        self._retry_error: AllocatorError | None = None
        """A failed begun claim, collected by a caller: the claimer thread backs off, then
        claims again."""
        self._stats.update(
            claims_begun=0,
            claims_on_caller_thread=0,
            claims_handed_over=0,
            claims_on_claimer_thread=0,
        )
        self._new_lock()
        self._thread: threading.Thread | None = None

    def _new_lock(self) -> None:
        self._lock = threading.Lock()
        self._claim_needed = threading.Condition(self._lock)
        self._changed = threading.Condition(self._lock)

    # -- handing out IDs (the hot path) ----------------------------------------------------

    def next_id(self) -> int:
        """One ID. From memory unless the buffer is empty; then waits up to
        ``wait_timeout_s`` for a claim (raises :class:`PoolEmptyError`,
        :class:`DatabaseUnavailableError`, :class:`ClientClosedError`)."""
        lock = self._lock
        lock.acquire()
        try:
            n = self._next
            if n <= self._last:
                self._next = n + 1
                if n == self._trigger:
                    self._refill_due()
                return n
        finally:
            lock.release()
        return self._next_slow()

    def _next_slow(self) -> int:
        ranges: list[Range] = []
        self._take_waiting(1, ranges)
        return ranges[0][0]

    def take_ranges(self, n: int) -> list[Range]:
        """``n`` IDs as inclusive ``(first, last)`` ranges (one per block touched), all or
        nothing: a call that times out gives back what it had gathered."""
        if n < 1:
            raise ValueError(f"n must be >= 1 (got {n})")
        ranges: list[Range] = []
        self._take_waiting(n, ranges)
        return ranges

    def take(self, n: int) -> list[int]:
        """``n`` IDs as a list (see :meth:`take_ranges` for the cheap form)."""
        ids: list[int] = []
        for first, last in self.take_ranges(n):
            ids.extend(range(first, last + 1))
        return ids

    def _take_waiting(self, need: int, ranges: list[Range]) -> None:
        with self._lock:
            deadline: float | None = None
            while True:
                need = self._take(need, ranges)
                if need == 0:
                    return
                try:
                    self._check_usable()
                except AllocatorError:
                    self._give_back(ranges)
                    raise
                self._start_locked()
                self._claim_needed.notify()
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._settings.wait_timeout_s
                    self._note_wait()
                elif now >= deadline:
                    self._give_back(ranges)
                    raise self._timeout_error()
                self._changed.wait(deadline - now)

    def _wake_claimer(self) -> None:
        self._claim_needed.notify()

    # -- the prefetch on the caller's thread (lock held) ------------------------------------

    def _refill_due(self) -> None:
        """The trigger ID went out: send the next claim from this thread without waiting
        when the claimer can, else wake the claimer thread (module docstring, Latency)."""
        self._trigger = _NO_ID
        self._refill_wanted = True
        if not self._begin_claim():
            self._wake_claimer()

    def _begin_claim(self) -> bool:
        """``begin`` the prefetch on this thread, if the claimer thread is idle (no claim in
        flight), nothing failed (no backoff pending) and nothing is closing; True if sent."""
        claimer = self._non_blocking
        if (
            claimer is None
            or self._thread is None
            or self._claim_in_flight
            or self._prefetched is not None
            or self._closing
            or self._closed_error is not None
            or self._fatal is not None
            or self._last_error is not None
            or self._retry_error is not None
        ):
            return False
        try:
            begun = claimer.begin(self._consumer, self._batch_blocks)
        except Exception as exc:  # begin() must not raise; if it does, the thread claims
            log.error("event=client_claimer_bug error=%r", exc, exc_info=exc)
            return False
        if begun:
            self._begun = True
            self._claim_in_flight = True
            self._begun_ns = time.perf_counter_ns()
            self._stats["claims_begun"] += 1
        return begun

    def _advance(self) -> bool:
        """At a block boundary: collect a begun claim's answer if it is in; when nothing is
        buffered, hand a begun claim still out over to the claimer thread."""
        if self._begun and not self._begun_handed_over:
            self._collect_begun()
        if super()._advance():
            return True
        if self._begun and not self._begun_handed_over:
            self._hand_over_begun()
        return False

    def _collect_begun(self) -> None:
        """``poll`` the begun claim; when it is over, buffer its segment or record its
        failure (the claimer thread then backs off and claims again)."""
        assert self._non_blocking is not None
        error: AllocatorError | None = None
        blocks: list[Block] | None = None
        try:
            blocks = self._non_blocking.poll()
        except Exception as exc:
            error = _as_allocator_error(exc)
        if blocks is None and error is None:
            return  # not in yet
        self._stats["claims_on_caller_thread"] += 1
        self._begun = False
        self._claim_in_flight = False
        self._timed(self._begun_ns)
        if blocks is not None:
            try:
                lost = self._accept(blocks)
            except AllocatorError as exc:
                error = exc
            else:
                self._changed.notify_all()
                if lost:
                    _log_lost(self._consumer, lost)
                return
        assert error is not None
        self._failed(error)
        self._refill_wanted = True
        self._retry_error = error
        self._claim_needed.notify()
        self._changed.notify_all()

    def _hand_over_begun(self) -> None:
        """From now on the claimer thread owns the begun claim (it waits for it with
        ``finish``); no caller polls it again."""
        self._begun_handed_over = True
        self._stats["claims_handed_over"] += 1
        self._claim_needed.notify()

    def _wants_claim(self) -> bool:
        return not self._begun and super()._wants_claim()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, wait: bool = False) -> None:
        """Start the claimer thread, which claims the first segment at once. With ``wait``,
        also wait (up to ``wait_timeout_s``) until that segment is buffered."""
        with self._lock:
            if self._closing or self._closed_error is not None:
                self._check_usable()
            if self._next > self._last and not self._rest and self._prefetched is None:
                self._advance()  # wants a refill, or collects/hands over a begun claim
            self._start_locked()
            self._claim_needed.notify()
            if not wait:
                return
            deadline = time.monotonic() + self._settings.wait_timeout_s
            while self._available() == 0:
                self._check_usable()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout_error()
                self._changed.wait(remaining)

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"allocator-claimer:{self._consumer}", daemon=True
            )
            self._thread.start()

    def close(self, timeout: float | None = None) -> UnusedIds:
        """Stop the claimer (waiting up to ``timeout`` s, default ``close_timeout_s``, for a
        claim in flight) and return the IDs never handed out: lost, never reused. Later
        calls return the same report; using the client after it raises
        :class:`ClientClosedError`."""
        with self._lock:
            if self._report is not None:
                return self._report
            self._closing = True
            if self._begun and not self._begun_handed_over:
                self._hand_over_begun()  # the claimer thread finishes it for the report
            self._claim_needed.notify_all()
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._settings.close_timeout_s if timeout is None else timeout)
        with self._lock:
            if self._report is not None:  # closed concurrently
                return self._report
            report = self._close_buffers()
            self._closed_error = ClientClosedError(
                f"ID client for consumer {self._consumer!r} is closed"
            )
            self._report = report
        if thread is None and self._owns_claimer:
            self._claimer.close()  # else the claimer thread closes it as it ends
        _log_unused(self._consumer, report)
        return report

    def __enter__(self) -> IdClient:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def get_stats(self) -> dict[str, int]:
        """Counters (claims, failures, waits, …) and ``ids_available`` right now."""
        with self._lock:
            return self._stats_snapshot()

    @property
    def consumer(self) -> str:
        return self._consumer

    # -- the claimer thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._claim_until_closed()
        finally:
            if self._owns_claimer:
                self._claimer.close()

    def _claim_until_closed(self) -> None:
        attempt = 0
        claims_at_failure = -1  # successes since the last failure reset the backoff
        while True:
            with self._lock:
                job = self._next_job()
                if job is None:
                    return
                if job == "retry":  # a caller collected a failed claim
                    error = self._retry_error
                    self._retry_error = None
                    assert error is not None
                    if self._stats["claims"] != claims_at_failure:
                        attempt = 0  # claims collected on a caller's thread succeeded since
                    claims_at_failure = self._stats["claims"]
                    if not self._back_off(error, attempt):
                        return
                    attempt += 1
                    continue
                started_ns = self._begun_ns if job == "finish" else time.perf_counter_ns()
            error = None
            blocks: list[Block] = []
            try:
                if job == "finish":
                    assert self._non_blocking is not None
                    blocks = self._non_blocking.finish()
                else:
                    blocks = self._claimer.claim(self._consumer, self._batch_blocks)
            except Exception as exc:
                error = _as_allocator_error(exc)
            with self._lock:
                self._timed(started_ns)
                self._claim_in_flight = False
                self._begun = self._begun_handed_over = False
                if error is None:
                    try:
                        lost = self._accept(blocks)
                    except AllocatorError as exc:
                        error = exc
                    else:
                        attempt = 0
                        self._changed.notify_all()
                        if lost:
                            _log_lost(self._consumer, lost)
                        continue
                self._failed(error)
                self._changed.notify_all()
                if self._stats["claims"] != claims_at_failure:
                    attempt = 0
                claims_at_failure = self._stats["claims"]
                if not self._back_off(error, attempt):
                    return
                attempt += 1

    def _next_job(self) -> str | None:
        """Wait (lock held) for the claimer thread's next job: ``finish`` a begun claim
        handed over (or left out at close), back off after a failed begun claim
        (``retry``), or ``claim``; None once there is nothing left to do."""
        while True:
            if self._begun and (self._begun_handed_over or self._closing):
                self._begun_handed_over = True
                return "finish"
            if self._retry_error is not None:
                return "retry"
            if self._wants_claim():
                self._claim_in_flight = True
                self._stats["claims_on_claimer_thread"] += 1
                return "claim"
            if self._closing or self._fatal is not None or self._closed_error:
                return None
            self._claim_needed.wait()

    def _back_off(self, error: AllocatorError, attempt: int) -> bool:
        """After a failed claim (lock held): False when the claimer must stop (the error is
        fatal), else True after the backoff delay (cut short by close)."""
        if self._fatal is not None:
            _log_claim_failed(self._consumer, error, None)
            return False
        delay = backoff_delay(
            attempt,
            initial_s=self._settings.backoff_initial_s,
            max_s=self._settings.backoff_max_s,
        )
        _log_claim_failed(self._consumer, error, delay)
        deadline = time.monotonic() + delay
        while not self._closing and (remaining := deadline - time.monotonic()) > 0:
            self._claim_needed.wait(remaining)
        return True

    def _after_fork_in_child(self) -> None:
        self._new_lock()  # the parent's lock may have been held at fork time
        self._thread = None
        # A begun claim is the parent's, on the parent's connection: never poll, finish or
        # close it here (closing would end the parent's session too).
        self._begun = self._begun_handed_over = self._claim_in_flight = False
        self._retry_error = None
        self._owns_claimer = False
        super()._after_fork_in_child()


# -- the asyncio client ----------------------------------------------------------------------


class AsyncIdClient(_Buffer):
    """:class:`IdClient` for asyncio: the same rules, ``await next_id()``, ``await take(n)``,
    ``await aclose()``; its claimer is a task on the loop of first use. Use it from one event
    loop (it takes no lock: its hot path never yields to the loop)."""

    def __init__(
        self,
        conninfo_or_pool: str | AsyncConnectionPool[Any] | AsyncClaimer,
        consumer: str,
        *,
        batch_blocks: int = DEFAULT_BATCH_BLOCKS,
        max_batch_blocks: int | None = None,
        refill_at: float = DEFAULT_REFILL_AT,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
        backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
    ) -> None:
        super().__init__(
            _settings(
                consumer,
                batch_blocks=batch_blocks,
                max_batch_blocks=max_batch_blocks,
                refill_at=refill_at,
                wait_timeout_s=wait_timeout_s,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                close_timeout_s=close_timeout_s,
            )
        )
        self._owns_claimer = isinstance(conninfo_or_pool, str | AsyncConnectionPool)
        self._claimer: AsyncClaimer
        if isinstance(conninfo_or_pool, str | AsyncConnectionPool):
            self._claimer = AsyncPostgresClaimer(
                conninfo_or_pool,
                connect_timeout_s=connect_timeout_s,
                statement_timeout_ms=statement_timeout_ms,
                application_name=f"{APPLICATION_NAME}:{consumer}"[:63],
            )
        else:
            self._claimer = conninfo_or_pool
        self._claim_needed = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def next_id(self) -> int:
        """One ID (see :meth:`IdClient.next_id`)."""
        n = self._next
        if n <= self._last:
            self._next = n + 1
            if n == self._trigger:
                self._refill_due()
            return n
        ranges: list[Range] = []
        await self._take_waiting(1, ranges)
        return ranges[0][0]

    async def take_ranges(self, n: int) -> list[Range]:
        """``n`` IDs as inclusive ranges (see :meth:`IdClient.take_ranges`)."""
        if n < 1:
            raise ValueError(f"n must be >= 1 (got {n})")
        ranges: list[Range] = []
        await self._take_waiting(n, ranges)
        return ranges

    async def take(self, n: int) -> list[int]:
        """``n`` IDs as a list."""
        ids: list[int] = []
        for first, last in await self.take_ranges(n):
            ids.extend(range(first, last + 1))
        return ids

    async def _take_waiting(self, need: int, ranges: list[Range]) -> None:
        deadline: float | None = None
        while True:
            need = self._take(need, ranges)
            if need == 0:
                return
            try:
                self._check_usable()
            except AllocatorError:
                self._give_back(ranges)
                raise
            self._start_task()
            self._claim_needed.set()
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._settings.wait_timeout_s
                self._note_wait()
            elif now >= deadline:
                self._give_back(ranges)
                raise self._timeout_error()
            await self._wait_changed(deadline - now)

    async def _wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def _notify_changed(self) -> None:
        # Waiters hold the old event; a fresh one serves the next round of waits.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _wake_claimer(self) -> None:
        self._claim_needed.set()

    async def start(self, wait: bool = False) -> None:
        """Start the claimer task (see :meth:`IdClient.start`)."""
        if self._closed_error is not None or self._closing:
            self._check_usable()
        if self._available() == 0:
            self._refill_wanted = True
        self._start_task()
        self._claim_needed.set()
        if not wait:
            return
        deadline = time.monotonic() + self._settings.wait_timeout_s
        while self._available() == 0:
            self._check_usable()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout_error()
            await self._wait_changed(remaining)

    def _start_task(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"allocator-claimer:{self._consumer}"
            )

    async def aclose(self, timeout: float | None = None) -> UnusedIds:
        """Stop the claimer task (cancelled after ``timeout`` s, default ``close_timeout_s``)
        and return the unused IDs: lost, never reused (see :meth:`IdClient.close`)."""
        if self._report is not None:
            return self._report
        self._closing = True
        self._claim_needed.set()
        self._notify_changed()
        task = self._task
        finished = True
        if task is not None and not task.done():
            limit = self._settings.close_timeout_s if timeout is None else timeout
            done, _ = await asyncio.wait({task}, timeout=limit)
            if not done:
                task.cancel()  # a claim that committed meanwhile is lost (and unreported)
                finished = False
                await asyncio.wait({task})
        if self._report is not None:
            return self._report
        report = self._close_buffers()
        if not finished:
            report = UnusedIds(report.count, report.ranges, complete=False)
        self._closed_error = ClientClosedError(
            f"ID client for consumer {self._consumer!r} is closed"
        )
        self._report = report
        if self._owns_claimer:
            await self._claimer.close()
        _log_unused(self._consumer, report)
        return report

    async def __aenter__(self) -> AsyncIdClient:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def get_stats(self) -> dict[str, int]:
        return self._stats_snapshot()

    @property
    def consumer(self) -> str:
        return self._consumer

    async def _run(self) -> None:
        attempt = 0
        while True:
            while not self._wants_claim():
                if self._closing or self._fatal is not None or self._closed_error:
                    return
                self._claim_needed.clear()
                await self._claim_needed.wait()
            self._claim_in_flight = True
            error: AllocatorError | None = None
            blocks: list[Block] = []
            started_ns = time.perf_counter_ns()
            try:
                blocks = await self._claimer.claim(self._consumer, self._batch_blocks)
            except Exception as exc:
                error = _as_allocator_error(exc)
            finally:
                self._claim_in_flight = False
                self._timed(started_ns)
            if error is None:
                try:
                    lost = self._accept(blocks)
                except AllocatorError as exc:
                    error = exc
                else:
                    attempt = 0
                    self._notify_changed()
                    if lost:
                        _log_lost(self._consumer, lost)
                    continue
            self._failed(error)
            self._notify_changed()
            if self._fatal is not None:
                _log_claim_failed(self._consumer, error, None)
                return
            delay = backoff_delay(
                attempt,
                initial_s=self._settings.backoff_initial_s,
                max_s=self._settings.backoff_max_s,
            )
            attempt += 1
            _log_claim_failed(self._consumer, error, delay)
            deadline = time.monotonic() + delay
            while not self._closing and (remaining := deadline - time.monotonic()) > 0:
                self._claim_needed.clear()
                try:
                    await asyncio.wait_for(self._claim_needed.wait(), remaining)
                except TimeoutError:
                    break
