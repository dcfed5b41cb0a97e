"""``allocator run``: one allocator node (see :mod:`allocator.node` for its rules).

Rules: every setting comes from the config (file < ``ALLOCATOR_*`` < ``--set`` < the flags
here); ``--check`` validates, prints the effective config with secrets masked and exits.
SIGTERM and SIGINT stop the node gracefully (a leader hands over at once). The process exit
code is the node's: 0 stopped, 3 session lost, 4 fenced (see ``allocator.node``).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import FrameType

import click

from allocator import config as config_mod
from allocator import logs


@click.command("run")
@click.option("--name", help="Instance name (node.name); default <hostname>-<pid>.")
@click.option("--admin-address", help="host:port of the admin HTTP server (node.admin_address).")
@click.option(
    "--on-session-loss",
    type=click.Choice(["exit", "rejoin"]),
    help="On ZooKeeper session loss: exit (code 3) or rejoin the election (node.on_session_loss).",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), help="Log format (node.log_format)."
)
@click.option("--check", is_flag=True, help="Validate and print the effective config, then exit.")
@config_mod.config_options
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
    config = config_mod.load_from_options(config_path, set_pairs, flags)
    if check:
        click.echo(json.dumps(config.masked_dict(), indent=2, default=str))
        return
    from allocator.node import Node  # kazoo, psycopg, APScheduler: only for a real node

    logs.configure(config.node.log_format)
    node = Node(config)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        node.request_stop(signal.Signals(signum).name.lower())

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.exit(node.run())
