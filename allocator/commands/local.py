"""``allocator local``: the embedded cluster (ZooKeeper ensemble, PostgreSQL, nodes on 127.0.0.1),
a thin layer over :class:`allocator.local.cluster.LocalCluster` (docs/design.md §8). Every
subcommand takes ``--state-dir``, so several clusters run side by side; nothing prints a
secret (the URLs carry none, ``env`` exports the secrets as file paths).
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path
from typing import Any

import click

from allocator.commands import options
from allocator.commands.options import (
    EMBEDDED_CLUSTER,
    NO_LOCAL_CLUSTER,
    OK,
    OTHER,
    USAGE,
    exit_codes,
)
from allocator.core import durations
from allocator.core.errors import UsageError
from allocator.core.exits import Exit
from allocator.local import client_env, postgres, zookeeper
from allocator.local import nodes as nodes_mod
from allocator.local.cluster import MAX_NODES, LocalCluster
from allocator.local.info import ClusterInfo, NodeInfo

STATE_DIR_ENV = "ALLOCATOR_LOCAL_STATE_DIR"
DEFAULT_STATE_DIR = Path(".run")


_state_dir_option = options.state_dir_option(
    DEFAULT_STATE_DIR,
    help="State folder of the cluster; one folder per cluster.",
    envvar=STATE_DIR_ENV,
)
_json_option = options.json_option(help="Print one JSON object.")


@click.group("local", epilog=exit_codes(*options.GROUP_CODES))
def local() -> None:
    """The embedded cluster: ZooKeeper and PostgreSQL on 127.0.0.1 under a state folder."""


@local.command(
    "up",
    epilog=exit_codes(
        (Exit.OK, "the servers serve (schema migrated unless --no-migrate), the nodes started"),
        USAGE,
        (
            Exit.FAILED,
            "the record does not allow the request (another --zk or --tick than recorded)",
        ),
        OTHER,
        *EMBEDDED_CLUSTER,
    ),
)
@options.zk_servers_option
@options.duration_option(
    "--tick",
    kind=options.Duration(step=options.MILLISECOND),
    default=None,
    into="tick_ms",
    convert=durations.milliseconds,
    old_flag="--tick-ms",
    old_unit="ms",
    help=f"ZooKeeper tickTime of a new cluster. [default: {zookeeper.DEFAULT_TICK_MS}ms]",
)
@click.option(
    "--pg-port",
    type=click.IntRange(1, 65535),
    default=None,
    show_envvar=True,
    help="PostgreSQL port of a new cluster. [default: a free port]",
)
@click.option(
    "--zk-port",
    "zk_ports",
    type=click.IntRange(1, 65535),
    multiple=True,
    show_envvar=True,
    help="ZooKeeper client port of a new cluster, once per server. [default: free ports]",
)
@options.nodes_option(
    0,
    MAX_NODES,
    None,
    help=f"Allocator nodes to run under the supervisor; 0 for none. [default: "
    f"{nodes_mod.DEFAULT_NODES} for a new cluster, else as recorded]",
)
@options.session_timeout_option(
    None,
    help=f"The nodes' ZooKeeper session timeout. [default: "
    f"{nodes_mod.DEFAULT_SESSION_TIMEOUT_MS}ms, or as recorded]",
)
@options.typed_option(
    "--node-command",
    default=None,
    help="Command line of each node, split like a shell would. [default: "
    "`<this python> -m allocator.cli run`, or as recorded]",
)
@click.option(
    "--node-env",
    "node_env",
    multiple=True,
    metavar="NAME=VALUE",
    show_envvar=True,
    callback=options.no_secret_pairs,
    help="An extra environment variable for every node (e.g. ALLOCATOR_POOL_MIN_BLOCKS=8); "
    "repeatable; replaces the recorded set when given. No secret here: a secret variable "
    "(ALLOCATOR_ZOOKEEPER_AUTH, ...) comes through ALLOCATOR_LOCAL_UP_NODE_ENV.",
)
@click.option(
    "--pg-standby",
    is_flag=True,
    default=False,
    show_envvar=True,
    help="Add a streaming standby that every commit waits for (synchronous replication), "
    "or rebuild the one a failover retired; `pg-failover` promotes it.",
)
@_state_dir_option
@_json_option
@click.option(
    "--migrate/--no-migrate",
    default=True,
    show_envvar=True,
    help="Apply the schema migrations once PostgreSQL is up.",
)
def up(
    zk_servers: int | None,
    tick_ms: int | None,
    pg_port: int | None,
    zk_ports: tuple[int, ...],
    nodes: int | None,
    session_timeout_ms: int | None,
    node_command: str | None,
    node_env: tuple[str, ...],
    pg_standby: bool,
    state_dir: Path,
    as_json: bool,
    migrate: bool,
) -> None:
    """Start the cluster (or what of it is not running), wait until it serves, start nodes."""
    try:
        command = shlex.split(node_command) if node_command is not None else None
    except ValueError as exc:  # an unclosed quote or a trailing backslash
        raise UsageError(f"--node-command cannot be split like a shell would: {exc}") from None
    if command is not None and not command:
        raise UsageError("--node-command is empty")
    cluster = LocalCluster(
        state_dir,
        zk_servers,
        tick_ms=tick_ms,
        pg_port=pg_port,
        zk_client_ports=zk_ports or None,
        node_command=command,
        node_env=_parse_env(node_env) if node_env else None,
        session_timeout_ms=session_timeout_ms,
        pg_standby=pg_standby,
    )
    if nodes is None and not cluster.exists():
        nodes = nodes_mod.DEFAULT_NODES
    info = cluster.up(migrate=migrate, nodes=nodes)
    client_env.client_env(info)  # the secret files `env` exports, fresh for a new cluster
    _emit(info, as_json)


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise UsageError(f"--node-env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


@local.command("status", epilog=exit_codes(OK, USAGE, NO_LOCAL_CLUSTER, OTHER))
@_state_dir_option
@_json_option
def status(state_dir: Path, as_json: bool) -> None:
    """Show the cluster's servers and nodes: ports, pids, states, restarts."""
    _emit(LocalCluster(state_dir).status(), as_json)


@local.command(
    "env",
    epilog=exit_codes(
        (Exit.OK, "the exports printed (a note on stderr when the cluster is not running)"),
        USAGE,
        NO_LOCAL_CLUSTER,
        (Exit.FAILED, "the secret files cannot be written"),
        OTHER,
    ),
)
@_state_dir_option
@_json_option
def env(state_dir: Path, as_json: bool) -> None:
    """Print the ALLOCATOR_* exports that point the CLI at the cluster.

    eval "$(allocator local env)" lets status, watch, claim and step-down reach it: the
    ZooKeeper hosts with the nodes' chroot, the nodes' and a consumer's database URLs, and
    the secrets as paths of files that hold them (ALLOCATOR_ZOOKEEPER_AUTH_FILE,
    ALLOCATOR_NODE_ADMIN_TOKEN_FILE), never as values. It also unsets the variables that
    would win over them (ALLOCATOR_CONFIG, ...).
    """
    found = client_env.client_env(LocalCluster(state_dir).status())
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=2))
        return
    for line in found.shell():
        click.echo(line)
    if not found.running:
        click.echo(
            f"note: the cluster in {found.state_dir} is not running: "
            f"allocator local up --state-dir {found.state_dir}",
            err=True,
        )


@local.command(
    "down",
    epilog=exit_codes(
        (Exit.OK, "every recorded process stopped (or no cluster recorded: nothing to stop)"),
        USAGE,
        (Exit.FAILED, "a process could not be stopped; it stays recorded: run down again"),
        OTHER,
    ),
)
@_state_dir_option
@options.typed_option(
    "--purge",
    is_flag=True,
    help="Also delete the cluster's data (ZooKeeper and PostgreSQL folders, the record).",
)
@_json_option
def down(state_dir: Path, purge: bool, as_json: bool) -> None:
    """Stop every process of the cluster by its recorded pid (data kept unless --purge)."""
    cluster = LocalCluster(state_dir)
    had_record = cluster.exists()
    cluster.down(purge=purge)
    if not had_record:
        text = f"no cluster recorded in {cluster.state_dir}; nothing to stop"
    else:
        text = f"stopped the cluster in {cluster.state_dir}" + ("; data purged" if purge else "")
    _done(as_json, text, "down", cluster, recorded=had_record, purged=purge and had_record)


@local.command("zk-stop", epilog=exit_codes(OK, USAGE, NO_LOCAL_CLUSTER, OTHER))
@click.argument("server_id", metavar="ID", type=int)
@click.option(
    "--graceful",
    is_flag=True,
    show_envvar=True,
    help="SIGTERM instead of SIGKILL (the default simulates a crash).",
)
@_state_dir_option
@_json_option
def zk_stop(server_id: int, graceful: bool, state_dir: Path, as_json: bool) -> None:
    """Stop ZooKeeper server ID (a drill)."""
    cluster = LocalCluster(state_dir)
    cluster.stop_zk(server_id, kill=not graceful)
    sent = "SIGTERM" if graceful else "SIGKILL"
    text = f"ZooKeeper server {server_id} stopped ({sent})"
    _done(as_json, text, "zk-stop", cluster, zk_server=server_id, signal=sent, running=False)


@local.command("zk-start", epilog=exit_codes(OK, USAGE, NO_LOCAL_CLUSTER, OTHER, *EMBEDDED_CLUSTER))
@click.argument("server_id", metavar="ID", type=int)
@_state_dir_option
@_json_option
def zk_start(server_id: int, state_dir: Path, as_json: bool) -> None:
    """Restart ZooKeeper server ID on its recorded ports."""
    cluster = LocalCluster(state_dir)
    cluster.start_zk(server_id)
    text = f"ZooKeeper server {server_id} running"
    _done(as_json, text, "zk-start", cluster, zk_server=server_id, running=True)


@local.command("pg-stop", epilog=exit_codes(OK, USAGE, NO_LOCAL_CLUSTER, OTHER))
@click.option(
    "--mode",
    type=click.Choice(postgres.STOP_MODES),
    default="fast",
    show_default=True,
    show_envvar=True,
    help="fast: SIGINT (clean); immediate: SIGQUIT (crash, recovery at next start); "
    "smart: SIGTERM (waits for clients).",
)
@_state_dir_option
@_json_option
def pg_stop(mode: postgres.StopMode, state_dir: Path, as_json: bool) -> None:
    """Stop PostgreSQL (a drill)."""
    cluster = LocalCluster(state_dir)
    cluster.stop_postgres(mode)
    _done(as_json, f"PostgreSQL stopped ({mode})", "pg-stop", cluster, mode=mode, running=False)


@local.command(
    "pg-failover",
    epilog=exit_codes(
        (Exit.OK, "the standby is the primary now"),
        (Exit.USAGE, "no standby to promote (local up --pg-standby adds one)"),
        USAGE,
        (Exit.FAILED, "the standby is not running, or the primary did not stop"),
        NO_LOCAL_CLUSTER,
        OTHER,
    ),
)
@_state_dir_option
@_json_option
def pg_failover(state_dir: Path, as_json: bool) -> None:
    """Kill the PostgreSQL primary (stop -m immediate) and promote its standby (a drill)."""
    info = LocalCluster(state_dir).pg_failover()
    if as_json:
        _emit(info, as_json)
        return
    click.echo(f"PostgreSQL primary killed; the standby on port {info.postgres.port} promoted")


@local.command("pg-start", epilog=exit_codes(OK, USAGE, NO_LOCAL_CLUSTER, OTHER, *EMBEDDED_CLUSTER))
@_state_dir_option
@_json_option
def pg_start(state_dir: Path, as_json: bool) -> None:
    """Start PostgreSQL on its recorded port and wait until it accepts connections."""
    cluster = LocalCluster(state_dir)
    cluster.start_postgres()
    _done(as_json, "PostgreSQL running", "pg-start", cluster, running=True)


_NODE_CODES = (
    OK,
    (Exit.USAGE, "no node NAME in this cluster"),
    USAGE,
    (Exit.FAILED, "the node supervisor is not running (local up starts it)"),
    NO_LOCAL_CLUSTER,
    OTHER,
)


@local.command("node-stop", epilog=exit_codes(*_NODE_CODES))
@click.argument("name", metavar="NAME")
@click.option(
    "--kill",
    is_flag=True,
    show_envvar=True,
    help="SIGKILL instead of SIGTERM (a crash instead of a graceful stop).",
)
@_state_dir_option
@_json_option
def node_stop(name: str, kill: bool, state_dir: Path, as_json: bool) -> None:
    """Stop node NAME and keep it stopped until node-start (or up)."""
    cluster = LocalCluster(state_dir)
    node = cluster.stop_node(name, kill=kill)
    sent = "SIGKILL" if kill else "SIGTERM"
    text = f"{name} stopped ({sent}); {_exit_text(node)}"
    _done(as_json, text, "node-stop", cluster, node=node.to_json(), signal=sent)


@local.command("node-start", epilog=exit_codes(*_NODE_CODES))
@click.argument("name", metavar="NAME")
@_state_dir_option
@_json_option
def node_start(name: str, state_dir: Path, as_json: bool) -> None:
    """Start node NAME again after node-stop."""
    cluster = LocalCluster(state_dir)
    node = cluster.start_node(name)
    text = f"{name} running, pid {node.pid}"
    _done(as_json, text, "node-start", cluster, node=node.to_json())


@local.command(
    "node-signal",
    epilog=exit_codes(
        OK,
        (Exit.USAGE, "no node NAME in this cluster"),
        USAGE,
        (Exit.FAILED, "the node is not running, or exited before the signal"),
        NO_LOCAL_CLUSTER,
        OTHER,
    ),
)
@click.argument("name", metavar="NAME")
@click.argument(
    "signal_name",
    metavar="SIGNAL",
    type=click.Choice(nodes_mod.DRILL_SIGNALS, case_sensitive=False),
)
@_state_dir_option
@_json_option
def node_signal(name: str, signal_name: str, state_dir: Path, as_json: bool) -> None:
    """Send SIGNAL to node NAME (a drill). After SIGKILL or SIGTERM the supervisor restarts
    it; after SIGSTOP it stays paused until SIGCONT."""
    cluster = LocalCluster(state_dir)
    sent = signal_name.upper()
    pid = cluster.signal_node(name, sent)
    text = f"{sent} sent to {name} (pid {pid})"
    _done(as_json, text, "node-signal", cluster, name=name, signal=sent, pid=pid)


def _done(as_json: bool, text: str, action: str, cluster: LocalCluster, **facts: Any) -> None:
    """One line for people, or one JSON object: ``action``, ``state_dir`` and ``facts``."""
    if as_json:
        document = {"action": action, "state_dir": str(cluster.state_dir), **facts}
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(text)


def _exit_text(node: NodeInfo) -> str:
    """``last exit 3``, ``last exit SIGKILL`` or ``no exit recorded``."""
    code = node.last_exit_code
    if code is None:
        return "no exit recorded"
    return f"last exit {_exit_label(code)}"


def _exit_label(code: int | None) -> str:
    """``0``, ``3``, ``SIGKILL``: an exit code, or the signal that ended the process."""
    if code is None:
        return "-"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return str(code)


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _emit(info: ClusterInfo, as_json: bool) -> None:
    """What ``up`` and ``status`` print: the table, or one object with docs/design.md §10's
    keys (the admin token and ZooKeeper identity are never in it)."""
    if as_json:
        click.echo(json.dumps(info.to_json(), indent=2))
        return
    for line in render(info):
        click.echo(line)


def render(info: ClusterInfo) -> list[str]:
    """The human-readable table of ``up`` and ``status``."""

    def pid(value: int | None) -> str:
        return "-" if value is None else str(value)

    pg = info.postgres
    lines = [
        f"state dir    {info.state_dir}",
        f"ZooKeeper    {info.zk_hosts}  (tick {info.tick_ms} ms)",
        f"  {'id':<4}{'pid':<9}{'client':<8}{'peer':<8}{'election':<10}mode",
    ]
    lines += [
        f"  {s.id:<4}{pid(s.pid):<9}{s.client_port:<8}{s.peer_port:<8}{s.election_port:<10}"
        + (s.mode or ("no quorum" if s.running else "stopped"))
        for s in info.zk_servers
    ]
    state = "running" if pg.running else "stopped"
    lines.append(f"PostgreSQL   pid {pid(pg.pid)}, port {pg.port}, {state} (OS user {pg.os_user})")
    if len(info.pg_servers) > 1:
        lines.append(f"  {'server':<12}{'role':<10}{'pid':<9}{'port':<8}{'recovery':<10}sync")
        lines += [
            f"  {s.name:<12}{s.role:<10}{pid(s.pid):<9}{s.port:<8}"
            f"{_yes_no(s.in_recovery):<10}{s.sync_state or '-'}"
            for s in info.pg_servers
        ]
    lines += [
        f"database     {info.database_url}  (superuser)",
        f"  node role  {info.node_database_url}",
        f"  app role   {info.consumer_database_url}",
        f"nodes        {len(info.nodes) or 'none'}"
        + (
            f"  (ZooKeeper {info.node_zk_hosts}, session timeout {info.session_timeout_ms} ms, "
            f"supervisor pid {pid(info.supervisor_pid)})"
            if info.nodes
            else ""
        ),
    ]
    if info.nodes:
        lines.append(f"  {'name':<10}{'pid':<9}{'state':<12}{'admin':<24}{'restarts':<10}last exit")
    lines += [
        f"  {n.name:<10}{pid(n.pid):<9}{n.state:<12}{n.admin_url:<24}{n.restarts:<10}"
        + _exit_label(n.last_exit_code)
        for n in info.nodes
    ]
    return lines
