"""``allocator local``: the embedded cluster (ZooKeeper ensemble, PostgreSQL, nodes on 127.0.0.1).

Rules: a thin layer over :class:`allocator.local.cluster.LocalCluster`; every subcommand
takes ``--state-dir`` (default ``.run``, env ``ALLOCATOR_LOCAL_STATE_DIR``), so several
clusters run side by side and any shell can inspect or stop one. ``up`` and ``status`` print
a short table, or with ``--json`` one object with DESIGN §10's keys. Neither prints a
secret: the cluster's URLs carry no password (``trust`` on loopback) and the nodes' admin
token and ZooKeeper identity stay in ``<state>/cluster.json`` (mode 0600: ``admin_token``,
``zk_auth``), where a shell that needs them reads them. ``up --node-env`` refuses a secret
variable on the command line; ``down --purge`` and ``up --node-command`` are never read from
the environment (:mod:`allocator.commands.options`). ``up`` runs 3 nodes for a new cluster
(``--nodes``; as recorded for an existing one). The drill commands act on one process by
its recorded pid: ``zk-stop``/``zk-start``, ``pg-stop``/``pg-start``,
``node-stop``/``node-start`` (through the node supervisor, which then neither restarts nor
forgets the node) and ``node-signal``.
Errors are :class:`allocator.errors.AllocatorError` subclasses: one line, non-zero exit.
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import click

from allocator.commands import options
from allocator.errors import UsageError
from allocator.local import nodes as nodes_mod
from allocator.local import postgres
from allocator.local.cluster import MAX_NODES, ClusterInfo, LocalCluster, NodeInfo

STATE_DIR_ENV = "ALLOCATOR_LOCAL_STATE_DIR"
DEFAULT_STATE_DIR = Path(".run")


_state_dir_option = options.state_dir_option(
    DEFAULT_STATE_DIR,
    help="State folder of the cluster; one folder per cluster.",
    envvar=STATE_DIR_ENV,
)
_json_option = options.json_option(help="Print one JSON object.")


@click.group("local")
def local() -> None:
    """The embedded cluster: ZooKeeper and PostgreSQL on 127.0.0.1 under a state folder."""


@local.command("up")
@options.zk_servers_option(
    None,
    help="ZooKeeper servers, 1 or 3 (any odd number up to 7). [default: 3 for a new "
    "cluster, else as recorded]",
)
@click.option(
    "--tick-ms",
    type=click.IntRange(min=1),
    default=None,
    show_envvar=True,
    help="ZooKeeper tickTime of a new cluster. [default: 200]",
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
    f"{nodes_mod.DEFAULT_SESSION_TIMEOUT_MS}, or as recorded]",
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
    _emit(cluster.up(migrate=migrate, nodes=nodes), as_json)


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise UsageError(f"--node-env {pair!r}: expected NAME=VALUE")
        env[name] = value
    return env


@local.command("status")
@_state_dir_option
@_json_option
def status(state_dir: Path, as_json: bool) -> None:
    """Show the cluster's servers and nodes: ports, pids, states, restarts."""
    _emit(LocalCluster(state_dir).status(), as_json)


@local.command("down")
@_state_dir_option
@options.typed_option(
    "--purge",
    is_flag=True,
    help="Also delete the cluster's data (ZooKeeper and PostgreSQL folders, the record).",
)
def down(state_dir: Path, purge: bool) -> None:
    """Stop every process of the cluster by its recorded pid (data kept unless --purge)."""
    cluster = LocalCluster(state_dir)
    had_record = cluster.exists()
    cluster.down(purge=purge)
    if not had_record:
        click.echo(f"no cluster recorded in {cluster.state_dir}; nothing to stop")
    else:
        click.echo(
            f"stopped the cluster in {cluster.state_dir}" + ("; data purged" if purge else "")
        )


@local.command("zk-stop")
@click.argument("server_id", metavar="ID", type=int)
@click.option(
    "--graceful",
    is_flag=True,
    show_envvar=True,
    help="SIGTERM instead of SIGKILL (the default simulates a crash).",
)
@_state_dir_option
def zk_stop(server_id: int, graceful: bool, state_dir: Path) -> None:
    """Stop ZooKeeper server ID (a drill)."""
    LocalCluster(state_dir).stop_zk(server_id, kill=not graceful)
    click.echo(f"ZooKeeper server {server_id} stopped ({'SIGTERM' if graceful else 'SIGKILL'})")


@local.command("zk-start")
@click.argument("server_id", metavar="ID", type=int)
@_state_dir_option
def zk_start(server_id: int, state_dir: Path) -> None:
    """Restart ZooKeeper server ID on its recorded ports."""
    LocalCluster(state_dir).start_zk(server_id)
    click.echo(f"ZooKeeper server {server_id} running")


@local.command("pg-stop")
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
def pg_stop(mode: postgres.StopMode, state_dir: Path) -> None:
    """Stop PostgreSQL (a drill)."""
    LocalCluster(state_dir).stop_postgres(mode)
    click.echo(f"PostgreSQL stopped ({mode})")


@local.command("pg-failover")
@_state_dir_option
@_json_option
def pg_failover(state_dir: Path, as_json: bool) -> None:
    """Kill the PostgreSQL primary (stop -m immediate) and promote its standby (a drill)."""
    info = LocalCluster(state_dir).pg_failover()
    if as_json:
        _emit(info, as_json)
        return
    click.echo(f"PostgreSQL primary killed; the standby on port {info.postgres.port} promoted")


@local.command("pg-start")
@_state_dir_option
def pg_start(state_dir: Path) -> None:
    """Start PostgreSQL on its recorded port and wait until it accepts connections."""
    LocalCluster(state_dir).start_postgres()
    click.echo("PostgreSQL running")


@local.command("node-stop")
@click.argument("name", metavar="NAME")
@click.option(
    "--kill",
    is_flag=True,
    show_envvar=True,
    help="SIGKILL instead of SIGTERM (a crash instead of a graceful stop).",
)
@_state_dir_option
def node_stop(name: str, kill: bool, state_dir: Path) -> None:
    """Stop node NAME and keep it stopped until node-start (or up)."""
    node = LocalCluster(state_dir).stop_node(name, kill=kill)
    click.echo(f"{name} stopped ({'SIGKILL' if kill else 'SIGTERM'}); {_exit_text(node)}")


@local.command("node-start")
@click.argument("name", metavar="NAME")
@_state_dir_option
def node_start(name: str, state_dir: Path) -> None:
    """Start node NAME again after node-stop."""
    node = LocalCluster(state_dir).start_node(name)
    click.echo(f"{name} running, pid {node.pid}")


@local.command("node-signal")
@click.argument("name", metavar="NAME")
@click.argument(
    "signal_name",
    metavar="SIGNAL",
    type=click.Choice(nodes_mod.DRILL_SIGNALS, case_sensitive=False),
)
@_state_dir_option
def node_signal(name: str, signal_name: str, state_dir: Path) -> None:
    """Send SIGNAL to node NAME (a drill). After SIGKILL or SIGTERM the supervisor restarts
    it; after SIGSTOP it stays paused until SIGCONT."""
    pid = LocalCluster(state_dir).signal_node(name, signal_name.upper())
    click.echo(f"{signal_name.upper()} sent to {name} (pid {pid})")


def _exit_text(node: NodeInfo) -> str:
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
