"""The restore procedure: ``allocator.reset_after_restore()`` and its record.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A database restored from a backup (or failed over to a standby that missed commits) is
behind what was handed out: blocks claimed after its restore point read as unclaimed and
would be claimed again, IDs cut after it would be cut again, and tokens of terms after it
would be accepted again. Nodes refuse to lead it when ZooKeeper's watermark shows it (see
``allocator.fence``); an operator makes it safe with ``allocator pool reset --after-restore``
(operator role, audited like ``fence rebase``), which calls this function in one
transaction:

* every unclaimed block is voided: claimed by ``allocator:voided-by-reset`` (a name the
  ledger shows; consumers never get it), held tickets forgotten. Blocks the restore lost
  track of may have been handed out: none of them is handed out again. The pool is empty
  afterwards; the next leader cuts a fresh one.
* the mark moves past every ID that can have been cut before the reset: past
  ``db_now + p_max_ahead_ms`` (no cut may lie further ahead of the database clock, AL105,
  with ``pool.max_clock_ahead_ms`` passed by the command) and past ``p_min_high_water_id``
  (ZooKeeper's watermark, which saw cuts the restored database never had). ``marked_at``
  is now, so the next cut may follow straight after the mark (a mark ahead, see 0003).
* the fence moves to the next generation with epoch 0 (recorded in ``fence_rebases`` like a
  re-base, the open term ended ``reset``); the command writes that generation into
  ZooKeeper, so no token from before the reset is accepted again.
* one row in ``allocator.pool_resets`` (operator role may read it): when, who, why, how many
  blocks were voided, the mark and token before and after.

The function takes the fence row first, as every fenced writer does, so no cut or requeue
runs concurrently with it. It does not stop consumers: claims made between the restore and
the reset can hand out a block again, so the procedure (docs/postgres-ha.md) keeps the
restored database from consumers until the reset has run.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0006/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0006/downgrade.sql")
