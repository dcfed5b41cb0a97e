"""A cheaper ``claim_blocks``: the same checks, errors, pause and bound, fewer steps per claim.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

Why: at 32 connections ``claim_blocks`` ran at about a quarter of the ``durable_commit``
reference (issue 26); besides the claim statement itself, each call ran a nested PL/pgSQL
function with a SET clause of its own (``age_bound_id``), a second statement for the pause
flag, and a transaction-local ``set_config`` that the caller's value made a no-op.

Rules:

* ``claim_blocks`` keeps its signature, result, owner, grants, comment, SECURITY DEFINER and
  ``SET search_path``; its argument checks (AL001, AL002) run first, in the same order with
  the same messages.
* The pause (0010) is unchanged in what it guarantees: the claim takes the shared advisory
  lock ``(1095520067, 4)`` first, then reads the flag in a statement of its own (READ
  COMMITTED: a snapshot taken after the lock; otherwise ``FOR SHARE``), so ``allocator pool
  pause`` still waits for every claim begun before it and ``claims_in_flight()`` still lists
  them. The bound on an ID's age (0011) is read in that same statement: the expression of
  ``age_bound_id(0, false)`` inline. Both read one-row tables; a pause still answers AL004
  before any ticket is drawn.
* ``synchronous_commit`` is ``on`` when the claim commits, as before (I4): set
  transaction-locally when the caller's value is anything else, left alone when it is
  ``on`` already (setting it to its own value changed nothing but cost a GUC stack entry).
* Nothing else changes: the fast path, the bound's loop, the requeue path and AL003.
  ``age_bound_id`` stays for ``claim_blocks_expiring`` and ``void_aged_blocks``; a test holds
  the inline expression to it. The downgrade restores 0011's ``claim_blocks`` word for word.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0013/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0013/downgrade.sql")
