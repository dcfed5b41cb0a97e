"""Fuzz: configuration values and unknown keys, from a TOML file, ``ALLOCATOR_*`` variables,
``--set`` pairs and typed overrides (issue 10, must-show 8).

Every outcome is a valid :class:`~allocator.config.Config` or the project's own error:
:class:`~allocator.core.errors.ConfigError` (exit 78; :class:`InvalidConfigError` lists one line
per problem) or, for a malformed ``--set`` pair, :class:`~allocator.core.errors.UsageError`
(exit 2). Never another exception, never a message of several lines, never a secret echoed.
A valid configuration only holds values the node can use: finite durations a timer or a
``timedelta`` accepts, and PostgreSQL settings that fit the server's ``integer``.

Inputs per surface (``ci`` profile): file 150, raw file bytes 40, environment 150,
``--set`` 150, typed overrides 100.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from allocator import config as config_mod
from allocator.config import KEYS, SECTIONS, Config, env_name, load_config, load_from_options
from allocator.core.errors import ConfigError, InvalidConfigError, UsageError
from allocator.core.exits import Exit
from tests.fuzz.profiles import examples

NOW_MS = 1_800_000_000_000  # 2027-01-15: "the epoch is not in the future" is deterministic
SECRET = "Zq9SecretMarker"
"""Part of every generated secret; no error message may contain it."""
PG_INT_MAX = 2**31 - 1
INT32_KEYS = {
    "postgres.statement_timeout_ms",
    "postgres.idle_in_transaction_timeout_ms",
    "postgres.tcp_user_timeout_ms",
    "zookeeper.session_timeout_ms",
}
"""PostgreSQL's integer settings, and ZooKeeper's session timeout (an int32 on the wire)."""

UNKNOWN_SECTIONS = ["clusters", "Pool", "zk", "", " ", "pool.min", "ü", "x" * 200, "node\n"]
UNKNOWN_KEYS = ["min_block", "MIN_BLOCKS", "", " ", "a.b", "ключ", "x" * 200, "tab\there"]

# Text that trips parsers: numbers in odd forms, huge and tiny, non-finite, non-ASCII
# digits (int() accepts some of these), blanks, controls, NUL, separators, surrogates.
NASTY = [
    "",
    " ",
    "-1",
    "0",
    "-0",
    "1.5",
    "1e400",
    "-1e400",
    "1e-400",
    "nan",
    "NaN",
    "inf",
    "-Infinity",
    "1_000",
    "0x10",
    "0b1",
    "٣",
    "١٢٣",
    "\uff11\uff12",  # full-width digits
    " 12 ",
    "12abc",
    "9" * 30,
    "9" * 5000,
    str(2**63),
    str(2**31),
    str(-(2**63) - 1),
    "true",
    "false",
    "null",
    "[]",
    "{}",
    '{"min_blocks": 1}',
    "a\nb",
    "a\x00b",
    "\x00",
    "\x1b[31mred",
    "\u2028",
    "\ufeff1",
    "\udcff",
    "postgresql://",
    "postgresql://u:pw@h:99999/db",
    "postgresql://[::1",
    "host:0",
    "host:65536",
    "[::1]:2181",
    "/",
    "//",
    "/a/../b",
    "/zookeeper/x",
    "user:",
    ":pw",
    "2020-01-01T00:00:00",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00+00:00",
]
text_values = st.one_of(st.sampled_from(NASTY), st.text(max_size=40))
env_text = text_values.map(lambda text: text.replace("\x00", ""))  # environ cannot hold NUL
"""Environment values: any text but NUL, which no process environment can carry."""
EXTREMES: list[int | float] = [
    0,
    -1,
    2**31 - 1,
    2**31,
    2**63 - 1,
    2**63,
    10**30,
    10**400,
    1e9,
    1e12,
    1e300,
    1.7e308,
    5e-324,
    -0.0,
    0.5,
]
"""Numbers at the edges: int32, int64, timer and timedelta limits, the smallest float."""
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30]),
    st.floats(),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 5e-324, -0.0, 0.5]),
)


def secret_value(key: str) -> st.SearchStrategy[str]:
    """Values for a secret key that carry :data:`SECRET` where a secret goes."""
    if key == "postgres.url":
        return st.sampled_from(
            [
                f"postgresql://u:{SECRET}@127.0.0.1:1/db",
                f"postgres://u:{SECRET}@[::1:5432/db",
                f"postgresql://u:{SECRET}@h:0/db",
                f"postgresql://u:{SECRET}@h/db?password={SECRET}",
                f"mysql://u:{SECRET}@h/db",
                f"postgresql://u:{SECRET}/x@h/db",
            ]
        )
    return st.sampled_from([f"user:{SECRET}", SECRET, f"u:{SECRET}\n", f"{SECRET}" * 40])


def value_for(key: str, *, as_text: bool) -> st.SearchStrategy[Any]:
    """Values for ``key``: mostly nonsense, sometimes plausible, secrets marked."""
    if key in config_mod.SECRET_KEYS:
        return st.one_of(secret_value(key), text_values)
    extreme = st.sampled_from(EXTREMES)
    if as_text:
        return st.one_of(extreme.map(str), text_values, numbers.map(str))
    return st.one_of(extreme, text_values, numbers, st.booleans())


known_keys = st.sampled_from(KEYS)
unknown_keys = st.one_of(
    st.tuples(st.sampled_from(list(SECTIONS)), st.sampled_from(UNKNOWN_KEYS)).map(".".join),
    st.tuples(st.sampled_from(UNKNOWN_SECTIONS), st.sampled_from(UNKNOWN_KEYS)).map(".".join),
    st.sampled_from(list(SECTIONS)),
)


# -- checking an outcome -------------------------------------------------------------------


def one_line(text: str) -> bool:
    return "\n" not in text and "\r" not in text and "Traceback" not in text


def check_usable(config: Config) -> None:
    """A valid config holds nothing the node would choke on at run time."""
    for name, section in config.sections().items():
        for key, value in section:
            where = f"{name}.{key} = {value!r}"
            if isinstance(value, bool | str | SecretStr):
                continue
            if isinstance(value, float):
                assert math.isfinite(value), where
                # A timer, a join or a sleep of it, or a timedelta, must not overflow.
                assert abs(value) <= threading.TIMEOUT_MAX, where
                datetime.now(UTC) - timedelta(seconds=value)
            elif isinstance(value, int):
                assert -(2**63) < value < 2**63, where
                if f"{name}.{key}" in INT32_KEYS:
                    assert value <= PG_INT_MAX, where
    json.dumps(config.masked_dict(), default=str)
    config.layout.decode(0)


def check_outcome(load: Callable[[], Config]) -> str:
    """Run ``load``; assert its outcome is documented. Returns "valid", or the error's class."""
    try:
        config = load()
    except (ConfigError, UsageError) as exc:
        error: ConfigError | UsageError = exc
    else:
        assert isinstance(config, Config)
        check_usable(config)
        return "valid"
    message = str(error)
    assert message, error
    assert one_line(message), message
    assert SECRET not in message, message
    assert error.exit_code in (Exit.USAGE, Exit.CONFIG)
    if not isinstance(error, InvalidConfigError):
        return type(error).__name__
    assert error.problems
    assert error.exit_code == 78
    for problem in error.problems:
        assert one_line(problem), problem
        assert SECRET not in problem, problem
        assert problem.partition(":")[0], problem  # names its key
    return "invalid"


# -- a small TOML writer (the standard library only reads TOML) ---------------------------


def toml_string(text: str) -> str:
    # A JSON string is a TOML basic string, except that TOML forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    return toml_string(str(value))


def toml_document(tables: Mapping[str, object]) -> str:
    lines: list[str] = []
    for section, body in tables.items():
        if isinstance(body, dict):
            lines.append(f"[{toml_string(section)}]")
            lines += [f"{toml_string(key)} = {toml_value(value)}" for key, value in body.items()]
        else:
            lines.insert(0, f"{toml_string(section)} = {toml_value(body)}")
    return "\n".join(lines) + "\n"


toml_scalars = st.one_of(
    text_values.filter(lambda text: not any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)),
    numbers.filter(lambda n: not isinstance(n, int) or -(2**63) <= n < 2**63),
    st.sampled_from(EXTREMES).filter(lambda n: not isinstance(n, int) or n < 2**63),
    st.booleans(),
    st.datetimes(timezones=st.sampled_from([UTC, None])),
)
toml_values = st.one_of(
    toml_scalars,
    st.lists(toml_scalars, max_size=3),
    st.dictionaries(st.sampled_from(UNKNOWN_KEYS), toml_scalars, max_size=2),
)


@st.composite
def toml_tables(draw: st.DrawFn) -> dict[str, object]:
    tables: dict[str, object] = {}
    for section in draw(
        st.lists(st.sampled_from([*SECTIONS, *UNKNOWN_SECTIONS]), max_size=4, unique=True)
    ):
        if section not in SECTIONS or draw(st.integers(0, 9)) == 0:
            # An unknown table, or a known section given as a plain value.
            tables[section] = draw(st.one_of(toml_values, st.just({})))
            continue
        fields = list(SECTIONS[section].model_fields)
        body: dict[str, object] = {}
        for key in draw(st.lists(st.sampled_from([*fields, *UNKNOWN_KEYS]), max_size=4)):
            dotted = f"{section}.{key}"
            if dotted in config_mod.SECRET_KEYS:
                body[key] = draw(secret_value(dotted))
            else:
                body[key] = draw(toml_values)
        tables[section] = body
    return tables


# -- the surfaces ----------------------------------------------------------------------------


def test_file_values_and_unknown_keys(tmp_path: Path) -> None:
    seen: dict[str, int] = {}

    @settings(max_examples=examples(150))
    @given(tables=toml_tables())
    def run(tables: dict[str, object]) -> None:
        path = tmp_path / "allocator.toml"
        path.write_text(toml_document(tables), encoding="utf-8")
        outcome = check_outcome(lambda: load_config(path, env={}, now_ms=NOW_MS))
        seen[outcome] = seen.get(outcome, 0) + 1

    run()
    assert seen.get("invalid"), seen  # the generator does reach validation


def test_raw_file_bytes(tmp_path: Path) -> None:
    """Not TOML, not UTF-8, truncated: one ConfigError line."""
    fragments = st.sampled_from(
        [b"[pool]\n", b"min_blocks = ", b"\xff\xfe", b"\x00", b'"', b"[[", b"= 1\n", b"\n"]
    )

    @settings(max_examples=examples(40))
    @given(content=st.one_of(st.binary(max_size=64), st.lists(fragments).map(b"".join)))
    def run(content: bytes) -> None:
        path = tmp_path / "raw.toml"
        path.write_bytes(content)
        check_outcome(lambda: load_config(path, env={}, now_ms=NOW_MS))

    run()


@st.composite
def environments(draw: st.DrawFn, tmp_path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.integers(0, 9))
        if kind <= 5:
            key = draw(known_keys)
            value = draw(value_for(key, as_text=True))
            env[env_name(key)] = value.replace("\x00", "")
        elif kind == 6:
            env[env_name(draw(unknown_keys))] = draw(env_text)
        elif kind == 7:  # a whole section as JSON, pydantic-settings' nested form
            section = draw(st.sampled_from(list(SECTIONS)))
            body = draw(st.dictionaries(st.sampled_from([*UNKNOWN_KEYS, "min_blocks"]), numbers))
            text = draw(st.one_of(st.just(json.dumps(body, default=str)), env_text))
            env[f"{config_mod.ENV_PREFIX}{section.upper()}"] = text
        elif kind == 8:
            env[env_name(draw(known_keys)).lower()] = draw(env_text)
        else:
            env[config_mod.CONFIG_PATH_ENV] = draw(
                st.sampled_from(["", str(tmp_path / "missing.toml"), str(tmp_path)])
            )
    return env


def test_environment_values_and_unknown_variables(tmp_path: Path) -> None:
    @settings(max_examples=examples(150))
    @given(env=environments(tmp_path))
    def run(env: dict[str, str]) -> None:
        check_outcome(lambda: load_config(None, env=env, now_ms=NOW_MS))

    run()


@st.composite
def set_pair(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 9))
    if kind <= 5:
        key = draw(known_keys)
        return f"{key}={draw(value_for(key, as_text=True))}"
    if kind == 6:
        return f"{draw(unknown_keys)}={draw(text_values)}"
    if kind == 7:
        return draw(st.sampled_from(["", "=", "pool.min_blocks", "=5", "pool=1", " . =1"]))
    if kind == 8:
        return f"{draw(known_keys).upper()} = {draw(text_values)}"
    return draw(text_values)


def test_set_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("ALLOCATOR_")]:
        monkeypatch.delenv(name)

    @settings(max_examples=examples(150))
    @given(pairs=st.lists(set_pair(), min_size=1, max_size=4))
    def run(pairs: list[str]) -> None:
        check_outcome(lambda: load_from_options(None, pairs))

    run()


odd_objects = st.one_of(
    st.none(),
    numbers,
    st.booleans(),
    text_values,
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
    st.just(b"\xff"),
    st.datetimes(),
)


def test_typed_overrides() -> None:
    """The Python API (dedicated CLI flags pass typed values): any object per key."""

    pairs = st.one_of(
        known_keys.flatmap(lambda key: st.tuples(st.just(key), value_for(key, as_text=False))),
        st.tuples(st.one_of(known_keys, unknown_keys), odd_objects),
    )

    @settings(max_examples=examples(100))
    @given(overrides=st.lists(pairs, min_size=1, max_size=4).map(dict))
    def run(overrides: dict[str, object]) -> None:
        check_outcome(lambda: load_config(None, overrides, env={}, now_ms=NOW_MS))

    run()
