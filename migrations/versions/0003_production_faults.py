"""Production faults: the token (generation, epoch), the layout record, the clock bound.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

What it does (DESIGN §11)
-------------------------
* **Fence re-base.** The fencing token becomes ``(generation, epoch)``: ``epoch`` stays the
  czxid of the leader's election znode (all 64 bits), ``generation`` is new and moves only
  through ``allocator.rebase_fence(reason)`` (operator role), which advances it, resets the
  epoch to 0 and records who, when and why in ``fence_rebases``. Nodes read the generation
  from their own ZooKeeper session and pass both halves; SQL never fills one in. So after an
  ensemble is wiped (czxids restart low) a re-base lets new leaders in, and a node still
  attached to the old ensemble, which reads the old generation, can never take the fence
  again (its token compares lower whatever its czxid) nor write (``lock_fence`` compares
  both halves for equality). ``leader_terms`` is keyed by the pair, so a reused czxid
  cannot collide.
* **Layout record.** ``cluster_layout`` holds the epoch, bit widths and datacenter id the
  IDs of this database were cut with. The first takeover or cut records it; every takeover
  and cut checks it (AL104, naming both layouts) and every block's datacenter field. A
  layout cannot change in place: the mark and every retained block were decoded with the
  old one, and a new epoch or width reorders IDs against time (I2/I5 could not be argued).
  A new layout means a new cluster: a new database and a new datacenter id.
* **Clock bound.** The database clock is the reference. ``cut_blocks`` rejects (AL105) a
  batch whose last ID carries a millisecond past ``db_now + greatest(p_max_ahead_ms,
  lead)``, where ``lead`` is the mark's lead over the database clock at the cut that set it
  (``high_water.marked_at``). One leader with a clock hours ahead therefore cannot move the
  mark ahead by more than ``p_max_ahead_ms``; a mark that is already ahead (written before
  this migration, or restored) keeps its lead at most, and every node can still cut
  straight after it: the lead can shrink, never grow. ``marked_at`` starts at the last
  ``updated_at``, so a mark already ahead keeps its lead instead of stalling the cluster.
* **Retention by the database clock.** ``prune_claimed`` takes a retention in ms and
  computes the cutoff from ``clock_timestamp()``.
* **Fenced write log.** Requeues and prunes that changed something are recorded in
  ``fenced_writes`` with their token, so the invariant checker can judge them by order, as
  it judges cuts through ``blocks.generation/epoch``.

Old function signatures are dropped, not kept: a node of an older version would cut
without the layout and clock checks. Upgrade the nodes with (or before) the migration; an
old node meets "schema older than this code"-style errors and writes nothing.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0003/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0003/downgrade.sql")
