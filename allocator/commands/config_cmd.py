"""``allocator config check``: validate the configuration and show the *effective* one
(defaults, file, ``ALLOCATOR_*`` and ``--set`` merged) with secrets masked; it never prints a
secret. ``--database`` is the only check that connects (to ``postgres.url``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from allocator import config as config_mod
from allocator.commands.options import GROUP_CODES, OTHER, USAGE, config_options, exit_codes
from allocator.config import runway
from allocator.core import errors
from allocator.core.errors import AllocatorError, InvalidConfigError, ZooKeeperUnavailableError
from allocator.core.exits import Exit
from allocator.core.layout import format_utc_ms
from allocator.core.records import Replication
from allocator.postgres.operator import read_pool_status, read_replication
from allocator.zookeeper import calls, negotiated, security
from allocator.zookeeper import client as zkclient


def render_toml(sections: dict[str, dict[str, object]]) -> str:
    """The masked config as TOML-like text, one table per section."""
    blocks = []
    for name, values in sections.items():
        lines = [f"[{name}]"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


@click.group("config", epilog=exit_codes(*GROUP_CODES))
def config() -> None:
    """Inspect the configuration."""


@config.command(
    "check",
    epilog=exit_codes(
        (Exit.OK, "the configuration is valid (warnings, if any, on stderr)"),
        (Exit.USAGE, "a malformed --set"),
        USAGE,
        (
            Exit.TEMPFAIL,
            "--database: the database is unreachable, or --zookeeper: no ZooKeeper server "
            "answered (retry later)",
        ),
        (
            Exit.CONFIG,
            "invalid (every problem listed), a file that cannot be read, or --database found "
            "a problem (asynchronous standbys, a login refused)",
        ),
        OTHER,
    ),
)
@config_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--database",
    "probe_database",
    is_flag=True,
    help="Also connect to postgres.url and check how it replicates: standbys that no commit "
    "waits for are a problem unless postgres.allow_async_replication is set.",
)
@click.option(
    "--zookeeper",
    "probe_zookeeper",
    is_flag=True,
    help="Also open a session with zookeeper.hosts and show the session timeout the server "
    "grants: a warning when it differs from zookeeper.session_timeout_ms.",
)
def check(
    config_path: Path | None,
    set_pairs: tuple[str, ...],
    as_json: bool,
    probe_database: bool,
    probe_zookeeper: bool,
) -> None:
    """Validate the configuration and print it, secrets masked.

    Exits 0 when valid; otherwise lists every problem, naming its key, and exits 78.
    """
    try:
        loaded = config_mod.load_from_options(config_path, set_pairs)
    except InvalidConfigError as exc:
        # Every problem, one line each on stderr, naming key, value and source (other
        # commands show the same as one line); --json also puts them on stdout.
        if as_json:
            click.echo(json.dumps({"valid": False, "errors": list(exc.problems)}, indent=2))
        count = len(exc.problems)
        click.echo(f"error: invalid configuration ({count} problem{'s' * (count > 1)}):", err=True)
        for problem in exc.problems:
            click.echo(f"  {problem}", err=True)
        raise click.exceptions.Exit(exc.exit_code) from exc
    ends_at = format_utc_ms(loaded.layout.ends_at_ms)
    warnings, problems, replication, probe_error = _replication_findings(loaded, probe_database)
    claim_rate = _claim_rate(loaded) if replication is not None else None
    warnings = zkclient.warnings(loaded) + runway.config_warnings(loaded) + warnings
    tls_problems = security.file_problems(loaded)
    problems += tls_problems
    granted_ms: int | None = None
    if probe_zookeeper and probe_error is None and not tls_problems:
        try:
            granted_ms = _granted_timeout_ms(loaded)
        except AllocatorError as exc:
            problems.append(f"zookeeper.hosts: cannot open a session: {errors.describe(exc)}")
            probe_error = exc
        else:
            grant_warning = _grant_warning(loaded, granted_ms)
            warnings += [grant_warning] if grant_warning else []
    if replication is not None and claim_rate is not None:
        rate_warning = runway.rate_warning(loaded, claim_rate)
        warnings += [rate_warning] if rate_warning else []
    if as_json:
        document = {
            "valid": not problems,
            "config": loaded.masked_dict(),
            "layout_ends_at": ends_at,
            "warnings": warnings,
            "pool_coverage": runway.coverage(loaded),
        }
        if problems:
            document["errors"] = problems
        if replication is not None:
            document["replication"] = asdict(replication) | {
                "asynchronous": replication.asynchronous
            }
        if granted_ms is not None:
            document["zookeeper"] = {
                "session_timeout_ms": loaded.zookeeper.session_timeout_ms,
                "granted_session_timeout_ms": granted_ms,
            }
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo("# effective configuration (secrets masked)")
        click.echo(render_toml(loaded.masked_dict()))
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        if not problems:
            click.echo(f"\n# configuration is valid; the layout's time bits run out on {ends_at}")
            click.echo(f"# {runway.coverage_line(loaded)}")
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
    if problems:
        code = probe_error.exit_code if probe_error else InvalidConfigError.exit_code
        raise click.exceptions.Exit(code)


def _granted_timeout_ms(loaded: config_mod.Config) -> int | None:
    """The session timeout a server of ``zookeeper.hosts`` grants this configuration (None if
    it granted nothing readable); :class:`ZooKeeperUnavailableError` when none answers."""
    client = calls.zookeeper_client(loaded)
    try:
        calls.start(client, loaded)
    except ZooKeeperUnavailableError:
        client.close()
        raise
    try:
        return negotiated.granted_timeout_ms(client)
    finally:
        calls.close(client)


def _grant_warning(loaded: config_mod.Config, granted_ms: int | None) -> str | None:
    """The warning for a grant that differs from ``zookeeper.session_timeout_ms``."""
    configured_ms = loaded.zookeeper.session_timeout_ms
    if granted_ms is None or granted_ms == configured_ms:
        return None
    return (
        f"the ZooKeeper server grants {granted_ms} ms, not zookeeper.session_timeout_ms "
        f"({configured_ms} ms): its minSessionTimeout/maxSessionTimeout clamp the request; "
        "nodes time their self-stop with the smaller (docs/operations.md, Session timeouts)"
    )


def _claim_rate(loaded: config_mod.Config) -> float | None:
    """The pool's current claim rate (blocks/s), or None if unknown or unreadable."""
    try:
        status = read_pool_status(
            loaded.postgres.url.get_secret_value(),
            connect_timeout_s=loaded.postgres.connect_timeout_s,
        )
    except AllocatorError:
        return None
    return status.claim_rate_blocks_per_s


def _replication_findings(
    loaded: config_mod.Config, probe_database: bool
) -> tuple[list[str], list[str], Replication | None, AllocatorError | None]:
    """(warnings, problems, the database's replication if probed, the error that kept it
    from being probed: its exit code is the command's, 75 unreachable or 78 login refused).

    Standbys that no commit waits for are a problem (exit 78) unless
    ``postgres.allow_async_replication`` is set, which is always warned about."""
    allowed = loaded.postgres.allow_async_replication
    warnings = []
    if allowed:
        warnings.append(
            "postgres.allow_async_replication is set: nodes cut even when no standby confirms "
            "commits, and a failover to such a standby can hand out IDs twice"
        )
    if not probe_database:
        return warnings, [], None, None
    try:
        replication = read_replication(
            loaded.postgres.url.get_secret_value(),
            connect_timeout_s=loaded.postgres.connect_timeout_s,
        )
    except AllocatorError as exc:
        problem = f"postgres.url: cannot check replication: {errors.describe(exc)}"
        return warnings, [problem], None, exc
    if replication.asynchronous and not allowed:
        problem = (
            f"the database replicates asynchronously ({replication.describe()}): nodes will "
            "not cut; make a standby synchronous (synchronous_standby_names, synchronous_commit "
            "on) or set postgres.allow_async_replication"
        )
        return warnings, [problem], replication, None
    if replication.asynchronous:
        warnings.append(f"the database replicates asynchronously ({replication.describe()})")
    return warnings, [], replication, None
