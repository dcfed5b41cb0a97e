"""Aging: void the blocks about to pass the bound on an ID's age, in bulk, oldest first (I7,
docs/design.md §12).
"""

from __future__ import annotations

from allocator.config import block_age
from allocator.core import logs
from jobs.batches import write_in_batches
from jobs.context import LeaderContext

log = logs.get_logger(__name__)

BATCH_BLOCKS = 5000
MAX_BATCHES_PER_RUN = 20


def run(ctx: LeaderContext) -> int:
    """One aging run (every ``pool.refill_interval_s``); returns the number of blocks
    voided.

    - Fenced like every block write (``void_aged_blocks``, migration 0011): voided blocks
      are marked claimed by ``allocator:voided-aged``, never deleted by the void and never
      cut again (they stay below the high-water mark), so I1 and I3 hold. The database
      decides what is aged, from its own clock and the bound the leader's heartbeat wrote.
    - Ahead of the bound: a block is voided once older than ``pool.max_block_age_s`` minus
      :func:`allocator.config.block_age.void_ahead_ms`, so claims almost never meet an aged
      block themselves.
    - At most :data:`MAX_BATCHES_PER_RUN` batches of :data:`BATCH_BLOCKS` per run
      (:func:`jobs.batches.write_in_batches`), so a large backlog (a pool cut before a long
      leaderless stretch) never holds the term's job slot for long; the next run goes on.
    - Something voided: counted (``allocator_blocks_voided_aged_total``) and the refill
      woken (``ctx.wake_refill``), so the pool is cut back up at once.
    """
    ahead_ms = block_age.void_ahead_ms(ctx.config)
    voided = write_in_batches(
        ctx,
        lambda limit: ctx.db.void_aged_blocks(
            ctx.term.token, ahead_ms, limit, commit_if=ctx.term.may_write
        ),
        batch_blocks=BATCH_BLOCKS,
        max_batches=MAX_BATCHES_PER_RUN,
        on_unavailable=lambda exc: log.warning(
            "aging_failed", epoch=ctx.term.epoch, error=str(exc)
        ),
    )
    if voided:
        ctx.metrics.blocks_voided_aged.inc(voided)
        log.info("aged_blocks_voided", epoch=ctx.term.epoch, blocks=voided, ahead_ms=ahead_ms)
        ctx.wake_refill()
    return voided
