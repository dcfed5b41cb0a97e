"""Chaos: known secrets flow through a cluster under faults, and none of them is ever shown.

Rules: one embedded cluster whose nodes carry three distinctive secrets: the cluster's
ZooKeeper digest identity (``zookeeper.auth``, random per cluster), its admin token
(``node.admin_token``) and a PostgreSQL password, which the server really checks (a
``scram-sha-256`` line in ``pg_hba.conf`` for the test's login roles; the rest of the
cluster keeps ``trust``). The nodes are ``allocator run`` processes outside the supervisor
(:meth:`ChaosCluster.start_extra_node`), configured through their environment like
supervised ones, one logging text and one JSON. Then: a step-down with the token, a SIGKILL
of the new leader, consumer claims, and the operator commands (``status``, ``config check``,
``run --check``, ``fence status``, ``watch``, ``claim``, ``migrate --check``, ``local
status --json``) plus commands that fail with the URL in their error (a wrong port, a URL
libpq cannot parse, a wrong password, a wrong token, a password on the command line).
Afterwards every file of the state folder (the nodes' logs, PostgreSQL's and ZooKeeper's
logs and data), every captured stdout and stderr, ``ps -eo args`` and the command line of
every process of the cluster are searched for each secret: none may appear. The 0600 record
(``cluster.json``) and the nodes' environments hold them on purpose: they are the positive
control that the search would find them. Most commands run in this process (click's
``CliRunner``); the step-down, ``status`` and two failures run as real processes, with the
CLI's own logging.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from allocator import cli
from allocator.core.exits import Exit
from allocator.local import nodes as nodes_mod
from tests.chaos.harness import ChaosCluster, ExtraNode, chaos_consumers, now_utc
from tests.fixtures.cluster import cluster_pids

pytestmark = pytest.mark.integration

ROLES = {"secret_node": "allocator_node", "secret_operator": "allocator_operator"}
ROLES_CONSUMER = {"secret_app": "allocator_consumer"}
CLI_TIMEOUT_S = 60.0
RECORD = "cluster.json"
"""The cluster's record (mode 0600): it holds the cluster's secrets by design."""


def _login_roles(superuser_url: str, password: str) -> None:
    """Login roles with ``password``, which PostgreSQL checks for them (scram-sha-256)."""
    with psycopg.connect(superuser_url, autocommit=True) as conn:
        for role, group in {**ROLES, **ROLES_CONSUMER}.items():
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                    sql.Identifier(role), sql.Literal(password), sql.Identifier(group)
                )
            )
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(str(row[0]))
        roles = ",".join([*ROLES, *ROLES_CONSUMER])
        hba.write_text(f"host all {roles} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")


def _role_url(url: str, role: str, password: str, port: int | None = None) -> str:
    """``url`` (the cluster's, password-free) as ``role`` with ``password``."""
    scheme, _, rest = url.partition("://")
    _user, _, host_part = rest.partition("@")
    if port is not None:
        host_part = f"127.0.0.1:{port}/" + host_part.partition("/")[2]
    return f"{scheme}://{role}:{password}@{host_part}"


@dataclass(frozen=True)
class Answer:
    code: int
    text: str


class Run:
    """An ``allocator`` command, in a subprocess (``process=True``: its own logging, as an
    operator runs it; ~1 s each) or in this process (click's ``CliRunner``); its stdout and
    stderr are kept for the search."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self._env = env
        self._cwd = cwd
        self.outputs: list[str] = []

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, process: bool = False
    ) -> Answer:
        full = {**self._env, **(env or {})}
        if process:
            done = subprocess.run(
                [sys.executable, "-m", "allocator.cli", *args],
                env=full,
                cwd=self._cwd,
                capture_output=True,
                text=True,
                timeout=CLI_TIMEOUT_S,
                check=False,
            )
            answer = Answer(done.returncode, done.stdout + done.stderr)
        else:
            ours = {key: value for key, value in full.items() if key.startswith("ALLOCATOR_")}
            result = CliRunner().invoke(cli.main, list(args), env=ours)
            answer = Answer(result.exit_code, result.stdout + result.stderr)
        self.outputs.append(f"$ allocator {' '.join(args[:2])} -> {answer.code}\n{answer.text}")
        return answer


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().replace(b"\0", b"\n").decode()


def test_no_secret_in_any_log_output_or_process_list(tmp_path: Path) -> None:
    """Breaks: nothing; exercises every path a secret travels (configuration, ZooKeeper
    authentication, PostgreSQL authentication, the admin HTTP step-down, failovers, error
    messages, the CLI's outputs).

    Must hold: no secret in a log, an output or a process list (issue 10, must-show 5).
    Cost: ~30 s."""
    pg_password = f"PgPw-{secrets.token_hex(10)}"
    with ChaosCluster(zk=1, nodes=0) as chaos:
        info = chaos.info()
        zk_auth = info.zk_auth  # the embedded cluster's digest identity (its ACL's)
        known = {
            "zookeeper password": zk_auth.partition(":")[2],
            "admin token": info.admin_token,
            "postgres password": pg_password,
        }
        assert all(len(value) >= 16 for value in known.values()), "distinctive secrets"
        _login_roles(chaos.database_url, pg_password)
        node_url = _role_url(info.node_database_url, "secret_node", pg_password)
        operator_url = _role_url(info.database_url, "secret_operator", pg_password)
        app_url = _role_url(info.consumer_database_url, "secret_app", pg_password)
        wrong = _role_url(info.database_url, "secret_operator", "not-the-password")
        with pytest.raises(psycopg.OperationalError):  # the server checks the password
            psycopg.connect(wrong, connect_timeout=3).close()

        secret_env = {"ALLOCATOR_ZOOKEEPER_AUTH": zk_auth}
        extras: list[ExtraNode] = [
            chaos.start_extra_node(
                f"secret-{index}",
                {**secret_env, "ALLOCATOR_NODE_LOG_FORMAT": log_format},
                database_url=node_url,
            )
            for index, log_format in ((1, "text"), (2, "json"), (3, "text"))
        ]
        first = chaos.wait_leader()
        chaos.wait_pool(100)
        consumers = chaos_consumers(app_url).start()  # claims make the leaders cut

        cli_env = {
            **nodes_mod.base_env(os.environ),
            "ALLOCATOR_ZOOKEEPER_HOSTS": info.node_zk_hosts,
            "ALLOCATOR_ZOOKEEPER_AUTH": zk_auth,
            "ALLOCATOR_POSTGRES_URL": operator_url,
            "ALLOCATOR_NODE_ADMIN_TOKEN": info.admin_token,
        }
        run = Run(cli_env, chaos.state_dir)

        # Faults: a step-down with the token, then a SIGKILL of the next leader.
        try:
            assert run("step-down", process=True).code == 0, run.outputs[-1]
            second = chaos.wait_leader(newer_than=first.epoch)
            killed = next(e for e in extras if e.name == second.name)
            killed.signal(signal.SIGKILL)
            killed_at = now_utc()
            third = chaos.wait_leader(newer_than=second.epoch)
            chaos.wait_cutting(third.epoch, after=killed_at)
            records = chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        claim_env = {"ALLOCATOR_CLAIM_DATABASE_URL": app_url}
        assert run("claim", "--consumer", "secret-c", "--count", "2", env=claim_env).code == 0
        url_file = tmp_path / "app-url"  # outside the searched state folder: it holds the URL
        url_file.write_text(app_url + "\n")
        assert (
            run("claim", "--consumer", "secret-c", "--database-url-file", str(url_file)).code == 0
        )
        for args in (
            ("status", "--json"),
            ("config", "check"),
            ("config", "check", "--json", "--database"),
            ("run", "--check"),
            ("fence", "status", "--json"),
            ("watch", "--duration", "1s"),
            ("local", "status", "--json", "--state-dir", str(chaos.state_dir)),
        ):
            assert run(*args).code == 0, run.outputs[-1]
        assert run("status", process=True).code == 0, run.outputs[-1]
        run("migrate", "--check")  # the operator may not read alembic's table: any answer

        # Failures whose error names the database.
        wrong_port = _role_url(info.database_url, "secret_operator", pg_password, port=1)
        failing = [
            run("claim", "--consumer", "c", env={"ALLOCATOR_CLAIM_DATABASE_URL": wrong_port}),
            run("status", env={"ALLOCATOR_POSTGRES_URL": wrong_port}),
            run(
                "config",
                "check",
                "--database",
                env={"ALLOCATOR_POSTGRES_URL": wrong_port},
                process=True,
            ),
            run("migrate", "--check", env={"ALLOCATOR_MIGRATE_DATABASE_URL": wrong_port}),
            run("status", env={"ALLOCATOR_POSTGRES_URL": operator_url + "?bogus=1"}),
            run("status", env={"ALLOCATOR_POSTGRES_URL": operator_url.replace("@", "@[", 1)}),
            run(
                "claim",
                "--consumer",
                "c",
                env={"ALLOCATOR_CLAIM_DATABASE_URL": wrong},
                process=True,
            ),
            run("step-down", env={"ALLOCATOR_NODE_ADMIN_TOKEN": "x" * 32}),
            run("migrate", "--database-url", operator_url),  # refused: a password on the line
        ]
        assert all(done.code != 0 for done in failing), run.outputs[-len(failing) :]
        assert failing[-1].code == Exit.USAGE

        # Every process of the cluster, as the process list shows it, while it runs.
        pids = [*cluster_pids(chaos.info()), *(e.pid for e in extras if e.exit_code is None)]
        process_list = subprocess.run(
            ["ps", "-eo", "args"], capture_output=True, text=True, check=True
        ).stdout
        cmdlines = "\n".join(_cmdline(pid) for pid in pids)
        assert "allocator.cli run" in cmdlines
        assert "allocator.cli run" in process_list
        running = next(e for e in extras if e.exit_code is None)
        node_environment = _environ(running.pid)  # positive control: the secrets are there

        for extra in extras:
            extra.stop()  # shutdown lines too
        logs = {
            str(path): path.read_text(errors="replace")
            for path in chaos.state_dir.rglob("*")
            if path.is_file() and path.name != RECORD
        }
        record = (chaos.state_dir / RECORD).read_text()

    searched = {
        **logs,
        "outputs of the CLI": "\n".join(run.outputs),
        "ps -eo args": process_list,
        "/proc/<pid>/cmdline": cmdlines,
    }
    assert records, "consumers claimed through the password URL"
    assert any(path.endswith(".log") and "secret-2" in path for path in logs), sorted(logs)
    leaks = [
        f"{what} in {where}"
        for what, secret in known.items()
        for where, text in searched.items()
        if secret in text
    ]
    assert not leaks, leaks
    # The search would have found them: the record and the nodes' environments hold them.
    assert known["admin token"] in record
    assert all(secret in node_environment for secret in known.values())
