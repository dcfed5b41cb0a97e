"""Chaos: the database is restored from a ``pg_dump`` taken mid-run, by the documented
procedure, while consumers keep claiming and the nodes' clocks disagree.

Rules: one embedded cluster (one ZooKeeper server, PostgreSQL) and two nodes outside the
supervisor under libfaketime, one at +400 ms and one at -400 ms (inside
``pool.max_clock_skew_ms``: both take part), the fast one leading when the run starts, so
its successor's clock is 800 ms behind it: the case in which a reset that trusts the
watermark and the clock alone can cut again what the old leader cut in its last second.
A small pool, so blocks are handed out soon after they are cut (as on a busy cluster).
Consumers claim throughout and reconnect after errors.

The procedure (docs/postgres-ha.md): ``pg_restore`` the dump into a new database; (1)
``allocator pool pause`` on the old database (it returns once every claim in flight has
ended); (2) ``allocator pool reset --after-restore --old-database-url <old>`` against the
restored one; (3) swap it in under the cluster's database name (the old leader is fenced
there); (4) once a leader of the new generation has cut, ``allocator pool resume``.

The verdict is the product's checker (:mod:`allocator.core.verify`): over what consumers got from
the old database, every rule against the old database's evidence; over everything they got
from both databases, rule I1 (no two ranges overlap; block ids are reused by the restored
database, so they are made unique per database first).
:func:`test_the_judge_fails_on_a_range_handed_out_twice` shows that judgement failing on a
range the two databases both handed out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import psycopg
import pytest

from allocator.core import verify
from allocator.core.verify import Claim, Violation
from allocator.local import postgres
from allocator.local.info import ClusterInfo
from allocator.postgres import ledger as verify_db
from allocator.postgres.store import DEFAULT_MAX_CLOCK_AHEAD_MS
from tests.chaos.harness import ChaosCluster, chaos_consumers, layout, wait_for
from tests.chaos.test_clock_skew import LIBFAKETIME, faketime_env

pytestmark = pytest.mark.integration

CLAIMS = 20
RESTORED = "allocator_restored"
BEFORE = "allocator_before_restore"
CLI = [sys.executable, "-m", "allocator.cli", "pool"]
SMALL_POOL = {
    "ALLOCATOR_POOL_MIN_BLOCKS": "60",
    "ALLOCATOR_POOL_MAX_BLOCKS": "200",
    "ALLOCATOR_POOL_LOW_WATERMARK_BLOCKS": "30",
}
NEW_DATABASE_IDS = 1 << 40
"""Added to the block ids the restored database hands out (it reuses the old ones)."""


def pool_command(info: ClusterInfo, *args: str) -> dict[str, object]:
    """``allocator pool ...`` as the operator runs it (the superuser stands in for an
    operator login here), with the cluster's ZooKeeper identity; its JSON answer."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
        "ALLOCATOR_ZOOKEEPER_HOSTS": info.node_zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": info.zk_auth,
    }
    done = subprocess.run(
        [*CLI, *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


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
        conn.execute(f"ALTER DATABASE allocator RENAME TO {BEFORE}")
        conn.execute(f"ALTER DATABASE {RESTORED} RENAME TO allocator")
        conn.execute(f"ALTER DATABASE {BEFORE} WITH ALLOW_CONNECTIONS true")


def generation_cut(url: str) -> int:
    """Blocks cut on ``url`` by a leader of generation 1 (0 while unreachable)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT count(*) FROM allocator.block_ledger WHERE generation = 1"
            ).fetchone()
    except psycopg.Error:
        return 0
    return int(row[0]) if row else 0


def judge_across(old: Sequence[Claim], new: Sequence[Claim]) -> list[Violation]:
    """Rule I1 of the checker over the ranges both databases handed out: each claim keeps its
    database's block id, made unique (the restored database reuses the old ids); nothing
    else is judged here (no ledger is passed, so only I1's overlap rule can speak)."""
    renumbered = [*old, *(replace(c, block_id=c.block_id + NEW_DATABASE_IDS) for c in new)]
    violations = verify.check(renumbered, [], [], layout())
    return [v for v in violations if v.invariant == "I1"]


def judge_old(url: str, records: Sequence[Claim]) -> list[Violation]:
    """Every rule of the checker over what the old database handed out, against its own
    ledger, history and fenced writes (the procedure changed nothing there but the pause)."""
    evidence = verify_db.read_url(url)
    return verify_db.judge(
        records, evidence, layout=layout(), max_clock_ahead_ms=DEFAULT_MAX_CLOCK_AHEAD_MS
    )


def test_the_judge_fails_on_a_range_handed_out_twice() -> None:
    """The proof the verdict below can fail: one range handed out by the old database and,
    overlapping it, one by the restored database (same block id, as a restore reuses ids)."""
    old = [Claim(7, 1000, 1999, "c1", 1.0)]
    assert judge_across(old, [Claim(7, 2000, 2999, "c2", 2.0)]) == []
    caught = judge_across(old, [Claim(7, 1500, 2499, "c2", 2.0)])
    assert len(caught) == 1
    assert "overlap" in caught[0].message


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="Debian package faketime not installed")
def test_a_restore_by_the_procedure_hands_out_no_id_twice() -> None:
    """Breaks: the database goes back to a dump taken while consumers claimed and the leader
    cut; the nodes' clocks are 800 ms apart; consumers never stop.

    Must hold: pause returns with no claim in flight; the reset's mark passes the old
    database's mark read after the pause; the old leader is fenced on the restored
    database; a leader of the next generation cuts there; claims are refused until the
    resume, then served; no ID range is handed out twice (checker). Cost: ~20 s.
    """
    with ChaosCluster(zk=1, nodes=0, node_env=SMALL_POOL) as chaos:
        ahead = chaos.start_extra_node("ahead", faketime_env("+0.4"))
        chaos.wait_role(ahead.admin_url, "leader", "the node 400 ms ahead to lead")
        behind = chaos.start_extra_node("behind", faketime_env("-0.4"))
        chaos.wait_role(behind.admin_url, "follower", "the node 400 ms behind to queue")
        chaos.wait_pool(60)
        info = chaos.info()
        superuser, port = info.postgres.superuser, info.postgres.port
        admin_url = postgres.database_url(superuser, port, "postgres")
        old_url = postgres.database_url(superuser, port, BEFORE)
        dump = chaos.state_dir / "allocator.dump"
        consumers = chaos_consumers(info.consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the dump")
            connection = ["-h", "127.0.0.1", "-p", str(port), "-U", superuser]
            pg_tool("pg_dump", *connection, "-Fc", "-f", str(dump), "allocator")
            dumped = time.time()
            wait_for(lambda: consumers.count(since=dumped) >= CLAIMS, "claims after the dump")
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {RESTORED}")
            pg_tool("pg_restore", *connection, "-d", RESTORED, str(dump))
            serving_url = postgres.database_url(superuser, port, "allocator")
            restored_url = postgres.database_url(superuser, port, RESTORED)

            paused = pool_command(
                info, "pause", "--reason", "restore", "--database-url", serving_url
            )
            reset = pool_command(
                info,
                "reset",
                "--after-restore",
                "--reason",
                "restored from the mid-run dump",
                "--yes",
                "--database-url",
                restored_url,
                "--old-database-url",
                serving_url,
            )
            swap_in(admin_url)
            wait_for(lambda: generation_cut(chaos.database_url) > 0, "a generation-1 leader to cut")
            resume_at = time.time()
            pool_command(info, "resume", "--reason", "restore done", "--database-url", serving_url)
            wait_for(lambda: consumers.count(since=resume_at) >= 3 * CLAIMS, "claims after")
        finally:
            records = consumers.stop()
        old_mark = reset["mark"]["candidates"]["old_database"]  # type: ignore[index]
        assert paused["already_paused"] is False
        assert isinstance(old_mark, int)
        assert reset["new_high_water_id"] >= old_mark  # type: ignore[operator]
        assert reset["new_generation"] == 1
        old_records = [r for r in records if r.returned_at < resume_at]
        new_records = [r for r in records if r.returned_at >= resume_at]
        assert new_records, consumers.describe()
        assert all(r.last_id <= old_mark for r in old_records)
        assert consumers.totals().error_kinds.get("AL004", 0) > 0  # refused while paused
        old_violations = judge_old(old_url, old_records)
        assert not old_violations, verify.summary(old_violations)
        across = judge_across(old_records, new_records)
        assert not across, verify.summary(across)
