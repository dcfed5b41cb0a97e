"""Issue 10: two rules of the product's source, checked on its syntax tree.

1. Only the configuration's environment module (``allocator/config/environment.py``) reads
   the process environment: no other module of ``allocator/`` or ``jobs/`` touches
   ``os.environ``/``environb``, calls ``os.getenv``/``getenvb``/``putenv``/``unsetenv`` or
   ``os.path.expandvars``, or imports any of them (``from os import environ``), also under
   another name (``import os as o``) or through ``getattr(os, "environ")``; they get a copy
   from ``allocator.config.process_environment()``. So no module can grow a test-only
   switch.
   Options that click declares with an environment variable (``auto_envvar_prefix``,
   ``envvar=``) are the CLI's documented surface, shown in ``--help``, not reads of code.
2. No SQL in the product writes the project's tables (every table and view of the
   ``allocator`` schema, as the migrations create them): ``INSERT INTO``, ``UPDATE``,
   ``DELETE FROM``, ``TRUNCATE``, ``MERGE INTO`` or ``COPY … FROM`` naming one, qualified
   with ``allocator.``, unqualified, or with a schema filled in at run time (an
   f-string). Blocks, the fence and the mark change only inside the fenced SQL functions
   (``migrations/sql``) the Python side calls. Scanned: every string literal of
   ``allocator/`` and ``jobs/`` (docstrings aside; f-strings with their fields as
   placeholders) and every ``.sql``/``.pgbench`` file there. The bench's own comparison
   tables live in the ``bench`` schema and are not covered. SQL assembled from
   ``psycopg.sql.Identifier`` at run time is not seen here: the database privileges
   (the node role may only execute the functions) are the other half of this rule.

Each checker is also fed a small bad source, so a checker that finds nothing cannot pass.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (ROOT / "allocator", ROOT / "jobs")
CONFIG_MODULE = ROOT / "allocator" / "config" / "environment.py"
MIGRATIONS_SQL = ROOT / "migrations" / "sql"

# -- rule 1: the environment ------------------------------------------------------------

OS_MODULES = frozenset({"os", "posix", "nt"})
ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})
EXPAND_VARS = "expandvars"


def environment_reads(source: str) -> list[str]:
    """Each place in ``source`` that reads (or changes) the process environment."""
    tree = ast.parse(source)
    os_names: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in OS_MODULES:
                    os_names.add(alias.asname if alias.asname else top)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            for alias in node.names:
                if top in OS_MODULES and (alias.name in ENV_NAMES or alias.name == "*"):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                elif alias.name == EXPAND_VARS:
                    found.append(f"line {node.lineno}: from {node.module} import {EXPAND_VARS}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if node.attr in ENV_NAMES and isinstance(base, ast.Name) and base.id in os_names:
                found.append(f"line {node.lineno}: {base.id}.{node.attr}")
            elif node.attr == EXPAND_VARS:
                found.append(f"line {node.lineno}: .{EXPAND_VARS}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in os_names
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in ENV_NAMES
        ):
            found.append(f"line {node.lineno}: getattr({node.args[0].id}, {node.args[1].value!r})")
    return found


def product_modules() -> Iterator[Path]:
    for folder in PRODUCT:
        yield from sorted(folder.rglob("*.py"))


def test_only_the_configuration_module_reads_the_environment() -> None:
    offenders = {
        str(path.relative_to(ROOT)): reads
        for path in product_modules()
        if path != CONFIG_MODULE and (reads := environment_reads(path.read_text()))
    }
    assert offenders == {}


def test_the_configuration_module_does_read_it() -> None:
    """The checker sees the one module that may (it would see any other the same way)."""
    assert environment_reads(CONFIG_MODULE.read_text())


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.environ.get('ALLOCATOR_TEST_X')",
        "import os\nif os.environ['X']: pass",
        "import os\nos.getenv('X')",
        "import os.path\nos.environ.copy()",
        "import os as o\no.environ",
        "import os\nenv = {**os.environ}",
        "from os import environ\n",
        "from os import getenv as g\n",
        "from os import *\n",
        "from posix import environ\n",
        "import os\nos.environb",
        "import os\nos.putenv('X', '1')",
        "import os\ngetattr(os, 'environ')",
        "import os\nos.path.expandvars('$HOME')",
        "from os.path import expandvars\n",
        "def f():\n    import os\n    return os.environ",
    ],
)
def test_the_environment_checker_catches_a_bad_module(source: str) -> None:
    assert environment_reads(source)


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.getpid()",
        "import os\nos.path.join('a', 'b')",
        "environ = {}\nenviron.get('X')",  # not the os module's
        "from allocator.config import process_environment\nprocess_environment()",
    ],
)
def test_the_environment_checker_leaves_other_code_alone(source: str) -> None:
    assert environment_reads(source) == []


# -- rule 2: writes of the project's tables -----------------------------------------------

_CREATED = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNLOGGED\s+)?(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"allocator\.(\w+)",
    re.IGNORECASE,
)
_TARGET = r"(?P<target>[\w.\"]+(?:\s*,\s*[\w.\"]+)*)"
_WRITE = re.compile(
    r"\b(?P<verb>INSERT\s+INTO|UPDATE(?:\s+ONLY)?|DELETE\s+FROM(?:\s+ONLY)?"
    r"|TRUNCATE(?:\s+TABLE)?(?:\s+ONLY)?|MERGE\s+INTO)\s+" + _TARGET,
    re.IGNORECASE,
)
_COPY_FROM = re.compile(r"\bCOPY\s+(?P<target>[\w.\"]+)\s*(?:\([^)]*\))?\s+FROM\b", re.IGNORECASE)
PLACEHOLDER = "_field_"
"""What an f-string's field becomes: a schema nobody can tell, so it counts as ours."""


def protected_tables() -> frozenset[str]:
    """Every table and view the migrations create in the ``allocator`` schema."""
    names = {
        match.lower()
        for path in MIGRATIONS_SQL.rglob("*.sql")
        for match in _CREATED.findall(path.read_text())
    }
    return frozenset(names)


def _writes_ours(target: str, tables: frozenset[str]) -> bool:
    schema, dot, name = target.replace('"', "").lower().rpartition(".")
    if not dot:
        schema = ""
    return name in tables and schema in {"", "allocator", PLACEHOLDER}


def table_writes(sql: str, tables: frozenset[str]) -> list[str]:
    """Each statement in ``sql`` that writes one of ``tables``."""
    text = re.sub(r"--[^\n]*", " ", sql)
    found: list[str] = []
    for match in _WRITE.finditer(text):
        targets = match["target"].split(",")
        if not match["verb"].upper().startswith("TRUNCATE"):
            targets = targets[:1]
        if any(_writes_ours(t.strip(), tables) for t in targets):
            found.append(" ".join(match.group(0).split()))
    for match in _COPY_FROM.finditer(text):
        if _writes_ours(match["target"], tables):
            found.append(" ".join(match.group(0).split()))
    return found


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [
            value.value if isinstance(value, ast.Constant) else PLACEHOLDER for value in node.values
        ]
        return "".join(str(part) for part in parts)
    return None


def string_literals(source: str) -> list[str]:
    """The string literals of a module (f-strings with placeholders), docstrings aside."""
    tree = ast.parse(source)
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant | ast.JoinedStr)
    }
    inside_fstrings = {
        id(value)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for value in node.values
    }
    literals = []
    for node in ast.walk(tree):
        if isinstance(node, ast.expr) and id(node) not in docstrings | inside_fstrings:
            text = _literal(node)
            if text is not None:
                literals.append(text)
    return literals


def python_writes(source: str, tables: frozenset[str]) -> list[str]:
    return [write for text in string_literals(source) for write in table_writes(text, tables)]


def sql_files() -> Iterator[Path]:
    for folder in PRODUCT:
        for pattern in ("*.sql", "*.pgbench"):
            yield from sorted(folder.rglob(pattern))


def test_the_migrations_name_the_tables_to_protect() -> None:
    tables = protected_tables()
    assert {"blocks", "fence", "high_water", "leader_terms", "block_ledger"} <= tables


def test_no_sql_in_the_product_writes_the_projects_tables() -> None:
    tables = protected_tables()
    offenders = {
        str(path.relative_to(ROOT)): writes
        for path in product_modules()
        if (writes := python_writes(path.read_text(), tables))
    }
    offenders |= {
        str(path.relative_to(ROOT)): writes
        for path in sql_files()
        if (writes := table_writes(path.read_text(), tables))
    }
    assert offenders == {}


def test_the_scan_sees_the_products_sql() -> None:
    """The SQL the node runs is found by the scan (the fenced functions it calls)."""
    literals = [text for path in product_modules() for text in string_literals(path.read_text())]
    for function in ("cut_blocks", "take_fence", "claim_blocks", "prune_claimed"):
        assert any(f"allocator.{function}(" in text for text in literals), function
    assert any(sql_files())


@pytest.mark.parametrize(
    "source",
    [
        'Q = "INSERT INTO allocator.blocks (ticket, first_id) VALUES (%s, %s)"',
        'Q = ("UPDATE allocator.blocks"\n     " SET claimed_at = now()")',
        "Q = '''\n    DELETE FROM\n      allocator.blocks b WHERE b.ticket < %s'''",
        'Q = "update   ONLY  \\"allocator\\".\\"blocks\\" set x = 1"',
        'Q = "TRUNCATE bench.queue, allocator.blocks"',
        'Q = "COPY allocator.blocks (first_id, last_id) FROM STDIN"',
        'Q = "INSERT INTO blocks VALUES (1)"',  # unqualified: the search path may find ours
        'schema = "allocator"\nQ = f"DELETE FROM {schema}.blocks"',
        'def f(conn):\n    conn.execute("UPDATE allocator.fence SET epoch = epoch + 1")',
        'Q = "UPDATE allocator.high_water SET last_id = 0"',
        'Q = "MERGE INTO allocator.blocks b USING x ON true WHEN MATCHED THEN DELETE"',
    ],
)
def test_the_sql_checker_catches_a_bad_module(source: str) -> None:
    assert python_writes(source, protected_tables())


@pytest.mark.parametrize(
    "source",
    [
        'Q = "SELECT * FROM allocator.cut_blocks(%s, %s, %s)"',
        'Q = "SELECT first_id FROM allocator.blocks WHERE ticket = %s"',
        'Q = "INSERT INTO bench.skip_locked_queue (first_id, last_id) VALUES (1, 2)"',
        'Q = "UPDATE bench.segment SET max_id = max_id + 1"',
        'Q = "COPY allocator.blocks TO STDOUT"',  # a read
        'def f():\n    """We never UPDATE allocator.blocks here: cut_blocks does."""',
        'log = "-- INSERT INTO allocator.blocks is only a comment"',
    ],
)
def test_the_sql_checker_leaves_other_sql_alone(source: str) -> None:
    assert python_writes(source, protected_tables()) == []


def test_the_sql_checker_reads_sql_files() -> None:
    bench = "-- comparison table\nINSERT INTO bench.segment VALUES (1);\n"
    bad = bench + "UPDATE allocator.blocks SET claimed_at = now();\n"
    assert table_writes(bench, protected_tables()) == []
    assert table_writes(bad, protected_tables()) == ["UPDATE allocator.blocks"]
