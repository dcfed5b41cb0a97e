"""A bound on an ID's age: ``allocator.block_age``, ``leader_heartbeat``, ``void_aged_blocks``,
``claim_blocks_expiring``, ``block_age_status``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-10

Why: an ID carries the time its block was cut, and a pool kept at a floor of blocks can hold
blocks for days at a low claim rate (issue 22). ``pool.max_block_age_s`` bounds it: no block
whose first ID lies further than the bound behind the database clock is handed out while a
leader serves.

Rules:

* "A leader serves" in database terms, since ``claim_blocks`` cannot see ZooKeeper: the
  one-row table ``allocator.block_age`` exists and its ``heartbeat_at >= clock_timestamp() -
  leader_stale_ms``. Only ``leader_heartbeat`` writes it, fenced on the caller's exact token
  like every leader write (AL100), with the leader's settings (``max_block_age_ms``,
  ``serve_aged_without_leader``, ``leader_stale_ms``) and ``clock_timestamp()``. The node
  writes it on every refill run (the first runs at takeover).
* A bound is in force while a leader serves, or at any time once ``serve_aged_without_leader``
  is false. Without a ``block_age`` row (no leader of this release has run yet, or an older
  leader runs against this schema) no bound is in force and ``claim_blocks`` behaves exactly
  as 0010's: older nodes and consumers keep working.
* Aged: the first ID's millisecond (the recorded layout: ``epoch_ms`` and the shift of
  ``cluster_layout``) lies more than ``max_block_age_ms`` behind the database clock, i.e.
  ``first_id < ((db_now_ms - max_block_age_ms - epoch_ms) << shift)``: one comparison per
  block, a range on the unique index of ``first_id`` (``age_bound_id()``, owner only).
* ``claim_blocks`` (same signature and result) reads the bound once per call. With a bound
  in force, a drawn block that is aged is voided (``claimed_by = 'allocator:voided-aged'``,
  ``claimed_at = clock_timestamp()``: never handed out, never deleted by the void, never cut
  again as it stays below the high-water mark, so I1 and I3 hold) and another ticket is
  drawn, as for a ticket whose block the leader's job voided already; at most 32 extra
  tickets per call (bounded work; the job voids the rest). The slow paths (held tickets,
  the stranded window) skip aged blocks. Its cost without a bound: one read of two one-row
  tables.
* ``void_aged_blocks(generation, epoch, ahead_ms, limit)`` (node role, fenced): voids the
  oldest unclaimed blocks older than ``max_block_age_ms - ahead_ms``, at most ``limit``,
  looking only at the unclaimed ones (above the requeue floor, plus the held ones, as
  ``available_blocks``), skipping rows a claim holds; then draws the claim tickets of the
  voided blocks at the head of the queue, up to the first block still unclaimed, with
  ``nextval`` (claims draw concurrently; the sequence never moves back), so claims do not
  draw voided tickets. Voids are not logged in ``fenced_writes`` (its kinds are fixed);
  the blocks themselves record them.
* ``claim_blocks_expiring(consumer, n)`` (consumer role): ``claim_blocks`` (called, so the
  same rules and errors), plus ``expires_in_ms`` per block, read right after the claim:
  milliseconds until its first ID passes the bound; NULL while no bound is in force.
* ``allocator.serving_stretches`` (read through the view ``serving_history``, node and
  operator roles): each run of heartbeats of one token with one set of settings, no more
  than ``leader_stale_ms / 2`` apart. Between ``first_at`` and ``last_at + leader_stale_ms``
  a leader served as ``claim_blocks`` saw it (up to a heartbeat's commit at either end):
  the invariant checker's evidence (:mod:`allocator.core.verify`, I7).
* ``allocator.block_age_status`` (consumer, node, operator): the settings, the heartbeat,
  ``leader_serves`` and the age of the oldest unclaimed block (NULL when the pool is empty),
  computed by the SECURITY DEFINER ``block_age_status_row()`` as ``pool_status`` is.
* ``claimed_block_ages(after_ticket, upto_ticket, limit)`` (node role, read-only): the blocks
  handed out with tickets in that range, newest first, voided ones left out; the leader's
  sampling job turns them into the age at hand-out (``allocator_claimed_block_age_seconds``).
* Voids are not demand: every claim ticket drawn for a voided block (by ``claim_blocks`` or
  ``void_aged_blocks``) also advances the sequence ``allocator.voided_tickets``; each
  ``pool_samples`` row records it (a column default, so an older node's sample does too)
  and ``pool_status``'s claim rate leaves those tickets out. Counting them would size the
  pool by its own voids: after a burst, a pool cut for it would age out, its voids would
  keep the rate up, and the refill would cut (and later void) as many again, for ever.
* ``claim_blocks`` refuses consumer names beginning with ``allocator:`` (AL001): the ledger
  marks voided blocks with that prefix, and the checker reads it as "not handed out".
* Downgrade: ``claim_blocks`` and ``pool_status_row`` as 0010 left them, the new objects
  dropped.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0011/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0011/downgrade.sql")
