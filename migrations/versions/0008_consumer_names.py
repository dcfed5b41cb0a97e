"""``claim_blocks`` refuses blank, invisible and line-breaking consumer names.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Fuzzing ``claim_blocks`` (issue 10) found names it accepted and claimed a block for, though
the ledger would show them as empty or split across lines: names made only of Unicode
spaces (U+00A0, U+3000, ...), zero-width characters or the byte-order mark, and names
holding a Unicode line or paragraph separator (U+2028/2029). They now get ``AL001`` like an
empty name or a control character. Only the validation at the top of the function changes;
``CREATE OR REPLACE`` keeps its owner (``allocator_owner``, 0007) and its grants. The
Python client's ``check_consumer`` applies the same rule before any I/O.
"""

from __future__ import annotations

from allocator.postgres.migrate import run_sql_file

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_sql_file("0008/upgrade.sql")


def downgrade() -> None:
    run_sql_file("0008/downgrade.sql")
