"""Fuzz: ``decode``, the Python function and ``allocator decode`` (issue 10, must-show 8).

An ID is ASCII decimal digits (an optional sign, surrounding whitespace ignored) in
``0..2^63-1``; anything else, including what ``int()`` would accept (``'1_000'``, Arabic-Indic
or full-width digits), is :class:`~allocator.core.errors.InvalidIdError`: one line, exit 2.
A valid ID decodes into fields that rebuild it.

Inputs (``ci`` profile): ``parse_id`` 300, ``Layout.decode`` 200, ``allocator decode`` 150.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.core.errors import InvalidIdError
from allocator.core.exits import Exit
from allocator.core.layout import MAX_ID, Layout, parse_id
from tests.fuzz.clikit import check_answer, clean_environment, invoke
from tests.fuzz.profiles import examples

_ASCII_ID = re.compile(r"[+-]?[0-9]+", re.ASCII)

NASTY_IDS = [
    "",
    " ",
    "-0",
    "+0",
    "-1",
    "-5",
    "+5",
    "--5",
    "+-5",
    "1_000",
    "1 000",
    "1,000",
    "0x10",
    "0o7",
    "0b1",
    "1e3",
    "1.0",
    "1.",
    ".5",
    "١٢٣",  # Arabic-Indic digits: int() accepts them
    "\uff11\uff12\uff13",  # full-width digits: int() accepts them
    "߁",  # NKo digit one
    "²",  # superscript two: isdigit() but not int()
    "\u00a012\u00a0",  # NBSP around digits: str.strip() removes it
    "\t12\n",
    "12\x00",
    "\x1b[2J",
    "nan",
    "inf",
    "None",
    str(MAX_ID),
    str(MAX_ID + 1),
    str(2**64),
    str(2**64 - 1),
    "9" * 19,
    "9" * 5000,  # more digits than int() converts by default
    "0" * 5000 + "7",
    "-" + "9" * 400,
    str(10**400),
    "\udcff",  # an undecodable byte of a command line
    "--json",
    "--help",
]
id_texts = st.one_of(
    st.sampled_from(NASTY_IDS),
    st.text(max_size=30),
    st.integers().map(str),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.from_regex(r"\s*[+-]?[0-9_]{1,25}\s*", fullmatch=True),
    st.tuples(st.sampled_from(["", " ", "+", "-", "\t"]), st.integers(0, MAX_ID)).map(
        lambda pair: f"{pair[0]}{pair[1]}"
    ),
)


def expected_id(text: str) -> int | None:
    """The ID ``text`` names, or None: a reference model of :func:`parse_id`."""
    stripped = text.strip()
    if not _ASCII_ID.fullmatch(stripped):
        return None
    digits = stripped.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:
        return None
    value = -int(digits) if stripped.startswith("-") else int(digits)
    return value if 0 <= value <= MAX_ID else None


@settings(max_examples=examples(300))
@given(text=id_texts)
def test_parse_id(text: str) -> None:
    expected = expected_id(text)
    if expected is None:
        with pytest.raises(InvalidIdError) as caught:
            parse_id(text)
        message = str(caught.value)
        assert message
        assert "\n" not in message, message
        assert "\r" not in message, message
        assert caught.value.exit_code == Exit.USAGE
        assert len(message) < 200, message  # long input is abbreviated
    else:
        assert parse_id(text) == expected


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    timestamp_bits = draw(st.integers(1, 41))
    rest = 63 - timestamp_bits
    sequence_bits = draw(st.integers(1, rest))
    datacenter_bits = draw(st.integers(0, rest - sequence_bits))
    return Layout(
        epoch_ms=draw(st.integers(0, 1_800_000_000_000)),
        timestamp_bits=timestamp_bits,
        datacenter_bits=datacenter_bits,
        lane_bits=rest - sequence_bits - datacenter_bits,
        sequence_bits=sequence_bits,
    )


ids = st.one_of(
    st.integers(),
    st.integers(0, MAX_ID),
    st.sampled_from([-1, MAX_ID, MAX_ID + 1, 2**64, -(2**63), 10**400, -(10**400)]),
)


@settings(max_examples=examples(200))
@given(layout=st.one_of(st.just(Layout()), layouts()), snowflake_id=ids)
def test_layout_decode(layout: Layout, snowflake_id: int) -> None:
    if not 0 <= snowflake_id <= MAX_ID:
        with pytest.raises(InvalidIdError) as caught:
            layout.decode(snowflake_id)
        assert "\n" not in str(caught.value)
        assert len(str(caught.value)) < 200
        return
    fields = layout.decode(snowflake_id)
    offset_ms = fields.timestamp_ms - layout.epoch_ms
    rebuilt = (
        (offset_ms << (layout.datacenter_bits + layout.lane_bits + layout.sequence_bits))
        | (fields.datacenter << (layout.lane_bits + layout.sequence_bits))
        | (fields.lane << layout.sequence_bits)
        | fields.sequence
    )
    assert rebuilt == snowflake_id


def test_decode_command(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_environment(monkeypatch)

    @settings(max_examples=examples(150))
    @given(
        text=id_texts.filter(lambda text: "\x00" not in text),  # no argv holds a NUL
        as_json=st.booleans(),
    )
    def run(text: str, as_json: bool) -> None:
        args = ["decode", *(["--json"] if as_json else []), text]
        result = invoke(args)
        check_answer(result, args)
        expected = expected_id(text)
        if text == "--help":
            assert result.exit_code == 0, result.output
            assert result.stdout.startswith("Usage:")
            return
        if expected is None:
            assert result.exit_code == Exit.USAGE, result.output
            assert result.stdout == ""
            return
        assert result.exit_code == 0, result.output
        if as_json:
            document = json.loads(result.stdout)
            assert document["id"] == expected
            assert set(document) >= {"id", "timestamp_ms", "time", "datacenter", "lane"}
        else:
            assert result.stdout.startswith(f"id          {expected}\n")

    run()
