"""The leader's block cutter as pure planning: which blocks to cut next, or how long to
wait.

No I/O and no clock: the caller passes ``now_ms`` and writes the planned blocks through the
fence. Blocks and the clock: docs/design.md §5; the invariants it serves (I2, I5): §2.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.errors import (
    ClockBehindError,
    InvalidIdError,
    LayoutError,
    TimeRangeExhaustedError,
)
from allocator.core.layout import MAX_ID, Layout, format_utc_ms

NO_MARK = -1
"""``mark_id`` of a cluster that has never cut a block."""

# (timestamp_ms, lane, sequence) of one ID of our datacenter; ordered like the IDs.
_Position = tuple[int, int, int]


@dataclass(frozen=True)
class Plan:
    """The blocks to cut now, in cutting order, and when to plan again.

    Each block is a contiguous range ``(first_id, last_id)`` of ``block_size`` IDs inside
    one (millisecond, lane) of the cluster's datacenter; cutting order is (millisecond,
    lane, sequence) order, which for a fixed datacenter is increasing ID order.
    ``wait_until_ms`` is ``None`` when every requested block was planned; otherwise the Unix
    millisecond the clock must reach before more blocks can be cut. ``clock_behind_ms`` is
    how far ``now_ms`` was behind the mark's millisecond (0 if not behind), for a metric.
    """

    blocks: tuple[tuple[int, int], ...]
    wait_until_ms: int | None
    clock_behind_ms: int = 0

    @property
    def ids(self) -> int:
        """How many IDs the planned blocks hold."""
        return sum(last - first + 1 for first, last in self.blocks)

    @property
    def last_id(self) -> int | None:
        """The high-water mark once these blocks are written; ``None`` for an empty plan."""
        return self.blocks[-1][1] if self.blocks else None


def check_block_size(layout: Layout, block_size: int) -> None:
    """Raise :class:`LayoutError` unless ``block_size`` is a power of two ``<= 2^sequence_bits``."""
    positions = layout.max_sequence + 1
    if block_size < 1 or block_size & (block_size - 1):
        raise LayoutError(
            f"block_size: must be a power of two (got {block_size})", field="block_size"
        )
    if block_size > positions:
        raise LayoutError(
            f"block_size: must be <= 2^sequence_bits = {positions} (got {block_size})",
            field="block_size",
        )


def capacity_per_ms(layout: Layout, block_size: int) -> int:
    """Blocks of ``block_size`` IDs that one millisecond of one datacenter holds.

    This is the cutter's throughput ceiling: ``2^(lane_bits + sequence_bits)`` IDs per
    millisecond (defaults: 32 blocks of 4096, 131,072 IDs, about 131 million IDs a second).
    A plan holds at most this many blocks; planning is arithmetic per block, never per ID.
    """
    check_block_size(layout, block_size)
    return layout.lanes * ((layout.max_sequence + 1) // block_size)


def plan_blocks(
    layout: Layout,
    datacenter: int,
    block_size: int,
    mark_id: int,
    now_ms: int,
    count: int,
    max_clock_behind_ms: int,
    ahead_allowance_ms: int | None = None,
) -> Plan:
    """Plan up to ``count`` blocks strictly after ``mark_id`` without passing ``now_ms``.

    ``mark_id`` is the persisted high-water mark (the last ID ever cut in the cluster, -1 if
    none), ``now_ms`` the leader's clock in Unix milliseconds.

    - Strictly after the mark, whatever the clock: cutting resumes right after the mark's
      (millisecond, lane, sequence), so every first ID is above the mark (I2).
    - Never borrows future time: no block carries a millisecond after ``now_ms``. Once the
      clock is past the mark's millisecond the plan jumps to ``(now_ms, lane 0, sequence
      0)`` instead of filling old milliseconds, so one call cuts in one millisecond only.
    - Clock behind the mark's millisecond by at most ``max_clock_behind_ms``: an empty plan
      that says when to try again. By more: :class:`ClockBehindError` (the leader alerts and
      keeps serving the pool), unless ``ahead_allowance_ms`` is given (the lead the database
      still allows, checked by the caller against the database clock): then the plan cuts
      densely straight after the mark, millisecond after millisecond, never past ``now_ms +
      ahead_allowance_ms``. A mark ahead of every clock so never stalls the cluster, and
      since dense cutting spends positions, not time, real time catches up. This is the one
      case of cutting ahead of the clock (docs/design.md §5, §11).
    - Refuses past the layout's range (I5): a clock past :attr:`Layout.ends_at_ms`, or a
      mark that used the last millisecond up, is :class:`TimeRangeExhaustedError`. A plan
      that fills the last millisecond still returns its blocks; the next call raises.

    Bad arguments: :class:`LayoutError` (``datacenter``, ``block_size``, an epoch after
    ``now_ms`` with no mark), :class:`InvalidIdError` (``mark_id``) or :class:`ValueError`
    (``count``, ``max_clock_behind_ms``).
    """
    _check_arguments(layout, datacenter, block_size, mark_id, count, max_clock_behind_ms)
    if now_ms > layout.ends_at_ms:
        raise TimeRangeExhaustedError(
            f"the clock ({_when(now_ms)}) is past the end of the layout's time range: "
            f"the time bits ran out at {format_utc_ms(layout.ends_at_ms)}; "
            "refusing to cut IDs (a new layout is needed)"
        )
    if mark_id == NO_MARK:
        layout.check_epoch(now_ms)
        return _fill(layout, datacenter, block_size, (now_ms, 0, 0), count)

    mark_ms = layout.decode(mark_id).timestamp_ms
    start = _after_mark(layout, datacenter, block_size, mark_id)
    if start[0] > layout.ends_at_ms:
        raise TimeRangeExhaustedError(
            f"the high-water mark {mark_id} used up the last millisecond of the layout's "
            f"time range, {format_utc_ms(layout.ends_at_ms)}; refusing to cut IDs "
            "(a new layout is needed)"
        )
    if now_ms < mark_ms:
        behind_ms = mark_ms - now_ms
        if behind_ms > max_clock_behind_ms and ahead_allowance_ms is not None:
            return _fill_dense(
                layout, datacenter, block_size, start, count, now_ms, ahead_allowance_ms
            )
        if behind_ms > max_clock_behind_ms:
            raise ClockBehindError(
                f"the clock ({_when(now_ms)}) is {behind_ms} ms behind the high-water mark's "
                f"millisecond ({format_utc_ms(mark_ms)}), more than max_clock_behind_ms "
                f"({max_clock_behind_ms}); not cutting until it catches up",
                now_ms=now_ms,
                mark_ms=mark_ms,
                bound_ms=max_clock_behind_ms,
            )
        return Plan(blocks=(), wait_until_ms=start[0], clock_behind_ms=behind_ms)
    if start[0] > now_ms:  # the mark's millisecond, which is now, is used up
        return Plan(blocks=(), wait_until_ms=start[0])
    # Past the mark's millisecond: jump to the current one instead of filling old ones.
    return _fill(layout, datacenter, block_size, max(start, (now_ms, 0, 0)), count)


def _check_arguments(
    layout: Layout,
    datacenter: int,
    block_size: int,
    mark_id: int,
    count: int,
    max_clock_behind_ms: int,
) -> None:
    if count < 1:
        raise ValueError(f"count: must be >= 1 (got {count})")
    if max_clock_behind_ms < 0:
        raise ValueError(f"max_clock_behind_ms: must be >= 0 (got {max_clock_behind_ms})")
    check_block_size(layout, block_size)
    if not 0 <= datacenter <= layout.max_datacenter:
        raise LayoutError(
            f"datacenter: must be in 0..{layout.max_datacenter} (got {datacenter})",
            field="datacenter",
        )
    if not NO_MARK <= mark_id <= MAX_ID:
        raise InvalidIdError(
            f"mark_id: must be {NO_MARK} (nothing cut yet) or an ID in 0..{MAX_ID} (got {mark_id})"
        )


def _after_mark(layout: Layout, datacenter: int, block_size: int, mark_id: int) -> _Position:
    """The first position where a block of ours fits strictly after the mark.

    The mark need not be aligned to ``block_size`` (an earlier leader may have used another
    size): blocks start right after it while they fit in its lane. If the mark carries a
    higher datacenter than ours, none of our IDs in its millisecond is above it, so cutting
    resumes in the next millisecond. The result may lie past the layout's end; the caller
    refuses then.
    """
    mark = layout.decode(mark_id)
    if datacenter < mark.datacenter:
        # All our IDs in the mark's millisecond are below it.
        return (mark.timestamp_ms + 1, 0, 0)
    return _fitting(layout, block_size, (mark.timestamp_ms, mark.lane, mark.sequence + 1))


def _fitting(layout: Layout, block_size: int, position: _Position) -> _Position:
    """``position``, or the next lane's (or millisecond's) start if no block fits there (an
    unfittable remainder is skipped).
    """
    timestamp_ms, lane, sequence = position
    if sequence + block_size <= layout.max_sequence + 1:
        return position
    if lane < layout.max_lane:
        return (timestamp_ms, lane + 1, 0)
    return (timestamp_ms + 1, 0, 0)


def _fill(layout: Layout, datacenter: int, block_size: int, start: _Position, count: int) -> Plan:
    """Up to ``count`` blocks from ``start`` (a fitting position) to the end of its millisecond."""
    timestamp_ms, lane, sequence = start
    positions = layout.max_sequence + 1
    blocks: list[tuple[int, int]] = []
    # Each lane after the first holds at least one block, so this loops at most count times.
    while len(blocks) < count and lane <= layout.max_lane:
        base = layout.encode(timestamp_ms, datacenter, lane, 0)
        fitting = (positions - sequence) // block_size
        firsts = range(base + sequence, base + sequence + fitting * block_size, block_size)
        blocks.extend((first, first + block_size - 1) for first in firsts[: count - len(blocks)])
        lane, sequence = lane + 1, 0
    wait_until_ms = None if len(blocks) == count else timestamp_ms + 1
    return Plan(blocks=tuple(blocks), wait_until_ms=wait_until_ms)


def _fill_dense(
    layout: Layout,
    datacenter: int,
    block_size: int,
    start: _Position,
    count: int,
    now_ms: int,
    allowance_ms: int,
) -> Plan:
    """Up to ``count`` blocks from ``start`` (after a mark ahead of ``now_ms``) on, over as
    many milliseconds as needed, none past ``now_ms + allowance_ms`` or the layout's end."""
    blocks: list[tuple[int, int]] = []
    position = start
    last_ms = min(now_ms + allowance_ms, layout.ends_at_ms)
    while len(blocks) < count and position[0] <= last_ms:
        part = _fill(layout, datacenter, block_size, position, count - len(blocks))
        blocks.extend(part.blocks)
        position = (position[0] + 1, 0, 0)
    behind_ms = start[0] - now_ms
    if len(blocks) == count:
        return Plan(blocks=tuple(blocks), wait_until_ms=None, clock_behind_ms=behind_ms)
    # Out of allowance: plan again once the clock has moved the limit onto the next position.
    wait_until_ms = max(position[0] - allowance_ms, now_ms + 1)
    return Plan(blocks=tuple(blocks), wait_until_ms=wait_until_ms, clock_behind_ms=behind_ms)


def _when(unix_ms: int) -> str:
    """A timestamp for a message; never fails, even outside datetime's range."""
    try:
        return format_utc_ms(unix_ms)
    except (OverflowError, ValueError):
        return f"{unix_ms} ms since 1970"
