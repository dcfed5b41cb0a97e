"""The schema's comments cite the repository's design document, ``docs/design.md``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

``COMMENT ON SCHEMA allocator`` sent readers to "DESIGN.md section 6", a file outside the
repository; it now names ``docs/design.md §6`` (the SQL surface). One comment inside
``cut_blocks``' body cited "DESIGN section 5": the function is replaced word for word but for
that line (same signature, owner and grants). Comments only: no object is added or dropped and
nothing behaves differently, so every node and consumer of an older release keeps working.
The downgrade restores both texts.
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
