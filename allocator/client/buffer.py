"""The buffer both clients share (:class:`Buffer`): the current block, the rest of the segment,
the prefetched segment, the refill triggers, the age deadlines, waits, failures and the close
report. No locking and no I/O here.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from allocator.client.base import (
    MAX_BATCH_BLOCKS,
    NO_ID,
    Block,
    ClaimArgumentError,
    ClaimsPausedError,
    ClientClosedError,
    PoolEmptyError,
    Range,
    UnusedIds,
    backoff_delay,
    check_consumer,
    merge_ranges,
)
from allocator.core import logs
from allocator.core.errors import AllocatorError, DatabaseError, DatabaseUnavailableError

log = logs.get_logger(__name__)

_NO_DEADLINE = math.inf
Span = tuple[int, int, float]
"""A buffered range of one block: ``(first, last, deadline)``, the deadline in the client's
clock (monotonic seconds), after which none of its IDs is handed out; ``_NO_DEADLINE`` when
the block came without ``expires_in_ms``."""
_Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Settings:
    """A client's settings, checked by :func:`validated_settings`."""

    consumer: str
    batch_blocks: int
    max_batch_blocks: int
    refill_at: float
    wait_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    close_timeout_s: float
    clock: _Clock = time.monotonic
    """Monotonic seconds: the deadlines' clock (tests pass a fake one)."""


def validated_settings(
    consumer: str,
    *,
    batch_blocks: int,
    max_batch_blocks: int | None,
    refill_at: float,
    wait_timeout_s: float,
    backoff_initial_s: float,
    backoff_max_s: float,
    close_timeout_s: float,
    clock: _Clock = time.monotonic,
) -> Settings:
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
    return Settings(
        consumer,
        batch_blocks,
        max_batch_blocks,
        refill_at,
        wait_timeout_s,
        backoff_initial_s,
        backoff_max_s,
        close_timeout_s,
        clock,
    )


def _spans_of(blocks: list[Block], started_at: float) -> list[Span]:
    """A claim's blocks as spans, oldest first, each with its deadline: the claim's start
    (``started_at``, before the query was sent: the conservative end) plus ``expires_in_ms``."""
    return [
        (
            b.first_id,
            b.last_id,
            _NO_DEADLINE if b.expires_in_ms is None else started_at + b.expires_in_ms / 1000,
        )
        for b in sorted(blocks, key=lambda b: b.first_id)
    ]


def ranges_of(spans: list[Span]) -> list[Range]:
    """The spans as ``(first, last)`` ranges."""
    return [(first, last) for first, last, _ in spans]


def _count_of(spans: list[Span] | deque[Span]) -> int:
    return sum(last - first + 1 for first, last, _ in spans)


class Buffer:
    """State and slow-path logic shared by both clients; no locking here (the sync client
    holds its lock around every method, the async one runs on one event loop).

    A double buffer, like Leaf's segments: a *segment* is the blocks one claim returned (up
    to ``batch_blocks``). IDs are handed out from the current segment, block by block,
    ascending within each block, blocks in the order they were claimed. When ``refill_at``
    (a fraction, by ID count or by the segment's life, whichever comes first) of the
    current segment is left, the next one is claimed while IDs keep flowing; at most one
    claim is out and at most one segment prefetched, the claimer otherwise idle.

    The current block is ``[_next, _last]`` (empty when ``_next > _last``), handed out until
    its ``_deadline``; ``_rest`` holds the current segment's other blocks; ``_prefetched`` the
    next segment; ``_trigger`` the ID whose hand-out asks for a refill (``NO_ID`` when none is
    pending) and ``_refill_by`` the time that does (``_NO_DEADLINE`` when none is pending).
    ``_check_at`` is the earliest time the slow path has something to do (the current
    block's deadline, ``_refill_by``, the prefetched segment's first deadline): the hot path
    hands out from memory only before it.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._consumer = settings.consumer
        self._now = settings.clock
        self._next = 1
        self._last = 0
        self._deadline = _NO_DEADLINE
        self._trigger = NO_ID
        self._refill_by = _NO_DEADLINE
        self._check_at = _NO_DEADLINE
        self._dated = False
        """Whether ``_check_at`` is a time: only then does the hot path read the clock."""
        self._rest: deque[Span] = deque()
        self._rest_expires = _NO_DEADLINE
        """No span in ``_rest`` has an earlier deadline (it may be stale-early, never late)."""
        self._prefetched: list[Span] | None = None
        self._prefetched_refill_by = _NO_DEADLINE
        self._prefetched_expires = _NO_DEADLINE
        self._refill_wanted = False
        self._claim_in_flight = False
        self._batch_blocks = settings.batch_blocks
        self._grown_after_claims = 0
        self._failures_in_a_row = 0
        self._closing = False
        self._closed_error: ClientClosedError | None = None
        self._fatal: AllocatorError | None = None
        self._last_error: AllocatorError | None = None
        self._report: UnusedIds | None = None
        self._stats = {
            "claims": 0,
            "claim_failures": 0,
            "pool_empty_answers": 0,
            "claims_paused_answers": 0,
            "blocks_claimed": 0,
            "ids_claimed": 0,
            "blocks_expired": 0,
            "ids_expired": 0,
            "waits": 0,
            "wait_timeouts": 0,
            "last_claim_us": 0,
            "max_claim_us": 0,
        }
        _LIVE_BUFFERS.add(self)

    # All of these run with the client's lock held (or on its event loop).

    def _advance(self) -> bool:
        """Make the next block current, dropping those past their deadline; False (and a
        refill wanted) when none is buffered."""
        now = self._now()
        while True:
            if self._rest:
                span = self._rest.popleft()
            elif self._prefetched:
                self._install(self._prefetched)
                span = self._rest.popleft()
            else:
                self._set_current(1, 0, _NO_DEADLINE)
                self._refill_wanted = True
                return False
            if span[2] > now:
                self._set_current(*span)
                return True
            self._drop_expired([span])

    def _set_current(self, first: int, last: int, deadline: float) -> None:
        self._next, self._last, self._deadline = first, last, deadline
        self._recheck()

    def _recheck(self) -> None:
        self._check_at = min(self._deadline, self._refill_by, self._prefetched_expires)
        self._dated = self._check_at != _NO_DEADLINE

    def _install(self, segment: list[Span]) -> None:
        """Make the prefetched ``segment`` the current one (its first block is popped by the
        caller) and arm its refill triggers: by IDs and by time."""
        self._prefetched = None
        self._prefetched_expires = _NO_DEADLINE
        total = _count_of(segment)
        offset = min(total - 1, math.floor(total * (1.0 - self._settings.refill_at)))
        self._trigger = NO_ID
        self._refill_by = self._prefetched_refill_by
        self._rest = deque(segment)
        self._rest_expires = min(span[2] for span in segment)
        self._recheck()
        if offset <= 0:  # refill_at = 1: ask for the next segment as this one starts
            self._refill_due()
            return
        for first, last, _ in segment:
            if offset <= last - first:
                self._trigger = first + offset
                return
            offset -= last - first + 1

    def _disarm_refill(self) -> None:
        self._trigger = NO_ID
        self._refill_by = _NO_DEADLINE
        self._recheck()

    def _refill_due(self) -> None:
        """The trigger ID went out, or the trigger time came: the claimer should fetch the
        next segment now."""
        self._disarm_refill()
        self._refill_wanted = True
        self._wake_claimer()

    def _expire(self, spans: list[Span]) -> int:
        """The slow path's time step (before handing anything out): drop what passed its
        deadline (the current block's rest, buffered blocks, ``spans`` a waiting ``take``
        gathered), ask for a refill when the time trigger came or a block was dropped;
        returns how many IDs were dropped from ``spans``."""
        now = self._now()
        dropped: list[Span] = []
        if self._next <= self._last and self._deadline <= now:
            dropped.append((self._next, self._last, self._deadline))
            self._set_current(1, 0, _NO_DEADLINE)
        if self._rest_expires <= now:
            dropped.extend(span for span in self._rest if span[2] <= now)
            self._rest = deque(span for span in self._rest if span[2] > now)
            self._rest_expires = min((span[2] for span in self._rest), default=_NO_DEADLINE)
        gathered = [span for span in spans if span[2] <= now]
        if gathered:
            spans[:] = [span for span in spans if span[2] > now]
        prefetched = self._prefetched
        if prefetched and self._prefetched_expires <= now:
            dropped.extend(span for span in prefetched if span[2] <= now)
            kept = [span for span in prefetched if span[2] > now]
            self._prefetched = kept or None
            self._prefetched_expires = min((span[2] for span in kept), default=_NO_DEADLINE)
        self._drop_expired(dropped + gathered)
        if (dropped and self._prefetched is None) or self._refill_by <= now:
            self._refill_due()  # nothing buffered to replace what was dropped, or time is up
        self._recheck()
        return _count_of(gathered)

    def _drop_expired(self, spans: list[Span]) -> None:
        """Count (``ids_expired``, ``blocks_expired``) and log (``client_ids_expired``, with
        the ranges) IDs never to be handed out: their block passed its deadline. They are
        lost like unused IDs: recorded as claimed, never handed to anyone (I1)."""
        if not spans:
            return
        ids = _count_of(spans)
        self._stats["blocks_expired"] += len(spans)
        self._stats["ids_expired"] += ids
        log.info(
            "client_ids_expired",
            consumer=self._consumer,
            ids=ids,
            ranges=",".join(f"{first}-{last}" for first, last in merge_ranges(ranges_of(spans))),
        )

    def _wake_claimer(self) -> None:
        raise NotImplementedError

    def _take(self, need: int, spans: list[Span]) -> int:
        """Move up to ``need`` IDs into ``spans``, first dropping whatever passed its deadline
        (``spans`` gathered before a wait included); returns how many are still missing."""
        need += self._expire(spans)
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
            spans.append((first, last, self._deadline))
            need -= count
        return need

    def _give_back(self, spans: list[Span]) -> None:
        """Return a failed ``take``'s spans; used before anything else. The current block
        is exhausted and nothing is buffered, or the take would not have had to wait."""
        if spans and self._closed_error is None:
            self._rest.extendleft(reversed(spans))
            self._rest_expires = min(self._rest_expires, *(span[2] for span in spans))
            spans.clear()

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
            log.info("client_batch_grown", consumer=self._consumer, batch_blocks=self._batch_blocks)

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

    def _accept(self, blocks: list[Block], started_at: float) -> list[Range]:
        """Buffer a claimed segment (also while closing: the report will include it), each
        block with its deadline from ``started_at`` (the client's clock when the claim was
        sent); returns it instead when the client's report is already out (the IDs are
        lost)."""
        segment = _spans_of(blocks, started_at)
        if not segment:  # claim_blocks raises AL003 instead; a custom claimer might not
            raise PoolEmptyError("claim ID blocks: the claim returned no block")
        if any(first > last for first, last, _ in segment):
            raise DatabaseError("claim ID blocks: the database returned a block with last < first")
        self._stats["claims"] += 1
        self._failures_in_a_row = 0
        self._stats["blocks_claimed"] += len(segment)
        self._stats["ids_claimed"] += _count_of(segment)
        self._last_error = None
        if self._closed_error is not None:  # the report is out: nobody will use these
            return ranges_of(segment)
        expires = min(span[2] for span in segment)
        self._prefetched = segment
        self._prefetched_expires = expires
        # Refill by time as by IDs: once ``refill_at`` of the segment's life is left.
        self._prefetched_refill_by = (
            _NO_DEADLINE
            if expires == _NO_DEADLINE
            else expires - self._settings.refill_at * (expires - started_at)
        )
        self._refill_wanted = False
        self._recheck()
        return []

    def _retry_delay(self) -> float:
        """Seconds to wait before claiming again after the failures in a row so far
        (:func:`backoff_delay`; a successful claim starts the count again)."""
        return backoff_delay(
            max(0, self._failures_in_a_row - 1),
            initial_s=self._settings.backoff_initial_s,
            max_s=self._settings.backoff_max_s,
        )

    def _failed(self, error: AllocatorError) -> None:
        self._stats["claim_failures"] += 1
        self._failures_in_a_row += 1
        if isinstance(error, ClaimsPausedError):
            self._stats["claims_paused_answers"] += 1
        elif isinstance(error, PoolEmptyError):
            self._stats["pool_empty_answers"] += 1
        if isinstance(error, ClaimArgumentError):
            self._fatal = error
        self._last_error = error

    def _check_usable(self) -> None:
        """Raise what a caller who found no ID left must raise at once, if anything: errors
        that waiting will not cure. A closed or closing client; AL001/AL002
        (:class:`ClaimArgumentError`: the claimer has stopped for good); any database error
        but an empty pool, paused claims or an unreachable database (permissions, a missing
        schema: the claimer keeps retrying, so the client recovers once it is fixed)."""
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
        """What a caller raises after waiting ``wait_timeout_s`` in vain: so a call never
        hangs. :class:`ClaimsPausedError` when claims were paused all along (AL004),
        :class:`PoolEmptyError` when the pool stayed empty (AL003),
        :class:`DatabaseUnavailableError` when PostgreSQL could not be reached or the claim is
        still running; the last claim's error is the ``__cause__``."""
        self._stats["wait_timeouts"] += 1
        last = self._last_error
        base = (
            f"no ID block for consumer {self._consumer!r} within "
            f"{self._settings.wait_timeout_s:g} s"
        )
        error: AllocatorError
        if isinstance(last, ClaimsPausedError):
            error = ClaimsPausedError(
                f"{base}: claims are paused by an operator (allocator pool resume ends it; {last})"
            )
        elif isinstance(last, PoolEmptyError):
            error = PoolEmptyError(
                f"{base}: the pool is empty (the leader refills it; check allocator.pool_status)"
            )
        elif last is None:
            error = DatabaseUnavailableError(f"{base}: the claim is still running")
        else:
            error = DatabaseUnavailableError(f"{base}: {last}")
        error.__cause__ = last
        return error

    def _clear(self) -> list[Span]:
        """Empty the buffer; returns what it held."""
        spans: list[Span] = []
        if self._next <= self._last:
            spans.append((self._next, self._last, self._deadline))
        spans.extend(self._rest)
        spans.extend(self._prefetched or [])
        self._rest = deque()
        self._rest_expires = _NO_DEADLINE
        self._prefetched = None
        self._prefetched_expires = _NO_DEADLINE
        self._set_current(1, 0, _NO_DEADLINE)
        self._disarm_refill()
        return spans

    def _close_buffers(self) -> UnusedIds:
        """Take every unused range out of the client (no ID can be handed out after this)."""
        spans = self._clear()
        return UnusedIds(
            count=_count_of(spans),
            ranges=merge_ranges(ranges_of(spans)),
            complete=not self._claim_in_flight,
            expired=self._stats["ids_expired"],
        )

    def _available(self) -> int:
        current = max(0, self._last - self._next + 1)
        return current + _count_of(self._rest) + _count_of(self._prefetched or [])

    def _stats_snapshot(self) -> dict[str, int]:
        return {
            **self._stats,
            "ids_available": self._available(),
            "prefetched_blocks": len(self._prefetched or []),
            "batch_blocks": self._batch_blocks,
            "claim_in_flight": int(self._claim_in_flight),
        }

    def _after_fork_in_child(self) -> None:
        self._clear()
        self._closed_error = ClientClosedError(
            f"ID client for consumer {self._consumer!r} was inherited across fork(); "
            "create a new client in the child process"
        )


_LIVE_BUFFERS: weakref.WeakSet[Buffer] = weakref.WeakSet()


def _forget_buffers_after_fork() -> None:
    """In a child process, every client inherited from the parent drops its buffered IDs
    and refuses to work (:class:`ClientClosedError`): the parent keeps handing out these
    IDs, so the child must never use them (I1). Create clients after forking."""
    for client in list(_LIVE_BUFFERS):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_forget_buffers_after_fork)


def log_unused(consumer: str, report: UnusedIds) -> None:
    """Log the close report (``client_closed``) when IDs were left or a claim still ran."""
    if report.count or not report.complete:
        log.info(
            "client_closed",
            consumer=consumer,
            unused_ids=report.count,
            unused_ranges=",".join(f"{first}-{last}" for first, last in report.ranges) or "-",
            complete=report.complete,
        )


def log_lost(consumer: str, segment: list[Range]) -> None:
    """Log a segment that landed after the close report was out: lost, never reused."""
    log.warning(
        "client_blocks_lost_after_close",
        consumer=consumer,
        ids=sum(last - first + 1 for first, last in segment),
        ranges=",".join(f"{first}-{last}" for first, last in merge_ranges(segment)),
    )


def log_claim_failed(consumer: str, error: AllocatorError, delay_s: float | None) -> None:
    """Log a failed claim: an empty pool or paused claims at debug (expected, retried), a
    fatal error (``delay_s`` None: no retry) as an error, any other as a warning."""
    if isinstance(error, ClaimsPausedError):
        log.debug("client_claims_paused", consumer=consumer, retry_in_s=round(delay_s or 0, 3))
    elif isinstance(error, PoolEmptyError):
        log.debug("client_pool_empty", consumer=consumer, retry_in_s=round(delay_s or 0, 3))
    elif delay_s is None:
        log.error("client_claim_refused", consumer=consumer, error=str(error))
    else:
        log.warning(
            "client_claim_failed",
            consumer=consumer,
            error=str(error),
            retry_in_s=round(delay_s, 3),
        )


def as_allocator_error(exc: Exception) -> AllocatorError:
    """A claimer's exception as the project's error; anything else than an
    :class:`AllocatorError` is a claimer bug, logged and raised as a :class:`DatabaseError`."""
    if isinstance(exc, AllocatorError):
        return exc
    log.error("client_claimer_bug", error=repr(exc), exc_info=exc)
    error = DatabaseError(f"claim ID blocks: unexpected {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
