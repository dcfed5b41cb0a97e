"""``allocator run``: one allocator node (its rules: :mod:`allocator.node`, docs/design.md §4).

The composition root (docs/design.md §1): the only module that knows both the allocator core
and the ``jobs`` package. It reads no test-only variable: broken nodes are built in ``tests/``
through the same seams (:func:`build_node`), skewed clocks come from libfaketime.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from allocator import config as config_mod
from allocator.commands.options import OTHER, USAGE, config_options, exit_codes
from allocator.core import logs
from allocator.core.exits import Exit

if TYPE_CHECKING:
    from allocator.config import Config
    from allocator.node import Node
    from allocator.node.seams import ZooKeeperFactory

log = logging.getLogger(__name__)


def zookeeper_factory(config: Config, *, root: bool = False) -> ZooKeeperFactory:
    """Builds a fresh kazoo client for the node's cluster (one per session, see the node),
    authenticated and with the cluster's ACL (:func:`allocator.zookeeper.client.client`); ``root``:
    without the chroot (only to recreate the chroot after an ensemble wipe). Given a
    ``client_id``, the client continues that session if it still lives
    (:mod:`allocator.zookeeper.resume`)."""
    from kazoo.retry import KazooRetry

    from allocator.zookeeper import client as zkclient
    from allocator.zookeeper.resume import resume

    def make(client_id: tuple[int, bytes] | None = None) -> Any:
        built = zkclient.client(
            config,
            chroot=not root,
            connection_retry=KazooRetry(
                max_tries=-1,
                delay=0.1,
                backoff=2,
                max_jitter=0.4,
                max_delay=config.zookeeper.max_reconnect_delay_s,
            ),
            command_retry=KazooRetry(max_tries=3, delay=0.1, backoff=2, max_delay=1.0),
        )
        return built if client_id is None else resume(built, client_id)

    return make


def build_node(
    config: Config,
    *,
    now_ms: Callable[[], int] | None = None,
    store: Any = None,
    term_factory: Any = None,
    jobs_factory: Any = None,
) -> Node:
    """A node wired with the real collaborators; ``store`` / ``term_factory`` /
    ``jobs_factory`` (called like :class:`jobs.leader.LeaderJobs`) replace the database
    access, the term and the leader's jobs (tests build broken variants this way, in
    ``tests/``)."""
    from allocator.core.clock import wall_clock_ms
    from allocator.core.leadership import Term
    from allocator.metrics import NodeMetrics
    from allocator.node import Node
    from allocator.postgres.store import NodeDatabase
    from jobs.leader import LeaderJobs

    clock = now_ms or wall_clock_ms
    metrics = NodeMetrics()
    database = store or NodeDatabase(
        config.postgres,
        node_name=config.node.resolved_name(),
        layout=config.layout,
        datacenter_id=config.cluster.datacenter_id,
        max_clock_ahead_ms=config.pool.max_clock_ahead_ms,
    )
    return Node(
        config,
        store=database,
        zookeeper=zookeeper_factory(config),
        zookeeper_root=zookeeper_factory(config, root=True),
        jobs=(jobs_factory or LeaderJobs)(database, config, metrics, clock),
        metrics=metrics,
        now_ms=clock,
        term_factory=term_factory or Term,
    )


def serve(node: Node) -> None:
    """Run ``node`` with SIGTERM/SIGINT stopping it gracefully (a leader hands over at once);
    exits with its code: 0 stopped, 3 session lost, 4 fenced (:mod:`allocator.core.exits`)."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        node.request_stop(signal.Signals(signum).name.lower())

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(node.run())


@click.command(
    "run",
    epilog=exit_codes(
        (Exit.OK, "stopped on request (SIGTERM, SIGINT); --check: the configuration is valid"),
        (Exit.SESSION_LOST, "ZooKeeper session lost (node.on_session_loss = exit)"),
        (Exit.FENCED, "fenced: a newer leader took over"),
        USAGE,
        (Exit.UNAVAILABLE, "a missing prerequisite"),
        (Exit.TEMPFAIL, "ZooKeeper or PostgreSQL unavailable at start"),
        (
            Exit.CONFIG,
            "invalid configuration, no zookeeper.auth without zookeeper.insecure, a layout "
            "or datacenter id the database recorded otherwise, or a schema revision this "
            "release cannot use (docs/upgrades.md)",
        ),
        OTHER,
    ),
)
@click.option("--name", help="Instance name (node.name); default <hostname>-<pid>.")
@click.option("--admin-address", help="host:port of the admin HTTP server (node.admin_address).")
@click.option(
    "--on-session-loss",
    type=click.Choice(["exit", "rejoin"]),
    help="On ZooKeeper session loss: rejoin the election, keeping the session if ZooKeeper "
    "still holds it (default), or exit with code 3 (node.on_session_loss).",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), help="Log format (node.log_format)."
)
@click.option("--check", is_flag=True, help="Validate and print the effective config, then exit.")
@config_options
def run(
    name: str | None,
    admin_address: str | None,
    on_session_loss: str | None,
    log_format: str | None,
    check: bool,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> None:
    """Run an allocator node: join the election, and cut blocks while leading."""
    from allocator.zookeeper import client as zkclient

    config = load(name, admin_address, on_session_loss, log_format, config_path, set_pairs)
    # Without zookeeper.auth both the node and --check refuse (78) unless zookeeper.insecure
    # is set; the node then warns at every start.
    zkclient.check_node(config)  # the node would refuse to start: so does --check
    if check:
        click.echo(json.dumps(config.masked_dict(), indent=2, default=str))
        for warning in zkclient.warnings(config):
            click.echo(f"warning: {warning}", err=True)
        return
    logs.configure(config.node.log_format)
    serve(build_node(config))


def load(
    name: str | None,
    admin_address: str | None,
    on_session_loss: str | None,
    log_format: str | None,
    config_path: Path | None,
    set_pairs: tuple[str, ...],
) -> Config:
    """The effective config of ``allocator run``'s options (file < ``ALLOCATOR_*`` < ``--set``
    < the flags of ``run``)."""
    flags = {
        key: value
        for key, value in {
            "node.name": name,
            "node.admin_address": admin_address,
            "node.on_session_loss": on_session_loss,
            "node.log_format": log_format,
        }.items()
        if value is not None
    }
    return config_mod.load_from_options(config_path, set_pairs, flags)
