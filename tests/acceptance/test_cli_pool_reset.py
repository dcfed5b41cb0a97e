"""``allocator pool reset --after-restore`` as an operator runs it: the CLI in a subprocess
against the session's ZooKeeper ensemble (a chroot per test) and a database of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from kazoo.client import KazooClient

from allocator.fence import Token, Watermark, watermark_path
from tests.fixtures.pg import cut, layout_blocks, take_fence
from tests.fixtures.zk import ZK_AUTH

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
EPOCH = 77
EX_USAGE = 2
REASON = "restored from the nightly dump"


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--reason", REASON, "--yes"], "needs --after-restore"),
        (["--after-restore", "--reason", "   ", "--yes"], "--reason must say why"),
        (["--after-restore", "--reason", REASON], "pass --yes to confirm"),
    ],
)
def test_refusals_change_nothing(
    env: dict[str, str], db_url: str, args: list[str], message: str
) -> None:
    done = cli(*args, env=env)
    assert done.returncode == EX_USAGE, done.stderr
    assert message in done.stderr
    assert fence_and_voided(db_url) == ((0, EPOCH), 0)


def test_reset_voids_moves_the_mark_past_the_watermark_and_advances_the_generation(
    env: dict[str, str], db_url: str, zk_hosts: str
) -> None:
    watermark = Watermark(Token(0, EPOCH + 5), 10**15)  # cuts the restored database lacks
    client = KazooClient(hosts=zk_hosts, auth_data=[("digest", ZK_AUTH)])
    client.start(timeout=10)
    try:
        client.create(watermark_path("/election"), watermark.to_bytes(), makepath=True)
        done = cli("--after-restore", "--reason", REASON, "--yes", "--json", env=env)
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
    assert generation == b"1"
    assert fence_and_voided(db_url) == ((1, 0), 6)
    with psycopg.connect(db_url) as conn:
        (reason,) = conn.execute("SELECT reason FROM allocator.pool_resets").fetchone()  # type: ignore[misc]
    assert reason == REASON


def test_human_output_says_what_was_done(env: dict[str, str]) -> None:
    done = cli("--after-restore", "--reason", REASON, "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert "pool reset: 6 unclaimed blocks voided" in done.stdout
    assert "-> generation 1, epoch 0" in done.stdout
