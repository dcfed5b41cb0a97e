"""``allocator status``'s ``ID age`` line (issue 22, item 5): the oldest unclaimed block's age
beside the bound, and whether a leader serves, from the ``block_age`` object that
``status --json`` prints (docs/schemas/status.schema.json)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from allocator.commands.status import block_age_line
from allocator.core.records import BlockAgeStatus

BEAT = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)


def age(**fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "max_block_age_ms": 300_000,
        "serve_aged_without_leader": True,
        "heartbeat_at": BEAT,
        "leader_serves": True,
        "oldest_unclaimed_age_ms": 42_400,
    }
    values.update(fields)
    return BlockAgeStatus(**values).to_json()


def test_the_json_object_is_in_seconds_with_the_heartbeat_as_a_timestamp() -> None:
    assert age() == {
        "max_block_age_s": 300.0,
        "oldest_unclaimed_age_s": 42.4,
        "leader_serves": True,
        "serve_aged_without_leader": True,
        "heartbeat_at": "2026-12-10T12:00:00+00:00",
    }


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({}, "ID age      oldest unclaimed block 42 s old, bound 300 s; a leader serves"),
        (
            {"oldest_unclaimed_age_ms": 420_000},
            "ID age      oldest unclaimed block 420 s old (PAST THE BOUND), bound 300 s; "
            "a leader serves",
        ),
        (
            {"oldest_unclaimed_age_ms": None, "leader_serves": False},
            "ID age      pool empty, bound 300 s; NO LEADER SERVES: older blocks are handed out",
        ),
        (
            {"leader_serves": False, "serve_aged_without_leader": False},
            "ID age      oldest unclaimed block 42 s old, bound 300 s; "
            "NO LEADER SERVES: aged blocks are refused",
        ),
        (
            {
                "max_block_age_ms": None,
                "serve_aged_without_leader": None,
                "heartbeat_at": None,
                "leader_serves": False,
            },
            "ID age      oldest unclaimed block 42 s old, no bound set yet; "
            "NO LEADER SERVES: older blocks are handed out",
        ),
    ],
)
def test_the_line_says_the_age_the_bound_and_who_holds_it(
    fields: dict[str, Any], line: str
) -> None:
    assert block_age_line(age(**fields)) == line


def test_a_database_before_migration_0011_prints_no_line() -> None:
    assert block_age_line(None) is None
