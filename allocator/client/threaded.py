"""The threaded client, :class:`IdClient`: thread-safe, one claimer thread, the prefetch sent
and collected on the caller's thread when its claimer can.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from psycopg_pool import ConnectionPool

from allocator.client.base import (
    APPLICATION_NAME,
    DEFAULT_BACKOFF_INITIAL_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BATCH_BLOCKS,
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REFILL_AT,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    DEFAULT_WAIT_TIMEOUT_S,
    Block,
    Claimer,
    ClientClosedError,
    NonBlockingClaimer,
    Range,
    UnusedIds,
)
from allocator.client.buffer import (
    Buffer,
    Span,
    as_allocator_error,
    log_claim_failed,
    log_lost,
    log_unused,
    ranges_of,
    validated_settings,
)
from allocator.client.claimers import PostgresClaimer
from allocator.core import logs
from allocator.core.errors import AllocatorError

log = logs.get_logger(__name__)


class IdClient(Buffer):
    """Thread-safe Snowflake IDs from claimed blocks, handed out from memory.

    ``IdClient(url_or_pool_or_claimer, consumer, batch_blocks=1, refill_at=0.5,
    wait_timeout_s=5.0)``: ``url_or_pool_or_claimer`` is a conninfo string (the client opens
    one connection of its own, in its claimer thread), a ``psycopg_pool.ConnectionPool``
    (borrowed per claim, never closed by the client) or any :class:`Claimer`.
    ``batch_blocks`` (1..1000) is how many blocks one claim asks for: raise it when one
    block lasts less than a few claim round trips. How to use it: docs/claiming-ids.md.

    - ``next_id()`` / ``take(n)`` / ``take_ranges(n)`` hand out IDs; they wait at most
      ``wait_timeout_s`` when nothing is buffered, then raise :class:`PoolEmptyError` (or
      :class:`DatabaseUnavailableError`).
    - No hidden I/O: the constructor only records and validates settings; the claimer
      thread starts on first use or :meth:`start`.
    - :meth:`close` stops it and returns the :class:`UnusedIds`: claimed, never handed out,
      and lost for good (never reused by anyone).
    - A block whose claim said ``expires_in_ms`` is handed out only until its deadline (the
      claim's start plus that, on ``clock``, monotonic seconds; tests pass a fake one); the
      rest is dropped, counted and never reused (docs/claiming-ids.md §4).
    - Safe to share among threads (every shared field is read and written under the
      client's lock); it does not survive ``fork()``: a child's inherited client refuses to
      work (:class:`ClientClosedError`) and leaves the parent's claim and connection alone.

    Latency: no GIL hand-over in the steady state. A claimer thread that wakes (for the
    trigger, and again when its query's answer arrives) needs the GIL; a ``next_id()``
    spinning in another thread is made to drop it and gets it back only when the OS runs it
    again, on a busy machine milliseconds later. So the claimer thread sleeps: the caller
    that hands out the trigger ID sends the claim itself (:meth:`NonBlockingClaimer.begin`:
    libpq's non-blocking send, microseconds), and callers look for the answer at each block
    boundary (``poll()``: one non-blocking read) and buffer it (with one block per segment:
    at the segment's end). That needs the client's own connection from a conninfo string (or
    any :class:`NonBlockingClaimer`), open, with no claim out and the last one not failed.
    The claimer thread does everything cold: connecting and the first claim, claims over a
    pool or a plain :class:`Claimer`, retries with backoff after any failure (a failed begun
    claim included), and a begun claim whose answer is late: a caller that finds nothing
    buffered hands it over (and then waits for that thread to get the GIL, up to
    ``sys.getswitchinterval()``, 5 ms, twice), and so does :meth:`close`; the thread waits in
    ``finish()`` on the socket (GIL released), for at most the statement timeout plus
    ``connect_timeout_s``, then carries on as after its own claims. Python code on another
    thread (a hand-over, a retry, an application thread) still costs a spinning caller the
    GIL; ``allocator bench client`` measures the worst calls next to the machine's noise
    floor. ``get_stats()`` says who ran the claims (``claims_begun``,
    ``claims_on_caller_thread``, ``claims_handed_over``, ``claims_on_claimer_thread``) and
    times them (a claim a caller collected: until collected).
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            validated_settings(
                consumer,
                batch_blocks=batch_blocks,
                max_batch_blocks=max_batch_blocks,
                refill_at=refill_at,
                wait_timeout_s=wait_timeout_s,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                close_timeout_s=close_timeout_s,
                clock=clock,
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
        # One thread at a time uses the claimer's connection: the claimer thread from setting
        # ``_claim_in_flight`` until clearing it (both under the lock), never while a begun
        # claim is out; a caller only under the lock, to begin (no claim in flight) or poll
        # (a begun claim not yet handed over); after the hand-over only the claimer thread.
        self._begun = False
        """A claim a caller's thread began is out (``_claim_in_flight`` is set too)."""
        self._begun_handed_over = False
        """...and the claimer thread owns it now: callers no longer poll it."""
        self._begun_ns = 0
        self._begun_at = 0.0
        """The client's clock when the begun claim was sent: its blocks' deadlines count
        from here."""
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
        :class:`DatabaseUnavailableError`, :class:`ClientClosedError`).

        The hot path: a lock acquire, an integer increment, three comparisons and a release,
        plus one monotonic clock read while the current block has a deadline (``_dated``);
        it allocates nothing but the returned int (and the clock's float). Switching blocks
        or segments, asking for a refill, dropping expired IDs, waiting and failing all
        happen on the slow path (:meth:`_take_waiting`)."""
        lock = self._lock
        lock.acquire()
        try:
            n = self._next
            if n <= self._last and (not self._dated or self._now() < self._check_at):
                self._next = n + 1
                if n == self._trigger:
                    self._refill_due()
                return n
        finally:
            lock.release()
        return self._next_slow()

    def _next_slow(self) -> int:
        spans: list[Span] = []
        self._take_waiting(1, spans)
        return spans[0][0]

    def take_ranges(self, n: int) -> list[Range]:
        """``n`` IDs as inclusive ``(first, last)`` ranges (one per block touched), all or
        nothing: a call that times out gives back what it had gathered."""
        if n < 1:
            raise ValueError(f"n must be >= 1 (got {n})")
        spans: list[Span] = []
        self._take_waiting(n, spans)
        return ranges_of(spans)

    def take(self, n: int) -> list[int]:
        """``n`` IDs as a list (see :meth:`take_ranges` for the cheap form)."""
        ids: list[int] = []
        for first, last in self.take_ranges(n):
            ids.extend(range(first, last + 1))
        return ids

    def _take_waiting(self, need: int, spans: list[Span]) -> None:
        """The slow path: take what is buffered, else wake the claimer and wait for it, at
        most ``wait_timeout_s`` in all (:meth:`_timeout_error`), failing at once on what
        waiting will not cure (:meth:`_check_usable`); a failed call gives back what it had
        gathered. A call never hangs."""
        with self._lock:
            deadline: float | None = None
            while True:
                need = self._take(need, spans)
                if need == 0:
                    return
                try:
                    self._check_usable()
                except AllocatorError:
                    self._give_back(spans)
                    raise
                self._start_locked()
                self._claim_needed.notify()
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._settings.wait_timeout_s
                    self._note_wait()
                elif now >= deadline:
                    self._give_back(spans)
                    raise self._timeout_error()
                self._changed.wait(deadline - now)

    def _wake_claimer(self) -> None:
        self._claim_needed.notify()

    # -- the prefetch on the caller's thread (lock held) ------------------------------------

    def _refill_due(self) -> None:
        """The trigger ID went out: send the next claim from this thread without waiting
        when the claimer can, else wake the claimer thread (class docstring, Latency)."""
        self._disarm_refill()
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
        begun_at = self._now()
        try:
            begun = claimer.begin(self._consumer, self._batch_blocks)
        except Exception as exc:  # begin() must not raise; if it does, the thread claims
            log.error("client_claimer_bug", error=repr(exc), exc_info=exc)
            return False
        if begun:
            self._begun = True
            self._claim_in_flight = True
            self._begun_ns = time.perf_counter_ns()
            self._begun_at = begun_at
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
            error = as_allocator_error(exc)
        if blocks is None and error is None:
            return  # not in yet
        self._stats["claims_on_caller_thread"] += 1
        self._begun = False
        self._claim_in_flight = False
        self._timed(self._begun_ns)
        if blocks is not None:
            try:
                lost = self._accept(blocks, self._begun_at)
            except AllocatorError as exc:
                error = exc
            else:
                self._changed.notify_all()
                if lost:
                    log_lost(self._consumer, lost)
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
        :class:`ClientClosedError`.

        Lost the same way, never handed to anyone again (this client included): a claim
        whose answer never arrived (connection lost after commit); a claim still running
        when this stopped waiting (``complete=False``; what it returns is logged as
        ``client_blocks_lost_after_close``); the IDs a ``take()`` had gathered when this
        interrupted it. A claim that lands while this waits is in the report (one a caller's
        thread began included: the claimer thread finishes it)."""
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
        log_unused(self._consumer, report)
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
        """Counters (claims, failures, waits, expired IDs and blocks, who ran the claims, …),
        claim times in µs and ``ids_available`` right now."""
        with self._lock:
            return self._stats_snapshot()

    @property
    def consumer(self) -> str:
        """The consumer name the client claims for."""
        return self._consumer

    # -- the claimer thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._claim_until_closed()
        finally:
            if self._owns_claimer:
                self._claimer.close()

    def _claim_until_closed(self) -> None:
        while True:
            with self._lock:
                job = self._next_job()
                if job is None:
                    return
                if job == "retry":  # a caller collected a failed claim
                    error = self._retry_error
                    self._retry_error = None
                    assert error is not None
                    if not self._back_off(error):
                        return
                    continue
                if job == "finish":
                    started_ns, started_at = self._begun_ns, self._begun_at
                else:
                    started_ns, started_at = time.perf_counter_ns(), self._now()
            error = None
            blocks: list[Block] = []
            try:
                if job == "finish":
                    assert self._non_blocking is not None
                    blocks = self._non_blocking.finish()
                else:
                    blocks = self._claimer.claim(self._consumer, self._batch_blocks)
            except Exception as exc:
                error = as_allocator_error(exc)
            with self._lock:
                self._timed(started_ns)
                self._claim_in_flight = False
                self._begun = self._begun_handed_over = False
                if error is None:
                    try:
                        lost = self._accept(blocks, started_at)
                    except AllocatorError as exc:
                        error = exc
                    else:
                        self._changed.notify_all()
                        if lost:
                            log_lost(self._consumer, lost)
                        continue
                self._failed(error)
                self._changed.notify_all()
                if not self._back_off(error):
                    return

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

    def _back_off(self, error: AllocatorError) -> bool:
        """After a failed claim (lock held): False when the claimer must stop (the error is
        fatal), else True after the backoff delay (cut short by close)."""
        if self._fatal is not None:
            log_claim_failed(self._consumer, error, None)
            return False
        delay = self._retry_delay()
        log_claim_failed(self._consumer, error, delay)
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
