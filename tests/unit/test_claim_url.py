"""``allocator claim`` connects as the application, never as the nodes.

Rules: its URL comes from ``--database-url`` / ``--database-url-file`` or their variables,
the first of which ``allocator local env`` exports; the configuration's ``postgres.url``
(the nodes' role, which may not call ``claim_blocks``) is never used, and without a URL
the command is a configuration error (78) that says where to put one, before it connects
anywhere. Driven in-process (click's ``CliRunner``); every URL points at port 1, which
refuses at once (the application's on 127.0.0.1, the nodes' on 127.0.0.2), so reaching the
database shows as exit 75 and the error names the host it tried.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from allocator import cli
from allocator.core.exits import Exit
from allocator.local.client_env import CLAIM_URL_ENV

NODE_URL = "postgresql://allocator_node@127.0.0.2:1/allocator"
APP_URL = "postgresql://allocator_app@127.0.0.1:1/allocator"
EX_CONFIG, EX_TEMPFAIL = Exit.CONFIG, Exit.TEMPFAIL


def claim(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli.main, ["claim", "--consumer", "c", *args], env=env or {})


def clean_env(**variables: str) -> dict[str, str | None]:
    """No claim URL from the caller's environment, plus ``variables``."""
    return {CLAIM_URL_ENV: None, f"{CLAIM_URL_ENV}_FILE": None, **variables}


@pytest.mark.parametrize(
    "where",
    ["nowhere", "the nodes' variable", "the config file"],
)
def test_without_an_application_url_claim_is_a_configuration_error(
    where: str, tmp_path: Path
) -> None:
    env = clean_env()
    args: list[str] = []
    if where == "the nodes' variable":
        env["ALLOCATOR_POSTGRES_URL"] = NODE_URL
    elif where == "the config file":
        config = tmp_path / "allocator.toml"
        config.write_text(f'[postgres]\nurl = "{NODE_URL}"\n')
        args = ["--config", str(config)]
    result = claim(*args, env=env)
    assert result.exit_code == EX_CONFIG, result.output
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: no database URL for claim")
    for hint in (CLAIM_URL_ENV, "--database-url-file", "allocator_consumer", "local env"):
        assert hint in result.stderr


@pytest.mark.parametrize("source", ["variable", "flag", "file"])
def test_the_application_url_is_taken_from_any_of_its_places(source: str, tmp_path: Path) -> None:
    env = clean_env(ALLOCATOR_POSTGRES_URL=NODE_URL)
    args: list[str] = []
    if source == "variable":
        env[CLAIM_URL_ENV] = APP_URL
    elif source == "flag":
        args = ["--database-url", APP_URL]
    else:
        url_file = tmp_path / "url"
        url_file.write_text(APP_URL + "\n")
        env[f"{CLAIM_URL_ENV}_FILE"] = str(url_file)
    result = claim(*args, env=env)
    # It got as far as connecting, to the application's host, not the nodes' (both refuse).
    assert result.exit_code == EX_TEMPFAIL, result.output
    assert '"127.0.0.1"' in result.stderr
    assert "127.0.0.2" not in result.stderr


def test_local_env_exports_the_variable_claim_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = click.Context(cli.main, info_name="allocator", auto_envvar_prefix="ALLOCATOR")
    command = cli.main.commands["claim"]
    sub = click.Context(command, parent=ctx, info_name="claim")
    param = next(p for p in command.params if p.name == "database_url")
    monkeypatch.setenv(CLAIM_URL_ENV, APP_URL)
    assert param.resolve_envvar_value(sub) == APP_URL
