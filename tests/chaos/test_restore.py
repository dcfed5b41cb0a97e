"""Chaos: the database is restored from a ``pg_dump`` taken mid-run, by the documented
procedure, while consumers keep claiming.

Rules: one embedded cluster (one ZooKeeper server, two nodes), consumers claiming throughout
and reconnecting after errors. The procedure (docs/postgres-ha.md): ``pg_restore`` into a new
database, ``allocator pool reset --after-restore`` against it (ZooKeeper's watermark saw the
cuts the dump misses), then swap it in under the cluster's database name. Block ids are
reused by the restored database, so "handed out twice" is judged on the IDs themselves:
every range a consumer got, before and after the restore, is disjoint from every other.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time

import psycopg
import pytest

from allocator import zkclient
from allocator.fence import Watermark, watermark_path
from allocator.local import postgres
from allocator.local.cluster import ClusterInfo
from tests.chaos.harness import ChaosCluster, chaos_consumers, wait_for

pytestmark = pytest.mark.integration

CLAIMS = 20
RESTORED = "allocator_restored"
RESET_COMMAND = [sys.executable, "-m", "allocator.cli", "pool", "reset", "--after-restore"]


def watermark(info: ClusterInfo) -> Watermark:
    """ZooKeeper's watermark, read as the cluster's identity (its znodes carry its ACL)."""
    client = zkclient.client_for(info.node_zk_hosts, info.zk_auth, timeout_s=10)
    client.start(timeout=10)
    try:
        data, _stat = client.get(watermark_path("/election"))
    finally:
        client.stop()
        client.close()
    return Watermark.from_bytes(data)


def high_water_id(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT high_water_id FROM allocator.pool_status").fetchone()
    assert row is not None
    return int(row[0])


def pg_tool(name: str, *args: str) -> None:
    tool = postgres.find_bin_dir() / name
    done = subprocess.run(
        [str(tool), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr


def swap_in(admin_url: str) -> None:
    """The restored database takes the cluster's database name (clients reconnect to it)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("ALTER DATABASE allocator WITH ALLOW_CONNECTIONS false")
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'allocator'"
        )
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = 'allocator'"
                ).fetchone()
                == (0,)
            ),
            "the old database's sessions to end",
        )
        conn.execute("ALTER DATABASE allocator RENAME TO allocator_before_restore")
        conn.execute(f"ALTER DATABASE {RESTORED} RENAME TO allocator")


def test_a_restore_by_the_procedure_hands_out_no_id_twice() -> None:
    """Breaks: the database goes back to a dump taken while consumers claimed and the leader
    cut; consumers never stop.

    Must hold: the reset voids what the dump did not know was claimed and moves the mark
    past the watermark; the old leader's token is fenced on the restored database; a leader
    of the next generation cuts; no ID range is handed out twice. Cost: ~15 s.
    """
    with ChaosCluster(zk=1, nodes=2) as chaos:
        chaos.wait_leader()
        chaos.wait_pool(300)
        info = chaos.info()
        superuser, port = info.postgres.superuser, info.postgres.port
        admin_url = postgres.database_url(superuser, port, "postgres")
        dump = chaos.state_dir / "allocator.dump"
        consumers = chaos_consumers(info.consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the dump")
            pg_tool(
                "pg_dump",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                superuser,
                "-Fc",
                "-f",
                str(dump),
                "allocator",
            )
            dumped_mark = high_water_id(chaos.database_url)
            dumped = time.time()
            wait_for(lambda: consumers.count(since=dumped) >= CLAIMS, "claims after the dump")
            wait_for(
                lambda: watermark(info).high_water_id > dumped_mark,
                "ZooKeeper's watermark to pass the dump's mark",
            )
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {RESTORED}")
            pg_tool(
                "pg_restore",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                superuser,
                "-d",
                RESTORED,
                str(dump),
            )
            restored_url = postgres.database_url(superuser, port, RESTORED)
            assert high_water_id(restored_url) < watermark(info).high_water_id
            result = pool_reset(info, restored_url)
            assert result["new_generation"] == 1
            assert isinstance(result["voided_blocks"], int)
            assert result["voided_blocks"] > 0  # the dump's pool, some of it handed out since
            assert result["new_high_water_id"] > watermark(info).high_water_id
            swap_in(admin_url)
            reset_at = time.time()
            wait_for(lambda: leader_generation(chaos.database_url) == 1, "a generation-1 leader")
            wait_for(lambda: consumers.count(since=reset_at) >= 3 * CLAIMS, "claims after")
        finally:
            records = consumers.stop()
    ranges = sorted((r.first_id, r.last_id, r.consumer, r.returned_at) for r in records)
    overlaps = [(a, b) for a, b in itertools.pairwise(ranges) if b[0] <= a[1]]
    assert not overlaps, f"{len(overlaps)} ID ranges handed out twice: {overlaps[:3]}"
    assert any(r.returned_at > reset_at for r in records)


def pool_reset(info: ClusterInfo, url: str) -> dict[str, object]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
        "ALLOCATOR_ZOOKEEPER_HOSTS": info.node_zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": info.zk_auth,
        "ALLOCATOR_POSTGRES_URL": url,
    }
    done = subprocess.run(
        [*RESET_COMMAND, "--reason", "restored from the mid-run dump", "--yes", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def leader_generation(url: str) -> int | None:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT generation FROM allocator.fence WHERE holder IS NOT NULL"
            ).fetchone()
    except psycopg.Error:
        return None
    return int(row[0]) if row else None
