"""Retention: ``allocator.prune_claimed(p_epoch, p_claimed_before, p_limit)``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

What it does
------------
Deletes at most ``p_limit`` blocks that are claimed and were claimed before
``p_claimed_before``, oldest claims first (in ticket order, which is claim order, so a batch
walks the ticket index instead of sorting the table; there is deliberately no index on
``claimed_at``, which would make every claim a non-HOT update). Unclaimed blocks are never
deleted. Fenced exactly like ``cut_blocks``: the function first locks the fence row
``FOR SHARE`` on the caller's exact epoch and raises AL100 otherwise, in the same
transaction as the delete, so only the current leader prunes (I3) and a takeover waits for a
prune in flight. Bad arguments (NULL cutoff, limit < 1) raise AL103. EXECUTE is revoked from
PUBLIC and granted to ``allocator_node`` only.

Why pruning never weakens I1 or I2
----------------------------------
* Every block was inserted by ``cut_blocks``, which in the same transaction advanced
  ``high_water.last_id`` to at least the block's ``last_id``. The mark only moves forward
  (``cut_blocks`` refuses a batch whose first block is not strictly after it) and pruning
  never touches ``high_water``. So every pruned ID is at or below the mark, and any block
  cut later starts strictly above it: a new block can never overlap a pruned one (I1), and
  first IDs keep increasing in cutting order across leaders (I2). That check, not the
  ``blocks_disjoint`` trigger, is what covers history that is no longer retained.
* Among retained blocks, the ``blocks_disjoint`` trigger still forbids overlap on every
  insert; deleting rows cannot create an overlap.
* No ID is handed out twice: only claimed blocks are deleted, a claim only updates a row
  that exists and is unclaimed, and nothing re-inserts or un-claims a row, so a pruned
  block's IDs are never offered again. Claim tickets for new blocks are numbered from
  ``high_water.last_ticket`` and the ticket sequence, never from the rows left in the
  table, so pruning cannot cause a ticket to be reused either.
* I4 is kept in substance: a pruned claim's record is gone, but the guarantee it stood for
  (the block is never handed to anyone else) is what the points above preserve. Retention
  should still keep claimed blocks long enough for audits and the chaos checker's ledger.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0002/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0002/downgrade.sql")
