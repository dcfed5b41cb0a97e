"""``allocator pool reset --after-restore`` as an operator runs it: the CLI in a subprocess
against the session's ZooKeeper ensemble (a chroot per test) and a database of its own (the
restored one) and, where a test needs it, a second one (the old database).

Must show (issue 19, item 3): the mark is at least the old database's mark read after its
pause, the watermark and the restored clock plus the lead; an old database that is not
paused, or cannot be read, changes nothing and says what to do; the plan (each candidate and
the winner) is in --json; the reset database starts paused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kazoo.client import KazooClient

from allocator.core.exits import Exit
from allocator.core.layout import Layout
from allocator.fence import Token, Watermark, watermark_path
from allocator.local.info import ClusterInfo
from tests.fixtures import pg
from tests.fixtures.pg import LAYOUT_JSON, cut, layout_blocks, take_fence
from tests.fixtures.zk import ZK_AUTH

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
EPOCH = 77
EX_USAGE, EX_OTHER, EX_TEMPFAIL = Exit.USAGE, Exit.FAILED, Exit.TEMPFAIL
REASON = "restored from the nightly dump"
UNREACHABLE = "--old-database-unreachable"


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")}
    return subprocess.run(
        [ALLOCATOR, "pool", "reset", *args],
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def env(db_url: str, zk_hosts: str) -> dict[str, str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        cut(conn, EPOCH, layout_blocks(10))
        conn.execute("SELECT * FROM allocator.claim_blocks('app', 4)").fetchall()
    return {
        "ALLOCATOR_ZOOKEEPER_HOSTS": zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": ZK_AUTH,
        "ALLOCATOR_POSTGRES_URL": db_url,
    }


def fence_and_voided(db_url: str) -> tuple[tuple[int, int], int]:
    with psycopg.connect(db_url) as conn:
        token = conn.execute("SELECT generation, epoch FROM allocator.fence").fetchone()
        (voided,) = conn.execute(  # type: ignore[misc]
            "SELECT count(*) FROM allocator.block_ledger"
            " WHERE claimed_by = 'allocator:voided-by-reset'"
        ).fetchone()
    assert token is not None
    return (int(token[0]), int(token[1])), int(voided)


@pytest.fixture
def old_db_url(cluster: ClusterInfo, template_db: str) -> Iterator[str]:
    """The old database: a second migrated database, stocked and claimed from."""
    name = f"old_{uuid.uuid4().hex[:12]}"
    url = pg.create_database(cluster.database_url, name, template_db)
    try:
        yield url
    finally:
        pg.drop_database(cluster.database_url, name)


def stock_old(url: str, *, ahead_ms: int = 0) -> int:
    """The old database after a run: blocks cut (the last ``ahead_ms`` ahead of its clock, as
    a leader whose clock runs ahead may cut) and claimed; returns its mark."""
    with psycopg.connect(url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        cut(conn, EPOCH, layout_blocks(10))
        if ahead_ms:
            (db_ms,) = conn.execute(  # type: ignore[misc]
                "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
            ).fetchone()
            first, last = Layout().nth_block(0, 4096, start_ms=db_ms + ahead_ms)
            conn.execute(
                "SELECT * FROM allocator.cut_blocks(0, %s, ARRAY[%s], ARRAY[%s], %s, %s)",
                (EPOCH, first, last, LAYOUT_JSON, ahead_ms + 60_000),
            )
        conn.execute("SELECT * FROM allocator.claim_blocks('app', 3)").fetchall()
        (mark,) = conn.execute(  # type: ignore[misc]
            "SELECT high_water_id FROM allocator.pool_status"
        ).fetchone()
    return int(mark)


def pause(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT * FROM allocator.pause_claims('restore step 1')")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reason", REASON, "--yes", UNREACHABLE], "needs --after-restore"),
        (["--after-restore", "--reason", "   ", "--yes", UNREACHABLE], "--reason must say why"),
        (["--after-restore", "--reason", REASON, UNREACHABLE], "pass --yes to confirm"),
        (["--after-restore", "--reason", REASON, "--yes"], "--old-database-unreachable"),
        (
            ["--after-restore", "--reason", REASON, "--yes", UNREACHABLE, "--old-database-url"],
            "not both",
        ),
        (
            ["--after-restore", "--reason", REASON, "--yes", "--old-database-url"],
            "names the database being reset",
        ),
    ],
)
def test_refusals_change_nothing(
    env: dict[str, str], db_url: str, args: list[str], message: str
) -> None:
    if args[-1] == "--old-database-url":
        args = [*args, db_url]
    done = cli(*args, env=env)
    assert done.returncode == EX_USAGE, done.stderr
    assert message in done.stderr
    assert fence_and_voided(db_url) == ((0, EPOCH), 0)


def test_an_old_database_still_serving_claims_changes_nothing(
    env: dict[str, str], db_url: str, old_db_url: str
) -> None:
    stock_old(old_db_url)
    done = cli(
        "--after-restore", "--reason", REASON, "--yes", "--old-database-url", old_db_url, env=env
    )
    assert done.returncode == EX_OTHER, done.stderr
    assert "claims are not paused on the old database" in done.stderr
    assert "allocator pool pause" in done.stderr
    assert fence_and_voided(db_url) == ((0, EPOCH), 0)


def test_an_unreachable_old_database_changes_nothing_and_names_the_way_out(
    env: dict[str, str], db_url: str, unused_tcp_port: int
) -> None:
    gone = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/allocator"
    done = cli("--after-restore", "--reason", REASON, "--yes", "--old-database-url", gone, env=env)
    assert done.returncode == EX_TEMPFAIL, done.stderr
    assert "cannot read the old database" in done.stderr
    assert UNREACHABLE in done.stderr
    assert fence_and_voided(db_url) == ((0, EPOCH), 0)


def test_the_mark_passes_the_old_databases_mark_read_after_its_pause(
    env: dict[str, str], db_url: str, old_db_url: str
) -> None:
    """The old database's last cut lies a minute ahead of its clock (past anything the
    restored clock or the watermark say): only its own mark can cover it, and it does."""
    old_mark = stock_old(old_db_url, ahead_ms=60_000)
    pause(old_db_url)
    done = cli(
        "--after-restore",
        "--reason",
        REASON,
        "--yes",
        "--json",
        "--old-database-url",
        old_db_url,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["new_high_water_id"] == old_mark
    mark = result["mark"]
    assert mark["candidates"]["old_database"] == old_mark
    assert mark["winner"] == "old_database"
    assert mark["candidates"]["restored_clock"] < old_mark
    assert mark["lead_ms"] == mark["max_clock_ahead_ms"] + 1000
    assert result["old_database"]["pause_reason"] == "restore step 1"
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT * FROM allocator.claim_blocks('app')")
        assert refused.value.sqlstate == "AL004"  # the restored database starts paused


def test_reset_voids_moves_the_mark_past_the_watermark_and_advances_the_generation(
    env: dict[str, str], db_url: str, zk_hosts: str
) -> None:
    watermark = Watermark(Token(0, EPOCH + 5), 10**15)  # cuts the restored database lacks
    client = KazooClient(hosts=zk_hosts, auth_data=[("digest", ZK_AUTH)])
    client.start(timeout=10)
    try:
        client.create(watermark_path("/election"), watermark.to_bytes(), makepath=True)
        done = cli("--after-restore", "--reason", REASON, "--yes", "--json", UNREACHABLE, env=env)
        assert done.returncode == 0, done.stderr
        generation, _stat = client.get("/fence-generation")
    finally:
        client.stop()
        client.close()
    result = json.loads(done.stdout)
    assert result["voided_blocks"] == 6
    assert result["new_high_water_id"] > watermark.high_water_id
    assert (result["old_generation"], result["old_epoch"], result["new_generation"]) == (
        0,
        EPOCH,
        1,
    )
    assert result["watermark"] == watermark.to_json()
    assert result["mark"]["candidates"]["watermark"] == watermark.high_water_id
    assert result["mark"]["candidates"]["old_database"] is None
    assert result["mark"]["floor"] == watermark.high_water_id
    assert generation == b"1"
    assert fence_and_voided(db_url) == ((1, 0), 6)
    with psycopg.connect(db_url) as conn:
        (reason,) = conn.execute("SELECT reason FROM allocator.pool_resets").fetchone()  # type: ignore[misc]
    assert reason == REASON


def test_human_output_says_what_was_done(env: dict[str, str]) -> None:
    done = cli("--after-restore", "--reason", REASON, "--yes", UNREACHABLE, env=env)
    assert done.returncode == 0, done.stderr
    assert "pool reset: 6 unclaimed blocks voided" in done.stdout
    assert "-> generation 1, epoch 0" in done.stdout
    assert "not read (--old-database-unreachable)" in done.stdout
    assert "<- the mark" in done.stdout
    assert "until `allocator pool resume`" in done.stdout
