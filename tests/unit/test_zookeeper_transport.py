"""TLS and SASL settings as kazoo's options, and the files TLS needs checked before a client
is built (issue 24, item 2), without servers: a bad file is a ConfigError naming its key."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from allocator import cli
from allocator.config import Config, load_config
from allocator.core.errors import ConfigError, PrerequisiteError
from allocator.zookeeper import client as zkclient
from tests.fixtures.tls import write_pki


def config(**overrides: object) -> Config:
    return load_config(None, {key.replace("__", "."): v for key, v in overrides.items()}, env={})


def tls_config(pki: Path, **overrides: object) -> Config:
    return config(
        zookeeper__tls=True,
        zookeeper__tls_ca_file=str(pki / "ca.pem"),
        zookeeper__tls_cert_file=str(pki / "client.pem"),
        zookeeper__tls_key_file=str(pki / "client.key"),
        **overrides,
    )


def test_tls_and_sasl_reach_kazoo_with_verification_on(tmp_path: Path) -> None:
    write_pki(tmp_path)
    cfg = tls_config(
        tmp_path,
        zookeeper__sasl_username="nodes",
        zookeeper__sasl_password="nodes-pw",
    )
    client = zkclient.client(cfg)
    try:
        assert client.use_ssl
        assert client.verify_certs
        assert client.ca == str(tmp_path / "ca.pem")
        assert (client.certfile, client.keyfile) == (
            str(tmp_path / "client.pem"),
            str(tmp_path / "client.key"),
        )
        sasl = client._connection.sasl_options
        assert sasl == {"mechanism": "DIGEST-MD5", "username": "nodes", "password": "nodes-pw"}
        assert client.auth_data == set()
    finally:
        client.close()


def test_without_tls_nothing_changes() -> None:
    client = zkclient.client(config(zookeeper__auth="u:pw"))
    try:
        assert not client.use_ssl
        assert client._connection.sasl_options is None
    finally:
        client.close()


@pytest.mark.parametrize(
    ("key", "file", "problem"),
    [
        ("tls_ca_file", "ca.pem", "cannot read the file"),
        ("tls_cert_file", "client.pem", "cannot read the file"),
        ("tls_key_file", "client.key", "cannot read the file"),
    ],
)
def test_a_missing_file_is_a_config_error_naming_its_key(
    tmp_path: Path, key: str, file: str, problem: str
) -> None:
    write_pki(tmp_path)
    (tmp_path / file).unlink()
    with pytest.raises(ConfigError, match=rf"^zookeeper\.{key}=.*{problem}") as caught:
        zkclient.client(tls_config(tmp_path))
    assert caught.value.exit_code == 78


def test_a_file_that_is_not_pem_or_a_wrong_key_password_is_named(tmp_path: Path) -> None:
    write_pki(tmp_path, key_password="key-pw")
    with pytest.raises(ConfigError, match=r"zookeeper\.tls_key_file=.*tls_key_password"):
        zkclient.client(tls_config(tmp_path))  # encrypted key, no password
    with pytest.raises(ConfigError, match=r"zookeeper\.tls_key_file=.*tls_key_password"):
        zkclient.client(tls_config(tmp_path, zookeeper__tls_key_password="wrong"))
    zkclient.client(tls_config(tmp_path, zookeeper__tls_key_password="key-pw")).close()
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"^zookeeper\.tls_ca_file=.*not usable"):
        zkclient.client(tls_config(tmp_path))


@pytest.mark.parametrize("command", [["config", "check"], ["run", "--check"]])
def test_config_check_and_run_check_read_the_tls_files(tmp_path: Path, command: list[str]) -> None:
    env = {
        "ALLOCATOR_ZOOKEEPER_AUTH": "u:pw",
        "ALLOCATOR_ZOOKEEPER_TLS": "true",
        "ALLOCATOR_ZOOKEEPER_TLS_CA_FILE": str(tmp_path / "missing-ca.pem"),
    }
    result = CliRunner().invoke(cli.main, command, env=env)
    assert result.exit_code == 78, result.output
    assert f"error: zookeeper.tls_ca_file={tmp_path}/missing-ca.pem: cannot read the file" in (
        result.output
    )
    write_pki(tmp_path)
    env["ALLOCATOR_ZOOKEEPER_TLS_CA_FILE"] = str(tmp_path / "ca.pem")
    assert CliRunner().invoke(cli.main, command, env=env).exit_code == 0


def test_sasl_without_its_package_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pure-sasl is the `sasl` extra (no wheel exists): without it kazoo would only time out."""
    real_find_spec = importlib.util.find_spec

    def without_puresasl(name: str, package: str | None = None) -> object:
        return None if name == "puresasl" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_puresasl)
    cfg = config(zookeeper__sasl_username="nodes", zookeeper__sasl_password="nodes-pw")
    with pytest.raises(PrerequisiteError, match=r"snowflake-block-allocator\[node,sasl\]"):
        zkclient.client(cfg)
    assert PrerequisiteError.exit_code == 69
