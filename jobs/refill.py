"""Refill: keep the pool at its target by cutting blocks after the high-water mark.

Rules:
- Target = max(``pool.min_blocks``, claim rate x ``pool.runway_s``), capped at
  ``pool.max_blocks``. Runs every ``pool.refill_interval_s`` and early when the sampler sees
  the pool below ``pool.low_watermark_blocks``.
- Blocks come from :func:`allocator.cutter.plan_blocks` (strictly after the mark, never ahead
  of the clock) and are written in batches, one statement each (``cut_blocks`` takes
  arrays); a run is bounded in time so leadership checks and other jobs are never starved.
- Clock behind the mark by more than ``pool.max_clock_behind_ms``: refuse, set the alert
  gauge, log ``clock_behind``, keep serving the pool. Past the layout's time range: refuse,
  set ``allocator_time_range_exhausted``, log loudly.
- Stranded blocks are requeued (fenced) on every run.
"""

from __future__ import annotations

import logging
import math
import time

from allocator import cutter
from allocator.config import PoolConfig
from allocator.errors import (
    BehindHighWaterError,
    ClockBehindError,
    DatabaseUnavailableError,
    FencedError,
    TimeRangeExhaustedError,
    WriteAbandonedError,
)
from jobs.context import LeaderContext

log = logging.getLogger(__name__)

MAX_BATCH_BLOCKS = 2000
RUN_BUDGET_S = 2.0
FLUSH_AFTER_S = 0.05


def pool_target(pool: PoolConfig, claim_rate_blocks_per_s: float | None) -> int:
    """How many available blocks the leader aims for."""
    by_runway = math.ceil((claim_rate_blocks_per_s or 0.0) * pool.runway_s)
    return min(max(pool.min_blocks, by_runway), pool.max_blocks)


def run(ctx: LeaderContext) -> int:
    """One refill run; returns the number of blocks cut."""
    with ctx.busy:
        if not ctx.term.may_write():
            return 0
        try:
            return _refill(ctx)
        except FencedError as exc:
            ctx.metrics.fenced_writes_rejected.inc()
            ctx.on_fenced(exc)
        except WriteAbandonedError:
            ctx.metrics.writes_abandoned.inc()
            log.warning("event=write_abandoned job=refill epoch=%s", ctx.term.epoch)
        except (DatabaseUnavailableError, BehindHighWaterError) as exc:
            log.warning("event=refill_failed epoch=%s error=%s", ctx.term.epoch, exc)
        return 0


def _refill(ctx: LeaderContext) -> int:
    config, term, db = ctx.config, ctx.term, ctx.db
    started = time.monotonic()
    status = db.pool_status()
    ctx.metrics.pool_available_blocks.set(status.available_blocks)
    if status.runway_s is not None:
        ctx.metrics.pool_runway_seconds.set(status.runway_s)
    db.requeue_stranded(term.epoch, commit_if=term.may_write)
    need = pool_target(config.pool, status.claim_rate_blocks_per_s) - status.available_blocks
    mark, cut = status.high_water_id, 0
    batch: list[tuple[int, int]] = []
    batch_started = time.monotonic()
    layout, section = config.layout, config.layout_section
    while need - len(batch) > 0 and term.may_write():
        try:
            plan = cutter.plan_blocks(
                layout,
                config.cluster.datacenter_id,
                section.block_size,
                mark,
                ctx.now_ms(),
                min(need - len(batch), MAX_BATCH_BLOCKS - len(batch)),
                config.pool.max_clock_behind_ms,
            )
        except ClockBehindError as exc:
            ctx.metrics.clock_behind.set(1)
            log.error("event=clock_behind epoch=%s error=%s", term.epoch, exc)
            break
        except TimeRangeExhaustedError as exc:
            ctx.metrics.time_range_exhausted.set(1)
            log.critical("event=time_range_exhausted epoch=%s error=%s", term.epoch, exc)
            break
        ctx.metrics.clock_behind.set(0)
        batch.extend(plan.blocks)
        if plan.last_id is not None:
            mark = plan.last_id
        full = len(batch) >= MAX_BATCH_BLOCKS or len(batch) >= need
        if batch and (full or time.monotonic() - batch_started >= FLUSH_AFTER_S):
            cut += _write(ctx, batch)
            need -= len(batch)
            batch, batch_started = [], time.monotonic()
        if time.monotonic() - started >= RUN_BUDGET_S:
            break
        if plan.wait_until_ms is not None:
            _sleep_until_ms(ctx, plan.wait_until_ms)
    if batch and term.may_write():
        cut += _write(ctx, batch)
    if cut:
        log.info("event=refill epoch=%s blocks=%s high_water_id=%s", term.epoch, cut, mark)
    ctx.metrics.refill_seconds.observe(time.monotonic() - started)
    return cut


def _write(ctx: LeaderContext, batch: list[tuple[int, int]]) -> int:
    ctx.db.cut_blocks(ctx.term.epoch, batch, commit_if=ctx.term.may_write)
    ctx.metrics.blocks_cut.inc(len(batch))
    ctx.metrics.ids_cut.inc(sum(last - first + 1 for first, last in batch))
    return len(batch)


def _sleep_until_ms(ctx: LeaderContext, wall_ms: int) -> None:
    delay_s = (wall_ms - ctx.now_ms()) / 1000
    if delay_s > 0:
        time.sleep(min(delay_s, 0.05))
