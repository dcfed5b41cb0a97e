"""The embedded cluster's synchronous PostgreSQL standby: ``up --pg-standby``,
``pg-failover`` and the rebuild of a retired primary, against real servers.

One cluster (one ZooKeeper server, no nodes) goes through a whole life: a standby is added,
the primary is killed and the standby promoted, the retired server is rebuilt as the new
standby and promoted in turn. Clients use the cluster's multi-host URLs throughout and are
never told where the primary went. Cost: ~8 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from allocator.cli import main
from allocator.core.errors import UsageError
from allocator.local import postgres
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo
from tests.fixtures.pg import cut, layout_blocks, take_fence

EPOCH = 1

pytestmark = pytest.mark.integration


def claim(url: str, consumer: str) -> int:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT block_id FROM allocator.claim_blocks(%s, 1)", (consumer,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def claimed_by(port: int, superuser: str, block_id: int) -> Any:
    """Who the server on ``port`` (primary or standby) says claimed ``block_id``."""
    url = postgres.database_url(superuser, port)
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT claimed_by FROM allocator.blocks WHERE block_id = %s", (block_id,)
        ).fetchone()
    return row[0] if row else None


def stock(url: str, blocks: int) -> None:
    """Blocks to claim without a node: cut as the superuser under a token of our own."""
    with psycopg.connect(url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        cut(conn, EPOCH, layout_blocks(blocks))


def roles(info: ClusterInfo) -> dict[str, tuple[str, bool | None, str | None]]:
    return {s.name: (s.role, s.in_recovery, s.sync_state) for s in info.pg_servers}


def test_a_standby_is_synchronous_survives_failover_and_is_rebuilt(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", 1, pg_standby=True, purge_on_exit=True) as cluster:
        info = cluster.status()
        assert roles(info) == {
            "pg": ("primary", False, None),
            "pg-standby": ("standby", True, "sync"),
        }
        first, second = (s.port for s in info.pg_servers)
        assert f":{first},127.0.0.1:{second}/" in info.consumer_database_url
        assert info.consumer_database_url.endswith("?target_session_attrs=read-write")
        as_json = info.to_json()
        assert [s["role"] for s in as_json["pg_servers"]] == ["primary", "standby"]
        assert as_json["postgres"]["port"] == first

        stock(info.database_url, 200)  # a failover skips sequence values (32 are logged ahead)
        acknowledged = claim(info.consumer_database_url, "before")
        # Synchronous: acknowledged means flushed on the standby (replayed soon after).
        assert claimed_by(second, info.postgres.superuser, acknowledged) in ("before", None)

        after = cluster.pg_failover()
        assert roles(after) == {
            "pg": ("retired", None, None),
            "pg-standby": ("primary", False, None),
        }
        assert after.postgres.port == second
        assert claimed_by(second, info.postgres.superuser, acknowledged) == "before"
        assert claim(after.consumer_database_url, "after") != acknowledged
        with pytest.raises(UsageError, match="no standby to promote"):
            cluster.pg_failover()

        # `up` never restarts a retired primary; `up --pg-standby` rebuilds it as a standby.
        assert not LocalCluster(tmp_path / "c").up(migrate=False).pg_servers[0].running
        rebuilt = cluster.up(migrate=False)
        assert roles(rebuilt) == {
            "pg": ("standby", True, "sync"),
            "pg-standby": ("primary", False, None),
        }
        again = claim(rebuilt.consumer_database_url, "rebuilt")
        back = cluster.pg_failover()
        assert back.postgres.port == first
        assert claimed_by(first, info.postgres.superuser, again) == "rebuilt"
        assert claim(back.consumer_database_url, "back") not in (acknowledged, again)


def test_cli_pg_failover_without_a_standby_is_a_usage_error(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", 1, purge_on_exit=True) as cluster:
        result = CliRunner().invoke(
            main, ["local", "pg-failover", "--state-dir", str(cluster.state_dir)]
        )
        assert result.exit_code == UsageError.exit_code, result.output
        assert "no standby to promote" in result.output
        info = cluster.status()
        assert [s.role for s in info.pg_servers] == ["primary"]
        assert info.postgres.in_recovery is None  # not asked: nothing replicates
