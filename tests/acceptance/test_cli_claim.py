"""``allocator claim`` run as a user runs it: a subprocess against a real, stocked database."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest

from allocator.core.exits import Exit
from tests.fixtures.pg import cut, take_fence

pytestmark = pytest.mark.integration

EPOCH = 3
FIRST = 1 << 22
SIZE = 16
EX_USAGE, EX_TEMPFAIL, EX_CONFIG = Exit.USAGE, Exit.TEMPFAIL, Exit.CONFIG


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI with a clean environment: no ALLOCATOR_* variable leaks in from the caller."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("ALLOCATOR_")}
    return subprocess.run(
        [sys.executable, "-m", "allocator.cli", "claim", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stock(url: str, count: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        take_fence(admin, EPOCH)
        cut(admin, EPOCH, [(FIRST + i * SIZE, FIRST + (i + 1) * SIZE - 1) for i in range(count)])


def test_claim_prints_one_line_per_block(db_url: str) -> None:
    stock(db_url, 3)
    result = run("--consumer", "orders", "--count", "2", "--database-url", db_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"1 {FIRST} {FIRST + SIZE - 1}",
        f"2 {FIRST + SIZE} {FIRST + 2 * SIZE - 1}",
    ]
    assert result.stderr == ""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM allocator.block_ledger WHERE claimed_by = 'orders'"
        ).fetchone()
    assert row == (2,)


def test_claim_json(db_url: str) -> None:
    stock(db_url, 1)
    result = run("--consumer", "orders", "--json", "--database-url", db_url)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "consumer": "orders",
        "requested": 1,
        "blocks": [{"block_id": 1, "first_id": FIRST, "last_id": FIRST + SIZE - 1, "size": SIZE}],
    }


def test_claim_takes_the_application_url_from_its_variable(db_url: str) -> None:
    stock(db_url, 1)
    result = run("--consumer", "orders", env={"ALLOCATOR_CLAIM_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", str(FIRST), str(FIRST + SIZE - 1)]


def test_claim_never_uses_the_nodes_url(db_url: str) -> None:
    stock(db_url, 1)
    result = run("--consumer", "orders", env={"ALLOCATOR_POSTGRES_URL": db_url})
    assert result.returncode == EX_CONFIG
    assert result.stdout == ""
    assert "ALLOCATOR_CLAIM_DATABASE_URL" in result.stderr
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM allocator.block_ledger WHERE claimed_by IS NOT NULL"
        ).fetchone()
    assert row == (0,)


def test_a_short_pool_returns_fewer_blocks_and_says_so(db_url: str) -> None:
    stock(db_url, 2)
    result = run("--consumer", "orders", "--count", "5", "--json", "--database-url", db_url)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["blocks"]) == 2
    assert "claimed 2 of 5 blocks" in result.stderr


@pytest.mark.parametrize("count", ["0", "1001", "many"])
def test_a_bad_count_exits_2(db_url: str, count: str) -> None:
    result = run("--consumer", "orders", "--count", count, "--database-url", db_url)
    assert result.returncode == EX_USAGE
    assert "--count" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("consumer", "message"),
    [("", "non-empty"), ("x" * 129, "129 characters"), ("a\tb", "control characters")],
)
def test_a_bad_consumer_exits_2_with_one_line(db_url: str, consumer: str, message: str) -> None:
    result = run("--consumer", consumer, "--database-url", db_url)
    assert result.returncode == EX_USAGE
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ")
    assert message in result.stderr


def test_an_empty_pool_exits_75_with_one_line(db_url: str) -> None:
    result = run("--consumer", "orders", "--database-url", db_url)
    assert result.returncode == EX_TEMPFAIL
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "pool empty" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_database_exits_75(unused_tcp_port: int) -> None:
    url = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/allocator"
    result = run("--consumer", "orders", "--database-url", url)
    assert result.returncode == EX_TEMPFAIL
    assert "unreachable" in result.stderr
    assert "Traceback" not in result.stderr
