"""The bound on an ID's age (docs/design.md §12): what the leader tells the database, and how
far ahead its job voids. Pure functions of a :class:`~allocator.config.Config`: no I/O.
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
    """How old the leader's heartbeat may be while it still counts as serving.

    ``claim_blocks`` cannot see ZooKeeper, so "a leader serves" is the database's judgement:
    the fenced heartbeat is no older than this. :data:`STALE_REFILLS` refill intervals plus
    ``pool.handover_margin_s`` (3 x 1 s + 5 s = 8 s by default): the leader writes the
    heartbeat at the start of every refill run, so three intervals let two runs in a row fail
    before the leader counts as gone, and the margin covers a slow run without the judgement
    flapping. Longer keeps a dead leader "serving" longer, which only matters with
    ``pool.serve_aged_blocks_without_leader`` (claims switch to aged blocks that much later).
    """
    pool = config.pool
    return max(1, round((STALE_REFILLS * pool.refill_interval_s + pool.handover_margin_s) * 1000))


def void_ahead_ms(config: Config) -> int:
    """How long before the bound the leader's job voids a block.

    The larger of :data:`AHEAD_FRACTION` of the bound and :data:`AHEAD_REFILLS` refill
    intervals: the void job runs once per refill interval and may wait for the refill in
    flight, so voiding that much early leaves claims almost no aged block to void themselves
    (each costs a claim an extra ticket, at most 32 per call). It stays below the bound
    because :mod:`allocator.config.checks` refuses a bound of two refill intervals or less.
    """
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
