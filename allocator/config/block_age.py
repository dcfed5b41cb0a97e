"""The bound on an ID's age: what the leader tells the database, and how far ahead it voids.

Rules:
- ``pool.max_block_age_s`` is the bound (migration 0011): no block whose first ID lies further
  than it behind the database clock is handed out while a leader serves. "A leader serves"
  is the database's judgement, since ``claim_blocks`` cannot see ZooKeeper: the leader's
  fenced heartbeat (``allocator.block_age.heartbeat_at``) is no older than
  :func:`leader_stale_ms`.
- :func:`leader_stale_ms` = :data:`STALE_REFILLS` refill intervals + ``pool.handover_margin_s``.
  The leader writes the heartbeat at the start of every refill run, so two heartbeats lie
  one interval apart plus a run's length. Three intervals let two runs in a row fail (a
  statement timeout, a lost connection) before the leader counts as gone; the handover
  margin, what a handover may take beyond the session timeout (5 s by default), covers a
  slow run without the judgement flapping. Defaults: 3 x 1 s + 5 s = 8 s. Longer would keep
  a dead leader "serving" longer, which only matters with
  ``pool.serve_aged_blocks_without_leader`` (true: claims switch to serving aged blocks that
  much later; false: nothing changes, the bound holds either way).
- :func:`void_ahead_ms` = the larger of :data:`AHEAD_FRACTION` of the bound and
  :data:`AHEAD_REFILLS` refill intervals: the void job runs once per refill interval and a
  run may wait for the refill in flight (the jobs of a term never overlap), so voiding that
  much before the bound leaves claims almost no aged block to void themselves (each costs a
  claim an extra ticket, at most 32 per call). A tenth of the bound (30 s of the default
  300 s) also makes the blocks the pool hands out a little younger than the bound, which
  the client's buffer then spends. It must stay below the bound:
  :mod:`allocator.config.checks` refuses a bound of two refill intervals or less.
- Pure functions of a :class:`~allocator.config.Config`: no I/O.
"""

from __future__ import annotations

from allocator.config.model import Config
from allocator.core.records import BlockAgeBound

STALE_REFILLS = 3
AHEAD_FRACTION = 0.1
AHEAD_REFILLS = 2


def max_block_age_ms(config: Config) -> int:
    """The bound in milliseconds, as the database stores it."""
    return max(1, round(config.pool.max_block_age_s * 1000))


def leader_stale_ms(config: Config) -> int:
    """How old the leader's heartbeat may be while it still counts as serving."""
    pool = config.pool
    return max(1, round((STALE_REFILLS * pool.refill_interval_s + pool.handover_margin_s) * 1000))


def void_ahead_ms(config: Config) -> int:
    """How long before the bound the leader's job voids a block."""
    pool = config.pool
    bound_s = pool.max_block_age_s
    return round(max(AHEAD_FRACTION * bound_s, AHEAD_REFILLS * pool.refill_interval_s) * 1000)


def bound(config: Config) -> BlockAgeBound:
    """What the leader's heartbeat writes (:func:`max_block_age_ms`, the leaderless setting,
    :func:`leader_stale_ms`)."""
    return BlockAgeBound(
        max_block_age_ms=max_block_age_ms(config),
        serve_aged_without_leader=config.pool.serve_aged_blocks_without_leader,
        leader_stale_ms=leader_stale_ms(config),
    )
