"""The Snowflake layout: how a 64-bit ID splits into time, datacenter, lane and sequence.

From the most significant bit down an ID is ``0 | timestamp | datacenter | lane |
sequence``; the default widths are 1 | 41 | 5 | 5 | 12 with the epoch 2020-01-01T00:00:00Z.
An ID's timestamp says when its block was cut, not when it was handed out (docs/design.md
§5).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from allocator.core.errors import InvalidIdError, LayoutError

ID_BITS = 63
"""Bits an ID may use; the 64th (sign) bit is always 0."""
MAX_ID = (1 << ID_BITS) - 1
DEFAULT_EPOCH_MS = 1_577_836_800_000
"""2020-01-01T00:00:00Z in Unix milliseconds."""
DEFAULT_TIMESTAMP_BITS = 41
DEFAULT_DATACENTER_BITS = 5
DEFAULT_LANE_BITS = 5
DEFAULT_SEQUENCE_BITS = 12
MAX_DATETIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z, the last millisecond :class:`datetime` can hold."""

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_SHOWN_CHARS = 40


def utc_from_ms(unix_ms: int) -> datetime:
    """The aware UTC datetime of a Unix millisecond."""
    return _UNIX_EPOCH + timedelta(milliseconds=unix_ms)


def format_utc_ms(unix_ms: int) -> str:
    """ISO-8601 UTC with milliseconds and a trailing Z, e.g. ``2020-01-01T00:00:00.000Z``."""
    moment = utc_from_ms(unix_ms)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


def _describe_ms(unix_ms: int) -> str:
    """A timestamp for an error message; never fails, even outside datetime's range."""
    try:
        return format_utc_ms(unix_ms)
    except (OverflowError, ValueError):
        return f"{unix_ms} ms since 1970"


def _abbreviate(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 3]}..."


@dataclass(frozen=True)
class DecodedId:
    """The fields of one ID; ``time`` is when its block was cut (aware, UTC)."""

    id: int
    timestamp_ms: int
    time: datetime
    datacenter: int
    lane: int
    sequence: int

    def to_json(self) -> dict[str, int | str]:
        """The stable ``allocator decode --json`` object (docs/design.md §10)."""
        return {
            "id": self.id,
            "timestamp_ms": self.timestamp_ms,
            "time": format_utc_ms(self.timestamp_ms),
            "datacenter": self.datacenter,
            "lane": self.lane,
            "sequence": self.sequence,
        }


@dataclass(frozen=True)
class Layout:
    """Bit widths and epoch of the IDs; validated on construction, without reading the
    clock.

    - The four widths sum to 63, so the sign bit stays 0 and every ID is a non-negative
      PostgreSQL ``bigint``; ``timestamp_bits`` and ``sequence_bits`` are at least 1,
      ``datacenter_bits`` and ``lane_bits`` may be 0 (the field is then unused).
    - The timestamp counts milliseconds since ``epoch_ms`` (Unix ms, UTC); the range ends at
      :attr:`ends_at_ms`, which must fall before the year 10000 so every timestamp can be
      written as ISO-8601.
    - The worker field is a lane: the leader is the only generator in its cluster and owns
      every lane. For a fixed datacenter, IDs order like their ``(timestamp_ms, lane,
      sequence)`` tuples.
    - No hidden I/O: whoever loads a layout from configuration calls :meth:`check_epoch`
      with the current time.
    """

    epoch_ms: int = DEFAULT_EPOCH_MS
    timestamp_bits: int = DEFAULT_TIMESTAMP_BITS
    datacenter_bits: int = DEFAULT_DATACENTER_BITS
    lane_bits: int = DEFAULT_LANE_BITS
    sequence_bits: int = DEFAULT_SEQUENCE_BITS

    def nth_block(
        self, index: int, block_size: int, datacenter: int = 0, start_ms: int | None = None
    ) -> tuple[int, int]:
        """The ``index``-th block of ``block_size`` IDs in cutting order from ``start_ms``
        (default: the epoch): lanes filled in turn within each millisecond, as the cutter
        does. For stocking pools in benches and tests, far behind any clock."""
        per_lane = (1 << self.sequence_bits) // block_size
        ms, rest = divmod(index, per_lane << self.lane_bits)
        lane, slot = divmod(rest, per_lane)
        first = self.encode(
            (self.epoch_ms if start_ms is None else start_ms) + ms,
            datacenter,
            lane,
            slot * block_size,
        )
        return first, first + block_size - 1

    def record(self, datacenter_id: int) -> dict[str, int]:
        """What the database records and checks on every takeover and cut (migration 0003)."""
        return {
            "epoch_ms": self.epoch_ms,
            "timestamp_bits": self.timestamp_bits,
            "datacenter_bits": self.datacenter_bits,
            "lane_bits": self.lane_bits,
            "sequence_bits": self.sequence_bits,
            "datacenter_id": datacenter_id,
        }

    def __post_init__(self) -> None:
        minimums = {"timestamp_bits": 1, "datacenter_bits": 0, "lane_bits": 0, "sequence_bits": 1}
        for name in ("epoch_ms", *minimums):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise LayoutError(f"{name}: must be an integer (got {value!r})", field=name)
        for name, least in minimums.items():
            if getattr(self, name) < least:
                raise LayoutError(
                    f"{name}: must be >= {least} (got {getattr(self, name)})", field=name
                )
        widths = (self.timestamp_bits, self.datacenter_bits, self.lane_bits, self.sequence_bits)
        if sum(widths) != ID_BITS:
            raise LayoutError(
                f"bit widths must sum to {ID_BITS}, the sign bit staying 0 (timestamp "
                f"{widths[0]} + datacenter {widths[1]} + lane {widths[2]} + sequence "
                f"{widths[3]} = {sum(widths)})"
            )
        if self.epoch_ms < 0:
            raise LayoutError(
                f"epoch_ms: must be >= 0, i.e. not before 1970 (got {self.epoch_ms})",
                field="epoch_ms",
            )
        if self.epoch_ms > MAX_DATETIME_MS:
            raise LayoutError(
                f"epoch_ms: must be before the year 10000 (got {self.epoch_ms})", field="epoch_ms"
            )
        if self.ends_at_ms > MAX_DATETIME_MS:
            raise LayoutError(
                f"timestamp_bits: {self.timestamp_bits} bits from the epoch "
                f"{_describe_ms(self.epoch_ms)} end after the year 9999; use fewer",
                field="timestamp_bits",
            )

    def check_epoch(self, now_ms: int) -> None:
        """Reject an epoch in the future of ``now_ms`` (Unix ms): no ID could be cut yet."""
        if self.epoch_ms > now_ms:
            raise LayoutError(
                f"epoch_ms: {format_utc_ms(self.epoch_ms)} is in the future "
                f"(now {_describe_ms(now_ms)})",
                field="epoch_ms",
            )

    @property
    def epoch(self) -> datetime:
        """The epoch as an aware UTC datetime."""
        return utc_from_ms(self.epoch_ms)

    @property
    def max_timestamp_offset_ms(self) -> int:
        """The largest value of the timestamp field: milliseconds after the epoch."""
        return (1 << self.timestamp_bits) - 1

    @property
    def ends_at_ms(self) -> int:
        """The last Unix millisecond an ID can carry; the time bits run out after it."""
        return self.epoch_ms + self.max_timestamp_offset_ms

    @property
    def ends_at(self) -> datetime:
        """:attr:`ends_at_ms` as an aware UTC datetime."""
        return utc_from_ms(self.ends_at_ms)

    @property
    def lanes(self) -> int:
        """How many lanes one millisecond has (``2^lane_bits``)."""
        return 1 << self.lane_bits

    @property
    def max_lane(self) -> int:
        return self.lanes - 1

    @property
    def max_sequence(self) -> int:
        return (1 << self.sequence_bits) - 1

    @property
    def max_datacenter(self) -> int:
        return (1 << self.datacenter_bits) - 1

    def encode(self, timestamp_ms: int, datacenter: int, lane: int, sequence: int) -> int:
        """The ID of one position; ``timestamp_ms`` is absolute (Unix ms), not an offset.

        Past :attr:`ends_at_ms` (or any field out of range) is a :class:`LayoutError`, never
        a wrap-around.
        """
        if timestamp_ms < self.epoch_ms:
            raise LayoutError(
                f"timestamp {_describe_ms(timestamp_ms)} is before the layout's epoch "
                f"{format_utc_ms(self.epoch_ms)}",
                field="timestamp_ms",
            )
        if timestamp_ms > self.ends_at_ms:
            raise LayoutError(
                f"timestamp {_describe_ms(timestamp_ms)} is past the end of the layout's time "
                f"range: the time bits ran out at {format_utc_ms(self.ends_at_ms)}",
                field="timestamp_ms",
            )
        for name, value, maximum in (
            ("datacenter", datacenter, self.max_datacenter),
            ("lane", lane, self.max_lane),
            ("sequence", sequence, self.max_sequence),
        ):
            if not 0 <= value <= maximum:
                raise LayoutError(f"{name}: must be in 0..{maximum} (got {value})", field=name)
        offset_ms = timestamp_ms - self.epoch_ms
        return (
            (offset_ms << (self.datacenter_bits + self.lane_bits + self.sequence_bits))
            | (datacenter << (self.lane_bits + self.sequence_bits))
            | (lane << self.sequence_bits)
            | sequence
        )

    def decode(self, snowflake_id: int) -> DecodedId:
        """The fields of an ID; any integer in ``0..2^63-1`` decodes."""
        check_id(snowflake_id)
        sequence = snowflake_id & self.max_sequence
        lane = (snowflake_id >> self.sequence_bits) & self.max_lane
        datacenter = (snowflake_id >> (self.lane_bits + self.sequence_bits)) & self.max_datacenter
        offset_ms = snowflake_id >> (self.datacenter_bits + self.lane_bits + self.sequence_bits)
        timestamp_ms = self.epoch_ms + offset_ms
        return DecodedId(
            id=snowflake_id,
            timestamp_ms=timestamp_ms,
            time=utc_from_ms(timestamp_ms),
            datacenter=datacenter,
            lane=lane,
            sequence=sequence,
        )


def check_id(value: int) -> None:
    """Raise :class:`InvalidIdError` unless ``value`` is in ``0..2^63-1``."""
    if value < 0:
        raise InvalidIdError(f"negative: {_abbreviate(str(value))}; Snowflake IDs are non-negative")
    if value > MAX_ID:
        raise InvalidIdError(f"too large: {_abbreviate(str(value))} exceeds 2^63-1 ({MAX_ID})")


def parse_id(text: str) -> int:
    """A decimal Snowflake ID from user input; surrounding whitespace is ignored."""
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped):
        raise InvalidIdError(f"not an integer: {_abbreviate(text)!r}")
    digits = stripped.lstrip("+-").lstrip("0")
    if stripped.startswith("-") and digits:
        raise InvalidIdError(f"negative: {_abbreviate(stripped)}; Snowflake IDs are non-negative")
    if len(digits) > len(str(MAX_ID)):
        # Too many digits to be an ID; not converted, as int() limits very long strings.
        raise InvalidIdError(f"too large: {_abbreviate(stripped)} exceeds 2^63-1 ({MAX_ID})")
    value = int(digits or "0")
    check_id(value)
    return value
