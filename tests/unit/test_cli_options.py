"""Issue 10, must-shows 5 and 6 at the CLI: dangerous choices are never read from an
``ALLOCATOR_*`` variable, no option carries a secret, and no error line prints one.

Driven in-process (click's ``CliRunner``); nothing here reaches a server: every database URL
points at 127.0.0.1 port 1, which refuses at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from allocator import cli
from allocator.commands import options
from allocator.core import errors, redact
from allocator.core.exits import Exit

PG_SECRET = "Pg-Secr3t-on-the-line"
URL_WITH_PASSWORD = f"postgresql://operator:{PG_SECRET}@127.0.0.1:1/allocator"

# The deliberate list: (command path, parameter name) of every option no variable may set.
# Adding a dangerous option means adding it here and to allocator/cli.py's docstring.
TYPED_OPTIONS = {
    ("migrate", "target"),
    ("migrate", "yes"),
    ("fence rebase", "reason"),
    ("fence rebase", "yes"),
    ("pool reset", "after_restore"),
    ("pool reset", "reason"),
    ("pool reset", "yes"),
    ("pool reset", "old_database_url"),
    ("pool reset", "old_database_unreachable"),
    ("pool pause", "reason"),
    ("pool resume", "reason"),
    ("local down", "purge"),
    ("local up", "node_command"),
}
CONFIRMATION_LIKE = re.compile(
    r"yes|force|purge|confirm|drop|delete|wipe|destroy|reset|after_restore|unsafe|i_know"
)


def commands(
    group: click.Group = cli.main, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name), command


def context(path: tuple[str, ...]) -> click.Context:
    """The context chain click builds for ``allocator <path>`` (its auto_envvar_prefix)."""
    ctx = click.Context(cli.main, info_name="allocator", auto_envvar_prefix="ALLOCATOR")
    group: click.Command = cli.main
    for name in path:
        assert isinstance(group, click.Group)
        group = group.commands[name]
        ctx = click.Context(group, parent=ctx, info_name=name)
    return ctx


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    base = {"ALLOCATOR_POSTGRES_URL": "postgresql://nobody@127.0.0.1:1/allocator"}
    return CliRunner().invoke(cli.main, list(args), env={**base, **(env or {})})


def test_the_dangerous_options_are_exactly_the_deliberate_list() -> None:
    typed: dict[tuple[str, str], str] = {}
    for path, command in commands():
        for param in command.params:
            if not isinstance(param, click.Option) or param.name is None:
                continue
            if not param.allow_from_autoenv:
                assert param.envvar is None, (path, param.name)
                assert options.NEVER_FROM_ENV in (param.help or ""), (path, param.name)
                typed[(" ".join(path), param.name)] = param.opts[0]
            else:
                looks_dangerous = param.name in options.DANGEROUS_NAMES or (
                    param.is_flag and CONFIRMATION_LIKE.search(param.name)
                )
                assert not looks_dangerous, f"{' '.join(path)} {param.opts[0]} is read from env"
    assert set(typed) == TYPED_OPTIONS
    doc = " ".join((cli.__doc__ or "").split())
    for (where, _name), flag in typed.items():
        assert f"{where} {flag}" in doc or (f"``{where}``" in doc and f"``{flag}``" in doc), flag


@pytest.mark.parametrize(("path", "name"), sorted(TYPED_OPTIONS))
def test_no_variable_sets_a_dangerous_option(
    path: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = context(tuple(path.split()))
    variable = f"{ctx.auto_envvar_prefix}_{name.upper()}"
    monkeypatch.setenv(variable, "1")
    param = next(p for p in ctx.command.params if p.name == name)
    assert param.resolve_envvar_value(ctx) is None
    assert param.value_from_envvar(ctx) is None


def test_the_mechanism_is_real_for_ordinary_options(monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: an ordinary option of the same command is read from its variable.
    ctx = context(("migrate",))
    monkeypatch.setenv("ALLOCATOR_MIGRATE_CHECK", "1")
    param = next(p for p in ctx.command.params if p.name == "check")
    assert param.value_from_envvar(ctx) == "1"


def test_migrate_yes_from_the_environment_does_not_drop_the_schema() -> None:
    result = invoke(
        "migrate",
        "--to",
        "base",
        env={"ALLOCATOR_MIGRATE_YES": "1", "ALLOCATOR_MIGRATE_TARGET": "base"},
    )
    assert result.exit_code == errors.UsageError.exit_code, result.output
    assert "add --yes to confirm" in result.stderr
    assert "Traceback" not in result.output


def test_a_password_on_the_command_line_is_refused_by_every_command() -> None:
    paths = [
        path
        for path, command in commands()
        if any(p.name == "database_url" for p in command.params)
    ]
    assert {"migrate", "claim", "fence rebase", "fence status", "pool reset"} <= {
        " ".join(p) for p in paths
    }
    for path in paths:
        result = invoke(*path, "--database-url", URL_WITH_PASSWORD)
        assert result.exit_code == errors.UsageError.exit_code, (path, result.output)
        variable = "ALLOCATOR_" + "_".join(path).upper().replace("-", "_") + "_DATABASE_URL"
        assert result.stderr.startswith("error: --database-url must not carry a password")
        assert variable in result.stderr
        assert "--database-url-file" in result.stderr
        assert PG_SECRET not in result.output


def test_the_same_url_from_the_environment_or_a_file_is_taken(tmp_path: Path) -> None:
    from_env = invoke(
        "claim", "--consumer", "c", env={"ALLOCATOR_CLAIM_DATABASE_URL": URL_WITH_PASSWORD}
    )
    url_file = tmp_path / "url"
    url_file.write_text(URL_WITH_PASSWORD + "\n")
    from_file = invoke("claim", "--consumer", "c", "--database-url-file", str(url_file))
    for result in (from_env, from_file):
        # Taken: it got as far as connecting (port 1 refuses), and the error masks it.
        assert result.exit_code == 75, result.output
        assert "operator:***@127.0.0.1:1" in result.stderr or "127.0.0.1" in result.stderr
        assert PG_SECRET not in result.output


def test_database_url_file_errors_are_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for args, message in [
        (("--database-url-file", str(tmp_path / "missing")), "cannot read it"),
        (("--database-url-file", str(empty)), "the file is empty"),
        (
            ("--database-url-file", str(empty), "--database-url", "postgresql://h/db"),
            "not both",
        ),
    ]:
        result = invoke("claim", "--consumer", "c", *args)
        assert result.exit_code == errors.UsageError.exit_code, result.output
        assert message in result.stderr
        assert result.stderr.count("\n") == 1


def test_a_password_free_url_on_the_command_line_is_fine() -> None:
    result = invoke("claim", "--consumer", "c", "--database-url", "postgresql://u@127.0.0.1:1/db")
    assert result.exit_code == 75, result.output  # connecting, refused: not a usage error


@pytest.mark.parametrize(
    "pair",
    [
        "ALLOCATOR_NODE_ADMIN_TOKEN=Tk-0123456789abcdefghijklmn",
        "ALLOCATOR_ZOOKEEPER_AUTH=user:Zk-Secret-pw",
        f"ALLOCATOR_POSTGRES_URL={URL_WITH_PASSWORD}",
    ],
)
def test_local_up_refuses_a_secret_node_variable(pair: str, tmp_path: Path) -> None:
    result = invoke("local", "up", "--state-dir", str(tmp_path), "--node-env", pair)
    assert result.exit_code == errors.UsageError.exit_code, result.output
    assert "a secret is never taken from the command line" in result.stderr
    assert pair.partition("=")[2] not in result.output
    assert not (tmp_path / "cluster.json").exists()


def test_click_usage_errors_are_masked() -> None:
    result = invoke("claim", "--consumer", "c", "--count", URL_WITH_PASSWORD)
    assert result.exit_code == errors.UsageError.exit_code
    assert "Invalid value for '--count'" in result.output
    assert PG_SECRET not in result.output


def test_an_unexpected_error_prints_a_masked_traceback() -> None:
    group = cli._Group("allocator")

    @group.command("boom")
    def boom() -> None:
        raise RuntimeError(f"bug near {URL_WITH_PASSWORD} password=Zz9-pw")

    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == Exit.SOFTWARE  # a bug
    assert "Traceback" in result.stderr
    assert "RuntimeError" in result.stderr
    assert PG_SECRET not in result.output
    assert "Zz9-pw" not in result.output
    assert redact.MASK in result.stderr
