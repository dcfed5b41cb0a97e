"""Alembic migrations: upgrade from nothing, downgrade to nothing, and back again."""

from __future__ import annotations

import psycopg
import pytest
from alembic import command

from allocator import migrate
from tests.fixtures.pg import claim, cut, take_fence

pytestmark = pytest.mark.integration

TABLES_0002 = {"fence", "high_water", "blocks", "leader_terms", "pool_samples"}
TABLES = TABLES_0002 | {"cluster_layout", "fence_rebases", "fenced_writes"}
VIEWS_0002 = {"block_ledger", "pool_status", "leader_history"}
VIEWS = VIEWS_0002 | {"fence_history", "layout"}
FUNCTIONS_0002 = {
    "claim_blocks",
    "take_fence",
    "end_term",
    "cut_blocks",
    "requeue_stranded",
    "record_pool_sample",
    "prune_claimed",
    "available_blocks",
    "lock_fence",
    "blocks_disjoint",
}
FUNCTIONS = FUNCTIONS_0002 | {"db_now_ms", "id_time_ms", "check_layout", "rebase_fence"}
ROLES = {"allocator_consumer", "allocator_node", "allocator_operator"}


def schema_objects(url: str) -> dict[str, set[str]]:
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_name, table_type FROM information_schema.tables"
            " WHERE table_schema = 'allocator'"
        ).fetchall()
        functions = conn.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'allocator'"
        ).fetchall()
    return {
        "tables": {name for name, kind in tables if kind == "BASE TABLE"},
        "views": {name for name, kind in tables if kind == "VIEW"},
        "functions": {name for (name,) in functions},
    }


def test_upgrade_creates_the_whole_schema(empty_db_url: str) -> None:
    assert migrate.current_revision(empty_db_url) is None
    migrate.upgrade_to_head(empty_db_url)
    assert migrate.current_revision(empty_db_url) == migrate.head_revision()
    objects = schema_objects(empty_db_url)
    assert objects == {"tables": TABLES, "views": VIEWS, "functions": FUNCTIONS}
    with psycopg.connect(empty_db_url) as conn:
        roles = conn.execute(
            "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'allocator\\_%'"
        ).fetchall()
    assert {name for name, _ in roles} >= ROLES
    assert not any(can_login for name, can_login in roles if name in ROLES)


def test_upgrade_twice_is_harmless(empty_db_url: str) -> None:
    migrate.upgrade_to_head(empty_db_url)
    migrate.upgrade_to_head(empty_db_url)
    assert migrate.current_revision(empty_db_url) == migrate.head_revision()


def test_downgrade_to_base_then_upgrade_again_works(empty_db_url: str) -> None:
    migrate.upgrade_to_head(empty_db_url)
    migrate.downgrade_to_base(empty_db_url)
    assert migrate.current_revision(empty_db_url) is None
    assert schema_objects(empty_db_url) == {"tables": set(), "views": set(), "functions": set()}
    migrate.upgrade_to_head(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        take_fence(conn, 7)
        cut(conn, 7, [(100, 199)])
        assert claim(conn, "after-roundtrip") == [(1, 100, 199)]


def test_downgrade_step_by_step_restores_each_older_schema_and_upgrade_returns(
    empty_db_url: str,
) -> None:
    migrate.upgrade_to_head(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        take_fence(conn, 7)
        cut(conn, 7, [(100, 199)])
    command.downgrade(migrate._alembic_config(empty_db_url), "0002")
    assert migrate.current_revision(empty_db_url) == "0002"
    objects = schema_objects(empty_db_url)
    assert objects == {"tables": TABLES_0002, "views": VIEWS_0002, "functions": FUNCTIONS_0002}
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("SELECT * FROM allocator.cut_blocks(7, ARRAY[200], ARRAY[299])")
        (granted,) = conn.execute(  # type: ignore[misc]
            "SELECT has_function_privilege('allocator_node',"
            " 'allocator.cut_blocks(bigint, bigint[], bigint[])', 'EXECUTE')"
        ).fetchone()
        assert granted
    command.downgrade(migrate._alembic_config(empty_db_url), "0001")
    assert schema_objects(empty_db_url)["functions"] == FUNCTIONS_0002 - {"prune_claimed"}
    migrate.upgrade_to_head(empty_db_url)
    assert schema_objects(empty_db_url)["functions"] == FUNCTIONS
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        cut(conn, 7, [(300, 399)])
        (granted,) = conn.execute(  # type: ignore[misc]
            "SELECT has_function_privilege('allocator_node',"
            " 'allocator.prune_claimed(bigint, bigint, bigint, integer)', 'EXECUTE')"
        ).fetchone()
    assert granted


def test_bad_url_is_a_clear_error() -> None:
    with pytest.raises(migrate.MigrationError, match="not a PostgreSQL URL"):
        migrate.upgrade_to_head("mysql://nobody@127.0.0.1/x")


def test_unreachable_database_is_a_clear_error(unused_tcp_port: int) -> None:
    url = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/nothing?connect_timeout=2"
    with pytest.raises(migrate.MigrationError, match="schema upgrade failed"):
        migrate.upgrade_to_head(url)
