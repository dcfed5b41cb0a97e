"""The secret keys (:data:`SECRET_KEYS`): ``postgres.url``'s password and every other libpq
secret parameter in it, ``zookeeper.auth``, ``zookeeper.sasl_password``,
``zookeeper.tls_key_password``, ``node.admin_token``. They are ``SecretStr``,
never echoed in errors, masked for display, and may come from a file named by a
``*_FILE`` variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import SecretStr

from allocator.config.environment import env_name, secret_file_env
from allocator.core import redact
from allocator.core.errors import ConfigError

MASK = redact.MASK
SECRET_KEYS = frozenset(
    {
        "postgres.url",
        "zookeeper.auth",
        "zookeeper.sasl_password",
        "zookeeper.tls_key_password",
        "node.admin_token",
    }
)


def mask_url(url: str) -> str:
    """``url`` with every libpq secret parameter masked
    (:func:`allocator.core.redact.mask_conninfo`)."""
    return redact.mask_conninfo(url)


def register_secrets(values: Mapping[str, object]) -> None:
    """Hands the secrets among ``values`` (dotted keys) to :func:`allocator.core.redact.register`,
    so no log line or error message of this process can print them: loading calls it as
    soon as it has read them."""
    for key in SECRET_KEYS:
        value = values.get(key)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not isinstance(value, str) or not value:
            continue
        if key == "postgres.url":
            redact.register(*redact.url_secrets(value))
        elif key == "zookeeper.auth":
            redact.register(value, value.partition(":")[2])
        else:
            redact.register(value)


def read_secret_files(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` without the secrets' ``*_FILE`` variables, and what their files hold by
    dotted key. An empty ``*_FILE`` variable counts as unset.

    Each secret can come from a file named by its variable plus ``_FILE``
    (:func:`~allocator.config.secret_file_env`: ``ALLOCATOR_NODE_ADMIN_TOKEN_FILE``,
    ``ALLOCATOR_ZOOKEEPER_AUTH_FILE``, ``ALLOCATOR_POSTGRES_URL_FILE``; systemd credentials,
    Kubernetes and compose secrets, ``allocator local env``): the file's text, stripped, on
    one line, in the environment's place in the order. Both the variable and its ``_FILE``
    is a :class:`~allocator.core.errors.ConfigError`, like a file that cannot be read."""
    file_keys = {secret_file_env(key): key for key in SECRET_KEYS}
    given = {name.upper() for name, value in env.items() if value}
    rest: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for name, value in env.items():
        key = file_keys.get(name.upper())
        if key is None:
            rest[name] = value
        elif value:
            if env_name(key) in given:
                raise ConfigError(f"set {env_name(key)} or {secret_file_env(key)}, not both")
            secrets[key] = _read_secret_file(secret_file_env(key), value)
    return rest, secrets


def _read_secret_file(name: str, path: str) -> str:
    shown = f"{name}={path if path.isprintable() else repr(path)}"  # one line, always
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: the file is not UTF-8 text") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "bad path"
        raise ConfigError(f"{shown}: cannot read the file ({reason})") from None
    if not text:
        raise ConfigError(f"{shown}: the file is empty")
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{shown}: the file must hold the secret on one line")
    return text
