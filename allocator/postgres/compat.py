"""Which schema revisions the nodes of this release can use (docs/upgrades.md).

Pure data and one decision, no I/O: the node reads the database's revision and its
compatibility marker (:class:`SchemaStamp`) and asks :func:`judge`. The rules:

- :data:`REVISIONS` is every revision this code knows, oldest first (a unit test holds it to
  ``migrations/versions``); a new migration is added here, and to :data:`CONTRACTS` when it
  drops or changes the signature of anything a node of an older release calls.
- A known revision is usable from :data:`NODE_OLDEST_REVISION` on: the oldest schema holding
  everything this code calls.
- A revision this code does not know was written by a newer release. Migrations are
  expand-only, so it is usable unless that release closed it to us: every ``allocator
  migrate`` records, in the comment of Alembic's version table, the newest contract at or
  below the revision it left (``{"min_node_revision": "0003"}``, :func:`marker`). A node
  whose code does not know that revision cannot use the schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

REVISIONS: tuple[str, ...] = (
    "0001",
    "0002",
    "0003",
    "0004",
    "0005",
    "0006",
    "0007",
    "0008",
    "0009",
    "0010",
    "0011",
    "0012",
    "0013",
)
"""Every revision this code knows, oldest first; the last is its head."""

CONTRACTS: tuple[str, ...] = ("0003",)
"""Revisions that dropped or re-signed something an older node calls: a node whose code
does not know one cannot run on it or on any later revision. 0003 replaced the node's
functions with new signatures; every later migration is expand-only (issue 19)."""

NODE_OLDEST_REVISION = "0011"
"""The oldest schema this code's node can use: it calls ``leader_heartbeat``,
``void_aged_blocks`` and ``claimed_block_ages`` (0011); 0012 changed comments only, 0013
the body of ``claim_blocks``."""

MARKER_KEY = "min_node_revision"
"""The key of the compatibility marker in the comment of ``public.alembic_version``."""

HEAD = REVISIONS[-1]


@dataclass(frozen=True, slots=True)
class SchemaStamp:
    """What the database says of its schema: the revision (None: never migrated, or at base)
    and the marker's ``min_node_revision`` (None: no marker)."""

    revision: str | None
    min_node_revision: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether this code's node may run on a schema, and if not, one line saying why and
    the way out."""

    usable: bool
    message: str
    newer: bool = False
    """The revision is one this code does not know (a newer release wrote it)."""


def accepted_range() -> str:
    """The revisions this release's nodes accept, in words (every refusal names it)."""
    return (
        f"this release's nodes run on schema revisions {NODE_OLDEST_REVISION} to {HEAD}, "
        "and on newer ones no contract closed to it"
    )


def contract_floor(revision: str | None) -> str | None:
    """The newest contract at or below known ``revision``: the marker it carries."""
    if revision is None or revision not in REVISIONS:
        return None
    at = REVISIONS.index(revision)
    floors = [c for c in CONTRACTS if REVISIONS.index(c) <= at]
    return floors[-1] if floors else None


def marker(revision: str | None) -> str | None:
    """The comment ``allocator migrate`` leaves on the version table at ``revision``."""
    floor = contract_floor(revision)
    return None if floor is None else json.dumps({MARKER_KEY: floor})


def read_marker(comment: str | None) -> str | None:
    """The ``min_node_revision`` in a version table's comment; None when there is none (a
    comment that is no marker counts as none)."""
    if not comment:
        return None
    try:
        document = json.loads(comment)
    except ValueError:
        return None
    value = document.get(MARKER_KEY) if isinstance(document, dict) else None
    return value if isinstance(value, str) and value else None


def judge(stamp: SchemaStamp) -> Verdict:
    """Whether this code's node can use the schema ``stamp`` describes."""
    revision = stamp.revision
    if revision is None:
        return Verdict(
            False,
            f"the database has no allocator schema (no revision); {accepted_range()}: run "
            "`allocator migrate` with this release",
        )
    if revision in REVISIONS:
        if REVISIONS.index(revision) < REVISIONS.index(NODE_OLDEST_REVISION):
            return Verdict(
                False,
                f"the database's schema revision {revision} is older than this node can use "
                f"({accepted_range()}): run `allocator migrate` with this release",
            )
        return Verdict(True, f"schema revision {revision} (this release's head: {HEAD})")
    floor = stamp.min_node_revision
    if floor is not None and floor not in REVISIONS:
        return Verdict(
            False,
            f"the database's schema revision {revision} is newer than this release knows and "
            f"closed to nodes that do not know revision {floor} ({accepted_range()}): "
            f"upgrade the node to a release that knows revision {floor}",
            newer=True,
        )
    return Verdict(
        True,
        f"schema revision {revision} is newer than this release knows (head {HEAD}); "
        f"usable: no contract since {floor or 'base'}",
        newer=True,
    )
