"""The claimers: :class:`PostgresClaimer` / :class:`AsyncPostgresClaimer` (own connection or a
psycopg pool), :class:`InMemoryClaimer` for tests, and :func:`claim_once`. Each serves one
caller at a time (the clients guarantee it).
"""

from __future__ import annotations

import contextlib
import math
import selectors
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from allocator.client.base import (
    APPLICATION_NAME,
    CLAIM_BLOCKS,
    CLAIM_BLOCKS_EXPIRING,
    CLAIM_BLOCKS_EXPIRING_PQ,
    CLAIM_BLOCKS_PQ,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    INT4_OID,
    KEEP_CONNECTION_SQLSTATES,
    MAX_BATCH_BLOCKS,
    SET_LOCAL_STATEMENT_TIMEOUT,
    SET_LOCAL_STATEMENT_TIMEOUT_PQ,
    TEXT_OID,
    UNDEFINED_FUNCTION_SQLSTATE,
    AsyncClaimer,
    Block,
    ClaimArgumentError,
    Claimer,
    PoolEmptyError,
    check_consumer,
    translate_claim_error,
)
from allocator.core import logs
from allocator.core.errors import DatabaseError, DatabaseUnavailableError

log = logs.get_logger(__name__)


def _blocks_of(rows: Sequence[TupleRow]) -> list[Block]:
    return [
        Block(
            int(row[0]),
            int(row[1]),
            int(row[2]),
            None if len(row) < 4 or row[3] is None else int(row[3]),
        )
        for row in rows
    ]


def _lacks_expiring(exc: psycopg.Error) -> bool:
    """Whether a ``claim_blocks_expiring`` call failed because the database has no such
    function (SQLSTATE 42883, undefined_function: a schema before migration 0011).

    The fallback rule of every PostgreSQL claimer: the first claim on each own connection
    (over a pool: the claimer's first) tries ``claim_blocks_expiring``; this answer makes it
    claim with ``claim_blocks`` at once, and for the rest of that connection's (the pool's)
    life, so a new client works against an older schema, without expiry. Both functions
    claim alike, and the failed lookup claimed nothing."""
    if exc.sqlstate != UNDEFINED_FUNCTION_SQLSTATE:
        return False
    log.info("client_claims_without_expiry", reason=exc.diag.message_primary or str(exc))
    return True


def _connect_timeout(seconds: float) -> int:
    return max(2, math.ceil(seconds))  # libpq counts whole seconds; below 2 it misbehaves


_PIPELINE = psycopg.Pipeline.is_supported()
"""Whether libpq has pipeline mode (14+; the ``psycopg[binary]`` wheels always do)."""


# The rule of every claim the claimers send, so that a claim works through PgBouncer in
# transaction mode and leaves nothing behind on a shared or pooled connection: its
# statement_timeout is set per transaction (SET_LOCAL_STATEMENT_TIMEOUT, in the claim's own
# transaction, one round trip in a pipeline), never per session; statements are never
# prepared server-side (``prepare=False``, own connections with ``prepare_threshold=None``):
# PgBouncer before 1.21 (Debian 12 ships 1.18) cannot route a named prepared statement; no
# SET, LISTEN or advisory lock ever runs on a claimer's connection.


def _claim_rows(
    conn: psycopg.Connection[TupleRow], statement: str, params: dict[str, Any], timeout_ms: str
) -> list[TupleRow]:
    """One claim statement with its statement_timeout, in one transaction (see the rule
    above): the connection's own (autocommit: the pipeline's implicit one) or the one a
    pooled connection opens and its pool context commits. Without pipeline mode: an explicit
    transaction (two more round trips)."""
    batch: contextlib.AbstractContextManager[object] = (
        conn.pipeline() if _PIPELINE else conn.transaction()
    )
    with batch:
        conn.execute(SET_LOCAL_STATEMENT_TIMEOUT, {"ms": timeout_ms}, prepare=False)
        cursor = conn.execute(statement, params, prepare=False)
    return cursor.fetchall()


async def _claim_rows_async(
    conn: psycopg.AsyncConnection[TupleRow],
    statement: str,
    params: dict[str, Any],
    timeout_ms: str,
) -> list[TupleRow]:
    """:func:`_claim_rows`, awaited."""
    batch: contextlib.AbstractAsyncContextManager[object] = (
        conn.pipeline() if _PIPELINE else conn.transaction()
    )
    async with batch:
        await conn.execute(SET_LOCAL_STATEMENT_TIMEOUT, {"ms": timeout_ms}, prepare=False)
        cursor = await conn.execute(statement, params, prepare=False)
    return await cursor.fetchall()


# -- PostgreSQL claimers -----------------------------------------------------------------------


@dataclass(slots=True)
class _SentClaim:
    """A claim :meth:`PostgresClaimer.begin` sent: its connection, whether libpq has flushed
    it all to the socket yet, and the results read so far."""

    conn: psycopg.Connection[TupleRow]
    flushed: bool
    results: list[PGresult]
    synced: bool = False
    """Whether the pipeline's sync arrived: the claim's transaction has ended (committed, or
    failed), so its results are final."""


class PostgresClaimer:
    """Claims over one connection of its own (opened on first claim, reopened after a
    failure) from a conninfo string, or over connections borrowed from a ``psycopg_pool``
    pool (whose settings are then the pool owner's business; each claim still sets its own
    statement_timeout, for its transaction only).

    It is a :class:`NonBlockingClaimer` over its own connection once that is open (the first
    :meth:`claim` opens it; ``begin`` never connects): ``begin`` sends the claim with libpq's
    non-blocking calls (psycopg keeps its connections in non-blocking mode), ``poll`` reads
    what has arrived, ``finish`` waits on the socket with the GIL released, for at most the
    statement timeout plus ``connect_timeout_s``. Over a pool ``begin`` always declines.

    Every claim sets its statement_timeout (``statement_timeout_ms``) for its own transaction
    only, and no statement is prepared server-side: a claim works through PgBouncer in
    transaction mode (docs/claiming-ids.md, PgBouncer).

    After any error but AL001..AL004 (answers of ``claim_blocks`` itself, on a sound
    connection) it closes its own connection, so the next claim reconnects.
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
        self._timeout_param = str(statement_timeout_ms)
        self._application_name = application_name
        self._answer_timeout_s = statement_timeout_ms / 1000 + connect_timeout_s
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._sent: _SentClaim | None = None
        self._expiring: bool | None = None
        """Whether the database has ``claim_blocks_expiring`` (None: not known yet): per own
        connection (reset on reconnect), or for the claimer's life over a pool."""

    def claim(self, consumer: str, n: int) -> list[Block]:
        """Claim up to ``n`` blocks, blocking (see :meth:`Claimer.claim`); with the fallback
        of :func:`_lacks_expiring`."""
        if self._sent is not None:  # a begun claim nobody finished: abandon it (lost)
            self.close()
        params = {"consumer": consumer, "n": n}
        try:
            if not isinstance(self._source, ConnectionPool):
                self._connection()  # first: a new connection asks again which function
            if self._expiring is not False:
                try:
                    rows = self._execute(CLAIM_BLOCKS_EXPIRING, params)
                except psycopg.Error as exc:
                    if not _lacks_expiring(exc):
                        raise
                    self._expiring = False
                else:
                    self._expiring = True
                    return _blocks_of(rows)
            rows = self._execute(CLAIM_BLOCKS, params)
        except psycopg.Error as exc:
            if (exc.sqlstate or "") not in KEEP_CONNECTION_SQLSTATES:
                self.close()  # the connection may be broken: the next claim reconnects
            raise translate_claim_error(exc) from exc
        return _blocks_of(rows)

    def _execute(self, statement: str, params: dict[str, Any]) -> list[TupleRow]:
        """One claim statement over a borrowed connection (each its own: a failed lookup may
        have aborted the first one's transaction, and the pool rolls it back) or the own one
        (autocommit: idle again after a failed lookup)."""
        if isinstance(self._source, ConnectionPool):
            with self._source.connection() as pooled:
                return _claim_rows(pooled, statement, params, self._timeout_param)
        return _claim_rows(self._connection(), statement, params, self._timeout_param)

    def _connection(self) -> psycopg.Connection[TupleRow]:
        if self._conn is None or self._conn.closed:
            assert isinstance(self._source, str)
            self._expiring = None  # a new connection asks again (the schema may be newer)
            self._conn = psycopg.connect(
                self._source,
                autocommit=True,
                prepare_threshold=None,
                connect_timeout=_connect_timeout(self._connect_timeout_s),
                application_name=self._application_name,
            )
        return self._conn

    def begin(self, consumer: str, n: int) -> bool:
        """Send a claim over the own connection without waiting (see
        :class:`NonBlockingClaimer`): in libpq's pipeline mode, the claim's statement_timeout,
        the claim and a sync, as :func:`_claim_rows` sends them. libpq writes the few hundred
        bytes into the socket buffer at once; the rare rest is flushed by :meth:`poll`."""
        conn = self._conn
        if (
            self._sent is not None
            or conn is None
            or conn.closed
            or self._expiring is None
            or not _PIPELINE
        ):
            # also: a pool source, which never opens a connection of its own; and a
            # connection that has not yet learnt which claim function the database has
            return False
        pgconn = conn.pgconn
        if pgconn.transaction_status != TransactionStatus.IDLE:
            return False
        try:
            params = [consumer.encode(conn.info.encoding), str(n).encode()]
        except (UnicodeError, LookupError):
            return False  # claim() reports it
        try:
            statement = CLAIM_BLOCKS_EXPIRING_PQ if self._expiring else CLAIM_BLOCKS_PQ
            pgconn.enter_pipeline_mode()
            pgconn.send_query_params(
                SET_LOCAL_STATEMENT_TIMEOUT_PQ,
                [self._timeout_param.encode()],
                param_types=[TEXT_OID],
            )
            pgconn.send_query_params(statement, params, param_types=[TEXT_OID, INT4_OID])
            pgconn.pipeline_sync()
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
        hand out the next result without waiting. The claim is over at the pipeline's sync
        (its transaction has ended): its rows arrive before the commit, and are never
        returned before it."""
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
            while not sent.synced:
                if pgconn.is_busy():
                    return None
                result = pgconn.get_result()
                if result is None:
                    continue  # the end of one statement's results; the next follow
                sent.results.append(result)
                sent.synced = result.status == ExecStatus.PIPELINE_SYNC
            pgconn.exit_pipeline_mode()
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
        closed unless it was AL001..AL004, as :meth:`claim` does)."""
        for result in sent.results:
            if result.status == ExecStatus.FATAL_ERROR:
                exc = psycopg.errors.error_from_result(result, encoding=sent.conn.info.encoding)
                if (exc.sqlstate or "") not in KEEP_CONNECTION_SQLSTATES:
                    self.close()
                raise translate_claim_error(exc) from exc
        rows = [r for r in sent.results if r.status == ExecStatus.TUPLES_OK]
        blocks: list[Block] = []
        if len(rows) == 2 and rows[1].nfields in (3, 4):  # set_config's, then the claim's
            result = rows[1]
            for row in range(result.ntuples):
                block_id, first_id, last_id = (result.get_value(row, column) for column in range(3))
                if block_id is None or first_id is None or last_id is None:
                    break
                expires = result.get_value(row, 3) if result.nfields == 4 else None
                blocks.append(
                    Block(
                        int(block_id),
                        int(first_id),
                        int(last_id),
                        None if expires is None else int(expires),
                    )
                )
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
        self._timeout_param = str(statement_timeout_ms)
        self._application_name = application_name
        self._conn: psycopg.AsyncConnection[TupleRow] | None = None
        self._expiring: bool | None = None
        """As :class:`PostgresClaimer`'s."""

    async def claim(self, consumer: str, n: int) -> list[Block]:
        """As :meth:`PostgresClaimer.claim`, awaited."""
        params = {"consumer": consumer, "n": n}
        try:
            if self._expiring is not False:
                try:
                    rows = await self._execute(CLAIM_BLOCKS_EXPIRING, params)
                except psycopg.Error as exc:
                    if not _lacks_expiring(exc):
                        raise
                    self._expiring = False
                else:
                    self._expiring = True
                    return _blocks_of(rows)
            rows = await self._execute(CLAIM_BLOCKS, params)
        except psycopg.Error as exc:
            if (exc.sqlstate or "") not in KEEP_CONNECTION_SQLSTATES:
                await self.close()
            raise translate_claim_error(exc) from exc
        return _blocks_of(rows)

    async def _execute(self, statement: str, params: dict[str, Any]) -> list[TupleRow]:
        """One claim statement over a borrowed connection (each its own) or the own one
        (autocommit: idle again after a failed lookup)."""
        if isinstance(self._source, AsyncConnectionPool):
            async with self._source.connection() as pooled:
                return await _claim_rows_async(pooled, statement, params, self._timeout_param)
        conn = await self._connection()
        return await _claim_rows_async(conn, statement, params, self._timeout_param)

    async def _connection(self) -> psycopg.AsyncConnection[TupleRow]:
        if self._conn is None or self._conn.closed:
            assert isinstance(self._source, str)
            self._expiring = None  # a new connection asks again (the schema may be newer)
            self._conn = await psycopg.AsyncConnection.connect(
                self._source,
                autocommit=True,
                prepare_threshold=None,
                connect_timeout=_connect_timeout(self._connect_timeout_s),
                application_name=self._application_name,
            )
        return self._conn

    async def close(self) -> None:
        """Close the own connection (a borrowed pool stays open)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


class InMemoryClaimer:
    """A fake pool for tests (yours and ours): consecutive blocks of ``block_size`` IDs from
    ``first_id``; after ``blocks`` blocks (None: never) it answers like an empty pool. Each
    block carries ``expires_in_ms`` (None: no age bound, like a database before migration
    0011); tests may change the attribute between claims.
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
        expires_in_ms: int | None = None,
    ) -> None:
        if block_size < 1 or first_id < 0 or (blocks is not None and blocks < 0):
            raise ValueError("block_size must be >= 1, first_id and blocks >= 0")
        self._lock = threading.Lock()
        self._block_size = block_size
        self._next_first = first_id
        self._left = blocks
        self._next_block_id = 1
        self.expires_in_ms = expires_in_ms
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
        """The next ``n`` blocks (fewer when the stock runs short), checked as the database
        checks its arguments; :class:`PoolEmptyError` when none is left."""
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
                last = first + self._block_size - 1
                blocks.append(Block(self._next_block_id, first, last, self.expires_in_ms))
                self._next_first += self._block_size
                self._next_block_id += 1
            self.handed_out.extend(blocks)
            return blocks

    def hold_answers(self) -> None:
        """Keep begun claims unanswered until :meth:`release_answers`."""
        self._answers.clear()

    def release_answers(self) -> None:
        """Let begun claims be answered again (see :meth:`hold_answers`)."""
        self._answers.set()

    @property
    def claim_begun(self) -> bool:
        """Whether a begun claim awaits collection."""
        return self._sent is not None

    def begin(self, consumer: str, n: int) -> bool:
        """Record a claim to be made when collected; False without ``non_blocking`` or while
        one is out."""
        with self._lock:
            if not self.non_blocking or self._sent is not None:
                return False
            self._sent = (consumer, n)
            self.begun.append((consumer, n))
            return True

    def poll(self) -> list[Block] | None:
        """Make the begun claim and return its blocks; None while answers are held."""
        with self._lock:
            sent = self._sent
            if sent is None:
                raise RuntimeError("InMemoryClaimer.poll() without a claim begun")
            if not self._answers.is_set():
                return None
            self._sent = None
        return self.claim(*sent)

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        """Wait for the begun claim's answer while answers are held (at most ``timeout_s``;
        None: the default statement timeout), then as :meth:`poll`."""
        limit = DEFAULT_STATEMENT_TIMEOUT_MS / 1000 if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while (blocks := self.poll()) is None:
            if not self._answers.wait(max(0.0, deadline - time.monotonic())):
                with self._lock:
                    self._sent = None
                raise DatabaseUnavailableError(f"claim ID blocks: no answer within {limit:g} s")
        return blocks

    def close(self) -> None:
        """Nothing to release."""

    def as_async(self) -> AsyncClaimer:
        """This claimer as an :class:`AsyncClaimer` (for :class:`AsyncIdClient`)."""
        return _AsyncAdapter(self)


class _AsyncAdapter:
    """Any :class:`Claimer` awaited: each call runs on the event loop's thread."""

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
