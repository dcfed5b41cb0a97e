"""The asyncio client, :class:`AsyncIdClient`: the rules of :class:`IdClient` on one event loop,
its claimer a task on the loop of first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from psycopg_pool import AsyncConnectionPool

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
    AsyncClaimer,
    Block,
    ClientClosedError,
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
from allocator.client.claimers import AsyncPostgresClaimer
from allocator.core.errors import AllocatorError


class AsyncIdClient(Buffer):
    """:class:`IdClient` for asyncio: the same rules, ``await next_id()``, ``await take(n)``,
    ``await aclose()``; its claimer is a task on the loop of first use, claiming over its own
    ``AsyncConnection``, a ``psycopg_pool.AsyncConnectionPool`` or any :class:`AsyncClaimer`.
    Use it from one event loop (it takes no lock: its hot path never yields to the loop). The
    constructor does no I/O; like :class:`IdClient` it does not survive ``fork()``."""

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
        """One ID (see :meth:`IdClient.next_id`); the same hot path, without the lock: it never
        awaits unless nothing is buffered."""
        n = self._next
        if n <= self._last and (not self._dated or self._now() < self._check_at):
            self._next = n + 1
            if n == self._trigger:
                self._refill_due()
            return n
        spans: list[Span] = []
        await self._take_waiting(1, spans)
        return spans[0][0]

    async def take_ranges(self, n: int) -> list[Range]:
        """``n`` IDs as inclusive ranges (see :meth:`IdClient.take_ranges`)."""
        if n < 1:
            raise ValueError(f"n must be >= 1 (got {n})")
        spans: list[Span] = []
        await self._take_waiting(n, spans)
        return ranges_of(spans)

    async def take(self, n: int) -> list[int]:
        """``n`` IDs as a list."""
        ids: list[int] = []
        for first, last in await self.take_ranges(n):
            ids.extend(range(first, last + 1))
        return ids

    async def _take_waiting(self, need: int, spans: list[Span]) -> None:
        """The slow path (see :meth:`IdClient._take_waiting`)."""
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
            self._start_task()
            self._claim_needed.set()
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._settings.wait_timeout_s
                self._note_wait()
            elif now >= deadline:
                self._give_back(spans)
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
        log_unused(self._consumer, report)
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
        """Counters and ``ids_available`` right now (see :meth:`IdClient.get_stats`)."""
        return self._stats_snapshot()

    @property
    def consumer(self) -> str:
        """The consumer name the client claims for."""
        return self._consumer

    async def _run(self) -> None:
        while True:
            while not self._wants_claim():
                if self._closing or self._fatal is not None or self._closed_error:
                    return
                self._claim_needed.clear()
                await self._claim_needed.wait()
            self._claim_in_flight = True
            error: AllocatorError | None = None
            blocks: list[Block] = []
            started_ns, started_at = time.perf_counter_ns(), self._now()
            try:
                blocks = await self._claimer.claim(self._consumer, self._batch_blocks)
            except Exception as exc:
                error = as_allocator_error(exc)
            finally:
                self._claim_in_flight = False
                self._timed(started_ns)
            if error is None:
                try:
                    lost = self._accept(blocks, started_at)
                except AllocatorError as exc:
                    error = exc
                else:
                    self._notify_changed()
                    if lost:
                        log_lost(self._consumer, lost)
                    continue
            self._failed(error)
            self._notify_changed()
            if self._fatal is not None:
                log_claim_failed(self._consumer, error, None)
                return
            delay = self._retry_delay()
            log_claim_failed(self._consumer, error, delay)
            deadline = time.monotonic() + delay
            while not self._closing and (remaining := deadline - time.monotonic()) > 0:
                self._claim_needed.clear()
                try:
                    await asyncio.wait_for(self._claim_needed.wait(), remaining)
                except TimeoutError:
                    break
