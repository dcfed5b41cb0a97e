"""Refill: keep the pool at its target by cutting blocks after the high-water mark.

The cutting rules are :func:`allocator.core.cutter.plan_blocks`'; the clock rules,
docs/design.md §5 and §11.
"""

from __future__ import annotations

import threading
import time

from allocator.config import PoolConfig, block_age, runway
from allocator.core import cutter, logs
from allocator.core.errors import (
    BehindHighWaterError,
    ClockAheadError,
    ClockBehindError,
    DatabaseUnavailableError,
    FencedError,
    LayoutMismatchError,
    TimeRangeExhaustedError,
    WriteAbandonedError,
)
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

_NEVER_SET = threading.Event()
MAX_BATCH_BLOCKS = 2000
RUN_BUDGET_S = 2.0
FLUSH_AFTER_S = 0.05


def run(ctx: LeaderContext) -> int:
    """One refill run; returns the number of blocks cut.

    Runs every ``pool.refill_interval_s`` and at once when the low-water check wakes it
    (``ctx.refilling`` is set meanwhile). A cut the database rejects as ahead of its clock
    (AL105) counts as a clock disagreement; another layout in the database (AL104) is fatal
    (the node stops, exit 78).
    """
    with ctx.busy:
        if not ctx.term.may_write():
            return 0
        ctx.refilling.set()
        try:
            return _refill(ctx)
        except FencedError as exc:
            ctx.metrics.fenced_writes_rejected.inc()
            ctx.hooks.on_fenced(exc)
        except WriteAbandonedError:
            ctx.metrics.writes_abandoned.inc()
            log.warning("write_abandoned", job="refill", epoch=ctx.term.epoch)
        except ClockAheadError as exc:
            ctx.hooks.health.clock_checked(False)
            ctx.metrics.clock_skew.set(1)
            log.error("cut_rejected_clock_ahead", epoch=ctx.term.epoch, error=str(exc))
        except LayoutMismatchError as exc:
            ctx.hooks.on_fatal(exc)
        except (DatabaseUnavailableError, BehindHighWaterError) as exc:
            log.warning("refill_failed", epoch=ctx.term.epoch, error=str(exc))
        finally:
            ctx.refilling.clear()
        return 0


def _refill(ctx: LeaderContext) -> int:
    """The run's body, in order.

    - A database below ZooKeeper's watermark (restored, or failed over to a standby that
      missed commits) gets no write at all, not even a requeue or a heartbeat: blocks
      claimed after its restore point read as unclaimed there, and a requeue would hand them
      out again.
    - The leader's heartbeat first (fenced, with ``pool.max_block_age_s``, the leaderless
      setting and :func:`allocator.config.block_age.leader_stale_ms`): the database's proof
      that a leader serves, under which ``claim_blocks`` holds the bound on an ID's age; the
      first run of a term runs at once, so the takeover writes it too. Then stranded blocks
      are requeued (fenced).
    - Target = max(``pool.min_blocks``, claim rate x the longer of ``pool.runway_s`` and the
      runway a hand-over needs), capped at ``pool.max_blocks``
      (:mod:`allocator.config.runway`).
    - No cut while the clock disagrees (:func:`_clock_agrees`) or replication is
      asynchronous (:func:`_replication_allows_cutting`).
    - Blocks come from the cutter and are written in batches of at most
      :data:`MAX_BATCH_BLOCKS`, one statement each; a run stops after :data:`RUN_BUDGET_S`,
      so leadership checks and other jobs are never starved. Clock behind the mark without
      an allowance (no layout recorded yet): refuse, set the alert gauge, log
      ``clock_behind``, keep serving the pool. Past the layout's time range: refuse, set
      ``allocator_time_range_exhausted``, log loudly.
    - Every committed write is reported to the node's health record, and every committed
      cut's last ID to the node, which raises ZooKeeper's watermark.
    """
    config, term, db = ctx.config, ctx.term, ctx.db
    started = time.monotonic()
    status = db.pool_status()
    ctx.hooks.pool_read(status)
    if ctx.hooks.database_went_back(status.high_water_id):
        # Restored or failed over to a standby that missed commits: blocks claimed since
        # read as unclaimed, so a requeue would hand them out again; nothing is written. The
        # database answered, so this is not a reason to hand over (every node sees the same).
        ctx.hooks.health.write_succeeded()
        ctx.metrics.refill_seconds.observe(time.monotonic() - started)
        return 0
    # The heartbeat first (migration 0011): while it is fresh, claim_blocks holds the bound on
    # an ID's age; the first run of a term writes it right after the takeover.
    db.leader_heartbeat(term.token, block_age.bound(config), commit_if=term.may_write)
    db.requeue_stranded(term.token, commit_if=term.may_write)
    ctx.hooks.health.write_succeeded()
    ahead_ms = max(0, status.mark_ahead_ms or 0)
    ctx.metrics.mark_ahead_seconds.set(ahead_ms / 1000)
    need = runway.target_blocks(config, status.claim_rate_blocks_per_s) - status.available_blocks
    if not _clock_agrees(ctx) or not _replication_allows_cutting(ctx) or need <= 0:
        ctx.metrics.refill_seconds.observe(time.monotonic() - started)
        return 0
    lead_ms = status.mark_lead_ms
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
                _allowance(config.pool, lead_ms),
            )
        except ClockBehindError as exc:
            ctx.metrics.clock_behind.set(1)
            log.error("clock_behind", epoch=term.epoch, error=str(exc))
            break
        except TimeRangeExhaustedError as exc:
            ctx.metrics.time_range_exhausted.set(1)
            log.critical("time_range_exhausted", epoch=term.epoch, error=str(exc))
            break
        ctx.metrics.clock_behind.set(0)
        batch.extend(plan.blocks)
        if plan.last_id is not None:
            mark = plan.last_id
        full = len(batch) >= MAX_BATCH_BLOCKS or len(batch) >= need
        if batch and (full or time.monotonic() - batch_started >= FLUSH_AFTER_S):
            written, lead_ms = _write(ctx, batch)
            cut += written
            need -= len(batch)
            batch, batch_started = [], time.monotonic()
        if time.monotonic() - started >= RUN_BUDGET_S:
            break
        if plan.wait_until_ms is not None:
            _sleep_until_ms(ctx, plan.wait_until_ms)
    if batch and term.may_write():
        cut += _write(ctx, batch)[0]
    if cut:
        log.info("refill", epoch=term.epoch, blocks=cut, high_water_id=mark)
    ctx.metrics.refill_seconds.observe(time.monotonic() - started)
    return cut


def _clock_agrees(ctx: LeaderContext) -> bool:
    """Compare our clock with the database's (one round trip); False: do not cut now.

    The database clock is the reference: while they differ by more than
    ``pool.max_clock_skew_ms`` the run cuts nothing (``allocator_clock_skew_alert``,
    ``clock_disagrees``), and the node hands over if a contender would do better.
    """
    bound = ctx.config.pool.max_clock_skew_ms
    reading = ctx.db.read_clock(ctx.now_ms)
    agrees = not reading.disagrees(bound)
    ctx.hooks.health.clock_checked(agrees)
    ctx.metrics.clock_offset_seconds.set(reading.offset_ms / 1000)
    ctx.metrics.clock_skew.set(0 if agrees else 1)
    if not agrees:
        log.error(
            "clock_disagrees",
            epoch=ctx.term.epoch,
            offset_ms=round(reading.offset_ms),
            bound_ms=bound,
            note="not cutting",
        )
    return agrees


def _replication_allows_cutting(ctx: LeaderContext) -> bool:
    """Check how the database replicates (one round trip); False: do not cut now.

    Standbys that no commit waits for mean no cutting (a failover could lose acknowledged
    claims), unless ``postgres.allow_async_replication`` (docs/postgres-ha.md).
    """
    replication = ctx.db.replication()
    asynchronous = replication.asynchronous
    ctx.hooks.health.replication_checked(asynchronous)
    ctx.metrics.async_replication.set(int(asynchronous))
    if not asynchronous:
        return True
    fields = {
        "epoch": ctx.term.epoch,
        "standbys": replication.standbys,
        "synchronous_standbys": replication.synchronous_standbys,
        "synchronous_standby_names": replication.synchronous_standby_names,
        "synchronous_commit": replication.synchronous_commit,
    }
    if ctx.config.postgres.allow_async_replication:
        log.warning("async_replication", **fields, note="cutting anyway (allowed)")
        return True
    log.error(
        "async_replication",
        **fields,
        note="not cutting; a failover could lose acknowledged claims (make a standby "
        "synchronous, or set postgres.allow_async_replication)",
    )
    return False


def _allowance(pool: PoolConfig, lead_ms: int | None) -> int | None:
    """How far ahead of our clock a cut after a mark in the future may go; None before the
    database has recorded a layout (it cannot judge a lead then).

    ``max(pool.max_clock_ahead_ms, the mark's lead at its cut) - pool.max_clock_skew_ms``,
    the skew being what our clock may differ by: the cutter then cuts densely straight after
    such a mark, no further ahead than the database allows (``allocator_mark_ahead_seconds``
    exports the lead). Real time catches up at the rate the pool leaves unused; the cluster
    never stalls on such a mark.
    """
    if lead_ms is None:
        return None
    return max(0, max(pool.max_clock_ahead_ms, lead_ms) - pool.max_clock_skew_ms)


def _write(ctx: LeaderContext, batch: list[tuple[int, int]]) -> tuple[int, int]:
    """Cut one batch; (blocks written, the new mark's lead over the database clock)."""
    result = ctx.db.cut_blocks(ctx.term.token, batch, commit_if=ctx.term.may_write)
    ctx.hooks.health.write_succeeded()
    ctx.hooks.cut_recorded(batch[-1][1])  # committed: ZooKeeper's watermark may follow
    ctx.metrics.blocks_cut.inc(len(batch))
    ctx.metrics.ids_cut.inc(sum(last - first + 1 for first, last in batch))
    return len(batch), result.lead_ms


def _sleep_until_ms(ctx: LeaderContext, wall_ms: int) -> None:
    delay_s = (wall_ms - ctx.now_ms()) / 1000
    if delay_s > 0:
        # An Event wait, not time.sleep: under libfaketime (the chaos tests' skewed clocks)
        # sleep's absolute-deadline clock_nanosleep fails with EINVAL.
        _NEVER_SET.wait(min(delay_s, 0.05))
