"""``allocator reap-session``: close the ZooKeeper session a dead node left, at once (for
systemd's ``ExecStopPost=``, so a crash hands over without waiting for the session timeout).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from allocator.commands.options import OTHER, USAGE, config_options, exit_codes
from allocator.commands.run import load
from allocator.core.errors import ConfigError
from allocator.core.exits import Exit
from allocator.session import reaper


@click.command(
    "reap-session",
    epilog=exit_codes(
        (
            Exit.OK,
            "whatever it decided: nothing to reap, ignored, alive, reaped, or ZooKeeper "
            "unreachable (the session then expires on its own)",
        ),
        USAGE,
        (Exit.CONFIG, "no node.state_dir, no configured node.name, or an invalid configuration"),
        OTHER,
    ),
)
@click.option("--name", help="The node's name (node.name) whose session to reap.")
@click.option("--json", "as_json", is_flag=True, show_envvar=True, help="Print one JSON object.")
@config_options
def reap_session(
    name: str | None, as_json: bool, config_path: Path | None, set_pairs: tuple[str, ...]
) -> None:
    """Close the ZooKeeper session of this node's dead predecessor (for ExecStopPost=)."""
    # The node's configuration exactly as `allocator run` reads it (--name overrides
    # node.name); then only what a starting node does first. The session is closed only if
    # its process is provably dead on this host (its state-folder lock free, or its pid gone
    # in the pid namespace it ran in); from another namespace (docker compose run) a pid it
    # cannot see counts as alive: run it in the node's container.
    config = load(name, None, None, None, config_path, set_pairs)
    state_dir = config.node.state_path()
    if state_dir is None:
        raise ConfigError("node.state_dir is not set: there is no session file to read")
    if not config.node.name:
        raise ConfigError(
            "node.name is not set: the default <hostname>-<pid> changes at every start, so "
            "no dead predecessor can be recognised"
        )
    decision = reaper.reap(
        state_dir,
        reaper.self_of(config),
        timeout_s=config.zookeeper.connect_timeout_s,
    )
    if as_json:
        click.echo(json.dumps({"action": decision.action.value, "reason": decision.reason}))
    else:
        click.echo(f"{decision.action.value}: {decision.reason}")
