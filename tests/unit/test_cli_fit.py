"""Issue 12, must-show 8 without servers: a CLI that fits.

Every command's ``--help`` lists its exit codes; every command that reports something takes
``--json`` (``watch`` as JSON lines, ``step-down``, ``migrate``, every ``local`` action);
``allocator local env`` exports the secrets as paths of files that hold them, never as
values, and what it exports loads as a configuration that reaches the cluster; secrets come
from ``ALLOCATOR_*_FILE`` variables; the README's example configuration loads and passes a
node's own checks. In-process (click's ``CliRunner``): the servers are faked where a command
would reach one (``tests/acceptance/test_cli_local_env.py`` does it against a real cluster).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
import time
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
from click.testing import CliRunner, Result

from allocator import cli
from allocator import cluster_status as status_mod
from allocator import config as config_mod
from allocator.commands import options
from allocator.core import errors
from allocator.core.exits import Exit
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo, PostgresInfo
from allocator.zookeeper import client as zkclient
from allocator.zookeeper.election import Contender, Identity
from tests.fuzz.clikit import EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]
ZK_AUTH = "allocator-1a2b3c4d:Zk-Secret-Value-not-to-print-0123"
ADMIN_TOKEN = "Admin-Token-Value-not-to-print-0123456789"
NODE_EXIT_CODES = {Exit.SESSION_LOST, Exit.FENCED}
"""``allocator run``'s own: ZooKeeper session lost, fenced (allocator.node)."""
NO_JSON = {
    ("run",): "a node; `run --check` prints the effective config as JSON already",
    ("demo",): "a show for people; `drill --json` is its machine-readable counterpart",
    ("alerts", "render"): "prints Prometheus rules (YAML) for a file, not a report",
}


def tree(
    group: click.Group = cli.main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from tree(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = list(tree())
LEAVES = [(path, command) for path, command in COMMANDS if not isinstance(command, click.Group)]


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.main, list(args), env=env, catch_exceptions=False)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("ALLOCATOR_", "PG"))]:
        monkeypatch.delenv(name)


# -- exit codes and --json on every command ---------------------------------------------------


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "allocator" for p, _ in COMMANDS]
)
def test_every_help_lists_the_exit_codes(path: tuple[str, ...], command: click.Command) -> None:
    result = invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    heading = f"\n  {options.EXIT_CODES_HEADING}\n"
    assert heading in result.output, f"allocator {' '.join(path)} --help lists no exit codes"
    listed = result.output.split(heading, 1)[1]
    codes = [int(m) for m in re.findall(r"^ {4}(\d+) +\S", listed, flags=re.MULTILINE)]
    assert codes == sorted(set(codes)), listed
    assert {Exit.OK, Exit.USAGE} <= set(codes), listed  # success, and click's own usage errors
    node_codes = NODE_EXIT_CODES if path in {("run",), ()} else set()
    assert set(codes) <= EXIT_CODES | node_codes, f"undocumented exit code in {listed}"


def test_the_exit_codes_come_from_the_errors_module() -> None:
    assert options.USAGE[0] == errors.UsageError.exit_code
    assert options.CONFIG[0] == errors.ConfigError.exit_code
    assert options.CONFIG[0] == errors.DatabaseLoginError.exit_code
    assert options.UNREACHABLE[0] == errors.ZooKeeperUnavailableError.exit_code
    assert options.UNREACHABLE[0] == errors.DatabaseUnavailableError.exit_code
    assert options.PREREQUISITE[0] == errors.PrerequisiteError.exit_code
    assert options.SERVER_START[0] == errors.ServerStartError.exit_code
    assert options.PORT_IN_USE[0] == errors.PortInUseError.exit_code
    assert options.NO_LOCAL_CLUSTER[0] == errors.LocalClusterError.exit_code


@pytest.mark.parametrize(("path", "command"), LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_reporting_command_takes_json(path: tuple[str, ...], command: click.Command) -> None:
    flags = {opt for param in command.params for opt in getattr(param, "opts", [])}
    if path in NO_JSON:
        assert "--json" not in flags, f"{path} takes --json now: drop it from NO_JSON"
        return
    assert "--json" in flags, f"allocator {' '.join(path)} has no --json"


# -- local env ---------------------------------------------------------------------------


def fake_info(state_dir: Path, *, running: bool = True) -> ClusterInfo:
    pg = PostgresInfo(
        pid=4242 if running else None,
        port=15432,
        running=running,
        superuser="postgres",
        os_user="postgres",
        data_dir=state_dir / "pg" / "data",
        log=state_dir / "pg" / "postgres.log",
    )
    return ClusterInfo(
        state_dir=state_dir,
        zk_hosts="127.0.0.1:12181",
        database_url="postgresql://postgres@127.0.0.1:15432/allocator",
        zk_servers=(),
        postgres=pg,
        nodes=(),
        tick_ms=200,
        node_zk_hosts="127.0.0.1:12181/allocator",
        node_database_url="postgresql://allocator_node_login@127.0.0.1:15432/allocator",
        consumer_database_url="postgresql://allocator_app@127.0.0.1:15432/allocator",
        admin_token=ADMIN_TOKEN,
        zk_auth=ZK_AUTH,
    )


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A state folder whose cluster ``status`` reports :func:`fake_info` (nothing runs)."""
    state_dir = tmp_path / "state dir"  # a space: the exports must quote it
    state_dir.mkdir()
    monkeypatch.setattr(LocalCluster, "status", lambda self: fake_info(self.state_dir))
    return state_dir


def exports(text: str) -> tuple[dict[str, str], list[str]]:
    """What ``eval`` of ``local env``'s lines would set, and unset."""
    variables: dict[str, str] = {}
    unset: list[str] = []
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] == "unset":
            unset += words[1:]
            continue
        assert words[0] == "export", line
        assert len(words) == 2, line
        name, _, value = words[1].partition("=")
        variables[name] = value
    return variables, unset


def test_local_env_exports_paths_of_secret_files_never_values(fake_cluster: Path) -> None:
    result = invoke("local", "env", "--state-dir", str(fake_cluster))
    assert result.exit_code == 0, result.output
    for secret in (ZK_AUTH, ZK_AUTH.partition(":")[2], ADMIN_TOKEN):
        assert secret not in result.output
    variables, unset = exports(result.stdout)
    secrets = fake_cluster / "secrets"
    assert variables == {
        "ALLOCATOR_LOCAL_STATE_DIR": str(fake_cluster),
        "ALLOCATOR_ZOOKEEPER_HOSTS": "127.0.0.1:12181/allocator",
        "ALLOCATOR_POSTGRES_URL": "postgresql://allocator_node_login@127.0.0.1:15432/allocator",
        "ALLOCATOR_CLAIM_DATABASE_URL": "postgresql://allocator_app@127.0.0.1:15432/allocator",
        "ALLOCATOR_ZOOKEEPER_AUTH_FILE": str(secrets / "zookeeper-auth"),
        "ALLOCATOR_NODE_ADMIN_TOKEN_FILE": str(secrets / "admin-token"),
    }
    assert {"ALLOCATOR_CONFIG", "ALLOCATOR_ZOOKEEPER_AUTH", "ALLOCATOR_NODE_ADMIN_TOKEN"} <= set(
        unset
    )
    assert secrets.stat().st_mode & 0o777 == 0o700
    for path, value in (
        (secrets / "zookeeper-auth", ZK_AUTH),
        (secrets / "admin-token", ADMIN_TOKEN),
    ):
        assert path.read_text().strip() == value
        assert path.stat().st_mode & 0o777 == 0o600

    # What the exports set is a configuration that reaches the cluster as its nodes do.
    loaded = config_mod.load_config(env=variables)
    assert loaded.zookeeper.hosts == "127.0.0.1:12181/allocator"
    assert loaded.zookeeper.auth.get_secret_value() == ZK_AUTH
    assert loaded.node.admin_token.get_secret_value() == ADMIN_TOKEN
    assert loaded.postgres.url.get_secret_value().startswith("postgresql://allocator_node_login@")
    zkclient.check_node(loaded)  # authenticated: the cluster's ACL lets it in

    as_json = invoke("local", "env", "--json", env={"ALLOCATOR_LOCAL_STATE_DIR": str(fake_cluster)})
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.stdout)
    assert document["variables"] == variables
    assert document["unset"] == unset
    assert document["state_dir"] == str(fake_cluster)
    assert ADMIN_TOKEN not in as_json.output
    assert ZK_AUTH not in as_json.output


def test_local_env_of_a_stopped_cluster_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        LocalCluster, "status", lambda self: fake_info(self.state_dir, running=False)
    )
    result = invoke("local", "env", "--state-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "export ALLOCATOR_ZOOKEEPER_HOSTS=" in result.stdout
    assert result.stderr.startswith("note: the cluster in ")
    assert "allocator local up" in result.stderr


def test_local_env_without_a_cluster_is_one_error_line(tmp_path: Path) -> None:
    result = invoke("local", "env", "--state-dir", str(tmp_path / "nothing"))
    assert result.exit_code == errors.LocalClusterError.exit_code
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: no local cluster in ")


def test_local_down_json_without_a_cluster(tmp_path: Path) -> None:
    result = invoke("local", "down", "--json", "--state-dir", str(tmp_path / "nothing"))
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document == {
        "action": "down",
        "state_dir": str(tmp_path / "nothing"),
        "recorded": False,
        "purged": False,
    }


# -- secrets from files --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "secret"),
    [
        ("node.admin_token", ADMIN_TOKEN, ADMIN_TOKEN),
        ("zookeeper.auth", ZK_AUTH, ZK_AUTH.partition(":")[2]),
        (
            "postgres.url",
            "postgresql://app:Pg-Secret-Value-9@db1:5432/allocator",
            "Pg-Secret-Value-9",
        ),
    ],
)
def test_every_secret_can_come_from_a_file(
    tmp_path: Path, key: str, value: str, secret: str
) -> None:
    path = tmp_path / "secret"
    path.write_text(value + "\n")
    name = config_mod.secret_file_env(key)
    section, field = key.split(".")
    loaded = config_mod.load_config(env={name: str(path)})
    assert getattr(loaded.sections()[section], field).get_secret_value() == value

    result = invoke("config", "check", env={name: str(path)})
    assert result.exit_code == 0, result.output
    assert secret not in result.output

    both = invoke("config", "check", env={name: str(path), config_mod.env_name(key): value})
    assert both.exit_code == errors.ConfigError.exit_code
    assert both.stderr.splitlines() == [
        f"error: set {config_mod.env_name(key)} or {name}, not both"
    ]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read the file (No such file or directory)"),
        ("\n \n", "the file is empty"),
        ("first\nsecond\n", "the file must hold the secret on one line"),
        (b"\xff\xfe", "the file is not UTF-8 text"),
    ],
)
def test_a_bad_secret_file_is_one_line(
    tmp_path: Path, content: str | bytes | None, problem: str
) -> None:
    path = tmp_path / "token"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    name = "ALLOCATOR_NODE_ADMIN_TOKEN_FILE"
    result = invoke("status", env={name: str(path)})
    assert result.exit_code == errors.ConfigError.exit_code
    assert result.stderr.splitlines() == [f"error: {name}={path}: {problem}"]
    assert "second" not in result.output


def test_a_short_token_from_a_file_is_named_with_its_variable(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("too-short\n")
    result = invoke("config", "check", env={"ALLOCATOR_NODE_ADMIN_TOKEN_FILE": str(path)})
    assert result.exit_code == errors.ConfigError.exit_code
    assert "from ALLOCATOR_NODE_ADMIN_TOKEN_FILE)" in result.stderr
    assert "too-short" not in result.output


# -- watch, step-down and reap-session as JSON ---------------------------------------------------


class FakeStatus:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_json(self) -> dict[str, Any]:
        return self.data


def status_data(leader: str, epoch: int, queue: list[str], problem: str | None) -> dict[str, Any]:
    return {
        "leader": {"name": leader, "epoch": epoch},
        "contenders": [{"name": name} for name in queue],
        "election": {
            "unparsable": [{"znode": "n-1", "problem": problem}] if problem else [],
            "ignored": [],
        },
        "fence": {
            "generation": 0,
            "zookeeper_generation": 0,
            "ahead_of_zookeeper": False,
            "problem": None,
        },
        "pool": {"available_blocks": 10, "available_ids": 40960, "runway_s": 12.5},
    }


def test_watch_json_is_one_object_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [
        errors.ZooKeeperUnavailableError("no ZooKeeper server answered"),
        status_data("node-1", 7, ["node-1", "node-2"], "not JSON"),
        status_data("node-2", 9, ["node-2"], None),
    ]

    def gather(config: object, **kwargs: object) -> FakeStatus:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return FakeStatus(answer)

    monkeypatch.setattr(status_mod, "gather", gather)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # watch waits between reads
    result = invoke("watch", "--json", "--duration", "200ms")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert all({"time", "event"} <= line.keys() for line in lines)
    assert all(line["time"].endswith("+00:00") for line in lines)
    events = [line["event"] for line in lines]
    assert events[0] == "unavailable"
    assert "no ZooKeeper server" in lines[0]["error"]
    leaders = [
        (line["leader"], line["epoch"], line["queue"])
        for line in lines
        if line["event"] == "leader"
    ]
    assert leaders == [("node-1", 7, ["node-1", "node-2"]), ("node-2", 9, ["node-2"])]
    elections = [line for line in lines if line["event"] == "election"]
    assert elections[0]["unparsable"] == [{"znode": "n-1", "problem": "not JSON"}]
    assert elections[-1]["unparsable"] == []  # the problem went away: said once
    assert [line["generation"] for line in lines if line["event"] == "fence"] == [0]
    assert {"available_blocks": 10, "available_ids": 40960, "runway_s": 12.5}.items() <= next(
        line for line in lines if line["event"] == "pool"
    ).items()


@pytest.fixture
def leader_admin() -> Iterator[tuple[str, list[str]]]:
    """A stand-in for the leader's admin server: answers POST /step-down like a node."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps({"stepping_down": True}).encode()
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_step_down_json_with_the_token_from_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, leader_admin: tuple[str, list[str]]
) -> None:
    url, seen = leader_admin
    leader = Contender("n-0000000001", 1, Identity("node-1", "host-a", 123, url))
    monkeypatch.setattr(status_mod, "read_contenders_once", lambda config: [leader])
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    result = invoke("step-down", "--json", env={"ALLOCATOR_NODE_ADMIN_TOKEN_FILE": str(token_file)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "leader": "node-1",
        "admin_url": url,
        "stepping_down": True,
    }
    assert seen == [f"Bearer {ADMIN_TOKEN}"]
    assert ADMIN_TOKEN not in result.output


def test_step_down_without_a_token_names_the_file_variable() -> None:
    result = invoke("step-down", "--json")
    assert result.exit_code == errors.ConfigError.exit_code
    [line] = result.stderr.splitlines()
    assert "ALLOCATOR_NODE_ADMIN_TOKEN_FILE" in line


def test_reap_session_json(tmp_path: Path) -> None:
    state_dir = tmp_path / "node-1"
    env = {"ALLOCATOR_NODE_STATE_DIR": str(state_dir), "ALLOCATOR_ZOOKEEPER_INSECURE": "true"}
    result = invoke("reap-session", "--name", "node-1", "--json", env=env)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout.splitlines()[-1])
    assert document["action"] == "nothing"
    assert document["reason"]


# -- the README ---------------------------------------------------------------------------------


def readme_config() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1]
    match = re.search(r"```toml\n(.*?)```", section, flags=re.DOTALL)
    assert match, "no TOML example under ## Configuration in README.md"
    return match.group(1)


def login_roles() -> set[str]:
    """The roles docs/sql.md's table says log in."""
    roles = set()
    for line in (ROOT / "docs" / "sql.md").read_text().splitlines():
        cells = [cell.strip(" `") for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[1] == "yes":
            roles.add(cells[0])
    return roles


def test_the_readme_example_configuration_works_as_written(tmp_path: Path) -> None:
    example = tmp_path / "allocator.toml"
    example.write_text(readme_config())
    tomllib.loads(example.read_text())
    # The example keeps zookeeper.auth out of the file: from a file named by the variable.
    auth = tmp_path / "zookeeper-auth"
    auth.write_text(ZK_AUTH + "\n")
    env = {"ALLOCATOR_ZOOKEEPER_AUTH_FILE": str(auth)}
    loaded = config_mod.load_config(example, env=env)
    zkclient.check_node(loaded)  # what `allocator run` checks before it starts
    assert not zkclient.warnings(loaded)

    user = urlsplit(loaded.postgres.url.get_secret_value()).username
    assert user in login_roles(), f"postgres.url logs in as {user}, which docs/sql.md says cannot"

    result = invoke("run", "--check", "--config", str(example), env=env)
    assert result.exit_code == 0, result.output
    assert ZK_AUTH.partition(":")[2] not in result.output
