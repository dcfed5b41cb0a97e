"""One slow consumer cannot degrade the pool: held tickets, and a bound on an open claim.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

The problem (issue 8, item 4)
-----------------------------
A consumer that runs ``BEGIN; SELECT allocator.claim_blocks(…)`` and then sits idle keeps
its block's row locked, and the block reads as unclaimed to everyone else. Under 0003,
``requeue_stranded`` skips the locked row (``SKIP LOCKED``, rightly: the leader must not
wait for a consumer) and stops ``high_water.requeued_upto`` just below it, so that a later
rollback is still found. From then on the floor no longer moves: ``available_blocks`` (so
``pool_status``), ``requeue_stranded`` itself and the claim slow path all scan the ticket
range from that floor, which grows by every claim made since, claimed history the design
is otherwise immune to. A claim left open for a minute at 20k claims/s is 1.2 M rows per
scan; the leader's refill (pool_status, then requeue, every second) falls behind.

What the floor was for, and how held tickets keep it
----------------------------------------------------
The floor carried one fact: "every block at or below it is claimed, or held by a claim in
flight". The held blocks are the only exceptions that matter later (a held claim may still
roll back), and there are few of them: at most one per claim open at a requeue run. So
0004 lists them instead of pinning the floor on them:

* ``allocator.held_tickets (block_id, ticket, held_since)``: blocks ``requeue_stranded``
  wanted to consider (unclaimed in its window) but found locked.
* ``requeue_stranded`` (same signature, same fence check, same ``fenced_writes`` record
  when it moved blocks) takes as candidates the unclaimed blocks of its window
  ``(requeued_upto, requeue_mark]`` (one range scan of the ticket index, as before) plus
  the held blocks (primary-key rows); it locks the candidates still unclaimed with
  ``FOR UPDATE SKIP LOCKED`` (the lock rechecks ``claimed_at`` on the newest version) and
  gives those fresh tickets at the end of the queue. Candidates it could not lock and that
  are still unclaimed are held (a held row keeps its ``held_since``); held rows whose block
  was requeued, is claimed (the claim committed) or gone (pruned) are forgotten; rows still
  locked stay. Then ``requeued_upto`` advances to ``requeue_mark`` unconditionally.
  Invariant, by induction over runs: every block with a ticket at or below the floor is
  claimed, or is listed in ``held_tickets``. (Every unclaimed block of the window is moved
  above the floor or listed; new tickets, from cuts and requeues, are always drawn above
  the ticket position, hence above every later floor; a listed block leaves the list only
  when it was requeued or its claim is committed; a committed claim is never undone.)
* ``available_blocks`` counts unclaimed blocks above the floor (the ticket index, as
  before) plus unclaimed held blocks (``ticket <= floor``, so nothing is counted twice). A
  held block whose claim is still open reads as unclaimed, as it did in 0003. It becomes
  PL/pgSQL (same signature) so that its plan is cached per session: a SQL function is
  planned on every call, and the two-part query took as long to plan as to run.
* The claim slow path first tries the held blocks (oldest tickets, by primary key; those
  still locked are skipped, never waited for), then the window as before. A rolled-back
  held block is so claimable at once, and otherwise requeued by the next leader run.

Every scan is now bounded by things that do not grow with how long one claim stays open:
the window (claims made between two requeue runs), the pool (blocks cut but not drawn),
and the held list (claims open at a run). The rules of 0001 all stand: nothing is stranded
forever (a held block that rolls back is requeued by the next run, or taken by a slow
path); a claim never waits (only ``SKIP LOCKED`` locks on blocks); nothing scans claimed
history; claims stay HOT updates (``held_tickets`` is a separate table, and claims never
write it); the range readers keep ``enable_seqscan = off`` and ``jit = off``. I1: a block
is only handed out by an ``UPDATE`` under its row lock after ``claimed_at IS NULL`` was
rechecked on its newest version, and only requeued under the same lock, so a requeue can
never move a block a claim holds or has claimed. I4: untouched (``synchronous_commit`` is
still forced per transaction).

What an open transaction still costs: it holds back the horizon below which PostgreSQL
may remove dead row versions, database-wide, whatever it touched. Claims are unaffected
(each block row is updated once, into the room ``fillfactor = 50`` leaves), but the
one-row ``high_water`` keeps a version per leader write (a cut, a requeue that moved the
floor) and each read of it walks them: that grows with leader writes during the hold,
about one or two a second at the refill job's pace, not with claims. ``requeue_stranded``
therefore leaves the row alone when nothing changed, and ``available_blocks`` reads it
once. ``allocator bench slow-consumer`` reports the table's size so the two effects can
be told apart; the 60 s bound below caps it in production.

Measured (``allocator bench slow-consumer``, embedded cluster, 2 CPUs; one claim held
open across 200,000 claims at 2,000/s, leader every 100 claims, pool_status read every
20 ms; p50 / p99 in ms, first vs last 10,000 claims):

==========================  ===========================  ===========================
measured                    0003 functions               0004 functions
==========================  ===========================  ===========================
pool_status                 1.76 / 2.74 -> 29.0 / 42.6   1.49 / 3.21 -> 1.60 / 2.39
requeue_stranded            1.24 / 2.91 -> 28.9 / 39.7   0.76 / 1.25 -> 0.88 / 1.30
claim                       0.26 / 1.87 -> 3.68 / 11.5   0.29 / 1.67 -> 0.25 / 1.62
==========================  ===========================  ===========================

With 0003 the two leader statements grow linearly with the claims made since the claim
was opened (and their CPU starves the claims: pgbench could no longer hold 2,000/s); with
0004 they stay flat but for the slow rise of the dead high_water versions above.

Alternatives considered: keeping the pinned floor and bounding the scans with a second
index ``(ticket) WHERE claimed_at IS NULL`` makes the scans cheap but turns every claim
into a non-HOT update (the claim changes the predicate), the decay the ticket design
avoids. Waiting for the lock is not allowed (a claim, and the leader, never wait on a
consumer). Remembering the held rows in the leader's memory loses them on failover.

Bounding how long a claim stays open
------------------------------------
``claim_blocks`` also sets ``idle_in_transaction_session_timeout`` to 60 s for the rest of
the calling transaction (``set_config(…, true)``), unless the session already has a bound
of 60 s or less. Settings made with ``ALTER ROLE`` on the NOLOGIN group
``allocator_consumer`` do not reach its members, and ``ALTER DATABASE`` would also bind
the nodes and operators, so the function sets it where the lock is taken. An autocommit
claim is never idle, so the common call is unaffected; a transaction that calls
``claim_blocks`` and then sits idle for 60 s is ended by the server (FATAL 25P03, the
connection closes), it rolls back, and the leader's next ``requeue_stranded`` puts the
block back. 60 s: far above any sane pause inside a transaction that hands out IDs, and
short enough that one stalled consumer costs at most a minute of one block. The bound is
cooperative: the caller's own later ``SET`` can lift it (the slow-consumer bench does so
on purpose); held tickets are what keeps the pool healthy whatever the bound.

Downgrade restores the 0003 function definitions verbatim and first moves the floor back
below the lowest unclaimed held ticket, so the 0003 requeue still finds those blocks.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0004/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0004/downgrade.sql")
