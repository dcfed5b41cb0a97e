"""Low-water check: wake the refill the moment the pool falls below its low watermark.

Why polling, not a NOTIFY from ``claim_blocks``: polling costs one small read on the
leader's connection and nothing on the claim path; a NOTIFY is taken under a lock that
serialises every notifying commit in the database, needs a change to the hottest function,
and a listening connection that can miss a notification while it reconnects.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from allocator.core import logs
from allocator.core.errors import DatabaseUnavailableError
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

ZONE_FLOORS = 4
"""Below this many floors (``pool.min_blocks``) the pool is read on every check."""


class LowWaterCheck:
    """One term's check; :meth:`run` is the scheduled job.

    Like the sampler it writes nothing and never waits on ``busy``; it runs only while the
    term may write (only the leader refills).
    """

    def __init__(self, ctx: LeaderContext, clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = ctx
        self._clock = clock
        self._read_at: float | None = None
        self._available: int | None = None
        self._low = False

    def _due(self) -> bool:
        """Whether to read the pool now.

        Every ``pool.low_watermark_check_s`` (0.1 s) while the pool is small (its last
        reading below :data:`ZONE_FLOORS` x ``pool.min_blocks``), once per
        ``pool.refill_interval_s`` above: reading ``pool_status`` costs in proportion to the
        pool (~2 ms at 2,000 blocks, ~110 ms at 600,000), and a pool that large lasts
        several refill intervals even at the fastest claim rate it was sized for.
        """
        pool = self._ctx.config.pool
        if self._read_at is None or self._available is None:
            return True
        if self._available < ZONE_FLOORS * pool.min_blocks:
            return True
        return self._clock() - self._read_at >= pool.refill_interval_s

    def run(self) -> None:
        """Below ``pool.low_watermark_blocks``, wake the refill at once.

        A refill in flight is not woken again (``ctx.refilling``): it is already cutting,
        and the next check after it ends wakes it again if the pool is still low. A
        ``pool_low`` log line marks each fall below the watermark, not every reading.
        """
        ctx = self._ctx
        if not ctx.term.may_write() or not self._due():
            return
        try:
            status = ctx.db.pool_status()
        except DatabaseUnavailableError as exc:
            log.warning("low_water_check_failed", error=str(exc))
            return
        self._read_at, self._available = self._clock(), status.available_blocks
        ctx.hooks.pool_read(status)
        low = status.available_blocks < ctx.config.pool.low_watermark_blocks
        if low and not self._low:
            log.info("pool_low", available_blocks=status.available_blocks)
        self._low = low
        if low and not ctx.refilling.is_set():
            ctx.wake_refill()
