"""``allocator local``: the embedded cluster (ZooKeeper ensemble + PostgreSQL on 127.0.0.1).

Rules: a thin layer over :class:`allocator.local.cluster.LocalCluster`; every subcommand
takes ``--state-dir`` (default ``.run``, env ``ALLOCATOR_LOCAL_STATE_DIR``), so several
clusters run side by side and any shell can inspect or stop one. ``up`` and ``status`` print
a short table, or with ``--json`` one object with DESIGN §10's keys. The drill commands
(``zk-stop``/``zk-start``, ``pg-stop``/``pg-start``) act on one server by its recorded pid.
Errors are :class:`allocator.errors.AllocatorError` subclasses: one line, non-zero exit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from allocator.local import postgres
from allocator.local.cluster import ClusterInfo, LocalCluster

STATE_DIR_ENV = "ALLOCATOR_LOCAL_STATE_DIR"
DEFAULT_STATE_DIR = Path(".run")


def _state_dir_option(func: Any) -> Any:
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_STATE_DIR,
        envvar=STATE_DIR_ENV,
        show_envvar=True,
        help="State folder of the cluster; one folder per cluster.",
    )(func)


def _json_option(func: Any) -> Any:
    return click.option(
        "--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object."
    )(func)


@click.group("local")
def local() -> None:
    """The embedded cluster: ZooKeeper and PostgreSQL on 127.0.0.1 under a state folder."""


@local.command("up")
@click.option(
    "--zk",
    "zk_servers",
    type=click.IntRange(1, 7),
    default=None,
    show_envvar=True,
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
    state_dir: Path,
    as_json: bool,
    migrate: bool,
) -> None:
    """Start the cluster (or what of it is not running) and wait until it serves."""
    cluster = LocalCluster(
        state_dir,
        zk_servers,
        tick_ms=tick_ms,
        pg_port=pg_port,
        zk_client_ports=zk_ports or None,
    )
    _emit(cluster.up(migrate=migrate), as_json)


@local.command("status")
@_state_dir_option
@_json_option
def status(state_dir: Path, as_json: bool) -> None:
    """Show the cluster's servers, ports, pids and whether they run."""
    _emit(LocalCluster(state_dir).status(), as_json)


@local.command("down")
@_state_dir_option
@click.option(
    "--purge",
    is_flag=True,
    show_envvar=True,
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


@local.command("pg-start")
@_state_dir_option
def pg_start(state_dir: Path) -> None:
    """Start PostgreSQL on its recorded port and wait until it accepts connections."""
    LocalCluster(state_dir).start_postgres()
    click.echo("PostgreSQL running")


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
    lines += [
        f"PostgreSQL   pid {pid(pg.pid)}, port {pg.port}, {state} (OS user {pg.os_user})",
        f"database     {info.database_url}",
        f"nodes        {len(info.nodes) or 'none'}",
    ]
    lines += [
        f"  {n.get('name', '?')}  pid {pid(n.get('pid'))}  {n.get('admin_url', '')}"
        for n in info.nodes
    ]
    return lines
