"""``allocator decode ID``: show the fields of a Snowflake ID under the configured layout;
``--json`` prints exactly the stable keys of docs/design.md §10.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from allocator import config as config_mod
from allocator.commands.options import CONFIG, OTHER, USAGE, config_options, exit_codes
from allocator.core import layout
from allocator.core.exits import Exit


@click.command(
    "decode",
    # A leading "-" is part of the ID, not a flag: `decode -5` reports a negative ID.
    context_settings={"ignore_unknown_options": True},
    epilog=exit_codes(
        (Exit.OK, "decoded"),
        (Exit.USAGE, "not an ID: not an integer, negative, or over 2^63-1"),
        USAGE,
        (CONFIG[0], "invalid configuration (every problem named)"),
        OTHER,
    ),
)
@click.argument("snowflake_id", metavar="ID", type=str)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@config_options
def decode(
    snowflake_id: str, as_json: bool, config_path: Path | None, set_pairs: tuple[str, ...]
) -> None:
    """Decode ID into its time (UTC, when its block was cut), datacenter, lane and sequence."""
    value = layout.parse_id(snowflake_id)  # before the config: a bad ID is reported as such
    loaded = config_mod.load_from_options(config_path, set_pairs)
    fields = loaded.layout.decode(value).to_json()
    if as_json:
        click.echo(json.dumps(fields))
        return
    rows = {
        "id": fields["id"],
        "timestamp": f"{fields['time']}  (Unix ms {fields['timestamp_ms']}; block cut)",
        "datacenter": fields["datacenter"],
        "lane": fields["lane"],
        "sequence": fields["sequence"],
    }
    for name, shown in rows.items():
        click.echo(f"{name:<11} {shown}")
