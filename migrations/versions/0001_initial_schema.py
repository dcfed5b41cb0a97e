"""Initial schema: fence, high-water mark, blocks, leader terms, views, roles, functions.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Table design for blocks, chosen for claim throughput without bloat decay
------------------------------------------------------------------------
A plain ``FOR UPDATE SKIP LOCKED`` queue makes every claimer scan from the head of the
queue, stepping over rows other claimers hold and over dead versions of rows already
claimed; throughput falls with concurrency and again as dead tuples pile up between
vacuums. A Leaf-style segment row (``UPDATE … SET max_id = max_id + step``) serialises every
claimer on one row lock. Instead:

* Each block gets a **claim ticket** when it is cut: consecutive numbers in cut order,
  unique (``blocks_ticket_unique``). A claim draws the next value of the sequence
  ``allocator.claim_ticket`` and updates *the* row carrying that ticket, found by the unique
  index: no scan, and no two claimers ever want the same row. The row is locked with
  ``FOR UPDATE SKIP LOCKED``, so even a row someone else holds (below) is skipped, never
  waited for: a claim never blocks, whatever other transactions keep open.
* The claim only sets ``claimed_by``/``claimed_at``, which are in no index, and the table has
  ``fillfactor = 50``, so the update is HOT: the new version goes on the same page, no index
  entry is added, and the dead version is pruned by the next visitor of the page without
  waiting for VACUUM. Throughput therefore does not decay with the number of prior claims.
  Retention (a job) deletes old claimed blocks in batches; autovacuum reclaims them.
* Nothing is stranded: a ticket burned by a rolled-back claim, or drawn before its block was
  cut (empty pool), would otherwise leave a block nobody will ever draw. Three rules close
  that: ``cut_blocks`` numbers new blocks after every ticket already drawn; the leader's
  ``requeue_stranded`` gives unclaimed blocks left below the ticket position fresh tickets
  at the end of the queue, considering only tickets drawn before its previous run (so a
  claim in flight keeps its block); and a claim whose ticket finds no block falls back to
  the oldest unheld block in that same window (``SKIP LOCKED``, between
  ``high_water.requeued_upto`` and ``requeue_mark``), so it never takes a ticket another
  claim is about to use and never scans claimed history.
* Scans of ticket ranges (``available_blocks``, ``requeue_stranded``) run with
  ``enable_seqscan = off``: the floor is only known at run time, and a sequential scan would
  grow with the claimed history the design is meant to be immune to.
* I1 is enforced by the database twice: the statement-level trigger ``blocks_disjoint``
  checks every inserted block against its neighbours by ``first_id`` (two probes of a
  unique btree per row) and refuses range updates, and ``cut_blocks`` (the only write path
  the node role has) refuses any block not strictly after the persisted high-water mark,
  which also covers blocks already pruned. A GiST exclusion constraint on the ranges was
  measured first and dropped: ascending ranges are its worst case (about 4k blocks/s, and
  slower as the table grew), while the trigger cuts about 100k blocks/s; cut_blocks
  serialises inserts on the high_water row, which is what a trigger needs to be race-free.
  A claim is an ``UPDATE … WHERE claimed_at IS NULL`` under the row lock, so no block is
  handed out twice whatever the tickets do.
* I3: ``cut_blocks`` and ``requeue_stranded`` first lock the fence row ``FOR SHARE`` on the
  caller's exact epoch (conflicting with ``take_fence``'s ``UPDATE``) and raise SQLSTATE
  AL100 otherwise, in the same transaction as the write.
* I4: ``claim_blocks`` sets ``synchronous_commit = on`` locally, so a claim is flushed to
  WAL before it returns, whatever the caller's session setting.

SQLSTATEs (documented in docs/sql.md): AL001 bad consumer, AL002 bad count, AL003 pool
empty, AL100 fenced write, AL101 stale takeover, AL102 behind the high-water mark, AL103 bad
block batch.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0001/tables.sql")
    run_sql_file("0001/functions.sql")
    run_sql_file("0001/roles.sql")


def downgrade() -> None:
    run_sql_file("0001/downgrade.sql")
