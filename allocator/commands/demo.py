"""``allocator demo``: what ``make demo`` runs — the whole system, a failover, a summary. It uses
the one cluster manager in its own state folder (never a cluster of ``allocator local up``),
prints what happens and how long it took, and asserts nothing about speed.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from allocator.commands.local import render
from allocator.commands.options import (
    EMBEDDED_CLUSTER,
    OTHER,
    SECOND,
    USAGE,
    Duration,
    duration_option,
    exit_codes,
    zk_servers_option,
)
from allocator.core.errors import AllocatorError
from allocator.core.exits import Exit
from allocator.local.cluster import LocalCluster
from allocator.local.processes import is_pid_alive

if TYPE_CHECKING:
    import psycopg
    from kazoo.client import KazooClient

    from allocator.core.verify import Claim, Violation
    from allocator.drill.consumers import Consumers
    from allocator.local.info import ClusterInfo

DEFAULT_STATE_DIR = Path(".run/demo")
CONSUMER = "demo-consumer-1"
VIEW_INTERVAL_S = 0.5
CLAIM_PAUSE_S = 0.01
LEADER_DEADLINE_S = 60.0
ELECTION_PATH = "/election"
DEMO_NODE_ENV = {"ALLOCATOR_POOL_MIN_BLOCKS": "1000", "ALLOCATOR_POOL_SAMPLE_INTERVAL_S": "1"}


class DemoError(AllocatorError):
    """The demo's run broke an invariant (the summary names each violation)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@click.command(
    "demo",
    epilog=exit_codes(
        (Exit.OK, "the story ran (or was interrupted) and the checker found no violation"),
        (Exit.FAILED, "an invariant was violated (each named), or no leader or no block in time"),
        USAGE,
        OTHER,
        *EMBEDDED_CLUSTER,
    ),
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE_DIR,
    help="State folder of the demo cluster.",
)
@zk_servers_option
@duration_option(
    "--phase",
    kind=Duration(maximum=600 * SECOND, zero=True),
    default=6 * SECOND,
    into="phase_s",
    convert=timedelta.total_seconds,
    old_flag="--phase-s",
    old_unit="s",
    help="How long before and after the kill (6s, 500ms).",
)
@click.option(
    "--keep", is_flag=True, help="Leave the cluster running (stop: allocator local down)."
)
def demo(state_dir: Path, zk_servers: int | None, phase_s: float, keep: bool) -> None:
    """Run the embedded cluster with 3 nodes, fail the leader over, and stop it all."""
    # Every process it started is stopped, by pid, on success, error, Ctrl-C and SIGTERM;
    # --keep leaves the cluster up on purpose.
    signal.signal(signal.SIGTERM, _on_sigterm)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    # The consumer claims ~100 blocks/s from a cold start, before the leader has seen any
    # claim rate: start from a pool that covers the first seconds (runway takes over later).
    cluster = LocalCluster(state_dir, zk_servers=zk_servers, node_env=DEMO_NODE_ENV)
    info: ClusterInfo | None = None
    try:
        started = time.monotonic()
        _step(f"starting ZooKeeper, PostgreSQL and 3 nodes in {state_dir}")
        info = cluster.up(migrate=True, nodes=3)
        _step(f"cluster up in {time.monotonic() - started:.1f} s; schema migrated")
        for line in render(info):
            click.echo(f"  {line}")
        _failover_story(cluster, info, phase_s)
        if keep:
            _step(f"left running; stop it with: allocator local down --state-dir {state_dir}")
            return
    except KeyboardInterrupt:
        _step("interrupted")
    finally:
        if not keep or info is None:
            _stop(cluster)


def _failover_story(cluster: LocalCluster, info: ClusterInfo, phase_s: float) -> None:
    import psycopg

    from allocator.zookeeper import client as zkclient

    zk = zkclient.client_for(info.node_zk_hosts, info.zk_auth, timeout_s=10.0)
    zk.start(timeout=15.0)
    try:
        with psycopg.connect(info.database_url, autocommit=True) as admin:
            _story(cluster, info, admin, zk, phase_s)
    finally:
        zk.stop()
        zk.close()


def _story(
    cluster: LocalCluster,
    info: ClusterInfo,
    admin: psycopg.Connection[tuple[object, ...]],
    zk: KazooClient,
    phase_s: float,
) -> None:
    """The story: a leader fills the pool; a consumer claims (one SQL call, as
    ``allocator_app``) under a live view; the leader is SIGKILLed; the summary counts blocks,
    the handover time, claim errors and the checker's violations (each named, and then
    :class:`DemoError`, after everything is stopped)."""
    leader, epoch = _wait_for_leader(admin, None)
    _step(f"elected: {leader} (fence epoch {epoch}); it fills the pool")
    _wait_for_pool(admin)
    from allocator.drill.consumers import Consumers

    consumer = Consumers(info.consumer_database_url, {CONSUMER: 1}, pause_s=CLAIM_PAUSE_S)
    consumer.start()
    _step(f"a consumer claims blocks: SELECT * FROM allocator.claim_blocks('{CONSUMER}')")
    _view(admin, zk, consumer, phase_s)
    victim = cluster.status()
    pid = next(n.pid for n in victim.nodes if n.name == leader)
    _step(
        f"SIGKILL the leader {leader} (pid {pid}); the supervisor sees it die and closes "
        "its ZooKeeper session (allocator/session/reaper.py), so nobody waits for the timeout"
    )
    killed_at = time.monotonic()
    cluster.signal_node(leader, "SIGKILL")
    new_leader, new_epoch = _wait_for_leader(admin, epoch)
    handover_s = time.monotonic() - killed_at
    _step(f"handover: {new_leader} took the fence (epoch {new_epoch}) after {handover_s:.2f} s")
    _view(admin, zk, consumer, phase_s)
    records = consumer.stop()
    stats = consumer.totals()
    violations = _verdict(info, records)
    ids = sum(r.last_id - r.first_id + 1 for r in records)
    errors = f" {stats.error_kinds}" if stats.error_kinds else ""
    click.echo("")
    click.echo("summary")
    click.echo(f"  blocks claimed      {len(records)} ({ids} IDs)")
    click.echo(
        f"  handover time       {handover_s:.2f} s after SIGKILL "
        f"(session timeout {info.session_timeout_ms} ms)"
    )
    click.echo(f"  violations          {len(violations)} (I1-I5 and I7: allocator.verify)")
    for violation in violations:
        click.echo(f"    {violation}")
    click.echo(
        f"  pool-empty answers  {stats.pool_empty}; other claim errors {stats.errors}{errors}"
    )
    click.echo("")
    if violations:
        from allocator.core import verify

        raise DemoError(
            f"{len(violations)} invariant violation(s) ({verify.counts_text(violations)})"
        )


def _verdict(info: ClusterInfo, records: Sequence[Claim]) -> list[Violation]:
    """The one invariant checker over the consumer's records and the database's evidence."""
    from allocator.core.layout import Layout
    from allocator.postgres import ledger as verify_db
    from allocator.postgres.store import DEFAULT_MAX_CLOCK_AHEAD_MS

    return verify_db.judge(
        records,
        verify_db.read_url(info.database_url),
        layout=Layout(),
        max_clock_ahead_ms=DEFAULT_MAX_CLOCK_AHEAD_MS,
    )


def _wait_for_leader(
    admin: psycopg.Connection[tuple[object, ...]], old_epoch: int | None
) -> tuple[str, int]:
    deadline = time.monotonic() + LEADER_DEADLINE_S
    while time.monotonic() < deadline:
        row = admin.execute("SELECT holder, epoch FROM allocator.fence").fetchone()
        if row and row[0] and int(str(row[1])) != (old_epoch or 0):
            return str(row[0]), int(str(row[1]))
        time.sleep(0.01)
    raise click.ClickException("no leader took the fence in time: see the node logs")


def _wait_for_pool(admin: psycopg.Connection[tuple[object, ...]]) -> None:
    deadline = time.monotonic() + LEADER_DEADLINE_S
    while time.monotonic() < deadline:
        row = admin.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
        if row and int(str(row[0])) > 0:
            return
        time.sleep(0.02)
    raise click.ClickException("the leader cut no block in time: see the node logs")


def _view(
    admin: psycopg.Connection[tuple[object, ...]],
    zk: KazooClient,
    consumer: Consumers,
    seconds: float,
) -> None:
    """The live view: fence holder, election queue, pool level, the consumer's progress."""
    from allocator.zookeeper.election import read_contenders

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        row = admin.execute(
            "SELECT holder, epoch, available_blocks FROM allocator.pool_status"
        ).fetchone()
        holder, epoch, available = row if row else ("-", 0, 0)
        queue = " > ".join(c.identity.name for c in read_contenders(zk, ELECTION_PATH)) or "-"
        click.echo(
            f"  {time.strftime('%H:%M:%S')}  fence {holder} (epoch {epoch})  queue {queue:<24}"
            f"  pool {available} blocks  claimed {consumer.record_count()}"
        )
        time.sleep(VIEW_INTERVAL_S)


def _step(message: str) -> None:
    click.echo(f"[demo] {message}")


def _stop(cluster: LocalCluster) -> None:
    """Stops the cluster by pid and says which pids it stopped and how many are left."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the cleanup short
    _step("stopping every process the demo started")
    started: list[int] = []
    if cluster.exists():
        current = cluster.status()
        started = [s.pid for s in current.zk_servers if s.pid] + [
            n.pid for n in current.nodes if n.pid
        ]
        if current.postgres.pid:
            started.append(current.postgres.pid)
        supervisor = current.to_json().get("supervisor_pid")
        if supervisor:
            started.append(int(supervisor))
    cluster.down()
    left = [pid for pid in started if is_pid_alive(pid)]
    shown = " ".join(str(pid) for pid in started) or "none"
    _step(f"stopped pids: {shown}; processes left running: {len(left)}")
