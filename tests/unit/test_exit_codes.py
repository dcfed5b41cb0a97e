"""One table of exit codes (issue 21, item 6), and every command driven to each code it can
end with.

The table (:mod:`allocator.core.exits`) uses sysexits(3)'s numbers where one fits (checked
against the ``os.EX_*`` constants); ``allocator --help`` prints it and
``docs/exit-codes.md`` is it, row for row; every error class of the product carries one of
its codes, and so does the console script's missing-dependency exit. A login the server
refuses is told apart from an unreachable server by the driver's error alone (SQLSTATE
28P01/28000, or libpq's message on a failed connection), naming the role.

Then the table-driven part: :data:`CASES` holds, per row, one case per command that can end
with it, each a cause (a closed port on 127.0.0.1, no ZooKeeper answering, a missing token,
an invalid configuration, a bad option, a missing program, a server that does not start, a
bug) and the message that must name it. Every row has cases; a bad option and an invalid
configuration are tried on every command that takes options or a configuration (found by
walking the CLI). The PostgreSQL login a server refuses is driven against the test server
(``tests/integration/test_exit_codes_db.py``); the node's own 3 and 4 by the node's tests
(:data:`NODE_ONLY`). In-process (click's ``CliRunner``), no server is started.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import psycopg
import pytest

from allocator import cli, console
from allocator.core import errors, exits, layout, logs
from allocator.core.exits import Exit
from allocator.postgres import errors as db_errors
from tests.fuzz.clikit import clean_environment, invoke

ROOT = Path(__file__).resolve().parents[2]
CLOSED = "postgresql://nobody@127.0.0.1:1/allocator"
TOKEN = "a-test-admin-token-0123456789"
BASE_ENV = {
    "ALLOCATOR_ZOOKEEPER_HOSTS": "127.0.0.1:1",
    "ALLOCATOR_ZOOKEEPER_INSECURE": "true",
    "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": "0.3",
    "ALLOCATOR_POSTGRES_URL": CLOSED,
    "ALLOCATOR_CLAIM_DATABASE_URL": CLOSED,
    "ALLOCATOR_POSTGRES_CONNECT_TIMEOUT_S": "1",
    "ALLOCATOR_NODE_ADMIN_TOKEN": TOKEN,
}
"""Every server on a closed port of 127.0.0.1 (a connection is refused at once). A case's
empty value removes the variable."""


# -- the table ----------------------------------------------------------------------------


def test_the_table_has_every_code_once_in_order() -> None:
    codes = [row.code for row in exits.TABLE]
    assert codes == sorted(Exit)
    assert all(row.meaning and "\n" not in row.meaning for row in exits.TABLE)
    assert exits.row(78).sysexits == "EX_CONFIG"
    with pytest.raises(ValueError, match="2 is not a valid Exit"):
        exits.row(2)


def test_sysexits_numbers_are_sysexits() -> None:
    named = [row for row in exits.TABLE if row.sysexits]
    assert {row.code for row in named} == {64, 69, 70, 75, 78}
    for row in named:
        assert getattr(os, row.sysexits) == row.code, row


def test_every_error_carries_a_code_of_the_table() -> None:
    pending: list[type[errors.AllocatorError]] = [errors.AllocatorError]
    seen = []
    while pending:
        cls = pending.pop()
        seen.append(cls)
        assert cls.exit_code in set(Exit), cls
        pending += cls.__subclasses__()
    assert len(seen) > 20  # the product's own subclasses too (they are imported by cli)
    assert errors.DatabaseLoginError.exit_code == Exit.CONFIG
    assert issubclass(errors.DatabaseLoginError, errors.DatabaseUnavailableError)
    assert console.EXIT_MISSING_PREREQUISITE == Exit.UNAVAILABLE


def test_help_prints_the_table() -> None:
    result = invoke(["--help"])
    assert result.exit_code == 0
    listed = result.stdout.split("Exit codes:\n", 1)[1]
    for row in exits.TABLE:
        first_words = " ".join(row.meaning.split()[:4])
        assert re.search(rf"^ {{4}}{int(row.code)} +{re.escape(first_words)}", listed, re.M), row


def test_the_docs_are_the_table() -> None:
    text = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    block = text.split("<!-- exit-codes:begin", 1)[1].split("<!-- exit-codes:end -->", 1)[0]
    rows = [line for line in block.splitlines() if re.match(r"^\| \d+ \|", line)]
    expected = [f"| {int(r.code)} | {r.sysexits} | {r.meaning} |" for r in exits.TABLE]
    assert [" ".join(row.split()) for row in rows] == [" ".join(e.split()) for e in expected]
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    assert "(exit-codes.md)" in operations


FAILED_AT = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    ("error", "role"),
    [
        (
            psycopg.OperationalError(
                FAILED_AT + 'FATAL:  password authentication failed for user "app"'
            ),
            "app",
        ),
        (psycopg.OperationalError(FAILED_AT + "fe_sendauth: no password supplied"), None),
        (psycopg.OperationalError(FAILED_AT + 'FATAL:  role "ghost" does not exist'), "ghost"),
        (
            psycopg.OperationalError(FAILED_AT + 'FATAL:  role "ro" is not permitted to log in'),
            "ro",
        ),
        (
            psycopg.OperationalError(
                FAILED_AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "app", '
                'database "allocator", no encryption'
            ),
            "app",
        ),
        (psycopg.errors.InvalidPassword('password authentication failed for user "op"'), "op"),
        (psycopg.errors.InvalidAuthorizationSpecification("not allowed"), None),
    ],
)
def test_a_refused_login_is_told_apart_from_an_unreachable_server(
    error: psycopg.Error, role: str | None
) -> None:
    found = db_errors.translate(error, "claim ID blocks")
    assert isinstance(found, errors.DatabaseLoginError)
    assert found.exit_code == Exit.CONFIG
    assert found.role == role
    who = f"role {role!r}" if role else "the configured role"
    assert str(found).startswith(f"claim ID blocks: PostgreSQL refused the login of {who}")


@pytest.mark.parametrize(
    "message",
    [
        FAILED_AT + "Connection refused\n\tIs the server running on that host?",
        FAILED_AT + "timeout expired",
    ],
)
def test_an_unreachable_server_stays_temporary(message: str) -> None:
    found = db_errors.translate(psycopg.OperationalError(message), "claim ID blocks")
    assert type(found) is errors.DatabaseUnavailableError
    assert found.exit_code == Exit.TEMPFAIL


# -- every command, driven to each code ---------------------------------------------------


@dataclass(frozen=True)
class Case:
    """``allocator <args>`` (``{tmp}`` is a fresh folder) with ``env`` over
    :data:`BASE_ENV`; ``says`` must be in its output."""

    args: tuple[str, ...]
    says: str
    env: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return " ".join(word for word in self.args if not word.startswith("{"))


def case(*args: str, says: str, **env: str) -> Case:
    return Case(args, says, tuple(env.items()))


EMPTY = ("--state-dir", "{tmp}")
NO_CLUSTER = "no local cluster in"
UNREACHABLE_PG = "PostgreSQL is unreachable"
NO_ZOOKEEPER = "no ZooKeeper server answered at 127.0.0.1:1"
NOT_INSTALLED = "ZooKeeper is not installed"
LOCAL_NEEDING_A_CLUSTER = [
    ("status",),
    ("env",),
    ("zk-stop", "1"),
    ("zk-start", "1"),
    ("pg-stop",),
    ("pg-start",),
    ("pg-failover",),
    ("node-stop", "node-1"),
    ("node-start", "node-1"),
    ("node-signal", "node-1", "SIGTERM"),
]

CASES: dict[Exit, list[Case]] = {
    Exit.OK: [
        case("decode", "0", says="datacenter"),
        case("config", "check", says="# configuration is valid"),
        case("run", "--check", says='"zookeeper"'),
        case("local", "down", *EMPTY, says="nothing to stop"),
        case("watch", "--duration", "300ms", says="unavailable: no ZooKeeper server answered"),
        case(
            "reap-session",
            "--name",
            "node-1",
            says="nothing: no session file",
            ALLOCATOR_NODE_STATE_DIR="{tmp}",
        ),
    ],
    Exit.FAILED: [
        case("local", *words, *EMPTY, says=NO_CLUSTER) for words in LOCAL_NEEDING_A_CLUSTER
    ],
    Exit.USAGE: [
        case("decode", "x", says="not an integer"),
        case("claim", "--consumer", "c", "--count", "0", says="Invalid value for '--count'"),
        case("migrate", "--to", "base", says="add --yes to confirm"),
        case("pool", "reset", "--reason", "r", says="needs --after-restore"),
        case("watch", "--duration", "5x", says="'5x' is not a duration"),
        case("step-down", "--timeout", "-1s", says="never negative"),
        case("local", "node-signal", "node-1", "SIGFOO", *EMPTY, says="'SIGFOO' is not one of"),
    ],
    Exit.UNAVAILABLE: [
        case(*path, *EMPTY, says=NOT_INSTALLED, ALLOCATOR_ZK_JAVA_DIR="{tmp}/no-jars")
        for path in (
            ("local", "up"),
            ("demo",),
            ("drill",),
            ("bench", "claims"),
            ("bench", "client"),
            ("bench", "slow-consumer"),
            ("bench", "sustained"),
        )
    ],
    Exit.SOFTWARE: [
        case(
            "local",
            "up",
            "--zk",
            "1",
            "--nodes",
            "0",
            *EMPTY,
            says="initdb failed",
            PATH="{fake}/bin",
            ALLOCATOR_PG_BIN_DIR="{fake}/pg",
        ),
        case("decode", "0", says="Traceback"),  # with a bug planted: see test_a_bug_is_70
    ],
    Exit.TEMPFAIL: [
        case("claim", "--consumer", "c", says=UNREACHABLE_PG),
        case("migrate", says=UNREACHABLE_PG),
        case("migrate", "--check", says=UNREACHABLE_PG),
        case("config", "check", "--database", says=UNREACHABLE_PG),
        case("pool", "pause", "--reason", "r", says=UNREACHABLE_PG),
        case("pool", "resume", "--reason", "r", says=UNREACHABLE_PG),
        case(
            "pool",
            "reset",
            "--after-restore",
            "--reason",
            "r",
            "--old-database-unreachable",
            "--yes",
            says=NO_ZOOKEEPER,
        ),
        case("fence", "rebase", "--reason", "r", "--yes", says=NO_ZOOKEEPER),
        case("fence", "status", says=NO_ZOOKEEPER),
        case("status", says=NO_ZOOKEEPER),
        case("step-down", says=NO_ZOOKEEPER),
        case("run", "--admin-address", "127.0.0.1:0", says=UNREACHABLE_PG),
        case("bench", "claims", "--database-url", CLOSED, says=UNREACHABLE_PG),
        case("bench", "slow-consumer", "--database-url", CLOSED, says=UNREACHABLE_PG),
        # bench client too, but only after waiting 180 s for the pool (POOL_WAIT_S).
        case("local", "up", "--pg-port", "{taken}", *EMPTY, says="is already in use"),
    ],
    Exit.CONFIG: [
        case("step-down", says="node.admin_token is not set", ALLOCATOR_NODE_ADMIN_TOKEN=""),
        case("claim", "--consumer", "c", says="no database URL", ALLOCATOR_CLAIM_DATABASE_URL=""),
        case("run", says="zookeeper.auth", ALLOCATOR_ZOOKEEPER_INSECURE="false"),
        case("reap-session", "--name", "node-1", says="node.state_dir is not set"),
        case("drill", "--config", "{folder}/bad.toml", says="pool.min_blocks"),
    ],
}
"""Per row, a case per command that can end with it (module rules); the invalid
configuration and the bad option of every command are added below, found by walking the
CLI."""
NODE_ONLY = {
    Exit.SESSION_LOST: "test_session_expiry_of_the_leader_exits_with_code_3",
    Exit.FENCED: "test_a_fenced_write_met_by_the_jobs_exits_with_code_4",
}
"""``allocator run``'s own codes, returned by the node (``sys.exit(node.run())``): driven by
``tests/unit/test_node_machine.py``'s tests of these names."""
ELSEWHERE = {Exit.CONFIG: "a login refused: tests/integration/test_exit_codes_db.py"}


def leaves(
    group: click.Group = cli.main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from leaves(command, (*path, name))
        else:
            yield (*path, name), command


LEAVES = list(leaves())
BEFORE_THE_CONFIGURATION = {
    ("claim",): ("--consumer", "c"),
    ("decode",): ("0",),
    ("fence", "rebase"): ("--reason", "r", "--yes"),
    ("pool", "pause"): ("--reason", "r"),
    ("pool", "resume"): ("--reason", "r"),
    ("pool", "reset"): ("--after-restore", "--reason", "r", "--old-database-unreachable", "--yes"),
}
"""What a command checks before it loads the configuration."""
for path, command in LEAVES:
    if path == ("decode",):  # it reads a leading "-" as part of the ID (a negative one)
        CASES[Exit.USAGE].append(case(*path, "--no-such-option", says="not an integer"))
    else:
        CASES[Exit.USAGE].append(case(*path, "--no-such-option", says="No such option"))
    if any(param.name == "set_pairs" for param in command.params):
        before = BEFORE_THE_CONFIGURATION.get(path, ())
        invalid = case(*path, *before, "--set", "pool.min_blocks=-1", says="pool.min_blocks")
        CASES[Exit.CONFIG].append(invalid)

PARAMS = [(code, c) for code, cases in CASES.items() for c in cases]


def test_every_row_is_driven() -> None:
    driven = {code for code, cases in CASES.items() if cases}
    assert driven | set(NODE_ONLY) == set(Exit)
    machine = importlib.import_module("tests.unit.test_node_machine")
    for name in NODE_ONLY.values():
        assert callable(getattr(machine, name)), name
    assert set(ELSEWHERE) <= driven


@pytest.fixture
def folder() -> Iterator[Path]:
    """A fresh folder any OS user can enter (PostgreSQL's, when we are root)."""
    path = Path(tempfile.mkdtemp(prefix="allocator-exit-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fakes(folder: Path) -> Path:
    """A ``java`` and a PostgreSQL whose programs fail at once, as a broken install would."""
    fake = folder / "fake"
    for name in ("bin/java", "pg/initdb", "pg/postgres"):
        program = fake / name
        program.parent.mkdir(parents=True, exist_ok=True)
        program.parent.chmod(0o755)
        program.write_text("#!/bin/sh\necho broken >&2\nexit 1\n")
        program.chmod(0o755)
    return fake


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.mark.parametrize(
    ("code", "case_"), PARAMS, ids=[f"{int(code)}: {c.name}" for code, c in PARAMS]
)
def test_each_command_ends_each_cause_with_its_code(
    code: Exit, case_: Case, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean_environment(monkeypatch)
    monkeypatch.chdir(folder)
    state = folder / "state"
    (folder / "bad.toml").write_text("[pool]\nmin_blocks = -1\n")
    values = {"tmp": str(state), "folder": str(folder), "fake": str(fakes(folder))}
    monkeypatch.setattr(logs, "configure", lambda log_format: None)  # run's: global
    if code is Exit.SOFTWARE and case_.says == "Traceback":
        monkeypatch.setattr(layout.Layout, "decode", planted_bug)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        values["taken"] = str(taken.getsockname()[1])
        env: dict[str, str | None] = {**BASE_ENV, **{k: fill(v, values) for k, v in case_.env}}
        if env.get("PATH"):
            env["PATH"] = f"{env['PATH']}{os.pathsep}{os.environ.get('PATH', '')}"
        removed = {name: None for name, value in env.items() if value == ""}
        result = invoke([fill(arg, values) for arg in case_.args], env={**env, **removed})
    shown = f"allocator {' '.join(case_.args)}: exit {result.exit_code}\n{result.output}"
    assert result.exit_code == code, shown
    assert case_.says in result.output, shown
    if code not in (Exit.OK, Exit.SOFTWARE):
        errors_ = [
            line for line in result.stderr.splitlines() if line.startswith(("error", "Error"))
        ]
        assert len(errors_) == 1, shown


def planted_bug(self: layout.Layout, value: int) -> None:
    raise RuntimeError("a bug planted by the test")
