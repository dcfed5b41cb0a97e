"""``pool_status_row`` runs with ``jit = off``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

The drill's timeline (issue 11) sampled ``pool_status`` at one read per ~1.5 s where it
asked for two per second: with PostgreSQL's default ``jit = on`` the function's queries
cost enough to be JIT-compiled, ~800 ms a call on a 64-block pool against ~23 ms without.
Nodes read the view on every refill tick (200 ms) and every ``/status``, so the refill job
overran its interval (APScheduler's "maximum number of running instances reached") and the
pool ran dry while a new leader took over. A function-level setting keeps the fix where
every caller gets it, whatever the server's configuration.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0009/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0009/downgrade.sql")
