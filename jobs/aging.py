"""Aging: void the blocks about to pass the bound on an ID's age, in bulk, oldest first.

Rules:
- Fenced like every block write (``void_aged_blocks``, migration 0011): voided blocks are
  marked claimed by ``allocator:voided-aged``, never deleted by the void and never cut
  again (they stay below the high-water mark), so I1 and I3 hold. The database decides
  what is aged, from its own clock and the bound the leader's heartbeat wrote.
- Ahead of the bound: a block is voided once it is older than ``pool.max_block_age_s`` minus
  :func:`allocator.config.block_age.void_ahead_ms` (the larger of 10 % of the bound and two
  refill intervals; why, there), so claims almost never meet an aged block themselves.
- Every ``pool.refill_interval_s``; at most :data:`MAX_BATCHES_PER_RUN` batches of
  :data:`BATCH_BLOCKS` per run, so a large backlog (a pool cut before a long leaderless
  stretch) never holds the term's job slot for long; the next run goes on.
- Something voided: counted (``allocator_blocks_voided_aged_total``), and the refill is
  woken (``ctx.wake_refill``), so the pool is cut back up at once instead of at the next
  interval.
- Errors as in :mod:`jobs.retention`: fenced ends the term, a write abandoned (leadership in
  doubt) or a database unavailable waits for the next run.
"""

from __future__ import annotations

from allocator.config import block_age
from allocator.core import logs
from allocator.core.errors import DatabaseUnavailableError, FencedError, WriteAbandonedError
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

BATCH_BLOCKS = 5000
MAX_BATCHES_PER_RUN = 20


def run(ctx: LeaderContext) -> int:
    """One aging run; returns the number of blocks voided."""
    voided = 0
    ahead_ms = block_age.void_ahead_ms(ctx.config)
    with ctx.busy:
        try:
            for _ in range(MAX_BATCHES_PER_RUN):
                if not ctx.term.may_write():
                    break
                n = ctx.db.void_aged_blocks(
                    ctx.term.token, ahead_ms, BATCH_BLOCKS, commit_if=ctx.term.may_write
                )
                ctx.hooks.health.write_succeeded()
                voided += n
                if n < BATCH_BLOCKS:
                    break
        except FencedError as exc:
            ctx.metrics.fenced_writes_rejected.inc()
            ctx.hooks.on_fenced(exc)
        except WriteAbandonedError:
            ctx.metrics.writes_abandoned.inc()
        except DatabaseUnavailableError as exc:
            log.warning("aging_failed", epoch=ctx.term.epoch, error=str(exc))
    if voided:
        ctx.metrics.blocks_voided_aged.inc(voided)
        log.info("aged_blocks_voided", epoch=ctx.term.epoch, blocks=voided, ahead_ms=ahead_ms)
        ctx.wake_refill()
    return voided
