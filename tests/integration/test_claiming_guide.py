"""docs/claiming-ids.md: the psql snippet, run as written against a consumer role, with a
leader's bound on an ID's age in force (migration 0011's ``claim_blocks_expiring``)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from allocator.core.layout import Layout
from tests.fixtures.pg import consumer_login, cut, take_fence

pytestmark = pytest.mark.integration

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "claiming-ids.md"


def psql_snippet() -> str:
    text = GUIDE.read_text()
    section = text.split("### psql", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "the guide's psql snippet is missing"
    return match.group(1).replace("\\\n", " ")


BOUND_MS = 300_000


@pytest.fixture
def consumer_url(db_url: str) -> Iterator[str]:
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, 5)
        row = admin.execute("SELECT allocator.db_now_ms()").fetchone()
        assert row is not None
        first = Layout().encode(int(row[0]), 0, 0, 0)
        cut(admin, 5, [(first, first + 4095)])
        admin.execute("SELECT allocator.leader_heartbeat(0, 5, %s, true, 60000)", (BOUND_MS,))
    with consumer_login(db_url, "guide") as url:
        yield url


def test_the_psql_snippet_claims_a_block(consumer_url: str) -> None:
    command = psql_snippet().replace(
        '"postgresql://orders_api@127.0.0.1:5432/allocator"', f'"{consumer_url}"'
    )
    assert consumer_url in command, "the snippet's URL changed: update this test"
    # psql comes with the project's system dependencies (scripts/install-system-deps.sh)
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    first, last, expires_in_ms = (int(v) for v in result.stdout.split())
    assert last - first == 4095
    assert 0 < expires_in_ms <= BOUND_MS  # the block was cut a moment ago


@pytest.mark.parametrize("language", ["Java (JDBC)", "Go (pgx v5)", "Node (pg)"])
def test_every_snippet_that_retries_an_empty_pool_retries_paused_claims_too(language: str) -> None:
    """AL004 (claims paused, migration 0010) is retried like AL003: each snippet says so."""
    section = GUIDE.read_text().split(f"### {language}", 1)[1].split("\n### ", 1)[0]
    assert "AL003" in section
    assert "AL004" in section


@pytest.mark.parametrize(
    "language", ["Python (psycopg 3)", "Java (JDBC)", "Go (pgx v5)", "Node (pg)"]
)
def test_every_snippet_keeps_to_the_blocks_deadline(language: str) -> None:
    """Each snippet claims with claim_blocks_expiring and derives a local deadline from a
    monotonic clock read before the call (docs/claiming-ids.md, section 4)."""
    section = GUIDE.read_text().split(f"### {language}", 1)[1].split("\n### ", 1)[0]
    assert "claim_blocks_expiring" in section
    assert "expires_in_ms" in section or "expiresInMs" in section
    assert "deadline" in section
