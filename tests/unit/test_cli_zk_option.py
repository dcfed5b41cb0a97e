"""``--zk`` means one thing in every command that starts an embedded cluster.

Rules: every command with a ``--zk`` option takes the same one (:func:`options.zk_servers_option`):
the same values (an odd number from 1 to 7), the same default (3 for a new cluster, else as
recorded) and the same help; a value outside them is a usage error (exit 2) before
anything starts. Driven in-process (click's ``CliRunner``); nothing here starts a server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from allocator import cli
from allocator.commands import options
from allocator.core.exits import Exit
from allocator.local.cluster import MAX_ZK_SERVERS

EX_USAGE = Exit.USAGE
STARTERS = {("local", "up"), ("demo",), ("drill",)}
"""The commands that start an embedded cluster of their own."""


def zk_options(
    group: click.Group = cli.main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Option]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from zk_options(command, (*path, name))
            continue
        for param in command.params:
            if isinstance(param, click.Option) and "--zk" in param.opts:
                yield (*path, name), param


def test_every_command_that_starts_a_cluster_has_the_one_zk_option() -> None:
    found = dict(zk_options())
    assert set(found) == STARTERS
    for path, param in found.items():
        assert param.name == "zk_servers", path
        assert isinstance(param.type, click.IntRange), path
        assert (param.type.min, param.type.max) == (1, MAX_ZK_SERVERS), path
        assert param.default is None, path
        assert param.help == options.ZK_SERVERS_HELP, path


@pytest.mark.parametrize("path", sorted(STARTERS))
@pytest.mark.parametrize("value", ["1", "3", "5", "7"])
def test_every_odd_count_up_to_seven_is_taken(
    path: tuple[str, ...], value: str, tmp_path: Path
) -> None:
    command = cli.main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    ctx = command.make_context(
        path[-1], ["--zk", value, "--state-dir", str(tmp_path)], resilient_parsing=False
    )
    assert ctx.params["zk_servers"] == int(value)


@pytest.mark.parametrize("path", sorted(STARTERS))
@pytest.mark.parametrize(
    ("value", "message"),
    [("2", "2 is even"), ("4", "4 is even"), ("0", "range"), ("9", "range"), ("three", "")],
)
def test_any_other_count_is_a_usage_error_before_anything_starts(
    path: tuple[str, ...], value: str, message: str, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    result = CliRunner().invoke(
        cli.main, [*path, "--zk", value, "--state-dir", str(state_dir)], env={}
    )
    assert result.exit_code == EX_USAGE, result.output
    assert "--zk" in result.output
    assert message in result.output
    assert not state_dir.exists()


def test_the_help_says_the_same_everywhere() -> None:
    for path in STARTERS:
        result = CliRunner().invoke(cli.main, [*path, "--help"], terminal_width=1000)
        assert result.exit_code == 0, result.output
        assert " ".join(options.ZK_SERVERS_HELP.split()) in " ".join(result.output.split())
