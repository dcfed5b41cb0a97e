"""Database privileges: the migrated database holds exactly the rights docs/sql.md lists.

The table under "Roles and privileges" in docs/sql.md is parsed and compared with a freshly
migrated database in both directions, over every privilege of every object in the schema
(``has_*_privilege``, so inherited rights count): what the table lists is held, nothing else
is. Every function is held to the rules for writing one (owned by ``allocator_owner``,
pinned ``search_path``), and a few calls show the refusals as SQLSTATE 42501. The
migration's downgrade to 0006 and upgrade again are checked here too.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from alembic import command
from psycopg import sql

from allocator.core.errors import describe
from allocator.local.cluster import LOGIN_ROLES
from allocator.postgres import migrate
from tests.fixtures.pg import LAYOUT_JSON, cut, take_fence, url_for_user

pytestmark = pytest.mark.integration

SQL_DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"
SECTION = "## Roles and privileges"
SCHEMA = "allocator"
OWNER = "allocator_owner"
PINNED_SEARCH_PATH = "search_path=pg_catalog, pg_temp"
INSUFFICIENT_PRIVILEGE = "42501"

TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")
SCHEMA_PRIVILEGES = ("USAGE", "CREATE")

Right = tuple[str, str, str]
"""(kind, object, privilege): kind is schema, relation, column, sequence or function."""

Conn = psycopg.Connection[tuple[object, ...]]


# -- the table in docs/sql.md ----------------------------------------------------------------


@dataclass(frozen=True)
class RoleRow:
    """One row of the table: a role, its attributes and the rights it holds itself."""

    role: str
    logs_in: bool | None  # None: not a role with attributes (PUBLIC)
    member_of: frozenset[str]
    owner: bool
    schema: frozenset[str]
    execute: frozenset[str]  # signatures as written, without the schema
    select: frozenset[str]  # relation names, without the schema


def _names(cell: str) -> frozenset[str]:
    return frozenset(re.findall(r"`([^`]+)`", cell))


def documented_roles(text: str) -> dict[str, RoleRow]:
    """The table under :data:`SECTION`, by role name (``public`` for PUBLIC)."""
    lines = text[text.index(SECTION) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i, line in enumerate(lines) if i > start and not line.startswith("|"))
    table = lines[start:end]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["role", "logs in", "member of", "schema `allocator`", "EXECUTE", "SELECT"]
    rows: dict[str, RoleRow] = {}
    for line in table[2:]:
        role_cell, login, member_of, schema, execute, select = (
            cell.strip() for cell in line.strip().strip("|").split("|")
        )
        (name,) = _names(role_cell)
        owner = schema == "owner"
        rows[name.lower()] = RoleRow(
            role=name.lower(),
            logs_in={"yes": True, "no": False}.get(login),
            member_of=_names(member_of),
            owner=owner,
            schema=frozenset() if owner else _names(schema),
            execute=frozenset() if owner else _names(execute),
            select=frozenset() if owner else _names(select),
        )
    return rows


DOCUMENTED = documented_roles(SQL_DOC.read_text(encoding="utf-8"))


# -- the database ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Catalog:
    """Every object of the schema, by the names the privilege functions take."""

    relations: tuple[str, ...]  # tables, views (qualified)
    sequences: tuple[str, ...]
    functions: tuple[str, ...]  # regprocedure text, qualified

    def every_right(self) -> set[Right]:
        rights: set[Right] = {("schema", SCHEMA, p) for p in SCHEMA_PRIVILEGES}
        rights |= {("relation", r, p) for r in self.relations for p in TABLE_PRIVILEGES}
        rights |= {("column", r, p) for r in self.relations for p in COLUMN_PRIVILEGES}
        rights |= {("sequence", s, p) for s in self.sequences for p in SEQUENCE_PRIVILEGES}
        rights |= {("function", f, "EXECUTE") for f in self.functions}
        return rights


def read_catalog(conn: Conn) -> Catalog:
    def names(query: str) -> tuple[str, ...]:
        return tuple(str(name) for (name,) in conn.execute(query, {"schema": SCHEMA}))

    return Catalog(
        relations=names(
            "SELECT c.oid::regclass::text FROM pg_class c"
            " WHERE c.relnamespace = %(schema)s::regnamespace"
            " AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1"
        ),
        sequences=names(
            "SELECT c.oid::regclass::text FROM pg_class c"
            " WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind = 'S' ORDER BY 1"
        ),
        functions=names(
            "SELECT p.oid::regprocedure::text FROM pg_proc p"
            " WHERE p.pronamespace = %(schema)s::regnamespace ORDER BY 1"
        ),
    )


PRIVILEGE_CHECK = {
    "schema": "SELECT has_schema_privilege(%(role)s, %(object)s, %(privilege)s)",
    "relation": "SELECT has_table_privilege(%(role)s, %(object)s, %(privilege)s)",
    "column": "SELECT has_any_column_privilege(%(role)s, %(object)s, %(privilege)s)",
    "sequence": "SELECT has_sequence_privilege(%(role)s, %(object)s, %(privilege)s)",
    "function": "SELECT has_function_privilege(%(role)s, %(object)s, %(privilege)s)",
}


def held_rights(conn: Conn, role: str, candidates: set[Right]) -> set[Right]:
    """The rights among ``candidates`` that ``role`` holds, itself or through its groups."""
    held: set[Right] = set()
    for kind, name, privilege in sorted(candidates):
        row = conn.execute(
            PRIVILEGE_CHECK[kind], {"role": role, "object": name, "privilege": privilege}
        ).fetchone()
        if row is not None and row[0]:
            held.add((kind, name, privilege))
    return held


def canonical_function(conn: Conn, signature: str) -> str:
    row = conn.execute("SELECT to_regprocedure(%s)::text", (f"{SCHEMA}.{signature}",)).fetchone()
    assert row is not None
    assert row[0] is not None, f"docs/sql.md names a missing {signature}"
    return str(row[0])


def documented_rights(conn: Conn, catalog: Catalog, role: str) -> set[Right]:
    """What the table gives ``role``: its own rights and its groups' (owner: everything)."""
    row = DOCUMENTED[role]
    if row.owner:
        return catalog.every_right()
    rights: set[Right] = {("schema", SCHEMA, p) for p in row.schema}
    for signature in row.execute:
        rights.add(("function", canonical_function(conn, signature), "EXECUTE"))
    for name in row.select:
        relation = f"{SCHEMA}.{name}"
        assert relation in catalog.relations, f"docs/sql.md names a missing {relation}"
        rights |= {("relation", relation, "SELECT"), ("column", relation, "SELECT")}
    for group in row.member_of & DOCUMENTED.keys():
        rights |= documented_rights(conn, catalog, group)
    return rights


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def admin(db_url: str) -> Iterator[Conn]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def login_roles(admin: Conn) -> Iterator[list[str]]:
    """The embedded cluster's login roles, as ``allocator local`` makes them (LOGIN, in their
    group). Roles are cluster-wide: the ones made here are dropped afterwards."""
    made: list[str] = []
    for login, group in LOGIN_ROLES:
        if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
            continue
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(login), sql.Identifier(group)
            )
        )
        made.append(login)
    yield [login for login, _ in LOGIN_ROLES]
    for login in made:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(login)))


LoginAs = Callable[[str], Conn]


@pytest.fixture
def login_as(db_url: str, admin: Conn) -> Iterator[LoginAs]:
    """Throwaway login users in a group role, dropped afterwards."""
    made: list[tuple[str, Conn]] = []

    def make(group: str) -> Conn:
        name = f"t_priv_{group.removeprefix('allocator_')}_{uuid.uuid4().hex[:8]}"
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(name), sql.Identifier(group)
            )
        )
        conn = psycopg.connect(url_for_user(db_url, name), autocommit=True)
        made.append((name, conn))
        return conn

    yield make
    for name, conn in made:
        conn.close()
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


# -- the table against the database ----------------------------------------------------------


def test_the_table_names_every_role_of_the_schema_and_the_embedded_cluster() -> None:
    assert {"allocator_owner", "allocator_consumer", "allocator_node", "allocator_operator"} <= (
        DOCUMENTED.keys()
    )
    assert "public" in DOCUMENTED
    documented_logins = {(r.role, g) for r in DOCUMENTED.values() if r.logs_in for g in r.member_of}
    assert documented_logins == set(LOGIN_ROLES)
    assert [r.role for r in DOCUMENTED.values() if r.owner] == [OWNER]


@pytest.mark.parametrize("role", sorted(DOCUMENTED))
def test_each_role_holds_exactly_the_rights_the_table_lists(
    role: str, admin: Conn, login_roles: list[str]
) -> None:
    catalog = read_catalog(admin)
    expected = documented_rights(admin, catalog, role)
    held = held_rights(admin, role, catalog.every_right())
    assert held - expected == set(), f"{role} holds rights docs/sql.md does not list"
    assert expected - held == set(), f"{role} lacks rights docs/sql.md lists"


@pytest.mark.parametrize("role", sorted(r for r in DOCUMENTED if r != "public"))
def test_each_role_has_the_documented_attributes_and_memberships(
    role: str, admin: Conn, login_roles: list[str]
) -> None:
    row = admin.execute(
        "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication"
        " FROM pg_roles WHERE rolname = %s",
        (role,),
    ).fetchone()
    assert row is not None, f"role {role} does not exist"
    can_login, *powers = row
    assert can_login is DOCUMENTED[role].logs_in
    assert not any(powers), f"{role} has a role attribute beyond LOGIN"
    groups = {
        str(name)
        for (name,) in admin.execute(
            "SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
            " WHERE m.member = %s::regrole",
            (role,),
        )
    }
    assert groups == DOCUMENTED[role].member_of


def test_the_owner_owns_the_schema_and_every_object_in_it(admin: Conn) -> None:
    owners = admin.execute(
        "SELECT 'schema', nspname, nspowner::regrole::text FROM pg_namespace"
        "  WHERE nspname = %(schema)s"
        " UNION ALL SELECT 'relation', c.oid::regclass::text, c.relowner::regrole::text"
        "  FROM pg_class c WHERE c.relnamespace = %(schema)s::regnamespace"
        " UNION ALL SELECT 'function', p.oid::regprocedure::text, p.proowner::regrole::text"
        "  FROM pg_proc p WHERE p.pronamespace = %(schema)s::regnamespace"
        " UNION ALL SELECT 'type', t.oid::regtype::text, t.typowner::regrole::text"
        "  FROM pg_type t WHERE t.typnamespace = %(schema)s::regnamespace",
        {"schema": SCHEMA},
    ).fetchall()
    assert len(owners) > 40  # relations, their indexes and row types, functions
    assert [(kind, name) for kind, name, owner in owners if owner != OWNER] == []


def test_every_function_pins_its_search_path_and_the_definers_are_the_owners(
    admin: Conn,
) -> None:
    functions = admin.execute(
        "SELECT p.oid::regprocedure::text, p.prosecdef, p.proconfig, p.proowner::regrole::text"
        " FROM pg_proc p WHERE p.pronamespace = %s::regnamespace",
        (SCHEMA,),
    ).fetchall()
    definers = {name for name, definer, _, _ in functions if definer}
    assert "allocator.claim_blocks(text,integer)" in definers
    assert "allocator.pool_status_row()" in definers
    for name, _, config, owner in functions:
        assert PINNED_SEARCH_PATH in (config or []), name
        assert owner == OWNER, name


def test_functions_the_owner_creates_later_are_not_executable_by_public(admin: Conn) -> None:
    with admin.transaction(force_rollback=True):
        admin.execute(f"SET LOCAL ROLE {OWNER}")
        admin.execute(
            "CREATE FUNCTION allocator.later() RETURNS int LANGUAGE sql"
            " SET search_path = pg_catalog, pg_temp AS 'SELECT 1'"
        )
        row = admin.execute(
            "SELECT has_function_privilege('public', 'allocator.later()', 'EXECUTE')"
        ).fetchone()
    assert row == (False,)


# -- refusals, as the database answers them ----------------------------------------------------

WRITES = [
    "INSERT INTO allocator.blocks (ticket, first_id, last_id, epoch) VALUES (1, 9e6, 9e6, 50)",
    "UPDATE allocator.blocks SET claimed_by = 'x', claimed_at = now()",
    "DELETE FROM allocator.blocks",
    "UPDATE allocator.fence SET epoch = epoch + 1",
    "UPDATE allocator.high_water SET last_id = 0",
    "INSERT INTO allocator.pool_samples (claim_position, cut_position) VALUES (0, 0)",
    "TRUNCATE allocator.held_tickets",
    "UPDATE allocator.claim_pause SET paused = false",
    "INSERT INTO allocator.claim_pauses (paused_by, reason) VALUES ('x', 'y')",
    "SELECT nextval('allocator.claim_ticket')",
    "CREATE TABLE allocator.mine (x int)",
]
CUT = f"SELECT * FROM allocator.cut_blocks(0, 50, ARRAY[5000], ARRAY[5099], '{LAYOUT_JSON}', 1000)"
HELPERS = [
    "SELECT * FROM allocator.available_blocks()",
    "SELECT allocator.id_time_ms(1), allocator.db_now_ms()",
    "SELECT allocator.lock_fence(0, 50)",
    f"SELECT * FROM allocator.check_layout('{LAYOUT_JSON}', 'x')",
]

PAUSES = [
    "SELECT * FROM allocator.pause_claims('x')",
    "SELECT * FROM allocator.claims_in_flight()",
    "SELECT * FROM allocator.resume_claims('x')",
]
"""The operator's pause functions (migration 0010), in an order that runs clean."""


def refusal(conn: Conn, statement: str) -> str | None:
    """The SQLSTATE the database answers ``statement`` with, None when it runs."""
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


@pytest.fixture
def stocked(admin: Conn) -> None:
    take_fence(admin, 50)
    cut(admin, 50, [(1000 + 100 * i, 1099 + 100 * i) for i in range(10)])


@pytest.mark.usefixtures("stocked")
def test_the_consumer_claims_and_reads_pool_status_and_is_refused_the_rest(
    login_as: LoginAs,
) -> None:
    consumer = login_as("allocator_consumer")
    assert len(consumer.execute("SELECT * FROM allocator.claim_blocks('app', 2)").fetchall()) == 2
    assert consumer.execute("SELECT available_blocks FROM allocator.pool_status").fetchone() == (8,)
    for statement in [
        *WRITES,
        CUT,
        f"SELECT * FROM allocator.take_fence(0, 99, 'x', 'h', 1, '{LAYOUT_JSON}')",
        "SELECT allocator.requeue_stranded(0, 50)",
        "SELECT allocator.record_pool_sample()",
        "SELECT * FROM allocator.rebase_fence('x')",
        "SELECT * FROM allocator.replication_status()",
        *HELPERS,
        *PAUSES,
        "SELECT * FROM allocator.blocks",
        "SELECT * FROM allocator.block_ledger",
        "SELECT * FROM allocator.leader_history",
        "SELECT * FROM allocator.claim_pause_history",
    ]:
        assert refusal(consumer, statement) == INSUFFICIENT_PRIVILEGE, statement


@pytest.mark.usefixtures("stocked")
def test_the_node_writes_only_through_the_fenced_functions(login_as: LoginAs) -> None:
    node = login_as("allocator_node")
    node.execute(f"SELECT * FROM allocator.take_fence(0, 60, 'n', 'h', 1, '{LAYOUT_JSON}')")
    node.execute(CUT.replace("0, 50,", "0, 60,"))
    node.execute("SELECT allocator.requeue_stranded(0, 60)")
    node.execute("SELECT allocator.record_pool_sample()")
    node.execute("SELECT * FROM allocator.replication_status()")
    assert node.execute("SELECT epoch FROM allocator.pool_status").fetchone() == (60,)
    node.execute("SELECT * FROM allocator.leader_history").fetchall()
    node.execute("SELECT * FROM allocator.fence_history").fetchall()
    node.execute("SELECT * FROM allocator.claim_pause_history").fetchall()
    for statement in [
        *WRITES,
        *HELPERS,
        *PAUSES,
        "SELECT * FROM allocator.claim_blocks('node', 1)",
        "SELECT * FROM allocator.rebase_fence('x')",
        "SELECT * FROM allocator.reset_after_restore('x', -1, 1000)",
        "SELECT * FROM allocator.blocks",
        "SELECT * FROM allocator.block_ledger",
    ]:
        assert refusal(node, statement) == INSUFFICIENT_PRIVILEGE, statement


@pytest.mark.usefixtures("stocked")
def test_the_operator_reads_and_runs_the_audited_commands_only(login_as: LoginAs) -> None:
    operator = login_as("allocator_operator")
    for view in (
        "pool_status",
        "block_ledger",
        "leader_history",
        "fence_history",
        "layout",
        "claim_pause_history",
    ):
        operator.execute(f"SELECT * FROM allocator.{view}").fetchall()
    for table in ("fenced_writes", "held_tickets", "pool_resets"):
        operator.execute(f"SELECT * FROM allocator.{table}").fetchall()
    operator.execute("SELECT * FROM allocator.replication_status()")
    for statement in [
        *WRITES,
        *HELPERS,
        CUT,
        "SELECT * FROM allocator.claim_blocks('op', 1)",
        "SELECT * FROM allocator.blocks",
    ]:
        assert refusal(operator, statement) == INSUFFICIENT_PRIVILEGE, statement
    assert operator.execute("SELECT new_generation FROM allocator.rebase_fence('x')").fetchone()
    for statement in PAUSES:
        operator.execute(statement).fetchall()


# -- the migration ---------------------------------------------------------------------------


def privileges_snapshot(url: str) -> set[tuple[str, str, str, str, str]]:
    """Every object's owner and effective grants (NULL ACLs read as their defaults)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "WITH objects AS ("
            "  SELECT 'relation' AS kind, c.oid::regclass::text AS name, c.relowner AS owner,"
            "         coalesce(c.relacl, acldefault(CASE c.relkind WHEN 'S' THEN 's'"
            "                                                      ELSE 'r' END::\"char\","
            "                                           c.relowner))"
            "           AS acl"
            "    FROM pg_class c WHERE c.relnamespace = %(schema)s::regnamespace"
            "     AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')"
            "  UNION ALL"
            "  SELECT 'function', p.oid::regprocedure::text, p.proowner,"
            "         coalesce(p.proacl, acldefault('f', p.proowner))"
            "    FROM pg_proc p WHERE p.pronamespace = %(schema)s::regnamespace"
            "  UNION ALL"
            "  SELECT 'schema', n.nspname, n.nspowner,"
            "         coalesce(n.nspacl, acldefault('n', n.nspowner))"
            "    FROM pg_namespace n WHERE n.oid = %(schema)s::regnamespace"
            ")"
            " SELECT o.kind, o.name, o.owner::regrole::text,"
            "        CASE WHEN a.grantee = 0 THEN 'public' ELSE a.grantee::regrole::text END,"
            "        a.privilege_type"
            "   FROM objects o, aclexplode(o.acl) a",
            {"schema": SCHEMA},
        ).fetchall()
    return {(str(k), str(n), str(o), str(g), str(p)) for k, n, o, g, p in rows}


def test_downgrade_to_0006_restores_its_privileges_and_upgrade_returns(
    empty_db_url: str,
) -> None:
    config = migrate._alembic_config(empty_db_url)
    command.upgrade(config, "0006")
    before = privileges_snapshot(empty_db_url)
    migrate.upgrade_to_head(empty_db_url)
    at_head = privileges_snapshot(empty_db_url)
    assert {owner for _, _, owner, _, _ in at_head} == {OWNER}
    command.downgrade(config, "0006")
    assert privileges_snapshot(empty_db_url) == before
    with psycopg.connect(empty_db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_default_acl WHERE defaclrole::regrole::text = %s", (OWNER,)
        ).fetchone()
        assert row == (0,)
        (available,) = conn.execute(  # type: ignore[misc]
            "SELECT available_blocks FROM allocator.pool_status"
        ).fetchone()
        assert available == 0
    migrate.upgrade_to_head(empty_db_url)
    assert privileges_snapshot(empty_db_url) == at_head


def test_a_migration_role_that_cannot_own_the_schema_gets_a_one_line_error(
    empty_db_url: str,
) -> None:
    """The database's owner, but no superuser, no CREATEROLE and not in allocator_owner:
    refused with a hint, and nothing is done."""
    name = f"t_priv_migrator_{uuid.uuid4().hex[:8]}"
    database = psycopg.conninfo.conninfo_to_dict(empty_db_url)["dbname"]
    with psycopg.connect(empty_db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        (superuser,) = admin.execute("SELECT current_user").fetchone()  # type: ignore[misc]
        admin.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(str(database)), sql.Identifier(name)
            )
        )
    try:
        with pytest.raises(migrate.MigrationError) as caught:
            migrate.upgrade_to_head(url_for_user(empty_db_url, name))
        message = describe(caught.value)
        assert "\n" not in message
        assert "schema upgrade failed" in message
        assert "member of allocator_owner" in message
        assert migrate.current_revision(empty_db_url) is None  # one transaction: all or nothing
    finally:
        with psycopg.connect(empty_db_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                    sql.Identifier(str(database)), sql.Identifier(str(superuser))
                )
            )
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
