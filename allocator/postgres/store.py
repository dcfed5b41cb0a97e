"""The node's PostgreSQL access: named operations over a connection pool, errors translated.

SQL text comes from :mod:`allocator.postgres.sql` (none is composed here); each operation
returns a small frozen record (:mod:`allocator.core.records`) or a plain value, never a
driver row. The fence protocol it carries: docs/design.md §3. Operators' calls are
:mod:`allocator.postgres.operator`'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg.rows import TupleRow, class_row
from psycopg_pool import ConnectionPool

from allocator.config import PostgresConfig
from allocator.core import logs
from allocator.core.errors import (
    DatabaseBehindError,
    DatabaseError,
    DatabaseLoginError,
    DatabaseUnavailableError,
    InvalidBatchError,
    SchemaMismatchError,
    WriteAbandonedError,
)
from allocator.core.layout import Layout
from allocator.core.records import (
    BlockAgeBound,
    BlockAgeStatus,
    ClaimedBlock,
    ClockReading,
    CommitCheck,
    CutResult,
    FenceState,
    PoolStatus,
    Replication,
    Takeover,
    TermRecord,
)
from allocator.fence import BIGINT_MAX, Token, Watermark, database_behind
from allocator.postgres import compat, sql
from allocator.postgres.compat import SchemaStamp
from allocator.postgres.errors import translate, translated

log = logs.get_logger(__name__)

APPLICATION_NAME_PREFIX = "allocator-node:"
LOCK_TIMEOUT_MS = 1000
"""Default wait of a node statement for a lock (the fence row, a block row) before failing."""
DEFAULT_MAX_CLOCK_AHEAD_MS = 1000

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What ``SHOW`` says on a node connection (for diagnostics and tests)."""

    statement_timeout: str
    idle_in_transaction_session_timeout: str
    lock_timeout: str
    application_name: str


def refuse_behind(held: Token, high_water_id: int, watermark: Watermark) -> None:
    """Raise :class:`DatabaseBehindError` if the database's fence ``held`` or its mark
    ``high_water_id`` lies below ``watermark`` (a takeover's comparison; the fake store
    makes it with this rule too)."""
    reason = database_behind(held, high_water_id, watermark)
    if reason is not None:
        raise DatabaseBehindError(
            reason, generation=held.generation, epoch=held.epoch, high_water_id=high_water_id
        )


def _check_before_commit(what: str, commit_if: CommitCheck | None) -> None:
    """Raise :class:`WriteAbandonedError` when ``commit_if`` says leadership came into doubt
    (I6): the write rolls back instead of committing.
    """
    if commit_if is not None and not commit_if():
        raise WriteAbandonedError(f"{what}: abandoned before commit, leadership is in doubt")


def _check_ids(ranges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The firsts and lasts of ``ranges``, each checked to fit a ``bigint``."""
    firsts = [first for first, _ in ranges]
    lasts = [last for _, last in ranges]
    if any(not 0 <= value <= BIGINT_MAX for value in (*firsts, *lasts)):
        raise InvalidBatchError("cut blocks: every ID must be in 0..2^63-1")
    return firsts, lasts


class NodeDatabase:
    """The leader's (and followers') access to PostgreSQL, over a ``psycopg_pool`` pool.

    - No hidden I/O: building one only records its settings; :meth:`open` creates and fills
      the pool (again after :meth:`close`), and ``with`` does both. Operations may run from
      several threads at once; ``open``/``close`` are not meant to race with them.
    - Every operation is one statement in its own short transaction; nothing stays open
      between operations, so a paused node holds a lock at most for
      ``idle_in_transaction_session_timeout``. The exception is :meth:`take_fence`, which
      sets its own ``lock_timeout`` for its transaction.
    - Fenced writes carry the whole token ``(generation, epoch)`` and take ``commit_if``,
      asked right before COMMIT: a node whose leadership came into doubt while the statement
      ran rolls the write back (:class:`WriteAbandonedError`) instead of committing it (I6).
      Block writes and takeovers also carry the node's layout (checked against the recorded
      one) and ``max_clock_ahead_ms`` (the database refuses blocks past its own clock plus
      that, or plus the lead the mark already had; migration 0003).
    - Errors are translated here (:func:`allocator.postgres.errors.translate`), keeping
      ``__cause__``; a pool timeout is :class:`DatabaseUnavailableError` too.
    """

    def __init__(
        self,
        config: PostgresConfig,
        *,
        node_name: str,
        lock_timeout_ms: int = LOCK_TIMEOUT_MS,
        takeover_lock_timeout_ms: int | None = None,
        layout: Layout | None = None,
        datacenter_id: int = 0,
        max_clock_ahead_ms: int = DEFAULT_MAX_CLOCK_AHEAD_MS,
    ) -> None:
        if lock_timeout_ms <= 0:
            raise ValueError(f"lock_timeout_ms must be > 0 (got {lock_timeout_ms})")
        if takeover_lock_timeout_ms is not None and takeover_lock_timeout_ms <= 0:
            raise ValueError(
                f"takeover_lock_timeout_ms must be > 0 (got {takeover_lock_timeout_ms})"
            )
        self._config = config
        self._node_name = node_name
        self._application_name = APPLICATION_NAME_PREFIX + node_name
        self._lock_timeout_ms = lock_timeout_ms
        self._takeover_lock_timeout_ms = takeover_lock_timeout_ms or config.statement_timeout_ms
        self._layout_json = json.dumps((layout or Layout()).record(datacenter_id), sort_keys=True)
        self._max_clock_ahead_ms = max_clock_ahead_ms
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def application_name(self) -> str:
        """``allocator-node:<name>``, as every pool connection reports it (PostgreSQL keeps
        63 bytes).
        """
        return self._application_name

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self._pool is not None

    def open(self, timeout: float | None = None) -> None:
        """Create the pool and wait up to ``timeout`` s (default: the connect timeout) for
        its first connection.

        A login the server refuses is :class:`DatabaseLoginError` (also a
        :class:`DatabaseUnavailableError`): found out with one connection of its own, as the
        pool only logs it.
        """
        if self._pool is not None:
            return
        timeout = self._config.connect_timeout_s if timeout is None else timeout
        pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
            self._config.url.get_secret_value(),
            kwargs={"autocommit": True, **connection_kwargs(self._config)},
            min_size=self._config.pool_min_size,
            max_size=self._config.pool_max_size,
            open=False,
            configure=self._configure,
            check=ConnectionPool.check_connection,
            name=self._application_name,
            timeout=self._config.connect_timeout_s,
        )
        failed: DatabaseUnavailableError | None = None
        try:
            with translated("open the node database pool"):
                pool.open(wait=True, timeout=timeout)
        except DatabaseUnavailableError as exc:
            pool.close()
            failed = exc
        except BaseException:
            pool.close()
            raise
        if failed is not None:  # outside the handler: the login's error is not chained to it
            raise self._refused_login() or failed
        self._pool = pool
        log.info(
            "db_pool_opened",
            name=self._application_name,
            min_size=self._config.pool_min_size,
            max_size=self._config.pool_max_size,
        )

    def _refused_login(self) -> DatabaseLoginError | None:
        """Why the pool could not connect, when it is a refused login (the pool only logs
        its connection errors): one connection of our own, translated."""
        try:
            psycopg.connect(
                self._config.url.get_secret_value(), **connection_kwargs(self._config)
            ).close()
        except psycopg.Error as exc:
            found = translate(exc, "open the node database pool")
            if isinstance(found, DatabaseLoginError):
                found.__cause__ = exc
                return found
        return None

    def close(self, timeout: float = 5.0) -> None:
        """Close the pool; connections in use are closed when they are returned."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=timeout)
            log.info("db_pool_closed", name=self._application_name)

    def __enter__(self) -> NodeDatabase:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _configure(self, conn: psycopg.Connection[TupleRow]) -> None:
        """Configure each new pool connection.

        ``statement_timeout`` and ``idle_in_transaction_session_timeout`` from
        :class:`PostgresConfig`, the :attr:`application_name`, and a short ``lock_timeout``:
        a fenced write that queues behind a takeover fails quickly and retryably (its retry
        is then rejected as fenced) instead of waiting.
        """
        conn.execute(
            sql.CONFIGURE_SESSION,
            {
                "statement_timeout": str(self._config.statement_timeout_ms),
                "idle_in_transaction_timeout": str(self._config.idle_in_transaction_timeout_ms),
                "lock_timeout": str(self._lock_timeout_ms),
                "application_name": self._application_name,
            },
        )

    @contextmanager
    def _connection(self, what: str) -> Iterator[psycopg.Connection[TupleRow]]:
        """A pool connection for ``what``, driver errors translated on the way out."""
        with translated(what):
            pool = self._pool
            if pool is None:
                raise DatabaseError(f"{what}: the node database is not open")
            with pool.connection() as conn:
                yield conn

    def _row(
        self,
        what: str,
        query: str,
        params: Mapping[str, Any],
        kind: type[_T],
        commit_if: CommitCheck | None = None,
    ) -> _T:
        """One statement's one row as ``kind``, in its own transaction, ``commit_if`` asked
        before COMMIT.
        """
        with (
            self._connection(what) as conn,
            conn.transaction(),
            conn.cursor(row_factory=class_row(kind)) as cursor,
        ):
            row = cursor.execute(query, params).fetchone()
            _check_before_commit(what, commit_if)
        if row is None:
            raise DatabaseError(f"{what}: the database returned no row")
        return row

    def _scalar(
        self,
        what: str,
        query: str,
        params: Mapping[str, Any] | None = None,
        commit_if: CommitCheck | None = None,
    ) -> Any:
        """One statement's single value, in its own transaction, ``commit_if`` asked before
        COMMIT.
        """
        with self._connection(what) as conn, conn.transaction():
            row = conn.execute(query, params).fetchone()
            _check_before_commit(what, commit_if)
        if row is None:
            raise DatabaseError(f"{what}: the database returned no row")
        return row[0]

    # -- the fence and block writes -------------------------------------------------------

    def take_fence(
        self,
        token: Token,
        holder: str,
        host: str,
        pid: int,
        watermark: Watermark | None = None,
    ) -> Takeover:
        """Move the fence to ``token`` (which must be newer) and record the term.

        With ``watermark`` (ZooKeeper's, as the node read it), the database is compared with
        it before the transaction commits, on what ``take_fence`` returns (the token it
        replaced and the mark, read under the fence row's lock): a database below it
        (:func:`allocator.fence.database_behind`) raises :class:`DatabaseBehindError` and the
        transaction rolls back, so nothing is written. No takeover commits without a
        completed comparison: a comparison that cannot be made is a takeover that cannot be
        made. (Not a read of ``pool_status`` first: that view counts the whole pool, the
        largest step of a planned handover.)

        Unlike the fenced writes, it must wait for a write already in flight: its
        ``lock_timeout`` is ``takeover_lock_timeout_ms`` (default: the statement timeout).
        Raises :class:`StaleTakeoverError` when the fence already holds ``token`` or a newer
        one, :class:`LayoutMismatchError` when the database recorded another layout.
        """
        what = "take the fence"
        params = {
            "generation": token.generation,
            "epoch": token.epoch,
            "holder": holder,
            "host": host,
            "pid": pid,
            "layout": self._layout_json,
        }
        with (
            self._connection(what) as conn,
            conn.transaction(),
            conn.cursor(row_factory=class_row(Takeover)) as cursor,
        ):
            cursor.execute(
                sql.SET_LOCAL_LOCK_TIMEOUT, {"lock_timeout": str(self._takeover_lock_timeout_ms)}
            )
            row = cursor.execute(sql.TAKE_FENCE, params).fetchone()
            if row is not None and watermark is not None:  # raised here: rolled back
                held = Token(row.previous_generation, row.previous_epoch)
                refuse_behind(held, row.high_water_id, watermark)
        if row is None:
            raise DatabaseError(f"{what}: the database returned no row")
        return row

    def cut_blocks(
        self,
        token: Token,
        ranges: Sequence[tuple[int, int]],
        commit_if: CommitCheck | None = None,
    ) -> CutResult:
        """Write a batch of blocks ``[(first_id, last_id), …]`` (ascending) in one statement.

        Raises :class:`FencedError` (``token`` no longer holds the fence),
        :class:`BehindHighWaterError` (the first block is not after the mark),
        :class:`InvalidBatchError` (empty, unordered, overlapping or malformed batch),
        :class:`LayoutMismatchError` (another layout or datacenter),
        :class:`ClockAheadError` (past the database clock plus the allowed lead).
        """
        firsts, lasts = _check_ids(ranges)
        params = {
            "generation": token.generation,
            "epoch": token.epoch,
            "first_ids": firsts,
            "last_ids": lasts,
            "layout": self._layout_json,
            "max_ahead_ms": self._max_clock_ahead_ms,
        }
        return self._row("cut blocks", sql.CUT_BLOCKS, params, CutResult, commit_if)

    def requeue_stranded(self, token: Token, commit_if: CommitCheck | None = None) -> int:
        """Give stranded unclaimed blocks fresh tickets (fenced); how many moved."""
        params = {"generation": token.generation, "epoch": token.epoch}
        return int(self._scalar("requeue stranded blocks", sql.REQUEUE_STRANDED, params, commit_if))

    def prune_claimed(
        self,
        token: Token,
        retention_s: float,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int:
        """Delete at most ``limit`` blocks claimed more than ``retention_s`` ago by the
        database clock (fenced); how many."""
        if retention_s < 0:
            raise ValueError(f"retention_s must be >= 0 (got {retention_s})")
        params = {
            "generation": token.generation,
            "epoch": token.epoch,
            "retention_ms": round(retention_s * 1000),
            "limit": limit,
        }
        return int(self._scalar("prune claimed blocks", sql.PRUNE_CLAIMED, params, commit_if))

    def leader_heartbeat(
        self,
        token: Token,
        bound: BlockAgeBound,
        commit_if: CommitCheck | None = None,
    ) -> datetime:
        """Record that this leader serves, with its bound on an ID's age (fenced); the
        heartbeat's time by the database clock."""
        params = {
            "generation": token.generation,
            "epoch": token.epoch,
            "max_block_age_ms": bound.max_block_age_ms,
            "serve_aged_without_leader": bound.serve_aged_without_leader,
            "leader_stale_ms": bound.leader_stale_ms,
        }
        what = "write the leader heartbeat"
        beat: datetime = self._scalar(what, sql.LEADER_HEARTBEAT, params, commit_if)
        return beat

    def void_aged_blocks(
        self,
        token: Token,
        ahead_ms: int,
        limit: int,
        commit_if: CommitCheck | None = None,
    ) -> int:
        """Void at most ``limit`` unclaimed blocks older than the bound minus ``ahead_ms``,
        oldest first (fenced); how many."""
        params = {
            "generation": token.generation,
            "epoch": token.epoch,
            "ahead_ms": ahead_ms,
            "limit": limit,
        }
        return int(self._scalar("void aged blocks", sql.VOID_AGED_BLOCKS, params, commit_if))

    def end_term(self, token: Token, reason: str) -> bool:
        """Mark the term of ``token`` ended; False when it was already ended or is unknown."""
        params = {"generation": token.generation, "epoch": token.epoch, "reason": reason}
        return bool(self._scalar("end the term", sql.END_TERM, params))

    def record_pool_sample(self) -> None:
        """Record one sample of the ticket positions (for the claim rate and runway)."""
        with self._connection("record a pool sample") as conn:
            conn.execute(sql.RECORD_POOL_SAMPLE)

    # -- reads ----------------------------------------------------------------------------

    def pool_status(self) -> PoolStatus:
        """The one row of ``allocator.pool_status``."""
        return self._row("read the pool status", sql.POOL_STATUS, {}, PoolStatus)

    def block_age_status(self) -> BlockAgeStatus:
        """The bound on an ID's age, whether a leader serves, the oldest block's age."""
        what = "read the block age status"
        return self._row(what, sql.BLOCK_AGE_STATUS, {}, BlockAgeStatus)

    def claimed_block_ages(
        self, after_ticket: int, upto_ticket: int, limit: int
    ) -> list[ClaimedBlock]:
        """The blocks handed out with tickets in ``(after_ticket, upto_ticket]``, newest
        first, at most ``limit``, voided ones left out."""
        params = {"after_ticket": after_ticket, "upto_ticket": upto_ticket, "limit": limit}
        with (
            self._connection("read the blocks handed out") as conn,
            conn.cursor(row_factory=class_row(ClaimedBlock)) as cursor,
        ):
            return cursor.execute(sql.CLAIMED_BLOCK_AGES, params).fetchall()

    def leader_history(self, limit: int) -> list[TermRecord]:
        """The latest ``limit`` terms, newest first."""
        with (
            self._connection("read the leader history") as conn,
            conn.cursor(row_factory=class_row(TermRecord)) as cursor,
        ):
            return cursor.execute(sql.LEADER_HISTORY, {"limit": limit}).fetchall()

    def fence(self) -> FenceState:
        """Who holds the fence now (token (0, 0) and no holder before the first takeover)."""
        with self._connection("read the fence") as conn:
            row = conn.execute(sql.FENCE_AND_HIGH_WATER).fetchone()
        if row is None:
            raise DatabaseError("read the fence: the database returned no row")
        return FenceState(
            epoch=int(row[0]), holder=row[1], generation=int(row[3]), high_water_id=int(row[2])
        )

    def high_water_id(self) -> int:
        """The last ID ever cut (inclusive); -1 before the first cut."""
        with self._connection("read the high-water mark") as conn:
            row = conn.execute(sql.FENCE_AND_HIGH_WATER).fetchone()
        if row is None:
            raise DatabaseError("read the high-water mark: the database returned no row")
        return int(row[2])

    def session_settings(self) -> SessionSettings:
        """The settings the pool applied, as one pool connection reports them."""
        return self._row("read session settings", sql.SESSION_SETTINGS, {}, SessionSettings)

    def ping(self) -> None:
        """One round trip; raises :class:`DatabaseUnavailableError` when it fails."""
        with self._connection("ping the database") as conn:
            conn.execute(sql.PING)

    def replication(self) -> Replication:
        """How the database replicates (one round trip; see :class:`Replication`)."""
        return self._row("read the replication status", sql.REPLICATION_STATUS, {}, Replication)

    def schema_stamp(self) -> SchemaStamp:
        """The database's schema revision and compatibility marker
        (:mod:`allocator.postgres.compat`), in one transaction.

        A role that may not read Alembic's version table is :class:`SchemaMismatchError`:
        ``allocator migrate`` of this release grants it (an older release's did not).
        """
        what = "read the schema revision"
        try:
            with self._connection(what) as conn, conn.transaction():
                present, comment = conn.execute(sql.VERSION_TABLE).fetchone() or (False, None)
                rows = conn.execute(sql.SCHEMA_REVISION).fetchall() if present else []
        except DatabaseError as exc:
            if isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
                raise SchemaMismatchError(
                    f"{what}: this node's role may not read public.alembic_version "
                    f"({compat.accepted_range()}): run `allocator migrate` with this release, "
                    "which grants allocator_node SELECT on it"
                ) from exc
            raise
        revision = str(rows[0][0]) if rows else None
        return SchemaStamp(revision, compat.read_marker(comment))

    def read_clock(self, now_ms: Callable[[], float]) -> ClockReading:
        """The database clock against ``now_ms`` (the node's clock), from one round trip."""
        with self._connection("read the database clock") as conn:
            before = now_ms()
            row = conn.execute(sql.DB_CLOCK).fetchone()
            after = now_ms()
        if row is None:
            raise DatabaseError("read the database clock: the database returned no row")
        db_ms = int(row[0])
        return ClockReading(
            offset_ms=db_ms - (before + after) / 2, uncertainty_ms=(after - before) / 2, db_ms=db_ms
        )


def connection_kwargs(config: PostgresConfig) -> dict[str, Any]:
    """libpq parameters of every node connection: a bounded connect, and TCP keepalives plus
    ``tcp_user_timeout``.

    A call on a path that drops packets (rather than refusing them) so fails within a bound
    instead of hanging; ``statement_timeout`` cannot help there, the server's cancel never
    arrives.
    """
    return {
        "connect_timeout": max(2, math.ceil(config.connect_timeout_s)),
        "keepalives": 1,
        "keepalives_idle": config.keepalives_idle_s,
        "keepalives_interval": config.keepalives_interval_s,
        "keepalives_count": config.keepalives_count,
        "tcp_user_timeout": config.tcp_user_timeout_ms,
    }
