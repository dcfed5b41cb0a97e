"""The exit codes of every ``allocator`` command: the one table.

Nothing else sets a process exit code: the errors of :mod:`allocator.core.errors`, the
node's codes in :mod:`allocator.node.exits` and every command's ``--help`` take theirs from
here. ``docs/exit-codes.md`` is the same table (a unit test compares).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Exit(IntEnum):
    """Every exit code of the CLI (see :data:`TABLE` for what each means).

    sysexits(3) numbers where one fits: 64 usage, 69 a prerequisite unavailable, 70 software
    (a server we started, a bug), 75 temporary failure (retry later), 78 configuration (fix
    it; retrying will not help). Below them: 0 done, 1 the answer is no (a check that
    failed, a declined prompt) or an error no row covers, and the node's own 3 and 4. One
    cause, one code, whichever command meets it: an unreachable ZooKeeper, PostgreSQL or
    leader is 75; a login PostgreSQL refuses (password, role, ``pg_hba.conf``) and a missing
    setting are 78; a bad flag or value is 64.
    """

    OK = 0
    FAILED = 1
    SESSION_LOST = 3
    FENCED = 4
    USAGE = 64
    UNAVAILABLE = 69
    SOFTWARE = 70
    TEMPFAIL = 75
    CONFIG = 78


@dataclass(frozen=True)
class Row:
    """One code: its sysexits(3) name (empty when it is not one) and what it means."""

    code: Exit
    sysexits: str
    meaning: str


TABLE: tuple[Row, ...] = (
    Row(Exit.OK, "", "done: what was asked happened (warnings, if any, on stderr)"),
    Row(
        Exit.FAILED,
        "",
        "the answer is no: a check failed (migrate --check: the schema is behind; a drill "
        "round, a violation), a prompt was declined, Ctrl-C; or an error no other row covers",
    ),
    Row(
        Exit.SESSION_LOST,
        "",
        "run only: the node's ZooKeeper session was lost (node.on_session_loss = exit)",
    ),
    Row(Exit.FENCED, "", "run only: fenced, a newer leader holds the fence"),
    Row(
        Exit.USAGE,
        "EX_USAGE",
        "bad arguments: an unknown option, a value of the wrong shape or out of range, no "
        "--yes without a terminal, a request refused as malformed (a reason, a name)",
    ),
    Row(
        Exit.UNAVAILABLE,
        "EX_UNAVAILABLE",
        "a prerequisite is missing: a program or package the command needs (zookeeper, "
        "postgresql, java, the node's Python dependencies)",
    ),
    Row(
        Exit.SOFTWARE,
        "EX_SOFTWARE",
        "a server the command started did not come up (its log's tail follows), or a bug "
        "(a traceback follows)",
    ),
    Row(
        Exit.TEMPFAIL,
        "EX_TEMPFAIL",
        "temporary: ZooKeeper, PostgreSQL or the leader unreachable or too slow, the pool "
        "empty, claims paused, a port taken, a clock out of bounds; retry later",
    ),
    Row(
        Exit.CONFIG,
        "EX_CONFIG",
        "configuration: invalid (every problem named), a setting missing, a login refused "
        "(the PostgreSQL role or ZooKeeper identity named), a layout the database recorded "
        "otherwise, a schema revision this release cannot use (both revisions named); fix "
        "it, a retry will not help",
    ),
)
"""Every code, in numeric order (a unit test checks it covers :class:`Exit` exactly)."""


def row(code: int) -> Row:
    """The row of ``code`` (ValueError for a code the table does not have)."""
    wanted = Exit(code)
    return next(entry for entry in TABLE if entry.code is wanted)


def help_lines() -> list[str]:
    """The table as ``allocator --help`` prints it: one line per code, its sysexits name in
    brackets."""
    lines = []
    for entry in TABLE:
        name = f" [{entry.sysexits}]" if entry.sysexits else ""
        lines.append(f"{int(entry.code):<3} {entry.meaning}{name}")
    return lines
