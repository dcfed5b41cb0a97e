"""allocator.redact: libpq secrets masked in both conninfo forms and in any text; registered
values masked; the CLI's error lines and the log lines go through it."""

from __future__ import annotations

import io
import json
import logging

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from allocator.config import load_config, mask_url
from allocator.core import errors, logs, redact

SECRET = "Hunter2-secret"  # long enough to be registered, distinctive enough to grep


@pytest.mark.parametrize(
    ("conninfo", "masked"),
    [
        ("postgresql://u:pw@h:1/db", "postgresql://u:***@h:1/db"),
        ("postgres://u:p@ss@h/db?sslpassword=q&x=1", "postgres://u:***@h/db?sslpassword=***&x=1"),
        ("postgresql:///db?host=/tmp&password=x", "postgresql:///db?host=/tmp&password=***"),
        # libpq decodes parameter names too: %70assword is password.
        ("postgresql://h/db?%70assword=zz#f", "postgresql://h/db?%70assword=***#f"),
        # An unescaped "/" in the password: where it ends cannot be told.
        ("postgresql://u:pa/ss@h/db", "postgresql://***"),
        ("postgresql://u:pw@[::1/db", "postgresql://***"),
        ("host=h password='a b\\' c' user=x", "host=h password=*** user=x"),
        ("host=h sslpassword = k3y port=5", "host=h sslpassword = *** port=5"),
        ("mysql://u:hunter2@h/db", "mysql://u:***@h/db"),
    ],
)
def test_mask_conninfo(conninfo: str, masked: str) -> None:
    assert redact.mask_conninfo(conninfo) == masked
    assert mask_url(conninfo) == masked
    assert redact.carries_secret(conninfo)


@pytest.mark.parametrize(
    "conninfo",
    [
        "postgresql://allocator_node@127.0.0.1:5432/allocator",
        "postgresql://h1:1,h2:2/db?target_session_attrs=read-write",
        "host=h user=u passfile=/home/u/.pgpass sslkey=/k",
        "postgresql://u:@h/db",  # an empty password is no secret
    ],
)
def test_password_free_conninfo_is_unchanged(conninfo: str) -> None:
    assert redact.mask_conninfo(conninfo) == conninfo
    assert not redact.carries_secret(conninfo)


def test_every_libpq_secret_parameter_is_masked() -> None:
    # Every parameter libpq documents as a secret, in both forms.
    for name in redact.SECRET_PARAMETERS:
        assert conninfo_to_dict(f"host=h {name}=x")[name] == "x"  # libpq knows the name
        assert f"{name}=x" not in redact.mask_conninfo(f"host=h {name}=x")
        assert f"{name}=x" not in redact.mask_conninfo(f"postgresql://h/db?{name}=x")


def test_libpq_errors_that_echo_the_url_are_masked() -> None:
    for url, secret in [
        ("postgresql://u:Zq9pw@[::1/db", "Zq9pw"),
        ("postgresql://u:pw@h/db?bogus=1&password=Zq9pw", "Zq9pw"),
        ("host=h password=Zq9pw foo", "Zq9pw"),
    ]:
        with pytest.raises(psycopg.Error) as caught:
            psycopg.connect(url, connect_timeout=1)
        wrapped = errors.DatabaseError("cannot connect")
        wrapped.__cause__ = caught.value
        assert secret not in errors.describe(wrapped)


def test_registered_values_are_masked_anywhere() -> None:
    redact.register("short")  # too short to register: would garble ordinary words
    redact.register(SECRET)
    assert redact.redact(f"token {SECRET}, again:{SECRET}") == "token ***, again:***"
    assert redact.redact("a short word") == "a short word"


def test_loading_the_config_registers_its_secrets() -> None:
    token = "tok-Xv3kR9pL2mQ7wZ4tB8nY6cJ1"
    load_config(
        overrides={
            "postgres.url": "postgresql://node:Pg%40ssw0rd@db/ids?sslpassword=K3ypass",
            "zookeeper.auth": "user:ZkPassw0rd",
            "node.admin_token": token,
        },
        env={},
    )
    for secret in ("Pg@ssw0rd", "Pg%40ssw0rd", "K3ypass", "ZkPassw0rd", token):
        assert secret not in redact.redact(f"x {secret} y"), secret


def test_an_invalid_config_registers_its_secrets_too() -> None:
    with pytest.raises(errors.InvalidConfigError) as caught:
        load_config(overrides={"zookeeper.auth": "user:Inval1dCfg", "pool.min_blocks": 0}, env={})
    assert "Inval1dCfg" not in str(caught.value)
    assert redact.redact("Inval1dCfg") == redact.MASK


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_log_lines_are_masked(log_format: str) -> None:
    redact.register(SECRET)
    stream = io.StringIO()
    stdlib = logging.getLogger("tests.redact")  # a library's records: stdlib, %-style
    handler = logs.handler(log_format, stream)
    stdlib.addHandler(handler)
    log = logs.get_logger("tests.redact")
    try:
        log.error("failed", url="postgresql://u:pw@h/db", note="password=x", token=SECRET)
        stdlib.error("library says url=%s password=%s", "postgresql://u:pw@h/db", "x")
        try:
            raise ValueError(f"boom postgresql://u:TbPass@h/db {SECRET}")
        except ValueError:
            log.exception("crashed")
    finally:
        stdlib.removeHandler(handler)
    text = stream.getvalue()
    for secret in (":pw@", "password=x", SECRET, "TbPass"):
        assert secret not in text, (secret, text)
    if log_format == "json":
        first, library, crashed = (json.loads(line) for line in text.splitlines() if line[0] == "{")
        assert first["url"] == "postgresql://u:***@h/db"
        assert first["note"] == f"password={redact.MASK}"
        assert first["token"] == redact.MASK
        assert (
            library["event"] == f"library says url=postgresql://u:***@h/db password={redact.MASK}"
        )
        assert crashed["event"] == "crashed"
        assert "ValueError: boom postgresql://u:***@h/db ***" in crashed["exception"]
