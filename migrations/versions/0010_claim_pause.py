"""Operators pause claims: ``allocator.pause_claims()`` / ``resume_claims()``, AL004.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

Why: the restore procedure (docs/postgres-ha.md) must freeze what the old database hands
out before it reads the marks a reset moves past (issue 19). Claims paused, every ID the old
database ever handed out was cut before the pause ended, so its mark read after the pause
bounds them all; blocks it cuts later are never handed out. Operators may pause for other
reasons too (``allocator pool pause``).

Rules:

* ``allocator.claim_pause`` is the flag (one row), ``allocator.claim_pauses`` the record:
  who paused (``session_user``), when and why, who resumed, when and why; at most one
  pause open (a partial unique index). Operators and nodes read the record through the view
  ``allocator.claim_pause_history`` (as ``fence_history``); ``pool_status`` gains a last
  column ``claims_paused`` (CREATE OR REPLACE VIEW may add columns at the end; every reader
  names its columns, so old readers see what they saw).
* ``pause_claims(reason)`` / ``resume_claims(reason)`` (operator role; a reason of
  1..1000 characters, AL106) write both in one transaction. Pausing paused claims and
  resuming claims that are not paused change nothing and say so (``already_paused``,
  ``was_paused``).
* ``claim_blocks`` (same signature and result) answers **AL004** while paused, after its
  argument checks and before it draws a ticket: nothing is claimed, no ticket is used. How
  "pause returns only after every claim begun before it has ended" holds: each claim first
  takes the shared advisory lock ``(1095520067, 4)`` (0x414C4F43 is ASCII "ALOC", 4 for
  AL004; the two-integer key space, which the one-bigint form never collides with) and
  holds it until its transaction ends, then reads the flag in a statement of its own. In
  READ COMMITTED that statement's snapshot is taken after the lock was granted, so a claim
  that took the lock after the pause committed sees the pause. ``allocator pool pause``
  commits the pause, lists the lock's holders (``claims_in_flight()``, operator role,
  SECURITY DEFINER to see other roles' sessions) and waits until none of those is left;
  whoever took the lock later sees the pause. Nobody takes the lock exclusively: a pause
  never makes a claim wait, and a claim never waits for anything new.
* Under REPEATABLE READ or SERIALIZABLE a claim's snapshot may be older than the lock: there
  the flag is read ``FOR SHARE``, which fails with 40001 (retryable) when the pause changed
  the row after that snapshot (``FOR KEY SHARE`` would not: a pause changes no key column).
  ``pause_claims`` takes the row ``FOR NO KEY UPDATE``, so it waits for such claims that hold
  the row (claims in flight, which the pause waits for anyway); READ COMMITTED claims, the
  documented way, take no row lock at all.
* The claim's added cost: a shared advisory lock (a lock-manager entry, no row lock, no
  multixact, no write) and a read of a one-row table, per call.
* ``reset_after_restore`` (same signature and result) leaves the database paused: it opens a
  pause with the reset's reason (closing one the backup held), so consumers get AL004 on the
  restored database until the procedure's last step, ``allocator pool resume``.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0010/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0010/downgrade.sql")
