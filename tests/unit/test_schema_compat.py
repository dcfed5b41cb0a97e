"""Which schema revisions this release's nodes accept (allocator/postgres/compat.py), case by
case, and the table held to the migrations it describes."""

from __future__ import annotations

import pytest

from allocator.postgres import compat, migrate
from allocator.postgres.compat import SchemaStamp

ACCEPTS = "this release's nodes run on schema revisions 0011 to 0013"


@pytest.mark.parametrize(
    ("stamp", "usable", "says"),
    [
        (SchemaStamp(None), False, "has no allocator schema (no revision)"),
        (SchemaStamp("0001"), False, "revision 0001 is older than this node can use"),
        (SchemaStamp("0009", "0003"), False, "revision 0009 is older than this node can use"),
        (SchemaStamp("0010", "0003"), False, "revision 0010 is older"),
        (SchemaStamp("0011", "0003"), True, "schema revision 0011"),
        (SchemaStamp("0012", "0003"), True, "schema revision 0012"),
        (SchemaStamp("0012"), True, "schema revision 0012"),  # migrated before the marker
        (SchemaStamp("0013", "0003"), True, "schema revision 0013"),
        (SchemaStamp("0014", "0003"), True, "newer than this release knows (head 0013)"),
        (SchemaStamp("0014"), True, "no contract since base"),  # no marker: expand-only
        (SchemaStamp("0014", "0013"), True, "usable: no contract since 0013"),
        (SchemaStamp("0015", "0014"), False, "closed to nodes that do not know revision 0014"),
        (SchemaStamp("0020", "0020"), False, "a release that knows revision 0020"),
    ],
)
def test_judge(stamp: SchemaStamp, usable: bool, says: str) -> None:
    verdict = compat.judge(stamp)
    assert verdict.usable is usable
    assert says in verdict.message
    assert "\n" not in verdict.message
    if not usable:  # both revisions and the way out, in the one line
        assert ACCEPTS in verdict.message
        assert str(stamp.revision or "no revision") in verdict.message
        way_out = "upgrade the node" if verdict.newer else "run `allocator migrate` with this"
        assert way_out in verdict.message


@pytest.mark.parametrize(
    ("revision", "marker"),
    [
        (None, None),
        ("0001", None),
        ("0002", None),
        ("0003", '{"min_node_revision": "0003"}'),
        ("0009", '{"min_node_revision": "0003"}'),
        ("0012", '{"min_node_revision": "0003"}'),
    ],
)
def test_the_marker_names_the_newest_contract_at_or_below(
    revision: str | None, marker: str | None
) -> None:
    assert compat.marker(revision) == marker
    assert compat.read_marker(marker) == (None if marker is None else "0003")


@pytest.mark.parametrize("comment", [None, "", "not json", "[1]", '{"min_node_revision": 3}'])
def test_a_comment_that_is_no_marker_counts_as_none(comment: str | None) -> None:
    assert compat.read_marker(comment) is None


def test_the_table_knows_exactly_the_migrations() -> None:
    """A new migration must be added to REVISIONS (and to CONTRACTS if it is one)."""
    assert list(compat.REVISIONS) == migrate.known_revisions()
    assert migrate.head_revision() == compat.HEAD
    assert set(compat.CONTRACTS) <= set(compat.REVISIONS)
    assert compat.NODE_OLDEST_REVISION in compat.REVISIONS
