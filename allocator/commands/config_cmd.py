"""``allocator config check``: validate the configuration and show what is in effect.

Rules: the output is the *effective* configuration (defaults, file, ``ALLOCATOR_*``
variables and ``--set`` flags merged) with secrets masked; it never prints a secret. An
invalid configuration exits 78 (EX_CONFIG) and lists every problem on stderr, one line
each, naming its key, value and source (other commands show the same as a single line);
with ``--json`` stdout also gets ``{"valid": false, "errors": [...]}``. A file that cannot
be read, or a malformed ``--set``, is one error line as usual.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from allocator import config as config_mod
from allocator.errors import InvalidConfigError
from allocator.layout import format_utc_ms


def render_toml(sections: dict[str, dict[str, object]]) -> str:
    """The masked config as TOML-like text, one table per section."""
    blocks = []
    for name, values in sections.items():
        lines = [f"[{name}]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


@click.group("config")
def config() -> None:
    """Inspect the configuration."""


@config.command("check")
@config_mod.config_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def check(config_path: Path | None, set_pairs: tuple[str, ...], as_json: bool) -> None:
    """Validate the configuration and print it, secrets masked.

    Exits 0 when valid; otherwise lists every problem, naming its key, and exits 78.
    """
    try:
        loaded = config_mod.load_from_options(config_path, set_pairs)
    except InvalidConfigError as exc:
        if as_json:
            click.echo(json.dumps({"valid": False, "errors": list(exc.problems)}, indent=2))
        count = len(exc.problems)
        click.echo(f"error: invalid configuration ({count} problem{'s' * (count > 1)}):", err=True)
        for problem in exc.problems:
            click.echo(f"  {problem}", err=True)
        raise click.exceptions.Exit(exc.exit_code) from exc
    ends_at = format_utc_ms(loaded.layout.ends_at_ms)
    if as_json:
        document = {"valid": True, "config": loaded.masked_dict(), "layout_ends_at": ends_at}
        click.echo(json.dumps(document, indent=2))
        return
    click.echo("# effective configuration (secrets masked)")
    click.echo(render_toml(loaded.masked_dict()))
    click.echo(f"\n# configuration is valid; the layout's time bits run out on {ends_at}")
