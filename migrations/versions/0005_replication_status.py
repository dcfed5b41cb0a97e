"""How the database replicates: ``allocator.replication_status()``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

A claim is durable on return (I4) only on the server that acknowledged it. With an
asynchronous standby, a failover loses every commit the standby had not yet received: the
claims among them read as unclaimed again and are handed out twice, and the leader's mark
moves back so that IDs are cut twice. So nodes refuse to cut when the database has standbys
and no commit waits for one, unless an operator accepts that explicitly
(``postgres.allow_async_replication``).

``replication_status()`` (SECURITY DEFINER: the details of ``pg_stat_replication`` are
visible only to roles with ``pg_read_all_stats``, which the node role has not) reports:

* ``standbys``: standbys streaming now, plus physical replication slots nobody streams from
  (a standby that is down but expected back still counts);
* ``synchronous_standbys``: streaming standbys whose flush a commit waits for
  (``sync_state`` ``sync`` or ``quorum``);
* ``synchronous_standby_names`` and the caller's ``synchronous_commit``;
* ``in_recovery``: this server is a standby itself.

The verdict is the node's (``allocator.db.Replication``): asynchronous when ``standbys > 0``
and (``synchronous_standbys = 0`` or the node's ``synchronous_commit`` is ``off``, ``local``
or ``remote_write``). ``claim_blocks`` forces ``synchronous_commit = on`` for its own
transaction, so claims wait for a synchronous standby whatever the consumer's session says.

Limits: a standby that neither streams nor has a slot is invisible (a database restored
elsewhere, a standby fed from a WAL archive only); storage-level replication (a managed
service's multi-zone disk) is not a standby here and is synchronous by construction. The
owner of the function needs ``pg_read_all_stats`` (a superuser has it) for the counts of
synchronous standbys; without it they read 0, which errs on the safe side (no cutting).
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0005/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0005/downgrade.sql")
