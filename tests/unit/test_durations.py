"""The one duration shape (issue 21, item 6): :mod:`allocator.core.durations` and the flags'
type :class:`allocator.commands.options.Duration`, with :func:`duration_option`'s old
spellings, on a command of the test's own (each real command's flag:
``tests/unit/test_duration_flags.py``).

Property tests (hypothesis, ``ci`` profile): what :func:`format_duration` writes reads back
as the same value; any text either parses or is refused with :class:`InvalidDurationError`,
never anything else; a duration's parts add up.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import cli
from allocator.commands import options
from allocator.commands.options import MILLISECOND, SECOND, Duration
from allocator.core import durations
from allocator.core.errors import InvalidDurationError
from allocator.core.exits import Exit
from tests.fuzz.profiles import examples


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("2h", timedelta(hours=2)),
        ("500ms", timedelta(milliseconds=500)),
        ("1m30s", timedelta(minutes=1, seconds=30)),
        ("1h30m15s250ms", timedelta(hours=1, minutes=30, seconds=15, milliseconds=250)),
        ("1.5s", timedelta(milliseconds=1500)),
        ("0.25ms", timedelta(microseconds=250)),
        ("1s1s", timedelta(seconds=2)),  # the parts add up
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        (" 5m ", timedelta(minutes=5)),
        ("87600h", durations.MAX),
    ],
)
def test_a_number_with_a_unit_is_a_duration(text: str, expected: timedelta) -> None:
    assert durations.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("30", "'30' has no unit (write 30s"),
        ("1.5", "'1.5' has no unit"),
        ("-1s", "'-1s': a duration is never negative"),
        ("-0", "never negative"),
        ("", "is not a duration"),
        ("s", "is not a duration"),
        ("5 m", "is not a duration"),
        ("5M", "is not a duration"),  # units are lower case: M is not m
        ("1d", "is not a duration"),
        ("1e3s", "is not a duration"),
        ("nans", "is not a duration"),
        ("inf", "is not a duration"),
        (".5s", "is not a duration"),
        ("5.s", "is not a duration"),
        ("\u0661s", "is not a duration"),  # an Arabic-Indic one: digits are ASCII
        ("0.0001ms", "finer than a microsecond"),
        ("87601h", "longer than 87600h"),
        ("9" * 70 + "h", "is not a duration"),  # too long to read at all
    ],
)
def test_anything_else_is_refused_naming_the_text(text: str, reason: str) -> None:
    with pytest.raises(InvalidDurationError) as caught:
        durations.parse(text)
    assert reason in str(caught.value)
    assert caught.value.exit_code == Exit.USAGE
    assert "\n" not in str(caught.value)


def test_a_control_character_is_escaped_in_the_error() -> None:
    with pytest.raises(InvalidDurationError) as caught:
        durations.parse("5\x1b[2Js")
    assert "\x1b" not in str(caught.value)
    assert "\\x1b" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(milliseconds=500), "500ms"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(seconds=90, milliseconds=5), "1m30s5ms"),
        (timedelta(days=2), "48h"),
    ],
)
def test_format_writes_the_shortest_text(value: timedelta, text: str) -> None:
    assert durations.format_duration(value) == text


def test_milliseconds_refuses_a_fraction() -> None:
    assert durations.milliseconds(timedelta(seconds=4)) == 4000
    with pytest.raises(ValueError, match="whole number of milliseconds"):
        durations.milliseconds(timedelta(microseconds=1500))


@settings(max_examples=examples(200))
@given(st.integers(0, durations.MAX // timedelta(microseconds=1)))
def test_what_format_writes_reads_back(micros: int) -> None:
    value = timedelta(microseconds=micros)
    assert durations.parse(durations.format_duration(value)) == value


@settings(max_examples=examples(300))
@given(st.text(max_size=30))
def test_any_text_parses_or_is_refused_as_a_usage_error(text: str) -> None:
    try:
        value = durations.parse(text)
    except InvalidDurationError:
        return
    assert timedelta(0) <= value <= durations.MAX


@settings(max_examples=examples(200))
@given(
    st.lists(
        st.tuples(st.integers(0, 999), st.sampled_from(sorted(durations.UNITS))),
        min_size=1,
        max_size=4,
    )
)
def test_the_parts_add_up(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{count}{unit}" for count, unit in parts)
    micros = sum(count * durations.UNITS[unit] for count, unit in parts)
    assert durations.parse(text) == timedelta(microseconds=micros)


# -- the flags' type and the old spellings, on a command of our own ------------------------


def toy(**kind: Any) -> click.Command:
    """``toy --wait`` (old: ``--wait-ms`` and ``TOY_WAIT_OLD``, a number of ms), printing
    what the command got, in ms; ``toy --limit`` (a bare number once meant seconds)."""

    @click.command("toy")
    @options.duration_option(
        "--wait",
        kind=Duration(**kind),
        default=2 * SECOND,
        into="wait_ms",
        convert=durations.milliseconds,
        old_flag="--wait-ms",
        old_unit="ms",
        old_envvar="TOY_WAIT_OLD",
        help="How long.",
    )
    @click.option("--limit", type=Duration(bare_unit="s", maximum=60 * SECOND), default=None)
    def command(wait_ms: int, limit: timedelta | None) -> None:
        click.echo(f"wait_ms={wait_ms} limit={limit}")

    return command


def run(args: list[str], env: dict[str, str] | None = None, **kind: Any) -> tuple[int, str, str]:
    settings = {"auto_envvar_prefix": "CLI", "show_default": True}
    group = cli._Group("cli", context_settings=settings)  # the CLI's: our errors, codes
    group.add_command(toy(**kind))
    result = CliRunner().invoke(group, ["toy", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_the_new_spelling_and_its_default() -> None:
    assert run([]) == (0, "wait_ms=2000 limit=None\n", "")
    assert run(["--wait", "1m"])[1] == "wait_ms=60000 limit=None\n"
    assert run([], env={"CLI_TOY_WAIT": "250ms"})[1] == "wait_ms=250 limit=None\n"


@pytest.mark.parametrize(
    ("args", "env", "warning"),
    [
        (["--wait-ms", "250"], {}, "warning: --wait-ms is deprecated: use --wait 250ms"),
        ([], {"CLI_TOY_WAIT_MS": "250"}, "warning: CLI_TOY_WAIT_MS is deprecated: use --wait"),
        (
            [],
            {"TOY_WAIT_OLD": "250"},
            "warning: TOY_WAIT_OLD is deprecated: set CLI_TOY_WAIT=250ms",
        ),
    ],
)
def test_an_old_spelling_still_works_and_warns(
    args: list[str], env: dict[str, str], warning: str
) -> None:
    code, out, err = run(args, env=env)
    assert (code, out) == (0, "wait_ms=250 limit=None\n")
    assert err.startswith(warning), err


def test_a_bad_old_variable_is_named() -> None:
    code, _out, err = run([], env={"TOY_WAIT_OLD": "-3"})
    assert code == Exit.USAGE
    assert "error: TOY_WAIT_OLD: '-3': a duration is never negative" in err


def test_the_old_and_the_new_spelling_together_are_refused() -> None:
    code, _out, err = run(["--wait", "1s", "--wait-ms", "5"])
    assert code == Exit.USAGE
    assert "give --wait or --wait-ms, not both" in err


def test_a_flag_that_took_seconds_reads_a_bare_number_with_a_warning() -> None:
    code, out, err = run(["--limit", "1.5"])
    assert (code, out) == (0, "wait_ms=2000 limit=0:00:01.500000\n")
    assert "warning: --limit 1.5: a number without a unit is deprecated; write 1.5s" in err
    code, out, err = run([], env={"CLI_TOY_LIMIT": "2"})
    assert "warning: CLI_TOY_LIMIT 2: a number without a unit is deprecated" in err


@pytest.mark.parametrize(
    ("args", "kind", "message"),
    [
        (["--wait", "0s"], {}, "'0s': must be more than 0"),
        (["--wait", "-5s"], {}, "never negative"),
        (["--wait", "5"], {}, "'5' has no unit"),  # a new spelling never guesses a unit
        (["--wait", "1.5ms"], {"step": MILLISECOND}, "not a whole number of milliseconds"),
        (["--wait", "10ms"], {"minimum": SECOND}, "'10ms' is less than 1s"),
        (["--wait", "2m"], {"maximum": 60 * SECOND}, "'2m' is more than 1m"),
        (["--limit", "2m"], {}, "'2m' is more than 1m"),
        (["--limit", "nan"], {}, "is not a duration"),
        (["--wait-ms", "-1"], {}, "never negative"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag(
    args: list[str], kind: dict[str, Any], message: str
) -> None:
    code, out, err = run(args, **kind)
    assert code == Exit.USAGE, err
    assert out == ""
    assert f"Invalid value for '{args[0]}'" in err
    assert message in err


def test_a_fraction_of_the_unit_the_command_takes_is_a_usage_error() -> None:
    code, _out, err = run(["--wait", "1.5ms"])  # no step: the conversion refuses it
    assert code == Exit.USAGE
    assert "--wait: 1.5ms is not a whole number of milliseconds" in err


def test_zero_where_it_means_something() -> None:
    assert run(["--wait", "0"], zero=True)[1] == "wait_ms=0 limit=None\n"


def test_old_spellings_are_hidden_from_help() -> None:
    code, out, _err = run(["--help"])
    assert code == 0
    assert "--wait DURATION" in out
    assert "--wait-ms" not in out
    assert "default: 2s" in out
