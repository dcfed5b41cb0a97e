"""Alembic migrations: upgrade from nothing, downgrade to nothing, and back again."""

from __future__ import annotations

import difflib

import psycopg
import pytest
from alembic import command

from allocator.core.errors import DatabaseUnavailableError
from allocator.local import postgres, schema_snapshot
from allocator.postgres import migrate
from tests.fixtures.pg import claim, cut, take_fence

pytestmark = pytest.mark.integration

TABLES_0002 = {"fence", "high_water", "blocks", "leader_terms", "pool_samples"}
TABLES_0003 = TABLES_0002 | {"cluster_layout", "fence_rebases", "fenced_writes"}
TABLES_0004 = TABLES_0003 | {"held_tickets"}
TABLES_0009 = TABLES_0004 | {"pool_resets"}
TABLES_0010 = TABLES_0009 | {"claim_pause", "claim_pauses"}
TABLES = TABLES_0010 | {"block_age", "serving_stretches"}
VIEWS_0002 = {"block_ledger", "pool_status", "leader_history"}
VIEWS_0009 = VIEWS_0002 | {"fence_history", "layout"}
VIEWS_0010 = VIEWS_0009 | {"claim_pause_history"}
VIEWS = VIEWS_0010 | {"block_age_status", "serving_history"}
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
FUNCTIONS_0003 = FUNCTIONS_0002 | {"db_now_ms", "id_time_ms", "check_layout", "rebase_fence"}
FUNCTIONS_0006 = FUNCTIONS_0003 | {"replication_status", "reset_after_restore"}
FUNCTIONS_0009 = FUNCTIONS_0006 | {"pool_status_row"}
FUNCTIONS_0010 = FUNCTIONS_0009 | {"pause_claims", "resume_claims", "claims_in_flight"}
FUNCTIONS = FUNCTIONS_0010 | {
    "age_bound_id",
    "claim_blocks_expiring",
    "leader_heartbeat",
    "void_aged_blocks",
    "block_age_status_row",
    "claimed_block_ages",
    "voided_position",
}
ROLES = {"allocator_consumer", "allocator_node", "allocator_operator", "allocator_owner"}


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
    with psycopg.connect(empty_db_url) as conn:  # nothing left that keeps a role from going
        readers = conn.execute(
            "SELECT count(*) FROM information_schema.role_table_grants"
            " WHERE table_schema = 'public' AND table_name = 'alembic_version'"
            " AND grantee LIKE 'allocator\\_%'"
        ).fetchone()
        comment = conn.execute(
            "SELECT obj_description('public.alembic_version'::regclass, 'pg_class')"
        ).fetchone()
    assert (readers, comment) == ((0,), (None,))
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
    command.downgrade(migrate._alembic_config(empty_db_url), "0004")
    assert schema_objects(empty_db_url)["functions"] == FUNCTIONS_0003
    command.downgrade(migrate._alembic_config(empty_db_url), "0003")
    assert migrate.current_revision(empty_db_url) == "0003"
    objects = schema_objects(empty_db_url)
    assert objects == {"tables": TABLES_0003, "views": VIEWS_0009, "functions": FUNCTIONS_0003}
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("SELECT allocator.requeue_stranded(0, 7)")
        assert claim(conn, "at-0003") == [(1, 100, 199)]
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
    assert schema_objects(empty_db_url)["tables"] == TABLES


def test_0004_grants_held_tickets_to_no_writer_and_keeps_the_function_grants(
    empty_db_url: str,
) -> None:
    command.upgrade(migrate._alembic_config(empty_db_url), "0004")
    checks = {
        ("allocator_node", "allocator.held_tickets", "INSERT,UPDATE,DELETE,SELECT"): False,
        ("allocator_consumer", "allocator.held_tickets", "SELECT"): False,
        ("allocator_operator", "allocator.held_tickets", "SELECT"): True,
        ("allocator_operator", "allocator.held_tickets", "INSERT,UPDATE,DELETE"): False,
    }
    with psycopg.connect(empty_db_url) as conn:
        for (role, table, privileges), expected in checks.items():
            (has,) = conn.execute(  # type: ignore[misc]
                "SELECT has_table_privilege(%s, %s, %s)", (role, table, privileges)
            ).fetchone()
            assert has is expected, (role, privileges)
        for role, function, expected in [
            ("allocator_consumer", "allocator.claim_blocks(text, integer)", True),
            ("allocator_node", "allocator.claim_blocks(text, integer)", False),
            ("allocator_node", "allocator.requeue_stranded(bigint, bigint)", True),
            ("allocator_consumer", "allocator.requeue_stranded(bigint, bigint)", False),
            ("allocator_consumer", "allocator.available_blocks()", True),
            ("public", "allocator.requeue_stranded(bigint, bigint)", False),
        ]:
            (has,) = conn.execute(  # type: ignore[misc]
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, function)
            ).fetchone()
            assert has is expected, (role, function)


def test_downgrade_to_0003_keeps_a_held_block_findable_by_the_old_requeue(
    empty_db_url: str,
) -> None:
    """0003 finds a rolled-back block only above its floor: the downgrade lowers the floor
    below the lowest held ticket before it drops held_tickets."""
    migrate.upgrade_to_head(empty_db_url)
    requeue = "SELECT allocator.requeue_stranded(0, 7)"
    with (
        psycopg.connect(empty_db_url, autocommit=True) as conn,
        psycopg.connect(empty_db_url) as holder,
    ):
        take_fence(conn, 7)
        cut(conn, 7, [(100 * i, 100 * i + 99) for i in range(1, 6)])
        ((mine, _, _),) = claim(holder, "slow")
        claim(conn, "others", 2)
        conn.execute(requeue)
        conn.execute(requeue)
        assert conn.execute("SELECT block_id FROM allocator.held_tickets").fetchall() == [(mine,)]
        holder.rollback()
    command.downgrade(migrate._alembic_config(empty_db_url), "0003")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        (floor,) = conn.execute(  # type: ignore[misc]
            "SELECT requeued_upto FROM allocator.high_water"
        ).fetchone()
        (ticket,) = conn.execute(  # type: ignore[misc]
            "SELECT ticket FROM allocator.blocks WHERE block_id = %s", (mine,)
        ).fetchone()
        assert floor < ticket
        (moved,) = conn.execute(requeue).fetchone()  # type: ignore[misc]
        assert moved == 1
        assert mine in [b for b, _, _ in claim(conn, "others", 3)]


def test_bad_url_is_a_clear_error() -> None:
    with pytest.raises(migrate.MigrationError, match="not a PostgreSQL URL"):
        migrate.upgrade_to_head("mysql://nobody@127.0.0.1/x")


def test_unreachable_database_is_a_clear_error(unused_tcp_port: int) -> None:
    """As every command reports it (exit 75, retry later), not as a failed migration."""
    url = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/nothing?connect_timeout=2"
    with pytest.raises(
        DatabaseUnavailableError, match="take the migration lock: PostgreSQL is unreachable"
    ):
        migrate.upgrade_to_head(url)


def function_definitions(url: str) -> dict[str, tuple[str, str | None, str | None]]:
    """Every allocator function: its definition, comment and grants."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid),"
            " obj_description(p.oid, 'pg_proc'), p.proacl::text"
            " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'allocator'"
        ).fetchall()
    return {name: (definition, comment, acl) for name, definition, comment, acl in rows}


def test_downgrade_from_0004_restores_the_0003_functions_exactly(empty_db_url: str) -> None:
    command.upgrade(migrate._alembic_config(empty_db_url), "0003")
    before = function_definitions(empty_db_url)
    command.upgrade(migrate._alembic_config(empty_db_url), "0004")
    changed = {n for n, d in function_definitions(empty_db_url).items() if before.get(n) != d}
    assert changed == {
        "allocator.claim_blocks(text,integer)",
        "allocator.requeue_stranded(bigint,bigint)",
        "allocator.available_blocks()",
    }
    command.downgrade(migrate._alembic_config(empty_db_url), "0003")
    assert function_definitions(empty_db_url) == before


def test_0005_adds_only_replication_status_for_nodes_and_operators(empty_db_url: str) -> None:
    command.upgrade(migrate._alembic_config(empty_db_url), "0004")
    before = function_definitions(empty_db_url)
    command.upgrade(migrate._alembic_config(empty_db_url), "0005")
    after = function_definitions(empty_db_url)
    assert {n for n, d in after.items() if before.get(n) != d} == {"allocator.replication_status()"}
    with psycopg.connect(empty_db_url) as conn:
        for role, expected in [
            ("allocator_node", True),
            ("allocator_operator", True),
            ("allocator_consumer", False),
            ("public", False),
        ]:
            (has,) = conn.execute(  # type: ignore[misc]
                "SELECT has_function_privilege(%s, 'allocator.replication_status()', 'EXECUTE')",
                (role,),
            ).fetchone()
            assert has is expected, role
        row = conn.execute("SELECT * FROM allocator.replication_status()").fetchone()
    assert row == (0, 0, "", "on", False)  # the test server has no standby
    command.downgrade(migrate._alembic_config(empty_db_url), "0004")
    assert function_definitions(empty_db_url) == before


def test_0006_adds_the_reset_for_operators_only_and_downgrades_cleanly(empty_db_url: str) -> None:
    command.upgrade(migrate._alembic_config(empty_db_url), "0005")
    before = function_definitions(empty_db_url)
    command.upgrade(migrate._alembic_config(empty_db_url), "0006")
    after = function_definitions(empty_db_url)
    assert {n for n, d in after.items() if before.get(n) != d} == {
        "allocator.reset_after_restore(text,bigint,bigint)"
    }
    function = "allocator.reset_after_restore(text, bigint, bigint)"
    with psycopg.connect(empty_db_url) as conn:
        for role, expected in [
            ("allocator_operator", True),
            ("allocator_node", False),
            ("allocator_consumer", False),
            ("public", False),
        ]:
            (has,) = conn.execute(  # type: ignore[misc]
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, function)
            ).fetchone()
            assert has is expected, role
            (reads,) = conn.execute(  # type: ignore[misc]
                "SELECT has_table_privilege(%s, 'allocator.pool_resets', 'SELECT')", (role,)
            ).fetchone()
            assert reads is (role == "allocator_operator"), role
    command.downgrade(migrate._alembic_config(empty_db_url), "0005")
    assert function_definitions(empty_db_url) == before
    assert schema_objects(empty_db_url)["tables"] == TABLES_0004


def pool_status_columns(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'allocator' AND table_name = 'pool_status'"
            " ORDER BY ordinal_position"
        ).fetchall()
    return [str(name) for (name,) in rows]


def test_0010_expands_only_and_downgrades_to_0009_exactly(empty_db_url: str) -> None:
    """Expand-only: claim_blocks and reset_after_restore keep their signatures (replaced in
    place), pool_status only gains a last column; the rest is new. The downgrade restores
    every 0009 function, comment and grant exactly, and the view's columns."""
    config = migrate._alembic_config(empty_db_url)
    command.upgrade(config, "0009")
    before, columns_before = function_definitions(empty_db_url), pool_status_columns(empty_db_url)
    command.upgrade(config, "0010")
    after = function_definitions(empty_db_url)
    assert set(before) <= set(after)  # nothing dropped, no signature changed
    assert {n for n, d in after.items() if before.get(n) != d} == {
        "allocator.claim_blocks(text,integer)",
        "allocator.reset_after_restore(text,bigint,bigint)",
        "allocator.pause_claims(text)",
        "allocator.resume_claims(text)",
        "allocator.claims_in_flight()",
    }
    assert pool_status_columns(empty_db_url) == [*columns_before, "claims_paused"]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        take_fence(conn, 7)
        cut(conn, 7, [(100, 199), (200, 299)])
        conn.execute("SELECT * FROM allocator.pause_claims('downgrade test')")
    command.downgrade(config, "0009")
    assert function_definitions(empty_db_url) == before
    assert pool_status_columns(empty_db_url) == columns_before
    objects = schema_objects(empty_db_url)
    assert objects == {"tables": TABLES_0009, "views": VIEWS_0009, "functions": FUNCTIONS_0009}
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert claim(conn, "after-downgrade") == [(1, 100, 199)]  # no pause any more
    command.upgrade(config, "0010")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert claim(conn, "after-upgrade") == [(2, 200, 299)]  # and not paused again


def table_grants(url: str, role: str, relations: list[str]) -> dict[str, bool]:
    with psycopg.connect(url) as conn:
        return {
            name: bool(
                conn.execute(  # type: ignore[index]
                    "SELECT has_table_privilege(%s, %s, 'SELECT')", (role, name)
                ).fetchone()[0]
            )
            for name in relations
        }


def test_0011_expands_only_grants_each_role_its_part_and_downgrades_to_0010_exactly(
    empty_db_url: str,
) -> None:
    """Expand-only: claim_blocks keeps its signature (replaced in place); nothing else of 0010
    changes. A pool an older leader left (no heartbeat) is claimed as before. The downgrade
    restores every 0010 function, comment and grant exactly and drops the new objects."""
    config = migrate._alembic_config(empty_db_url)
    command.upgrade(config, "0010")
    before, columns_before = function_definitions(empty_db_url), pool_status_columns(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        take_fence(conn, 7)
        cut(conn, 7, [(100, 199), (200, 299), (300, 399)])
    command.upgrade(config, "0011")
    after = function_definitions(empty_db_url)
    assert set(before) <= set(after)  # nothing dropped, no signature changed
    assert {n for n, d in after.items() if before.get(n) != d} == {
        "allocator.claim_blocks(text,integer)",
        "allocator.age_bound_id(bigint,boolean)",
        "allocator.claim_blocks_expiring(text,integer)",
        "allocator.leader_heartbeat(bigint,bigint,bigint,boolean,bigint)",
        "allocator.void_aged_blocks(bigint,bigint,bigint,integer)",
        "allocator.block_age_status_row()",
        "allocator.claimed_block_ages(bigint,bigint,integer)",
        "allocator.voided_position()",
        "allocator.pool_status_row()",  # same signature and columns; voids left out of the rate
    }
    assert pool_status_columns(empty_db_url) == columns_before
    assert schema_objects(empty_db_url) == {
        "tables": TABLES,
        "views": VIEWS,
        "functions": FUNCTIONS,
    }
    with psycopg.connect(empty_db_url) as conn:
        for role, function, expected in [
            ("allocator_consumer", "allocator.claim_blocks_expiring(text, integer)", True),
            ("allocator_node", "allocator.claim_blocks_expiring(text, integer)", False),
            (
                "allocator_node",
                "allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint)",
                True,
            ),
            ("allocator_node", "allocator.void_aged_blocks(bigint, bigint, bigint, integer)", True),
            (
                "allocator_consumer",
                "allocator.void_aged_blocks(bigint, bigint, bigint, integer)",
                False,
            ),
            (
                "allocator_operator",
                "allocator.leader_heartbeat(bigint, bigint, bigint, boolean, bigint)",
                False,
            ),
            ("allocator_consumer", "allocator.age_bound_id(bigint, boolean)", False),
            ("allocator_node", "allocator.age_bound_id(bigint, boolean)", False),
            ("allocator_node", "allocator.claimed_block_ages(bigint, bigint, integer)", True),
            ("allocator_consumer", "allocator.claimed_block_ages(bigint, bigint, integer)", False),
        ]:
            (has,) = conn.execute(  # type: ignore[misc]
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, function)
            ).fetchone()
            assert has is expected, (role, function)
    status_and_history = ["allocator.block_age_status", "allocator.serving_history"]
    assert table_grants(empty_db_url, "allocator_consumer", status_and_history) == {
        "allocator.block_age_status": True,
        "allocator.serving_history": False,
    }
    for role in ("allocator_node", "allocator_operator"):
        assert set(table_grants(empty_db_url, role, status_and_history).values()) == {True}
    for role in ("allocator_consumer", "allocator_node", "allocator_operator"):
        assert table_grants(empty_db_url, role, ["allocator.block_age"]) == {
            "allocator.block_age": False
        }
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert claim(conn, "older-leader") == [(1, 100, 199)]  # no heartbeat: as before
        conn.execute("SELECT allocator.leader_heartbeat(0, 7, 300000, true, 8000)")
    command.downgrade(config, "0010")
    assert function_definitions(empty_db_url) == before
    objects = schema_objects(empty_db_url)
    assert objects == {"tables": TABLES_0010, "views": VIEWS_0010, "functions": FUNCTIONS_0010}
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert claim(conn, "after-downgrade") == [(2, 200, 299)]
    command.upgrade(config, "0011")
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert claim(conn, "after-upgrade") == [(3, 300, 399)]  # no heartbeat survived
        row = conn.execute("SELECT leader_serves FROM allocator.block_age_status").fetchone()
        assert row == (False,)


def test_0012_repoints_the_schema_comment_to_docs_design_and_changes_nothing_else(
    empty_db_url: str,
) -> None:
    """Comments only: the whole dump at 0012 differs from 0011's in the schema's comment and
    one comment line inside cut_blocks' body alone, nothing in the schema cites the shared
    folder's DESIGN.md any more, and the downgrade restores 0011's dump exactly."""
    config = migrate._alembic_config(empty_db_url)
    bin_dir = postgres.find_bin_dir()
    command.upgrade(config, "0011")
    before = schema_snapshot.pg_dump(bin_dir, empty_db_url).splitlines()
    command.upgrade(config, "0012")
    after = schema_snapshot.pg_dump(bin_dir, empty_db_url).splitlines()
    changed = [line for line in difflib.ndiff(before, after) if line[:1] in "+-"]
    comment = "COMMENT ON SCHEMA allocator IS 'Snowflake ID block allocator"
    clock_rule = "    -- The clock rule"
    assert changed == [
        f"- {comment} (see DESIGN.md section 6)';",
        f"+ {comment} (see docs/design.md §6)';",
        f"- {clock_rule} (DESIGN section 5): the database clock is the reference.",
        f"+ {clock_rule} (docs/design.md §5): the database clock is the reference.",
    ]
    with psycopg.connect(empty_db_url) as conn:
        citing = conn.execute(
            "SELECT count(*) FROM pg_description"
            " WHERE description ~ 'DESIGN|shared folder' AND objoid IN"
            " (SELECT oid FROM pg_namespace WHERE nspname = 'allocator'"
            "  UNION SELECT oid FROM pg_class WHERE relnamespace = 'allocator'::regnamespace"
            "  UNION SELECT oid FROM pg_proc WHERE pronamespace = 'allocator'::regnamespace)"
        ).fetchone()
    assert citing == (0,)
    with psycopg.connect(empty_db_url) as conn:
        bodies = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'allocator'::regnamespace"
            " AND prosrc ~ 'DESIGN|shared folder'"
        ).fetchone()
    assert bodies == (0,)
    command.downgrade(config, "0011")
    assert schema_snapshot.pg_dump(bin_dir, empty_db_url).splitlines() == before


def test_0013_changes_only_claim_blocks_body_and_downgrades_to_0012_exactly(
    empty_db_url: str,
) -> None:
    """Expand-only: claim_blocks keeps its signature, result, comment, owner and grants (the
    whole dump differs in its body alone), and the downgrade restores 0012's dump exactly."""
    config = migrate._alembic_config(empty_db_url)
    bin_dir = postgres.find_bin_dir()
    command.upgrade(config, "0012")
    before = function_definitions(empty_db_url)
    dump = schema_snapshot.pg_dump(bin_dir, empty_db_url)
    command.upgrade(config, "0013")
    after = function_definitions(empty_db_url)
    assert {name for name, d in after.items() if before.get(name) != d} == {
        "allocator.claim_blocks(text,integer)"
    }
    old, new = (
        before["allocator.claim_blocks(text,integer)"],
        after["allocator.claim_blocks(text,integer)"],
    )
    assert old[1:] == new[1:]  # comment and grants
    assert old[0].split("AS $function$")[0] == new[0].split("AS $function$")[0]  # signature
    command.downgrade(config, "0012")
    assert schema_snapshot.pg_dump(bin_dir, empty_db_url) == dump
