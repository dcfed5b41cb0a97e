"""The node's PostgreSQL access: named operations over a connection pool, errors translated.

Rules:

- SQL text comes from :mod:`allocator.postgres.sql`; this module composes none. Each operation
  returns a small frozen dataclass (or a plain value), never a driver row.
- No hidden I/O: :class:`NodeDatabase` only records its settings when built. :meth:`open`
  creates and fills the pool (and may be called again after :meth:`close`); the context
  manager does both. Operations may run from several threads at once (the pool is shared);
  ``open``/``close`` are not meant to race with them.
- Every operation is one statement in its own short transaction: a fenced function locks
  the fence row on the caller's exact epoch, checks, writes and advances the mark (DESIGN
  §3). Fenced writes take ``commit_if``, asked right before COMMIT: a node whose leadership
  came into doubt while the statement ran (ZooKeeper SUSPENDED) rolls the write back
  (:class:`WriteAbandonedError`) instead of committing it (I6). Nothing stays open between
  operations, so a paused node holds a lock at most for ``idle_in_transaction_session_timeout``.
  The one exception is
  :meth:`NodeDatabase.take_fence`, which raises its own ``lock_timeout`` for the length of
  its transaction (below).
- Every pool connection is configured (``configure`` callback) with ``statement_timeout``
  and ``idle_in_transaction_session_timeout`` from :class:`PostgresConfig`,
  ``application_name = 'allocator-node:<name>'`` (PostgreSQL keeps 63 bytes) and a short
  ``lock_timeout``: a fenced write that queues behind a takeover fails quickly and
  retryably (and its retry is then rejected as fenced) instead of waiting. A takeover, in
  turn, must wait for a write already in flight, so ``take_fence`` waits up to
  ``takeover_lock_timeout_ms`` (default: the statement timeout).
- Every connection sets TCP keepalives and ``tcp_user_timeout`` (:func:`connection_kwargs`):
  on a path that silently drops packets no call hangs past those bounds.
- Fenced writes carry the whole token ``(generation, epoch)`` (:mod:`allocator.fence`),
  block writes and takeovers also the node's layout (checked against the recorded one) and
  ``max_clock_ahead_ms`` (the database refuses blocks past its own clock plus that, or plus
  the lead the mark already had: see migration 0003).
- Errors are translated here (:func:`allocator.postgres.errors.translate`, which the ID client
  shares), keeping ``__cause__``: SQLSTATE AL100 → :class:`FencedError`,
  AL101 → :class:`StaleTakeoverError`, AL102 → :class:`BehindHighWaterError`, AL103 →
  :class:`InvalidBatchError` (a bug), AL104 → :class:`LayoutMismatchError`, AL105 →
  :class:`ClockAheadError`, AL106 → :class:`InvalidRequestError`; connection failures, pool
  timeouts, lock and statement timeouts, server shutdowns, deadlocks and serialization failures →
  :class:`DatabaseUnavailableError` (retryable; after a write the outcome is unknown, since
  the commit may have happened: re-read the high-water mark); anything else →
  :class:`DatabaseError`.
- :func:`read_status` serves operator commands: any URL, one short-lived read-only
  connection, one consistent snapshot; it needs only the operator (or node) role.
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
from psycopg import IsolationLevel
from psycopg.rows import TupleRow, class_row
from psycopg_pool import ConnectionPool

from allocator.config import PostgresConfig
from allocator.core import logs
from allocator.core.errors import (
    DatabaseBehindError,
    DatabaseError,
    InvalidBatchError,
    WriteAbandonedError,
)
from allocator.core.layout import Layout
from allocator.fence import Token, Watermark, database_behind
from allocator.postgres import sql
from allocator.postgres.errors import translate as translate  # also store.translate, for callers

log = logs.get_logger(__name__)

APPLICATION_NAME_PREFIX = "allocator-node:"
STATUS_APPLICATION_NAME = "allocator-status"
LOCK_TIMEOUT_MS = 1000
"""Default wait of a node statement for a lock (the fence row, a block row) before failing."""
STATUS_CONNECT_TIMEOUT_S = 5.0
STATUS_STATEMENT_TIMEOUT_MS = 5000
STATUS_HISTORY_LIMIT = 10
MAX_BIGINT = (1 << 63) - 1
DEFAULT_MAX_CLOCK_AHEAD_MS = 1000

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a successful ``take_fence`` found: the persisted mark and the token it replaced."""

    high_water_id: int
    """The last ID ever cut (inclusive); -1 before the first cut."""
    previous_generation: int
    previous_epoch: int


@dataclass(frozen=True, slots=True)
class CutResult:
    """The state after a committed ``cut_blocks`` batch."""

    high_water_id: int
    """The new high-water mark: the batch's last ID."""
    last_ticket: int
    """The claim ticket of the batch's last block."""
    lead_ms: int = 0
    """How far the new mark lies ahead of the database clock (0 when not ahead)."""


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One row of ``allocator.pool_status``."""

    available_blocks: int
    available_ids: int
    claim_rate_blocks_per_s: float | None
    """None until a pool sample at least 1 s old exists."""
    runway_s: float | None
    """Available blocks / claim rate; None while the rate is unknown or zero."""
    high_water_id: int
    cut_position: int
    claim_position: int
    epoch: int
    holder: str | None
    generation: int = 0
    mark_ahead_ms: int | None = None
    """The mark's millisecond minus the database clock now (> 0: the mark is in the future);
    None before the layout is recorded."""
    mark_lead_ms: int | None = None
    """The mark's lead over the database clock at the cut that set it: the allowance the next
    cut may keep (``cut_blocks``' clock rule)."""
    claims_paused: bool = False
    """An operator paused claims (migration 0010): ``claim_blocks`` answers AL004."""


@dataclass(frozen=True, slots=True)
class Term:
    """One row of ``allocator.leader_history``: a leader's term, from takeover to its end."""

    epoch: int
    holder: str
    host: str | None
    pid: int | None
    elected_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    generation: int = 0


@dataclass(frozen=True, slots=True)
class FenceState:
    """Who holds the fence: token (0, 0) and no holder before the first takeover."""

    epoch: int
    holder: str | None
    generation: int = 0
    high_water_id: int = -1
    """The last ID ever cut (read with the fence, in one statement)."""

    @property
    def token(self) -> Token:
        return Token(self.generation, self.epoch)


@dataclass(frozen=True, slots=True)
class ClockReading:
    """The database clock against the node's, from one round trip."""

    offset_ms: float
    """Database clock minus the node's clock at the middle of the round trip."""
    uncertainty_ms: float
    """Half the round trip: the true offset lies within ``offset_ms`` ± this."""
    db_ms: int

    def disagrees(self, bound_ms: int) -> bool:
        """True if the clocks differ by more than ``bound_ms`` even at the best reading."""
        return abs(self.offset_ms) - self.uncertainty_ms > bound_ms


SYNCHRONOUS_COMMIT_LEVELS = frozenset({"on", "remote_apply"})
"""``synchronous_commit`` values whose commit waits for a synchronous standby's flush."""


@dataclass(frozen=True, slots=True)
class Replication:
    """How the database replicates, from ``allocator.replication_status()`` (migration 0005)."""

    standbys: int
    """Standbys streaming now plus physical slots nobody streams from."""
    synchronous_standbys: int
    """Streaming standbys a commit waits for (``sync`` or ``quorum``)."""
    synchronous_standby_names: str
    synchronous_commit: str
    """This node's session setting."""
    in_recovery: bool

    @property
    def asynchronous(self) -> bool:
        """True if there are standbys and a commit (of this node) waits for none of them: a
        failover to one may lose acknowledged claims and move the mark back."""
        if self.standbys == 0:
            return False
        return (
            self.synchronous_standbys == 0
            or self.synchronous_commit not in SYNCHRONOUS_COMMIT_LEVELS
        )

    def describe(self) -> str:
        return (
            f"standbys={self.standbys} synchronous_standbys={self.synchronous_standbys} "
            f"synchronous_standby_names={self.synchronous_standby_names!r} "
            f"synchronous_commit={self.synchronous_commit}"
        )


@dataclass(frozen=True, slots=True)
class Reset:
    """What ``allocator.reset_after_restore`` did."""

    voided_blocks: int
    old_high_water_id: int
    new_high_water_id: int
    old_generation: int
    old_epoch: int
    new_generation: int


@dataclass(frozen=True, slots=True)
class Rebase:
    """What ``allocator.rebase_fence`` did."""

    old_generation: int
    old_epoch: int
    new_generation: int


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What ``SHOW`` says on a node connection (for diagnostics and tests)."""

    statement_timeout: str
    idle_in_transaction_session_timeout: str
    lock_timeout: str
    application_name: str


@contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, what) from exc


def _refuse_behind(row: tuple[Any, ...] | None, watermark: Watermark) -> None:
    """Raise :class:`DatabaseBehindError` if the fence row ``row`` (epoch, holder,
    high_water_id, generation) lies below ``watermark``."""
    if row is None:
        raise DatabaseError("compare with the watermark: the database returned no row")
    held = Token(int(row[3]), int(row[0]))
    high_water_id = int(row[2])
    reason = database_behind(held, high_water_id, watermark)
    if reason is not None:
        raise DatabaseBehindError(
            reason, generation=held.generation, epoch=held.epoch, high_water_id=high_water_id
        )


CommitCheck = Callable[[], bool]
"""Asked right before COMMIT of a fenced write; False rolls the write back (leadership doubt)."""


def _check_before_commit(what: str, commit_if: CommitCheck | None) -> None:
    if commit_if is not None and not commit_if():
        raise WriteAbandonedError(f"{what}: abandoned before commit, leadership is in doubt")


def _check_ids(ranges: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    firsts = [first for first, _ in ranges]
    lasts = [last for _, last in ranges]
    if any(not 0 <= value <= MAX_BIGINT for value in (*firsts, *lasts)):
        raise InvalidBatchError("cut blocks: every ID must be in 0..2^63-1")
    return firsts, lasts


class NodeDatabase:
    """The leader's (and followers') access to PostgreSQL, over a ``psycopg_pool`` pool.

    ``NodeDatabase(config.postgres, node_name=...)`` does no I/O; call :meth:`open` (or use
    ``with``). See the module docstring for the rules every operation follows.
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
        return self._application_name

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    def open(self, timeout: float | None = None) -> None:
        """Create the pool and wait up to ``timeout`` s (default: the connect timeout) for
        its ``pool_min_size`` connections. Raises :class:`DatabaseUnavailableError` (the pool
        is then closed again; the pool's log says why connecting failed)."""
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
        try:
            with _translated("open the node database pool"):
                pool.open(wait=True, timeout=timeout)
        except BaseException:
            pool.close()
            raise
        self._pool = pool
        log.info(
            "db_pool_opened",
            name=self._application_name,
            min_size=self._config.pool_min_size,
            max_size=self._config.pool_max_size,
        )

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

    def pool_stats(self) -> dict[str, int]:
        """``psycopg_pool``'s counters (``pool_size``, ``requests_waiting``, …); {} when closed."""
        pool = self._pool
        return pool.get_stats() if pool is not None else {}

    def _configure(self, conn: psycopg.Connection[TupleRow]) -> None:
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
        with _translated(what):
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

        With ``watermark`` (ZooKeeper's, as the node read it), the database is first compared
        with it in the same transaction: a database below it (:func:`allocator.fence.
        database_behind`) raises :class:`DatabaseBehindError` and nothing is written. So no
        takeover happens without a completed comparison: a comparison that cannot be made is
        a takeover that cannot be made. (The fence and the mark only move forward, so a
        database not behind at the read is not behind at the takeover.)

        Waits for a fenced write in flight (up to the takeover lock timeout). Raises
        :class:`StaleTakeoverError` when the fence already holds ``token`` or a newer one,
        :class:`LayoutMismatchError` when the database recorded another layout.
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
            if watermark is not None:
                _refuse_behind(conn.execute(sql.FENCE_AND_HIGH_WATER).fetchone(), watermark)
            row = cursor.execute(sql.TAKE_FENCE, params).fetchone()
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
        return self._row("read the pool status", sql.POOL_STATUS, {}, PoolStatus)

    def leader_history(self, limit: int) -> list[Term]:
        """The latest ``limit`` terms, newest first."""
        with (
            self._connection("read the leader history") as conn,
            conn.cursor(row_factory=class_row(Term)) as cursor,
        ):
            return cursor.execute(sql.LEADER_HISTORY, {"limit": limit}).fetchall()

    def fence(self) -> FenceState:
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
    ``tcp_user_timeout`` so a call on a path that drops packets (rather than refusing them)
    fails within a bound instead of hanging; ``statement_timeout`` cannot help there, the
    server's cancel never arrives."""
    return {
        "connect_timeout": max(2, math.ceil(config.connect_timeout_s)),
        "keepalives": 1,
        "keepalives_idle": config.keepalives_idle_s,
        "keepalives_interval": config.keepalives_interval_s,
        "keepalives_count": config.keepalives_count,
        "tcp_user_timeout": config.tcp_user_timeout_ms,
    }


def _one_row(
    url: str, what: str, query: str, params: Mapping[str, Any], kind: type[_T], timeout_s: float
) -> _T:
    """One statement on a connection of its own (operator and diagnostic commands)."""
    with _translated(what):
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=max(2, math.ceil(timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        )
        with conn, conn.cursor(row_factory=class_row(kind)) as cursor:
            row = cursor.execute(query, params).fetchone()
    if row is None:
        raise DatabaseError(f"{what}: the database returned no row")
    return row


def rebase_fence(
    url: str, reason: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> Rebase:
    """Run ``allocator.rebase_fence`` as whoever ``url`` logs in as (the operator role)."""
    return _one_row(
        url, "re-base the fence", sql.REBASE_FENCE, {"reason": reason}, Rebase, connect_timeout_s
    )


def reset_after_restore(
    url: str,
    reason: str,
    min_high_water_id: int,
    max_ahead_ms: int,
    *,
    connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S,
) -> Reset:
    """Run ``allocator.reset_after_restore`` as whoever ``url`` logs in as (operator role)."""
    params = {
        "reason": reason,
        "min_high_water_id": min_high_water_id,
        "max_ahead_ms": max_ahead_ms,
    }
    return _one_row(
        url,
        "reset the pool after a restore",
        sql.RESET_AFTER_RESTORE,
        params,
        Reset,
        connect_timeout_s,
    )


def read_replication(
    url: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> Replication:
    """How the database at ``url`` replicates, as whoever ``url`` logs in as (node/operator)."""
    return _one_row(
        url,
        "read the replication status",
        sql.REPLICATION_STATUS,
        {},
        Replication,
        connect_timeout_s,
    )


def read_pool_status(
    url: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> PoolStatus:
    """``allocator.pool_status`` at ``url`` (every role may read it)."""
    return _one_row(url, "read the pool status", sql.POOL_STATUS, {}, PoolStatus, connect_timeout_s)


def read_status(
    url: str,
    *,
    history_limit: int = STATUS_HISTORY_LIMIT,
    connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S,
    statement_timeout_ms: int = STATUS_STATEMENT_TIMEOUT_MS,
) -> tuple[PoolStatus, list[Term]]:
    """The pool status and the latest terms, for ``allocator status``, from any URL.

    One plain connection, opened and closed here; both reads come from one read-only
    REPEATABLE READ transaction, so they describe the same moment.
    """
    what = "read the allocator status"
    with _translated(what):
        conn = psycopg.connect(
            url,
            connect_timeout=max(2, math.ceil(connect_timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        )
        with conn:
            conn.isolation_level = IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            with conn.transaction():
                conn.execute(
                    sql.SET_LOCAL_STATEMENT_TIMEOUT,
                    {"statement_timeout": str(statement_timeout_ms)},
                )
                with conn.cursor(row_factory=class_row(PoolStatus)) as cursor:
                    status = cursor.execute(sql.POOL_STATUS).fetchone()
                with conn.cursor(row_factory=class_row(Term)) as cursor:
                    terms = cursor.execute(sql.LEADER_HISTORY, {"limit": history_limit}).fetchall()
    if status is None:
        raise DatabaseError(f"{what}: the database returned no row")
    return status, terms


# -- pausing claims (operator role, migration 0010) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Pause:
    """What ``allocator.pause_claims`` answered: the open pause."""

    pause_id: int
    paused_at: datetime
    paused_by: str
    reason: str
    already_paused: bool
    """Claims were paused before this call (nothing changed; the pause is the earlier one)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """What ``allocator.resume_claims`` answered; all None but ``was_paused`` when claims
    were not paused."""

    pause_id: int | None
    paused_at: datetime | None
    paused_by: str | None
    reason: str | None
    resumed_at: datetime | None
    resumed_by: str | None
    resume_reason: str | None
    was_paused: bool


@dataclass(frozen=True, slots=True)
class OpenPause:
    """The open row of ``allocator.claim_pause_history``: why claims are paused."""

    pause_id: int
    paused_at: datetime
    paused_by: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClaimInFlight:
    """A session whose open transaction holds a claim (``allocator.claims_in_flight()``)."""

    pid: int | None
    """None for a prepared transaction (two-phase commit): it holds the claim until
    ``COMMIT PREPARED`` or ``ROLLBACK PREPARED``."""
    virtualtransaction: str
    usename: str | None
    application_name: str | None
    client_addr: str | None
    state: str | None
    xact_start: datetime | None
    state_change: datetime | None

    def describe(self) -> str:
        since = self.xact_start.isoformat(timespec="seconds") if self.xact_start else "?"
        return (
            f"pid {self.pid} ({self.usename or '?'}, application "
            f"{self.application_name or '-'!r}, {self.client_addr or 'local'}, "
            f"{self.state or '?'}, transaction since {since})"
        )


@dataclass(frozen=True, slots=True)
class LayoutClock:
    """The recorded layout's epoch and timestamp shift, with the database clock."""

    epoch_ms: int
    shift: int
    db_ms: int

    def id_at(self, ms: int) -> int:
        """The last ID of millisecond ``ms`` (Unix), as ``reset_after_restore`` computes
        its clock bound; -1 before the layout's epoch."""
        if ms < self.epoch_ms:
            return -1
        return min(MAX_BIGINT, ((ms - self.epoch_ms + 1) << self.shift) - 1)


class OperatorSession:
    """One operator connection (autocommit: each call its own transaction), for commands
    that make several calls, such as ``allocator pool pause`` polling the claims in flight.
    Errors leave translated; build it with :func:`operator_session`."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def _fetch(self, what: str, query: str, params: Mapping[str, Any], kind: type[_T]) -> list[_T]:
        with _translated(what), self._conn.cursor(row_factory=class_row(kind)) as cursor:
            return cursor.execute(query, params).fetchall()

    def _one(self, what: str, query: str, params: Mapping[str, Any], kind: type[_T]) -> _T:
        rows = self._fetch(what, query, params, kind)
        if not rows:
            raise DatabaseError(f"{what}: the database returned no row")
        return rows[0]

    def pause_claims(self, reason: str) -> Pause:
        return self._one("pause claims", sql.PAUSE_CLAIMS, {"reason": reason}, Pause)

    def resume_claims(self, reason: str) -> Resume:
        return self._one("resume claims", sql.RESUME_CLAIMS, {"reason": reason}, Resume)

    def claims_in_flight(self) -> list[ClaimInFlight]:
        return self._fetch("list the claims in flight", sql.CLAIMS_IN_FLIGHT, {}, ClaimInFlight)

    def open_pause(self) -> OpenPause | None:
        rows = self._fetch("read the open pause", sql.OPEN_PAUSE, {}, OpenPause)
        return rows[0] if rows else None

    def pool_status(self) -> PoolStatus:
        return self._one("read the pool status", sql.POOL_STATUS, {}, PoolStatus)

    def layout_clock(self) -> LayoutClock | None:
        """None before the first takeover recorded a layout."""
        rows = self._fetch("read the layout and clock", sql.LAYOUT_AND_CLOCK, {}, LayoutClock)
        return rows[0] if rows else None


@contextmanager
def operator_session(
    url: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> Iterator[OperatorSession]:
    """An :class:`OperatorSession` on ``url``, closed on leaving."""
    with _translated("connect to the database"):
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=max(2, math.ceil(connect_timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        )
    with conn:
        yield OperatorSession(conn)
