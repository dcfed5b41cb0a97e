"""CLI commands, one module each; ``COMMANDS`` is what ``allocator.cli`` registers."""

from __future__ import annotations

import click

from allocator.commands import config_cmd, decode, migrate_cmd

COMMANDS: list[click.Command] = [config_cmd.config, decode.decode, migrate_cmd.migrate_command]

from allocator.commands import local as _local  # noqa: E402

COMMANDS.append(_local.local)
