"""The schema's comments cite the repository's design document, ``docs/design.md``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

``COMMENT ON SCHEMA allocator`` sent readers to "DESIGN.md section 6", a file outside the
repository; it now names ``docs/design.md §6`` (the SQL surface). No other comment cites the
design. Comments only: no object is added, dropped or changed, so every node and consumer of
an older release keeps working. The downgrade restores 0001's text.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0012/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0012/downgrade.sql")
