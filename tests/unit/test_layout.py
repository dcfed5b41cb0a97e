"""The Snowflake layout: round trips, ordering, bounds and validation (no servers)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.core.errors import InvalidIdError, LayoutError, UsageError
from allocator.core.layout import (
    DEFAULT_EPOCH_MS,
    MAX_ID,
    DecodedId,
    Layout,
    format_utc_ms,
    parse_id,
)

NOW_MS = 1_800_000_000_000  # 2027-01-15; a fixed "now" keeps the tests independent of the clock
# With 47 timestamp bits every epoch up to NOW_MS still ends before the year 10000.
MAX_TESTED_TIMESTAMP_BITS = 47


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    timestamp_bits = draw(st.integers(1, MAX_TESTED_TIMESTAMP_BITS))
    rest = 63 - timestamp_bits
    sequence_bits = draw(st.integers(1, rest))
    datacenter_bits = draw(st.integers(0, rest - sequence_bits))
    return Layout(
        epoch_ms=draw(st.integers(0, NOW_MS)),
        timestamp_bits=timestamp_bits,
        datacenter_bits=datacenter_bits,
        lane_bits=rest - sequence_bits - datacenter_bits,
        sequence_bits=sequence_bits,
    )


Position = tuple[int, int, int, int]  # (timestamp_ms, datacenter, lane, sequence)


def positions(layout: Layout, datacenter: int | None = None) -> st.SearchStrategy[Position]:
    return st.tuples(
        st.integers(layout.epoch_ms, layout.ends_at_ms),
        st.just(datacenter) if datacenter is not None else st.integers(0, layout.max_datacenter),
        st.integers(0, layout.max_lane),
        st.integers(0, layout.max_sequence),
    )


@given(st.data())
def test_encode_decode_round_trip(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    timestamp_ms, datacenter, lane, sequence = data.draw(positions(layout))
    snowflake_id = layout.encode(timestamp_ms, datacenter, lane, sequence)
    assert 0 <= snowflake_id <= MAX_ID
    decoded = layout.decode(snowflake_id)
    assert (decoded.timestamp_ms, decoded.datacenter, decoded.lane, decoded.sequence) == (
        timestamp_ms,
        datacenter,
        lane,
        sequence,
    )
    assert decoded.id == snowflake_id
    assert decoded.time == datetime.fromtimestamp(timestamp_ms / 1000, UTC).replace(
        microsecond=timestamp_ms % 1000 * 1000
    )


@given(st.data())
def test_every_id_decodes_and_re_encodes(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    snowflake_id = data.draw(st.integers(0, MAX_ID))
    d = layout.decode(snowflake_id)
    assert layout.encode(d.timestamp_ms, d.datacenter, d.lane, d.sequence) == snowflake_id


@given(st.data())
def test_id_order_is_timestamp_lane_sequence_order(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    datacenter = data.draw(st.integers(0, layout.max_datacenter))
    first = data.draw(positions(layout, datacenter))
    second = data.draw(positions(layout, datacenter))
    first_id, second_id = layout.encode(*first), layout.encode(*second)

    def key(position: Position) -> tuple[int, int, int]:
        return position[0], position[2], position[3]

    assert (key(first) < key(second)) == (first_id < second_id)
    assert (key(first) == key(second)) == (first_id == second_id)


@given(layouts())
def test_extreme_positions_encode_to_zero_and_max_id(layout: Layout) -> None:
    assert layout.encode(layout.epoch_ms, 0, 0, 0) == 0
    top = layout.encode(
        layout.ends_at_ms, layout.max_datacenter, layout.max_lane, layout.max_sequence
    )
    assert top == MAX_ID


@given(st.data())
def test_out_of_range_fields_raise(data: st.DataObject) -> None:
    layout = data.draw(layouts())
    timestamp_ms, datacenter, lane, sequence = data.draw(positions(layout))
    bad_calls = {
        "timestamp_ms": (layout.epoch_ms - 1, datacenter, lane, sequence),
        "datacenter": (timestamp_ms, layout.max_datacenter + 1, lane, sequence),
        "lane": (
            timestamp_ms,
            datacenter,
            data.draw(st.sampled_from([-1, layout.lanes])),
            sequence,
        ),
        "sequence": (timestamp_ms, datacenter, lane, layout.max_sequence + 1),
    }
    for field, args in bad_calls.items():
        with pytest.raises(LayoutError) as caught:
            layout.encode(*args)
        assert caught.value.field == field
    with pytest.raises(LayoutError, match="past the end"):
        layout.encode(layout.ends_at_ms + 1, datacenter, lane, sequence)


def test_out_of_range_timestamps_name_the_dates() -> None:
    layout = Layout()
    with pytest.raises(LayoutError, match=r"2019-12-31T23:59:59\.999Z is before .*2020-01-01T00"):
        layout.encode(DEFAULT_EPOCH_MS - 1, 0, 0, 0)
    with pytest.raises(LayoutError, match=r"time bits ran out at 2089-09-06T15:47:35\.551Z"):
        layout.encode(layout.ends_at_ms + 1, 0, 0, 0)


def test_default_layout() -> None:
    layout = Layout()
    assert layout.epoch == datetime(2020, 1, 1, tzinfo=UTC)
    assert (layout.lanes, layout.max_lane, layout.max_sequence, layout.max_datacenter) == (
        32,
        31,
        4095,
        31,
    )
    assert layout.max_timestamp_offset_ms == 2**41 - 1
    # 2^41 ms after 2020-01-01 is 2089-09-06T15:47:35.552Z; the last usable ms is one before.
    assert layout.ends_at_ms == 3_776_860_055_551
    assert layout.ends_at == datetime(2089, 9, 6, 15, 47, 35, 551_000, tzinfo=UTC)
    assert format_utc_ms(layout.ends_at_ms) == "2089-09-06T15:47:35.551Z"


def test_known_vector() -> None:
    layout = Layout()
    expected = (1 << 22) | (1 << 17) | (2 << 12) | 3
    assert layout.encode(DEFAULT_EPOCH_MS + 1, 1, 2, 3) == expected
    assert layout.decode(expected).to_json() == {
        "id": expected,
        "timestamp_ms": DEFAULT_EPOCH_MS + 1,
        "time": "2020-01-01T00:00:00.001Z",
        "datacenter": 1,
        "lane": 2,
        "sequence": 3,
    }


def test_decoded_id_json_has_exactly_the_stable_keys() -> None:
    decoded = Layout().decode(MAX_ID)
    assert isinstance(decoded, DecodedId)
    assert set(decoded.to_json()) == {
        "id",
        "timestamp_ms",
        "time",
        "datacenter",
        "lane",
        "sequence",
    }
    assert decoded.to_json()["time"] == "2089-09-06T15:47:35.551Z"
    assert decoded.time.tzinfo is UTC


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        (
            {"timestamp_bits": 40},
            None,
            r"sum to 63.*timestamp 40 \+ datacenter 5 \+ lane 5 \+ sequence 12 = 62",
        ),
        ({"sequence_bits": 13}, None, "sum to 63"),
        ({"timestamp_bits": 0, "sequence_bits": 53}, "timestamp_bits", "must be >= 1"),
        ({"sequence_bits": 0, "timestamp_bits": 53}, "sequence_bits", "must be >= 1"),
        ({"datacenter_bits": -1, "lane_bits": 11}, "datacenter_bits", "must be >= 0"),
        ({"lane_bits": -1, "datacenter_bits": 11}, "lane_bits", "must be >= 0"),
        ({"epoch_ms": -1}, "epoch_ms", "must be >= 0"),
        ({"epoch_ms": 1.5}, "epoch_ms", "must be an integer"),
        ({"epoch_ms": 10**20}, "epoch_ms", "before the year 10000"),
        ({"lane_bits": True}, "lane_bits", "must be an integer"),
        (
            {"timestamp_bits": 48, "datacenter_bits": 5, "lane_bits": 5, "sequence_bits": 5},
            "timestamp_bits",
            "after the year 9999",
        ),
    ],
)
def test_invalid_layouts(kwargs: dict[str, object], field: str | None, message: str) -> None:
    with pytest.raises(LayoutError, match=message) as caught:
        Layout(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_unused_fields_are_allowed() -> None:
    layout = Layout(timestamp_bits=41, datacenter_bits=0, lane_bits=0, sequence_bits=22)
    assert (layout.max_datacenter, layout.lanes) == (0, 1)


def test_check_epoch() -> None:
    layout = Layout(epoch_ms=NOW_MS)
    layout.check_epoch(NOW_MS)
    with pytest.raises(LayoutError, match="is in the future") as caught:
        layout.check_epoch(NOW_MS - 1)
    assert caught.value.field == "epoch_ms"


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), (" 42\n", 42), ("+7", 7), ("007", 7), ("-0", 0), (str(MAX_ID), MAX_ID)],
)
def test_parse_id_accepts(text: str, value: int) -> None:
    assert parse_id(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", "not an integer: 'abc'"),
        ("", "not an integer: ''"),
        ("1.5", "not an integer: '1.5'"),
        ("0x10", "not an integer: '0x10'"),
        ("1_000", "not an integer: '1_000'"),
        ("١٢", "not an integer"),  # non-ASCII digits
        ("-5", "negative: -5; Snowflake IDs are non-negative"),
        ("-99999999999999999999999", "negative"),
        (str(MAX_ID + 1), f"too large: {MAX_ID + 1} exceeds 2^63-1"),
        ("9" * 5000, "too large: 9999"),
    ],
)
def test_parse_id_rejects(text: str, message: str) -> None:
    with pytest.raises(InvalidIdError, match=re.escape(message)) as caught:
        parse_id(text)
    assert isinstance(caught.value, UsageError)
    assert "\n" not in str(caught.value)


@given(st.integers())
def test_parse_id_agrees_with_range(value: int) -> None:
    if 0 <= value <= MAX_ID:
        assert parse_id(str(value)) == value
    else:
        with pytest.raises(InvalidIdError, match="negative" if value < 0 else "too large"):
            parse_id(str(value))


@pytest.mark.parametrize("value", [-1, MAX_ID + 1])
def test_decode_rejects_out_of_range_ints(value: int) -> None:
    with pytest.raises(InvalidIdError):
        Layout().decode(value)
