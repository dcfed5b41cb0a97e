"""Database privileges: a NOLOGIN owner role, and exactly the rights docs/sql.md lists.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

Until 0006 the schema, its tables and its SECURITY DEFINER functions belonged to whoever ran
the migrations: a superuser, or an administrator login. Every function then ran with that
login's rights, and the login could not be retired without breaking them. Now:

* ``allocator_owner`` (NOLOGIN, cluster-wide like the other allocator roles, created if
  missing) owns the schema and every table, view, sequence and function in it, so the
  SECURITY DEFINER functions run with exactly the rights of the tables' owner and nobody
  logs in as it. It is a member of ``pg_read_all_stats``, because ``replication_status()``
  reads which standbys a commit waits for from ``pg_stat_replication``, whose details
  PostgreSQL shows only to that role.
* Whoever runs the migrations must be a superuser or a member of ``allocator_owner`` (with
  INHERIT, PostgreSQL's default): ``ALTER ... OWNER TO`` needs that, and so does every later
  migration that replaces or drops the owner's objects. A non-superuser migration role that
  may create roles (CREATEROLE) makes itself a member here; any other is refused with a hint.
* ``pool_status`` reads its row from ``pool_status_row()`` (SECURITY DEFINER): a view reads
  tables with its owner's rights but calls functions with the reader's, so until now every
  reader needed EXECUTE on ``available_blocks()``, ``id_time_ms()`` and ``db_now_ms()``.
  Those helpers are now the owner's alone, as are ``lock_fence``, ``check_layout`` and the
  trigger function ``blocks_disjoint``.
* Every right on the schema's objects is revoked from PUBLIC and the three group roles, then
  granted again exactly as the table "Roles and privileges" in docs/sql.md says; the node
  role keeps only the reads it makes (``pool_status``, ``leader_history``,
  ``fence_history``), no longer ``block_ledger`` or ``layout``. Default privileges stop the
  owner's future functions from being executable by PUBLIC.
* Every function keeps ``SET search_path = pg_catalog, pg_temp`` (all names in the bodies
  are schema-qualified, and ``pg_temp`` last means no temporary object can shadow anything).

``tests/integration/test_privileges.py`` checks the database against that table in both
directions, and holds every function to the rules above; docs/sql.md says how to write the
next function. The downgrade gives the schema back to whoever runs it (as before 0007),
restores the 0006 grants and view, and drops ``allocator_owner`` unless another database of
the cluster still uses it.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0007/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0007/downgrade.sql")
