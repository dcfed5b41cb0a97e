"""The cutter's planning: order, bounds, lanes, marks and clocks (pure; no servers)."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocator.core.cutter import NO_MARK, Plan, capacity_per_ms, check_block_size, plan_blocks
from allocator.core.errors import (
    AllocatorError,
    ClockBehindError,
    InvalidIdError,
    LayoutError,
    TimeRangeExhaustedError,
)
from allocator.core.layout import MAX_ID, Layout, format_utc_ms

NOW_MS = 1_800_000_000_000  # 2027-01-15; a fixed "now" keeps the tests independent of the clock
DEFAULT = Layout()
DC = 3
BOUND_MS = 1000
# A layout whose time range ends soon after its epoch (1024 ms); widths still sum to 63.
SHORT = Layout(
    epoch_ms=NOW_MS, timestamp_bits=10, datacenter_bits=31, lane_bits=10, sequence_bits=12
)


@st.composite
def small_layouts(draw: st.DrawFn) -> Layout:
    """Few lanes and short sequences, so a millisecond fills up in a handful of blocks."""
    sequence_bits = draw(st.integers(1, 5))
    lane_bits = draw(st.integers(0, 3))
    timestamp_bits = draw(st.integers(41, 45))
    return Layout(
        epoch_ms=draw(st.integers(0, NOW_MS - 10_000)),
        timestamp_bits=timestamp_bits,
        datacenter_bits=63 - timestamp_bits - lane_bits - sequence_bits,
        lane_bits=lane_bits,
        sequence_bits=sequence_bits,
    )


def block_sizes(layout: Layout) -> st.SearchStrategy[int]:
    return st.integers(0, layout.sequence_bits).map(lambda bits: 1 << bits)


def plan(
    mark_id: int,
    now_ms: int = NOW_MS,
    count: int = 10,
    *,
    layout: Layout = DEFAULT,
    datacenter: int = DC,
    block_size: int = 4096,
    bound_ms: int = BOUND_MS,
) -> Plan:
    return plan_blocks(layout, datacenter, block_size, mark_id, now_ms, count, bound_ms)


def fields(layout: Layout, snowflake_id: int) -> tuple[int, int, int, int]:
    d = layout.decode(snowflake_id)
    return d.timestamp_ms, d.datacenter, d.lane, d.sequence


def check_blocks(
    layout: Layout, datacenter: int, block_size: int, mark_id: int, now_ms: int, result: Plan
) -> None:
    """What every plan must satisfy, whatever its inputs."""
    previous_last = mark_id
    for first, last in result.blocks:
        assert first > previous_last  # strictly increasing, disjoint, above the mark
        assert last - first + 1 == block_size
        ms, dc, lane, seq = fields(layout, first)
        assert fields(layout, last) == (ms, dc, lane, seq + block_size - 1)  # one (ms, lane)
        assert dc == datacenter
        assert ms <= now_ms
        previous_last = last
    assert result.ids == len(result.blocks) * block_size
    assert result.last_id == (result.blocks[-1][1] if result.blocks else None)


def check_dense(layout: Layout, block_size: int, result: Plan) -> None:
    """No fitting position is skipped between blocks; lanes are taken in order."""
    positions = layout.max_sequence + 1
    for (_, prev_last), (first, _) in zip(result.blocks, result.blocks[1:], strict=False):
        prev_ms, _, prev_lane, prev_seq = fields(layout, prev_last)
        ms, _, lane, seq = fields(layout, first)
        if first != prev_last + 1:  # a lane change: the remainder could not hold a block
            assert (ms, lane, seq) == (prev_ms, prev_lane + 1, 0)
            assert positions - (prev_seq + 1) < block_size


# --- properties ---------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Layout, int, int, int, int, int]:
    layout = draw(small_layouts())
    block_size = draw(block_sizes(layout))
    datacenter = draw(st.integers(0, min(layout.max_datacenter, 7)))
    now_ms = draw(st.integers(layout.epoch_ms + 5, layout.epoch_ms + 5_000))
    if draw(st.booleans()):
        mark_id = NO_MARK
    else:
        mark_id = layout.encode(
            draw(st.integers(max(layout.epoch_ms, now_ms - 5), now_ms + 5)),
            draw(st.integers(0, min(layout.max_datacenter, 7))),
            draw(st.integers(0, layout.max_lane)),
            draw(st.integers(0, layout.max_sequence)),
        )
    count = draw(st.integers(1, 3 * capacity_per_ms(layout, block_size)))
    return layout, datacenter, block_size, mark_id, now_ms, count


@given(scenarios(), st.integers(0, 6))
def test_any_plan_is_ordered_above_the_mark_and_not_ahead_of_the_clock(
    scenario: tuple[Layout, int, int, int, int, int], bound_ms: int
) -> None:
    layout, datacenter, block_size, mark_id, now_ms, count = scenario
    mark_ms = layout.decode(mark_id).timestamp_ms if mark_id != NO_MARK else now_ms
    if mark_ms - now_ms > bound_ms:
        with pytest.raises(ClockBehindError) as caught:
            plan_blocks(layout, datacenter, block_size, mark_id, now_ms, count, bound_ms)
        assert caught.value.behind_ms == mark_ms - now_ms
        return
    result = plan_blocks(layout, datacenter, block_size, mark_id, now_ms, count, bound_ms)
    check_blocks(layout, datacenter, block_size, mark_id, now_ms, result)
    check_dense(layout, block_size, result)
    assert len(result.blocks) <= count
    assert (result.wait_until_ms is None) == (len(result.blocks) == count)
    if result.wait_until_ms is not None:
        assert result.wait_until_ms > now_ms
    if result.blocks:
        # Blocks are cut in the current millisecond only: no gap of old ones, no future.
        assert {fields(layout, first)[0] for first, _ in result.blocks} == {now_ms}
        if len(result.blocks) < count:  # the millisecond is full: no lane left after the last
            _, _, lane, seq = fields(layout, result.blocks[-1][1])
            assert lane == layout.max_lane
            assert layout.max_sequence - seq < block_size
            assert result.wait_until_ms == now_ms + 1
    assert result.clock_behind_ms == max(0, mark_ms - now_ms)


@given(scenarios())
def test_the_first_block_is_the_first_fitting_position(
    scenario: tuple[Layout, int, int, int, int, int],
) -> None:
    layout, datacenter, block_size, mark_id, now_ms, count = scenario
    result = plan_blocks(layout, datacenter, block_size, mark_id, now_ms, count, 10)
    if mark_id == NO_MARK or layout.decode(mark_id).timestamp_ms < now_ms:
        assert result.blocks
        assert fields(layout, result.blocks[0][0]) == (now_ms, datacenter, 0, 0)
        return
    mark_ms, mark_dc, mark_lane, mark_seq = fields(layout, mark_id)
    if mark_ms > now_ms or datacenter < mark_dc:
        assert result.blocks == ()
        return
    # The mark is in the current millisecond, and our datacenter is not below its own.
    if mark_seq + 1 + block_size <= layout.max_sequence + 1:
        expected = (mark_lane, mark_seq + 1)
    elif mark_lane < layout.max_lane:
        expected = (mark_lane + 1, 0)
    else:
        assert result.blocks == ()
        assert result.wait_until_ms == now_ms + 1
        return
    assert fields(layout, result.blocks[0][0]) == (now_ms, datacenter, *expected)


@given(
    st.data(),
    st.lists(st.tuples(st.integers(-3, 3), st.integers(1, 40)), min_size=1, max_size=40),
)
def test_successive_plans_never_repeat_or_go_backwards(
    data: st.DataObject, steps: list[tuple[int, int]]
) -> None:
    layout = data.draw(small_layouts())
    block_size = data.draw(block_sizes(layout))
    datacenters = st.integers(0, min(layout.max_datacenter, 3))
    mark_id, now_ms = NO_MARK, layout.epoch_ms + 100
    cut: list[tuple[int, int]] = []
    for clock_step_ms, count in steps:
        now_ms += clock_step_ms  # the clock may step back, within the bound
        # A failover may bring a leader configured with another datacenter or block size.
        datacenter = data.draw(datacenters)
        if mark_id != NO_MARK and layout.decode(mark_id).timestamp_ms - now_ms > 10:
            with pytest.raises(ClockBehindError):
                plan_blocks(layout, datacenter, block_size, mark_id, now_ms, count, 10)
            continue
        result = plan_blocks(layout, datacenter, block_size, mark_id, now_ms, count, 10)
        check_blocks(layout, datacenter, block_size, mark_id, now_ms, result)
        cut += result.blocks
        if result.last_id is not None:
            mark_id = result.last_id
        if data.draw(st.booleans()):
            block_size = data.draw(block_sizes(layout))
    firsts = [first for first, _ in cut]
    assert firsts == sorted(set(firsts))
    assert all(last < next_first for (_, last), next_first in zip(cut, firsts[1:], strict=False))
    timestamps = [layout.decode(first).timestamp_ms for first in firsts]
    assert timestamps == sorted(timestamps)  # I5: time never goes backwards


@given(st.data())
def test_a_millisecond_is_cut_whole_over_several_calls(data: st.DataObject) -> None:
    layout = data.draw(small_layouts())
    block_size = data.draw(block_sizes(layout))
    capacity = capacity_per_ms(layout, block_size)
    now_ms, mark_id, cut = layout.epoch_ms + 7, NO_MARK, 0
    while True:
        result = plan_blocks(
            layout, 0, block_size, mark_id, now_ms, data.draw(st.integers(1, 5)), 0
        )
        cut += len(result.blocks)
        if result.last_id is None:
            break
        mark_id = result.last_id
    assert cut == capacity
    assert result.wait_until_ms == now_ms + 1
    assert layout.decode(mark_id).lane == layout.max_lane


# --- examples -----------------------------------------------------------------------------


def test_no_mark_starts_at_lane_0_sequence_0_of_now() -> None:
    result = plan(NO_MARK, count=3)
    assert result.blocks[0] == (
        DEFAULT.encode(NOW_MS, DC, 0, 0),
        DEFAULT.encode(NOW_MS, DC, 0, 4095),
    )
    assert [fields(DEFAULT, first)[2] for first, _ in result.blocks] == [0, 1, 2]
    assert result.wait_until_ms is None
    assert result.ids == 3 * 4096
    assert result.clock_behind_ms == 0


def test_a_mark_in_an_older_millisecond_jumps_to_now() -> None:
    mark = DEFAULT.encode(NOW_MS - 50_000, DC, 7, 100)
    result = plan(mark, count=1)
    assert fields(DEFAULT, result.blocks[0][0]) == (NOW_MS, DC, 0, 0)


def test_a_mark_in_the_current_millisecond_uses_the_rest_then_waits() -> None:
    mark = DEFAULT.encode(NOW_MS, DC, 29, 4095)
    result = plan(mark, count=5)
    assert [fields(DEFAULT, first) for first, _ in result.blocks] == [
        (NOW_MS, DC, 30, 0),
        (NOW_MS, DC, 31, 0),
    ]
    assert result.wait_until_ms == NOW_MS + 1
    # The millisecond is now full: nothing until the next one.
    assert plan(result.blocks[-1][1], count=5) == Plan(blocks=(), wait_until_ms=NOW_MS + 1)
    nxt = plan(result.blocks[-1][1], NOW_MS + 1, count=1)
    assert fields(DEFAULT, nxt.blocks[0][0]) == (NOW_MS + 1, DC, 0, 0)


def test_all_lanes_are_used() -> None:
    capacity = capacity_per_ms(DEFAULT, 1024)
    assert capacity == 32 * 4
    result = plan(NO_MARK, count=capacity, block_size=1024)
    assert result.wait_until_ms is None
    positions = [fields(DEFAULT, first)[2:] for first, _ in result.blocks]
    assert positions == [(lane, seq) for lane in range(32) for seq in (0, 1024, 2048, 3072)]
    over = plan(NO_MARK, count=capacity + 1, block_size=1024)
    assert over.blocks == result.blocks
    assert over.wait_until_ms == NOW_MS + 1


def test_a_misaligned_mark_cuts_from_the_next_sequence_and_skips_the_remainder() -> None:
    # An earlier leader cut blocks of 1024; we cut blocks of 2048 in the same lane.
    mark = DEFAULT.encode(NOW_MS, DC, 4, 1023)
    result = plan(mark, count=2, block_size=2048)
    assert [(fields(DEFAULT, f)[2:], fields(DEFAULT, last)[3]) for f, last in result.blocks] == [
        ((4, 1024), 3071),
        ((5, 0), 2047),  # 3072..4095 cannot hold 2048: skipped to the next lane
    ]


def test_a_misaligned_mark_with_no_room_left_moves_to_the_next_lane() -> None:
    mark = DEFAULT.encode(NOW_MS, DC, 4, 1023)
    result = plan(mark, count=1, block_size=4096)
    assert fields(DEFAULT, result.blocks[0][0]) == (NOW_MS, DC, 5, 0)


def test_a_mark_of_a_lower_datacenter_continues_after_its_position() -> None:
    mark = DEFAULT.encode(NOW_MS, DC - 1, 6, 4095)
    result = plan(mark, count=1)
    assert fields(DEFAULT, result.blocks[0][0]) == (NOW_MS, DC, 7, 0)
    assert result.blocks[0][0] > mark


def test_a_mark_of_a_higher_datacenter_moves_to_the_next_millisecond() -> None:
    mark = DEFAULT.encode(NOW_MS, DC + 1, 0, 0)
    assert plan(mark) == Plan(blocks=(), wait_until_ms=NOW_MS + 1)
    result = plan(mark, NOW_MS + 1, count=1)
    assert fields(DEFAULT, result.blocks[0][0]) == (NOW_MS + 1, DC, 0, 0)
    assert result.blocks[0][0] > mark


def test_a_clock_behind_within_the_bound_waits_for_the_mark() -> None:
    mark = DEFAULT.encode(NOW_MS + 5, DC, 2, 4095)
    assert plan(mark) == Plan(blocks=(), wait_until_ms=NOW_MS + 5, clock_behind_ms=5)
    assert plan(mark, NOW_MS + 5, count=1).blocks[0][0] == DEFAULT.encode(NOW_MS + 5, DC, 3, 0)


def test_a_clock_behind_a_full_millisecond_waits_for_the_next_one() -> None:
    mark = DEFAULT.encode(NOW_MS + BOUND_MS, DC, 31, 4095)  # exactly at the bound
    result = plan(mark)
    assert result == Plan(blocks=(), wait_until_ms=NOW_MS + BOUND_MS + 1, clock_behind_ms=1000)


def test_a_clock_behind_beyond_the_bound_refuses() -> None:
    mark_ms = NOW_MS + BOUND_MS + 1
    mark = DEFAULT.encode(mark_ms, DC, 0, 0)
    with pytest.raises(ClockBehindError) as caught:
        plan(mark)
    message = str(caught.value)
    assert format_utc_ms(NOW_MS) in message
    assert format_utc_ms(mark_ms) in message
    assert "1001 ms behind" in message
    assert "max_clock_behind_ms (1000)" in message
    assert (caught.value.now_ms, caught.value.mark_ms, caught.value.bound_ms) == (
        NOW_MS,
        mark_ms,
        BOUND_MS,
    )
    assert isinstance(caught.value, AllocatorError)


def test_a_clock_reset_before_the_epoch_is_a_clock_behind_the_mark() -> None:
    mark = DEFAULT.encode(NOW_MS, DC, 0, 0)
    with pytest.raises(ClockBehindError):
        plan(mark, now_ms=0)


def test_a_clock_before_the_epoch_without_a_mark_is_refused() -> None:
    with pytest.raises(LayoutError, match="in the future"):
        plan(NO_MARK, now_ms=DEFAULT.epoch_ms - 1)


def test_the_last_millisecond_is_cut_then_the_time_range_refuses() -> None:
    end = SHORT.ends_at_ms
    assert end == NOW_MS + 1023
    result = plan(NO_MARK, end, count=10_000, layout=SHORT)
    assert len(result.blocks) == capacity_per_ms(SHORT, 4096) == 1024
    assert result.wait_until_ms == end + 1
    end_text = re.escape(format_utc_ms(end))
    with pytest.raises(TimeRangeExhaustedError, match=f"last millisecond .*{end_text}"):
        plan(result.blocks[-1][1], end, layout=SHORT)
    with pytest.raises(TimeRangeExhaustedError, match=f"past the end .*{end_text}"):
        plan(result.blocks[-1][1], end + 1, layout=SHORT)
    with pytest.raises(TimeRangeExhaustedError, match=end_text):
        plan(NO_MARK, end + 1, layout=SHORT)


def test_a_full_last_millisecond_refuses_even_with_the_clock_behind() -> None:
    mark = SHORT.encode(SHORT.ends_at_ms, DC, SHORT.max_lane, 4095)
    with pytest.raises(TimeRangeExhaustedError):
        plan(mark, SHORT.ends_at_ms - 1, layout=SHORT)


def test_the_last_id_of_all_is_a_valid_mark() -> None:
    with pytest.raises(TimeRangeExhaustedError):
        plan(MAX_ID, DEFAULT.ends_at_ms)


def test_ten_thousand_blocks_in_one_call() -> None:
    result = plan(NO_MARK, count=10_000, block_size=1)
    assert len(result.blocks) == 10_000
    assert result.wait_until_ms is None
    assert result.blocks[-1] == (DEFAULT.encode(NOW_MS, DC, 2, 1807),) * 2


def test_capacity_per_ms_defaults_and_ceiling() -> None:
    assert capacity_per_ms(DEFAULT, 4096) == 32
    ceiling = 1 << (DEFAULT.lane_bits + DEFAULT.sequence_bits)
    for block_size in (1, 2, 64, 4096):
        assert capacity_per_ms(DEFAULT, block_size) * block_size == ceiling
    assert capacity_per_ms(Layout(datacenter_bits=10, lane_bits=0), 1024) == 4


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"count": 0}, ValueError, r"count: must be >= 1 \(got 0\)"),
        ({"bound_ms": -1}, ValueError, r"max_clock_behind_ms: must be >= 0"),
        ({"block_size": 3}, LayoutError, r"block_size: must be a power of two \(got 3\)"),
        ({"block_size": 0}, LayoutError, r"block_size: must be a power of two"),
        ({"block_size": 8192}, LayoutError, r"block_size: must be <= 2\^sequence_bits = 4096"),
        ({"datacenter": 32}, LayoutError, r"datacenter: must be in 0\.\.31 \(got 32\)"),
        ({"datacenter": -1}, LayoutError, r"datacenter: must be in 0\.\.31"),
        ({"mark_id": -2}, InvalidIdError, r"mark_id: must be -1 .* \(got -2\)"),
        ({"mark_id": MAX_ID + 1}, InvalidIdError, r"mark_id: .*0\.\.9223372036854775807"),
    ],
)
def test_bad_arguments_are_refused_clearly(
    kwargs: dict[str, int], error: type[Exception], pattern: str
) -> None:
    a = {"datacenter": DC, "block_size": 4096, "mark_id": NO_MARK, "count": 10} | kwargs
    with pytest.raises(error, match=pattern):
        plan_blocks(
            DEFAULT,
            a["datacenter"],
            a["block_size"],
            a["mark_id"],
            NOW_MS,
            a["count"],
            a.get("bound_ms", BOUND_MS),
        )


def test_block_size_errors_name_the_field() -> None:
    with pytest.raises(LayoutError) as caught:
        check_block_size(DEFAULT, 5)
    assert caught.value.field == "block_size"
    with pytest.raises(LayoutError):
        capacity_per_ms(DEFAULT, 8192)


# -- a mark ahead of the clock: dense cutting within the database's allowance -------------


def dense(mark_id: int, count: int, allowance_ms: int) -> Plan:
    return plan_blocks(DEFAULT, DC, 4096, mark_id, NOW_MS, count, BOUND_MS, allowance_ms)


def test_a_mark_an_hour_ahead_is_followed_densely_not_waited_for() -> None:
    hour_ms = 3_600_000
    mark = DEFAULT.encode(NOW_MS + hour_ms, DC, DEFAULT.max_lane, DEFAULT.max_sequence)
    result = dense(mark, 100, hour_ms + 500)
    assert len(result.blocks) == 100
    assert result.wait_until_ms is None
    assert result.clock_behind_ms == hour_ms + 1  # the lead, for the metric
    # Straight after the mark: its millisecond is used up, so the next one, lane 0.
    assert result.blocks[0][0] == DEFAULT.encode(NOW_MS + hour_ms + 1, DC, 0, 0)
    stamps = [DEFAULT.decode(first).timestamp_ms - NOW_MS for first, _ in result.blocks]
    assert stamps == sorted(stamps)
    assert stamps[-1] == hour_ms + 4  # 32 blocks per millisecond: 100 blocks span 4 ms
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(result.blocks[:32]))


def test_dense_cutting_never_passes_now_plus_the_allowance_and_says_when_to_retry() -> None:
    mark = DEFAULT.encode(NOW_MS + 5000, DC, DEFAULT.max_lane, DEFAULT.max_sequence)
    result = dense(mark, 1000, 5002)  # room for the milliseconds +5001 and +5002 only
    assert len(result.blocks) == 2 * 32
    assert max(DEFAULT.decode(last).timestamp_ms for _, last in result.blocks) == NOW_MS + 5002
    assert result.wait_until_ms == NOW_MS + 1  # the limit reaches +5003 one ms later
    nothing = dense(mark, 10, 4000)  # the allowance is below the mark: wait for the clock
    assert nothing.blocks == ()
    assert nothing.wait_until_ms == NOW_MS + 5001 - 4000


def test_without_an_allowance_a_mark_ahead_is_still_a_clock_behind() -> None:
    mark = DEFAULT.encode(NOW_MS + BOUND_MS + 1, DC, 0, 0)
    with pytest.raises(ClockBehindError):
        plan_blocks(DEFAULT, DC, 4096, mark, NOW_MS, 10, BOUND_MS, None)
    small_lead = DEFAULT.encode(NOW_MS + 10, DC, 0, 0)  # within max_clock_behind_ms: wait
    assert dense(small_lead, 10, 5000).blocks == ()
