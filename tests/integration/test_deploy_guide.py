"""Issue 24, item 1: docs/deploy.md run as written, on loopback.

A ZooKeeper server, a PostgreSQL primary and its synchronous standby (``pg_basebackup``,
``synchronous_standby_names = 'db2'``) are started here by hand; their only TCP access
rules are the guide's pg_hba lines (the test itself uses the primary's Unix socket). Then
every ``sh`` block of the guide runs with bash, after the substitutions its table states
and no others (:mod:`tests.deploy_guide`), in one shell session's environment; a
``sh systemd`` block is done as systemd would: the kit's unit, as the guide installed it,
has its ``Environment=`` and ``EnvironmentFile=`` read, its credentials copied to ``%d``,
``ExecStartPre=`` run and ``ExecStart=`` started in the background. A leader must cut, the
application's role must claim, and ``status``, ``fence status`` and ``step-down`` must work
in the operator's documented environment, leadership passing to another node.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from allocator.local import postgres, processes, tcp_ports
from allocator.local import zookeeper as zk
from tests import deploy_guide as guide

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60.0
BLOCK_TIMEOUT_S = 120.0
POLL_S = 0.2
BLOCK_SIZE = 4096  # deploy/systemd/allocator.toml
INSTANCES = ("node1", "node2", "node3")


class Servers:
    """The ensemble and the database servers, started by hand; stopped by pid."""

    def __init__(self, base: Path) -> None:
        self.base = base
        (self.zk_client, zk_peer, zk_election, self.primary, self.standby, *admin) = (
            tcp_ports.pick_free_ports(8)
        )
        self.admin_ports = admin
        self.zk_server = zk.Server(1, self.zk_client, zk_peer, zk_election)
        self.bin = postgres.find_bin_dir()
        self.user = postgres.server_user()
        # The postgres user must reach its folders: not below pytest's private tmp folder.
        self.pg_root = Path(tempfile.mkdtemp(prefix="allocator-deploy-guide-"))
        self.socket = self.pg_root / "socket"
        self.primary_data = self.pg_root / "db1"
        self.daemons: list[processes.Daemon] = []

    def _own(self, path: Path) -> None:
        if self.user.is_switch:
            os.chown(path, self.user.uid, self.user.gid)

    def superuser(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=str(self.socket), port=self.primary, user="postgres", dbname=database,
            autocommit=True, connect_timeout=2,
        )  # fmt: skip

    def start(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        runtime = zk.find_runtime()
        zk_daemon = zk.start(runtime, self.base / "zk", self.zk_server, [self.zk_server], 200)
        self.daemons.append(zk_daemon)
        self._own(self.pg_root)
        self.socket.mkdir()
        self._own(self.socket)
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}
        initdb = [str(self.bin / "initdb"), "-D", str(self.primary_data), "-U", "postgres"]
        initdb += ["--auth-local=trust", "--auth-host=reject", "--encoding=UTF8", "--no-locale"]
        self._run(initdb, "initdb.log", env)
        # Only the socket is open; TCP access is what the guide's pg_hba lines allow.
        (self.primary_data / "pg_hba.conf").write_text(
            "local all all trust\nlocal replication all trust\n"
        )
        self._postgres(self.primary_data, self.primary, "synchronous_standby_names=db2")
        self._wait_primary(deadline)
        standby_data = self.pg_root / "db2"
        backup = [str(self.bin / "pg_basebackup"), "-D", str(standby_data), "-R"]
        backup += ["-h", str(self.socket), "-p", str(self.primary), "-U", "postgres"]
        self._run([*backup, "--wal-method=stream", "--checkpoint=fast"], "basebackup.log", env)
        conninfo = f"host={self.socket} port={self.primary} user=postgres application_name=db2"
        self._postgres(standby_data, self.standby, f"primary_conninfo={conninfo}")
        zk.wait_ready(zk_daemon, self.zk_server, deadline)
        synchronous = (
            "SELECT 1 FROM pg_stat_replication WHERE application_name = 'db2'"
            " AND sync_state = 'sync'"
        )
        with self.superuser() as conn:
            while conn.execute(synchronous).fetchone() is None:
                assert time.monotonic() < deadline, "the standby did not stream synchronously"
                time.sleep(POLL_S)

    def _run(self, argv: list[str], log: str, env: dict[str, str]) -> None:
        out = self.base / log
        code = processes.run(argv, log_path=out, env=env, cwd=Path("/"), user=self.user)
        assert code == 0, f"{argv[0]} exited {code}:\n{out.read_text()}"

    def _postgres(self, data: Path, port: int, *settings: str) -> None:
        argv = [str(self.bin / "postgres"), "-D", str(data), "-c", f"port={port}"]
        argv += ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.socket}"]
        for setting in settings:
            argv += ["-c", setting]
        self.daemons.append(
            processes.start(
                argv, log_path=self.base / f"{data.name}.log",
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, cwd=Path("/"), user=self.user,
            )
        )  # fmt: skip

    def _wait_primary(self, deadline: float) -> None:
        while True:
            try:
                with self.superuser():
                    return
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, (self.base / "db1.log").read_text()
                time.sleep(POLL_S)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):  # the standby before the primary
            sig = signal.SIGINT if "postgres" in Path(daemon.argv[0]).name else signal.SIGTERM
            processes.stop(daemon.pid, daemon.argv, sig=sig, timeout_s=30)
        shutil.rmtree(self.pg_root, ignore_errors=True)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    found = Servers(tmp_path / "servers")
    try:
        found.start()
        yield found
    finally:
        found.stop()


class Site:
    """The three hosts on one file system: the guide's paths below ``root``, its shell
    session's exports in ``env.sh``, the nodes started from the kit's unit."""

    def __init__(self, root: Path, servers: Servers) -> None:
        self.root = root
        self.servers = servers
        self.checkout = root / "checkout"
        self.env_file = root / "env.sh"
        self.nodes: dict[str, processes.Daemon] = {}
        psql = f"{servers.bin / 'psql'} -h {servers.socket} -p {servers.primary} -U postgres"
        self.pairs: list[tuple[str, str]] = [
            ("sudo -u postgres psql", psql),
            ("/etc/postgresql/16/main", str(servers.primary_data)),
            *((f"zk{i}.example.net:2181", f"127.0.0.1:{servers.zk_client}") for i in (1, 2, 3)),
            ("db1.example.net:5432", f"127.0.0.1:{servers.primary}"),
            ("db2.example.net:5432", f"127.0.0.1:{servers.standby}"),
            *(
                (f"alloc{i}.example.net:8470", f"127.0.0.1:{port}")
                for i, port in enumerate(servers.admin_ports, 1)
            ),
            ("192.0.2.0/24", "127.0.0.1/32"),
            ("198.51.100.0/24", "127.0.0.1/32"),
            ("/opt/allocator", sys.prefix),
            *(
                (path, str(root / path.strip("/").replace("/", "_")))
                for path in (
                    "/etc/allocator",
                    "/etc/systemd/system",
                    "/usr/share/doc/allocator",
                    "/root/allocator-db",
                )
            ),
        ]
        self.specifiers = {"S": str(root / "var_lib")}
        self._lay_out_checkout()

    def _lay_out_checkout(self) -> None:
        """What the blocks install from "a checkout": the kit's files substituted like the
        blocks, the documentation as it is."""
        (self.checkout / "docs").mkdir(parents=True)
        shutil.copy(guide.ROOT / "README.md", self.checkout)
        for page in (guide.ROOT / "docs").glob("*.md"):
            shutil.copy(page, self.checkout / "docs")
        kit = self.checkout / "deploy" / "systemd"
        kit.mkdir(parents=True)
        for source in (guide.ROOT / "deploy" / "systemd").iterdir():
            (kit / source.name).write_text(guide.substitute(source.read_text(), self.pairs))
        for folder in ("var_lib", "home", "etc_systemd_system"):  # a host has them
            (self.root / folder).mkdir()

    def shell(self, text: str) -> subprocess.CompletedProcess[str]:
        """One block in the session: the previous blocks' exports, then theirs kept."""
        script = (
            "set -eo pipefail\n"
            f"if [ -f {self.env_file} ]; then source {self.env_file}; fi\n"
            f"cd {self.checkout}\n"
            f"{text}\n"
            f"export -p > {self.env_file}\n"
        )
        env = {"PATH": os.environ["PATH"], "HOME": str(self.root / "home"), "LANG": "C.UTF-8"}
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, env=env, cwd=self.root,
            timeout=BLOCK_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def run_block(self, text: str) -> str:
        result = self.shell(guide.substitute(text, self.pairs))
        assert result.returncode == 0, (
            f"the guide's block failed (exit {result.returncode}):\n{text}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
        return result.stdout

    def systemctl(self, words: list[str]) -> None:
        if words[0] == "journalctl" or words[1] == "daemon-reload":
            return
        if words[1:] == ["start", "allocator-migrate.service"]:
            self._start_unit("allocator-migrate.service", "allocator-migrate.service")
            return
        assert words[1:3] == ["enable", "--now"], words
        assert words[3].startswith("allocator@"), words
        instance = words[3].removeprefix("allocator@").removesuffix(".service")
        self._start_unit("allocator@.service", f"allocator@{instance}.service", instance)

    def _start_unit(self, file: str, name: str, instance: str = "") -> None:
        unit = guide.read_unit(Path(dict(self.pairs)["/etc/systemd/system"]) / file)
        credentials = self.root / "run_credentials" / name
        specifiers = {**self.specifiers, "i": instance, "n": name, "d": str(credentials)}

        def expanded(value: str) -> str:
            return guide.expand(value, specifiers)

        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        for line in unit.environment:
            env.update(word.split("=", 1) for word in shlex.split(expanded(line)))  # type: ignore[misc]
        for path in unit.environment_files:
            env.update(guide.environment_file(Path(expanded(path).removeprefix("-"))))
        credentials.mkdir(parents=True, mode=0o700)
        for line in unit.credentials:
            credential, _, source = expanded(line).partition(":")
            shutil.copy(source, credentials / credential)
            (credentials / credential).chmod(0o400)
        for folder in unit.state_directories:
            (Path(specifiers["S"]) / expanded(folder)).mkdir(parents=True, mode=0o700)
        log = self.root / f"{name}.log"
        for line in unit.exec_start_pre:
            code = processes.run(shlex.split(expanded(line)), log_path=log, env=env, cwd=Path("/"))
            assert code == 0, f"{name}: ExecStartPre exited {code}:\n{log.read_text()}"
        (argv,) = (shlex.split(expanded(line)) for line in unit.exec_start)
        if not instance:  # the one-shot: to its end
            code = processes.run(argv, log_path=log, env=env, cwd=Path("/"))
            assert code == 0, f"{name} exited {code}:\n{log.read_text()}"
            return
        self.nodes[instance] = processes.start(argv, log_path=log, env=env, cwd=Path("/"))

    def stop_nodes(self) -> None:
        for node in self.nodes.values():
            processes.stop(node.pid, node.argv, timeout_s=20)

    def status(self) -> dict[str, object]:
        """``allocator status --json`` in the operator's shell, as the guide left it."""
        out = self.run_block("/opt/allocator/bin/allocator status --json")
        document: dict[str, object] = json.loads(out)
        return document


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not by the deadline"
        time.sleep(POLL_S)


def leader_of(status: dict[str, object]) -> tuple[str, int] | None:
    leader = status.get("leader")
    if not isinstance(leader, dict):
        return None
    return str(leader["name"]), int(leader["epoch"])


def test_the_deploy_guide_runs_as_written(servers: Servers, tmp_path: Path) -> None:
    text = guide.GUIDE.read_text()
    table = text.split("## How this guide is tested", 1)[1]
    site = Site(tmp_path / "site", servers)
    for old, _new in site.pairs:
        assert f"`{old}`" in table, f"the guide's table does not list the substitution {old}"
    claimed = ""
    try:
        for block in guide.blocks(text):
            if block.kind == guide.INSTALL:
                continue
            if block.kind == guide.SYSTEMD:
                for words in guide.systemctl_lines(block):
                    site.systemctl(words)
                if site.nodes:
                    cut_blocks(servers)  # a leader cuts
                continue
            if "allocator step-down" in block.text:
                before = leader_of(site.status())
                assert before is not None
                site.run_block(block.text)
                wait_for("another node leads", functools.partial(handed_over, site, before))
                continue
            out = site.run_block(block.text)
            if "claim_blocks_expiring" in block.text:
                claimed = out
        assert sorted(site.nodes) == list(INSTANCES)
        first_id, last_id, expires_in_ms = (int(v) for v in claimed.split())
        assert last_id - first_id + 1 == BLOCK_SIZE
        assert expires_in_ms > 0
        with servers.superuser("allocator") as conn:
            row = conn.execute(
                "SELECT pg_has_role('orders_api', 'allocator_consumer', 'USAGE'),"
                " pg_has_role('allocator_node_login', 'allocator_consumer', 'USAGE'),"
                " (SELECT count(*) FROM allocator.block_ledger"
                "  WHERE claimed_by = 'orders-api' AND first_id = %s)",
                (first_id,),
            ).fetchone()
        assert row == (True, False, 1)  # the application's role, not the node's
    finally:
        site.stop_nodes()


def cut_blocks(servers: Servers) -> None:
    def available() -> bool:
        with servers.superuser("allocator") as conn:
            row = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
        return row is not None and int(str(row[0])) > 0

    wait_for("a leader cuts blocks", available)


def handed_over(site: Site, before: tuple[str, int]) -> bool:
    now = leader_of(site.status())
    return now is not None and now[0] != before[0] and now[1] > before[1]
