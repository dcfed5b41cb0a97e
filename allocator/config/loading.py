"""Loading: :func:`load_config` merges the defaults, a TOML file, the ``ALLOCATOR_*``
environment (and the secrets' ``*_FILE`` files) and command-line overrides into one
validated, frozen :class:`~allocator.config.Config`; :func:`parse_set_pairs` reads the
``--set`` flags. It reads those sources and the clock, nothing else.
"""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from allocator.config.checks import cross_check
from allocator.config.environment import (
    CONFIG_PATH_ENV,
    ENV_PREFIX,
    EnvSource,
    env_name,
    process_environment,
    secret_file_env,
)
from allocator.config.model import Config
from allocator.config.problems import error_message, show_value, unknown_key
from allocator.config.secrets import SECRET_KEYS, mask_url, read_secret_files, register_secrets
from allocator.config.sections import KEYS, SECTIONS, Section
from allocator.core.errors import ConfigError, InvalidConfigError, UsageError


def _read_file(path: Path) -> dict[str, Any]:
    shown = str(path) if str(path).isprintable() else repr(str(path))  # one line, always
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {shown}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {shown} is not valid TOML") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"config file {shown} is not valid UTF-8") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"cannot read config file {shown}") from exc


def _flatten(nested: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in nested.items():
        if isinstance(body, Mapping):
            flat.update({f"{section}.{key}": value for key, value in body.items()})
        else:
            flat[str(section)] = body
    return flat


def load_config(
    path: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    now_ms: int | None = None,
) -> Config:
    """Load, merge and validate: defaults < file < ``ALLOCATOR_*`` variables < ``overrides``.

    ``path`` defaults to ``$ALLOCATOR_CONFIG``; when neither is set no file is read (a file
    that was named must exist). ``overrides`` maps dotted keys (``"zookeeper.hosts"``) to
    values, text or typed: the command line's ``--set`` and dedicated flags. ``env``
    defaults to the process environment; a secret's ``*_FILE`` takes its variable's place
    (:func:`~allocator.config.secrets.read_secret_files`). ``now_ms`` (for the check that
    the layout epoch is not in the future) defaults to the clock.

    Every value is validated, and the rules between keys are checked once the keys involved
    are valid themselves. Raises :class:`InvalidConfigError` whose ``problems`` lists every
    problem, one line each (:mod:`allocator.config.problems`): an unknown key in the file,
    the environment or the overrides, or a bad value, named with its dotted key, the value
    and where it came from, e.g.
    ``pool.min_blocks: must be >= 1 (got 0, from ALLOCATOR_POOL_MIN_BLOCKS)``; "default"
    when a key nobody set breaks a rule with one that was set. Raises :class:`ConfigError`
    when the file is not TOML (or not UTF-8), or it or a secret's ``*_FILE`` cannot be
    read.

    Reads nothing else: ``node.name`` left empty becomes ``<hostname>-<pid>`` only when
    :meth:`~allocator.config.NodeConfig.resolved_name` is called.
    """
    env = process_environment() if env is None else env
    if path is None and env.get(CONFIG_PATH_ENV):
        path = Path(env[CONFIG_PATH_ENV])
    layers: list[tuple[Mapping[str, Any], Callable[[str], str]]] = []
    if path is not None:
        layers.append((_flatten(_read_file(path)), lambda key: f"from {path}"))
    env, from_files = read_secret_files(env)
    try:
        layers.append((_flatten(EnvSource(Config, env)()), lambda key: f"from {env_name(key)}"))
    except SettingsError as exc:
        raise ConfigError(f"cannot read the {ENV_PREFIX}* environment variables") from exc
    layers.append((from_files, lambda key: f"from {secret_file_env(key)}"))
    layers.append(
        ({str(k): v for k, v in (overrides or {}).items()}, lambda key: "from the command line")
    )

    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for flat, label in layers:
        for key, value in flat.items():
            values[key], origin[key] = value, label(key)
    register_secrets(values)

    problems: list[str] = []
    for key in [key for key in values if key not in KEYS]:
        problems.append(f"{unknown_key(key)} ({origin[key]})")
        del values[key]

    def line(key: str, message: str, value: object) -> str:
        shown = show_value(key, values.get(key, value))
        return f"{key}: {message} (got {shown}, {origin.get(key, 'default')})"

    sections: dict[str, Section] = {}
    for name, model in SECTIONS.items():
        prefix = f"{name}."
        body = {
            key[len(prefix) :]: value for key, value in values.items() if key.startswith(prefix)
        }
        try:
            sections[name] = model.model_validate(body)
        except ValidationError as exc:
            for error in exc.errors():
                key = ".".join([name, *(str(part) for part in error["loc"])])
                problems.append(line(key, error_message(error), error["input"]))
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    for key, message, value in cross_check(sections, set_keys=origin, now_ms=now_ms):
        problems.append(line(key, message, value))
    if problems:
        raise InvalidConfigError(problems)
    return Config.model_validate(sections)


def parse_set_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``--set section.key=value`` flags as overrides for :func:`load_config`; last one wins.

    A secret (``zookeeper.auth``, ``node.admin_token``, a ``postgres.url`` with a password)
    is refused: it would show in every process list. It comes from the environment or the
    config file."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        key = key.strip()
        if not equals or not re.fullmatch(r"[A-Za-z0-9_]+\.[A-Za-z0-9_]+", key):
            raise UsageError(
                f"--set {pair!r}: expected SECTION.KEY=VALUE, e.g. pool.min_blocks=128"
            )
        if key.lower() in SECRET_KEYS and (
            key.lower() != "postgres.url" or mask_url(value) != value
        ):
            # A flag shows in every process list (a URL without a password is no secret);
            # the value is not echoed here either.
            raise UsageError(
                f"--set {key.lower()}: a secret is never taken from the command line; "
                f"set {env_name(key.lower())} or put it in the config file"
            )
        overrides[key.lower()] = value
    return overrides


def load_from_options(
    config_path: Path | None,
    set_pairs: Iterable[str] = (),
    flags: Mapping[str, object] | None = None,
) -> Config:
    """:func:`load_config` from the shared options; ``flags`` (dedicated options) beat ``--set``."""
    return load_config(config_path, {**parse_set_pairs(set_pairs), **(flags or {})})
