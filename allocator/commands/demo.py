"""``allocator demo``: what ``make demo`` runs.

Rules: uses the one cluster manager (:class:`LocalCluster`) in its own state folder, so it
never touches a cluster started with ``allocator local up``; always stops every process it
started, by pid, on success, on error, on Ctrl-C and on SIGTERM (``--keep`` leaves it up on
purpose). Prints what it did and how long each step took; asserts nothing about speed.

What it shows at this stage: the embedded cluster coming up (3 ZooKeeper servers, one
PostgreSQL, schema migrated), its status, the SQL pool as a consumer sees it, ZooKeeper
keeping quorum while one server is down, and a clean shutdown with no process left.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from allocator.commands.local import render
from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive

if TYPE_CHECKING:
    from allocator.local.cluster import ClusterInfo

DEFAULT_STATE_DIR = Path(".run/demo")
ZK_TIMEOUT_S = 15.0


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@click.command("demo")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    help="State folder of the demo cluster.",
)
@click.option("--zk", "zk_servers", type=click.Choice(["1", "3"]), default="3")
@click.option(
    "--keep", is_flag=True, help="Leave the cluster running (stop: allocator local down)."
)
def demo(state_dir: Path, zk_servers: str, keep: bool) -> None:
    """Run the embedded cluster, show it working, and stop it."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    # The demo kills a ZooKeeper server on purpose; kazoo's reconnect warnings are noise here.
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    cluster = LocalCluster(state_dir, zk_servers=int(zk_servers))
    info: ClusterInfo | None = None
    try:
        started = time.monotonic()
        _step(f"starting {zk_servers} ZooKeeper server(s) and PostgreSQL under {state_dir}")
        info = cluster.up(migrate=True)
        _step(f"ready in {time.monotonic() - started:.1f} s; schema migrated")
        for line in render(info):
            click.echo(f"  {line}")
        _show_schema(info)
        if len(info.zk_servers) == 3:
            _show_quorum_survives(cluster, info)
        if keep:
            _step(f"left running; stop it with: allocator local down --state-dir {state_dir}")
            return
    except KeyboardInterrupt:
        _step("interrupted")
    finally:
        if not keep or info is None:
            _stop(cluster, info)


def _step(message: str) -> None:
    click.echo(f"[demo] {message}")


def _show_schema(info: ClusterInfo) -> None:
    import psycopg

    from allocator import migrate

    revision = migrate.current_revision(info.database_url)
    with psycopg.connect(info.database_url) as conn:
        status = conn.execute(
            "SELECT available_blocks, high_water_id, epoch, holder FROM allocator.pool_status"
        ).fetchone()
        roles = conn.execute(
            "SELECT string_agg(rolname, ', ' ORDER BY rolname) FROM pg_roles"
            " WHERE rolname LIKE 'allocator\\_%'"
        ).fetchone()
    _step(f"schema revision {revision}; roles: {roles[0] if roles else '-'}")
    if status:
        blocks, mark, epoch, holder = status
        _step(
            f"pool as a consumer sees it: {blocks} blocks, high-water mark {mark}, "
            f"fence epoch {epoch} ({holder or 'no leader yet: `allocator run` comes next'})"
        )


def _show_quorum_survives(cluster: LocalCluster, info: ClusterInfo) -> None:
    from kazoo.client import KazooClient

    victim = info.zk_servers[-1].id
    _step(f"killing ZooKeeper server {victim} (SIGKILL by pid)")
    cluster.stop_zk(victim)
    client = KazooClient(hosts=info.zk_hosts, timeout=ZK_TIMEOUT_S)
    try:
        client.start(timeout=ZK_TIMEOUT_S)
        path = client.create(f"/demo/quorum-{uuid.uuid4().hex[:8]}", b"ok", makepath=True)
        _step(f"2 of 3 servers still form a quorum: wrote {path}")
        client.delete("/demo", recursive=True)
    finally:
        client.stop()
        client.close()
    cluster.start_zk(victim)
    _step(f"ZooKeeper server {victim} restarted")


def _stop(cluster: LocalCluster, info: ClusterInfo | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the cleanup short
    _step("stopping every process the demo started")
    started: list[int] = []
    if cluster.exists():
        current = cluster.status()
        started = [s.pid for s in current.zk_servers if s.pid] + (
            [current.postgres.pid] if current.postgres.pid else []
        )
    cluster.down()
    left = [pid for pid in started if is_pid_alive(pid)]
    shown = " ".join(str(pid) for pid in started) or "none"
    _step(f"stopped pids: {shown}; processes left running: {len(left)}")
