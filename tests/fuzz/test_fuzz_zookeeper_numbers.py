"""Fuzz: the two numbers a node reads from ZooKeeper, the fence generation and the watermark
(issue 19, must-show 8).

A generation is ASCII decimal digits (surrounding whitespace ignored) in ``0..2^63-1``; a
watermark is our JSON object whose three integers fit ``bigint`` (``high_water_id`` may be
-1). Anything else is a ``ValueError`` with a one-line message: a node reports it, and one
bad write never blocks every node for good nor overflows a reset.

Inputs (``ci`` profile): ``parse_generation`` 300, ``Watermark.from_bytes`` 300.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.fence import BIGINT_MAX, Token, Watermark, parse_generation
from tests.fuzz.profiles import examples

_DIGITS = re.compile(r"[0-9]+")

NASTY_GENERATIONS = [
    b"",
    b" ",
    b"0",
    b" 7\n",
    b"-1",
    b"+1",
    b"1_000",
    b"1e3",
    b"0x10",
    "١٢".encode(),  # Arabic-Indic digits: int() accepts them
    "²".encode(),  # isdigit() but not int()
    str(BIGINT_MAX).encode(),
    str(BIGINT_MAX + 1).encode(),
    b"9" * 19,
    b"0" * 30 + b"5",
    b"9" * 5000,
    b"\xff\xfe",
]
generations = st.one_of(
    st.sampled_from(NASTY_GENERATIONS),
    st.binary(max_size=30),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda v: str(v).encode()),
    st.integers(0, BIGINT_MAX).map(lambda v: f" {v}\n".encode()),
)


def expected_generation(data: bytes) -> int | None:
    """The generation ``data`` holds, or None: a reference model of the parser."""
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if not _DIGITS.fullmatch(text):
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > 19 or int(digits) > BIGINT_MAX:
        return None
    return int(digits)


@settings(max_examples=examples(300))
@given(data=generations)
def test_parse_generation(data: bytes) -> None:
    expected = expected_generation(data)
    if expected is None:
        with pytest.raises(ValueError, match="generation znode holds") as caught:
            parse_generation(data)
        assert "\n" not in str(caught.value)
    else:
        assert parse_generation(data) == expected


BOUNDS = [-(2**70), -2, -1, 0, 1, BIGINT_MAX, BIGINT_MAX + 1, 2**64, 2**70]
numbers = st.one_of(
    st.sampled_from(BOUNDS),
    st.integers(),
    st.integers(-1, BIGINT_MAX),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)


@st.composite
def watermark_data(draw: st.DrawFn) -> bytes:
    """Mostly our object with fuzzed values; sometimes any JSON or any bytes."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=60))
    if kind == 1:
        value = draw(st.recursive(st.none() | st.integers() | st.text(max_size=5), st.lists))
        return json.dumps(value).encode()
    keys = draw(st.lists(st.sampled_from(["generation", "epoch", "high_water_id"]), max_size=3))
    raw = {key: draw(numbers) for key in ("generation", "epoch", "high_water_id")}
    for key in keys:  # a few keys missing
        raw.pop(key, None)
    return json.dumps(raw).encode()


def in_range(raw: dict[str, object]) -> bool:
    values = [raw.get(key) for key in ("generation", "epoch", "high_water_id")]
    if not all(type(v) is int for v in values):
        return False
    generation, epoch, high_water_id = (int(v) for v in values)  # type: ignore[call-overload]
    return (
        0 <= generation <= BIGINT_MAX
        and 0 <= epoch <= BIGINT_MAX
        and -1 <= high_water_id <= BIGINT_MAX
    )


@settings(max_examples=examples(300))
@given(data=watermark_data())
def test_watermark_from_bytes(data: bytes) -> None:
    try:
        raw = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        raw = None
    if isinstance(raw, dict) and in_range(raw):
        mark = Watermark.from_bytes(data)
        assert mark == Watermark(Token(raw["generation"], raw["epoch"]), raw["high_water_id"])
        assert Watermark.from_bytes(mark.to_bytes()) == mark
    else:
        with pytest.raises(ValueError, match="watermark znode holds") as caught:
            Watermark.from_bytes(data)
        assert "\n" not in str(caught.value)
