"""What the clients and claimers share: settings bounds and defaults, the claim statements,
the errors a claim ends in, :class:`Block` and :class:`UnusedIds`, the claimer protocols, and
pure helpers (error translation, backoff, consumer-name check, range merging). Nothing here
does I/O or keeps state.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Protocol, runtime_checkable

import psycopg
from psycopg_pool import PoolClosed

from allocator.core.errors import AllocatorError, DatabaseError, UsageError
from allocator.core.exits import Exit
from allocator.postgres import errors as db_errors

Range = tuple[int, int]


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
_MAX_CONSUMER_CHARS = 128
APPLICATION_NAME = "allocator-client"

# The client's statements. They live here rather than in allocator.sql, which holds the
# node's: the client is the consumer side and needs nothing else.
CLAIM_BLOCKS: Final = (
    "SELECT block_id, first_id, last_id FROM allocator.claim_blocks(%(consumer)s, %(n)s)"
)
CLAIM_BLOCKS_EXPIRING: Final = (
    "SELECT block_id, first_id, last_id, expires_in_ms"
    " FROM allocator.claim_blocks_expiring(%(consumer)s, %(n)s)"
)
""":data:`CLAIM_BLOCKS` plus each block's ``expires_in_ms`` (migration 0011; a database
without it answers SQLSTATE 42883, undefined_function, and the claimers fall back)."""
SET_LOCAL_STATEMENT_TIMEOUT: Final = "SELECT set_config('statement_timeout', %(ms)s, true)"
"""The claim's own ``statement_timeout``, sent ahead of the claim statement in the same
transaction (a pipeline: one round trip). ``true``: the setting ends with that transaction,
so nothing stays on the connection (a server connection PgBouncer shares in transaction
mode, a pool's connection). It applies to the claim statement, which PostgreSQL times
afresh: it restarts the timer after each statement of a pipeline (PostgreSQL 13+)."""
SET_LOCAL_STATEMENT_TIMEOUT_PQ: Final = b"SELECT set_config('statement_timeout', $1, true)"
""":data:`SET_LOCAL_STATEMENT_TIMEOUT` for libpq's own placeholders."""
CLAIM_BLOCKS_PQ: Final = b"SELECT block_id, first_id, last_id FROM allocator.claim_blocks($1, $2)"
""":data:`CLAIM_BLOCKS` for libpq's own placeholders (:meth:`PostgresClaimer.begin`)."""
CLAIM_BLOCKS_EXPIRING_PQ: Final = (
    b"SELECT block_id, first_id, last_id, expires_in_ms"
    b" FROM allocator.claim_blocks_expiring($1, $2)"
)
""":data:`CLAIM_BLOCKS_EXPIRING` for libpq's own placeholders."""
UNDEFINED_FUNCTION_SQLSTATE: Final = "42883"
TEXT_OID: Final = 25
INT4_OID: Final = 23

_ARGUMENT_SQLSTATES = frozenset({"AL001", "AL002"})
POOL_EMPTY_SQLSTATE = "AL003"
CLAIMS_PAUSED_SQLSTATE = "AL004"
KEEP_CONNECTION_SQLSTATES = _ARGUMENT_SQLSTATES | {POOL_EMPTY_SQLSTATE, CLAIMS_PAUSED_SQLSTATE}
"""Answers of ``claim_blocks`` itself: the connection is sound, a claimer keeps it."""
NO_ID = -1  # never a valid trigger: IDs are >= 0


class PoolEmptyError(AllocatorError):
    """No ID block could be claimed: the pool is empty (AL003), or stayed empty for as long
    as a caller was willing to wait. Retry later; check ``allocator.pool_status``."""

    exit_code = Exit.TEMPFAIL
    sqlstate = POOL_EMPTY_SQLSTATE


class ClaimsPausedError(PoolEmptyError):
    """AL004: an operator paused claims (``allocator pool pause``, or a database the restore
    procedure reset); nothing is handed out until ``allocator pool resume``.

    A kind of :class:`PoolEmptyError` on purpose: for whoever claims, both mean "no block
    now, retry with backoff", so the clients retry it the same way within their deadline,
    and an application that already catches ``PoolEmptyError`` keeps working unchanged; the
    class and the message say which it was."""

    sqlstate = CLAIMS_PAUSED_SQLSTATE


class ClaimArgumentError(UsageError):
    """AL001 (bad consumer name) or AL002 (bad block count): the call itself is wrong."""

    def __init__(self, message: str, *, sqlstate: str = "") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class ClientClosedError(AllocatorError):
    """The client was closed, or was inherited across ``fork()``."""


class Block(NamedTuple):
    """One claimed block: every ID in ``[first_id, last_id]`` belongs to the claimer.

    ``expires_in_ms``: how long after the claim (database clock) the block's first ID passes
    the age bound (``pool.max_block_age_s``); None when no bound is in force or the database
    predates ``claim_blocks_expiring``. The clients stop handing out a block's IDs at a local
    deadline, the claim's start plus this; a block without it (no bound in force, an older
    schema, a custom claimer) never expires."""

    block_id: int
    first_id: int
    last_id: int
    expires_in_ms: int | None = None

    @property
    def size(self) -> int:
        """How many IDs the block holds."""
        return self.last_id - self.first_id + 1

    def to_json(self) -> dict[str, int]:
        """The block as JSON; ``expires_in_ms`` only when a bound is in force."""
        document = {
            "block_id": self.block_id,
            "first_id": self.first_id,
            "last_id": self.last_id,
            "size": self.size,
        }
        if self.expires_in_ms is not None:
            document["expires_in_ms"] = self.expires_in_ms
        return document


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
    expired: int = 0
    """IDs dropped earlier, over the client's life, because their block passed its age
    deadline (not in ``count`` or ``ranges``; each drop was logged with its ranges as
    ``client_ids_expired``). Lost the same way."""

    def to_json(self) -> dict[str, Any]:
        """The report as JSON (ranges as two-element lists)."""
        return {
            "count": self.count,
            "ranges": [list(r) for r in self.ranges],
            "complete": self.complete,
            "expired": self.expired,
        }


class Claimer(Protocol):
    """The I/O seam of :class:`IdClient`: claim up to ``n`` blocks, or raise one of the
    translated errors (:class:`PoolEmptyError`, :class:`ClaimsPausedError`,
    :class:`ClaimArgumentError`,
    :class:`DatabaseUnavailableError`, :class:`DatabaseError`). Called from one thread.

    Every ID a client hands out comes from a block its claimer returned. Ours claim with
    ``allocator.claim_blocks_expiring``, or ``allocator.claim_blocks`` on a schema before
    migration 0011 (docs/design.md §6); either is durable on return (I4). A claimer only
    claims and translates errors: it never cuts or invents IDs and never buffers them."""

    def claim(self, consumer: str, n: int) -> list[Block]:
        """Claim up to ``n`` blocks for ``consumer``, oldest first (fewer when the pool runs
        short); raises the translated errors."""
        ...

    def close(self) -> None:
        """Release what the claimer owns (its own connection); a later claim may reopen it."""
        ...


@runtime_checkable
class NonBlockingClaimer(Claimer, Protocol):
    """A :class:`Claimer` that can also claim without blocking its caller, so that
    :class:`IdClient` can send its prefetch from the thread that asked for it and collect
    the answer later, with no other thread involved (:class:`IdClient`, Latency).

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
        claimed is lost) and :class:`~allocator.core.errors.DatabaseUnavailableError` raised."""
        ...


class AsyncClaimer(Protocol):
    """The I/O seam of :class:`AsyncIdClient`; as :class:`Claimer`, awaited."""

    async def claim(self, consumer: str, n: int) -> list[Block]:
        """As :meth:`Claimer.claim`."""
        ...

    async def close(self) -> None:
        """As :meth:`Claimer.close`."""
        ...


# -- errors and retries ------------------------------------------------------------------------


def translate_claim_error(exc: psycopg.Error) -> AllocatorError:
    """The project's error for a driver error raised by a claim; the caller chains it
    (``raise ... from exc``, keeping ``__cause__``), so no driver error leaves a claimer.

    AL003 is :class:`PoolEmptyError` and AL004 :class:`ClaimsPausedError` (both retried by
    the clients until a caller's deadline); AL001/AL002 are :class:`ClaimArgumentError`
    (fatal: the client's claimer stops); connection failures and timeouts are
    :class:`~allocator.core.errors.DatabaseUnavailableError` (retried); anything else
    (permissions, a missing schema, a closed pool) is
    :class:`~allocator.core.errors.DatabaseError` (retried, but waiting callers fail at
    once)."""
    state = exc.sqlstate or ""
    primary = exc.diag.message_primary or str(exc).strip().partition("\n")[0]
    if state == POOL_EMPTY_SQLSTATE:
        return PoolEmptyError(f"claim ID blocks: {primary}")
    if state == CLAIMS_PAUSED_SQLSTATE:
        return ClaimsPausedError(f"claim ID blocks: {primary}")
    if state in _ARGUMENT_SQLSTATES:
        return ClaimArgumentError(f"claim ID blocks: {primary}", sqlstate=state)
    if isinstance(exc, PoolClosed):
        return DatabaseError("claim ID blocks: the connection pool is closed")
    return db_errors.translate(exc, "claim ID blocks")


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


_BLANK = "".join(
    chr(code)
    for low, high in [
        (0x09, 0x0D),
        (0x20, 0x20),
        (0x85, 0x85),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x180E, 0x180E),
        (0x2000, 0x200F),
        (0x2028, 0x202F),
        (0x205F, 0x2064),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ]
    for code in range(low, high + 1)
)
"""What ``claim_blocks`` counts as blank (migration 0008): white space, Unicode spaces,
zero-width characters and the byte-order mark; a name of nothing else is empty."""


def check_consumer(consumer: str) -> str:
    """``consumer`` if it is a name ``claim_blocks`` accepts (the database is the authority;
    this only catches mistakes before any I/O). Raises :class:`ClaimArgumentError`."""
    if not isinstance(consumer, str) or not consumer.strip(_BLANK):
        raise ClaimArgumentError("consumer must be a non-empty name", sqlstate="AL001")
    if len(consumer) > _MAX_CONSUMER_CHARS:
        raise ClaimArgumentError(
            f"consumer name is {len(consumer)} characters long; the maximum is "
            f"{_MAX_CONSUMER_CHARS}",
            sqlstate="AL001",
        )
    if any(ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in "\u2028\u2029" for ch in consumer):
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
