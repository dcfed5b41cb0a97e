"""``allocator alerts render``: the alert rules with their runbook links pointing at your copy
of the runbook; every ``runbook_url`` is rewritten (:mod:`allocator.alert_rules`) and nothing
else changes.
"""

from __future__ import annotations

from pathlib import Path

import click

from allocator import alert_rules
from allocator.commands.options import GROUP_CODES, OTHER, USAGE, exit_codes
from allocator.core import files
from allocator.core.errors import UsageError
from allocator.core.exits import Exit


@click.group("alerts", epilog=exit_codes(*GROUP_CODES))
def alerts() -> None:
    """The Prometheus alert rules of deploy/prometheus/ (and deploy/k8s/)."""


@alerts.command(
    "render",
    epilog=exit_codes(
        (Exit.OK, "rendered"),
        USAGE,
        (
            Exit.USAGE,
            "the runbook URL is not an absolute http(s) URL, or RULES holds no alert rules "
            "or cannot be read, or --output cannot be written",
        ),
        OTHER,
    ),
)
@click.argument("rules", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--runbook-base",
    required=True,
    callback=lambda _ctx, _param, value: _checked(value),
    show_envvar=True,
    help="Where your copy of docs/operations.md is published, e.g. "
    "https://wiki.example.com/allocator/operations; each alert's #anchor is appended. "
    f"The shipped rules use {alert_rules.DEFAULT_RUNBOOK}.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_envvar=True,
    help="Write the rules to this file (replaced atomically) instead of printing them.",
)
def render(rules: Path, runbook_base: str, output: Path | None) -> None:
    """Print RULES (an alert rules file or a PrometheusRule) with every runbook_url pointing
    at --runbook-base."""
    try:
        text = rules.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UsageError(f"{rules}: cannot read it ({reason})") from None
    try:
        rendered = alert_rules.with_runbook(text, runbook_base)
    except ValueError as exc:
        raise UsageError(f"{rules}: {exc}") from None
    if output is None:
        click.echo(rendered, nl=False)
        return
    try:
        files.write_atomic(output, rendered.encode("utf-8"))  # the input may be the output
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot write it ({exc.strerror or exc})") from None


def _checked(runbook_base: str) -> str:
    try:
        return alert_rules.check_runbook(runbook_base)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
