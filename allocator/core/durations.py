"""Durations as the CLI takes them: a number with a unit (``30s``, ``2h``, ``500ms``,
``1m30s``).

The one parser of the command line's and the environment's durations (every flag takes them
through :class:`allocator.commands.options.Duration`); configuration file keys keep their
own names and units (``*_s``, ``*_ms`` numbers).
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from allocator.core.errors import InvalidDurationError

UNITS: dict[str, int] = {"ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}
"""Each unit in microseconds."""
MAX = timedelta(days=3650)
"""Ten years: longer than any wait means, and what every timer and ``sleep`` can hold."""
SHAPE = "a number with a unit: 500ms, 30s, 5m, 2h or 1m30s"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_BARE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_MAX_TEXT = 64


def parse(text: str) -> timedelta:
    """``text`` as a duration.

    One or more parts, each a decimal number (digits, optionally a fraction) followed by one
    of :data:`UNITS`, no spaces or signs between them; the parts add up. A bare ``0`` is
    zero; any other bare number is refused, its unit would be a guess
    (:func:`is_bare_number` lets a flag that once took one read it in its old unit). Never
    negative, at most :data:`MAX`, exact to the microsecond (a finer fraction is refused,
    never rounded). Errors are :class:`~allocator.core.errors.InvalidDurationError` (a usage
    error): one line that quotes the text and shows the shape.
    """
    stripped = text.strip()
    if stripped == "0":
        return timedelta(0)
    if not stripped or len(stripped) > _MAX_TEXT:
        raise InvalidDurationError(f"{_shown(text)} is not a duration ({SHAPE})")
    if stripped.startswith("-"):
        raise InvalidDurationError(f"{_shown(text)}: a duration is never negative")
    if is_bare_number(stripped):
        raise InvalidDurationError(f"{_shown(text)} has no unit (write {stripped}s, or {SHAPE})")
    micros = Decimal(0)
    position = 0
    while position < len(stripped):
        part = _PART.match(stripped, position)
        if part is None:
            raise InvalidDurationError(f"{_shown(text)} is not a duration ({SHAPE})")
        micros += Decimal(part.group(1)) * UNITS[part.group(2)]
        position = part.end()
    if micros != micros.to_integral_value():
        raise InvalidDurationError(f"{_shown(text)} is finer than a microsecond")
    if micros > Decimal(MAX // timedelta(microseconds=1)):
        raise InvalidDurationError(f"{_shown(text)} is longer than {format_duration(MAX)}")
    return timedelta(microseconds=int(micros))


def is_bare_number(text: str) -> bool:
    """True for a number without a unit (``30``, ``0.5``): what an old flag took."""
    return _BARE.fullmatch(text.strip()) is not None


def format_duration(value: timedelta) -> str:
    """The shortest text :func:`parse` reads back as ``value`` (``1h30m``, ``500ms``,
    ``1.5ms``, ``0s``); ValueError for a negative one."""
    micros = value // timedelta(microseconds=1)
    if micros < 0:
        raise ValueError("a duration is never negative")
    if micros == 0:
        return "0s"
    parts = []
    for unit in ("h", "m", "s"):
        count, micros = divmod(micros, UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    if micros:
        whole, fraction = divmod(micros, UNITS["ms"])
        text = str(whole) + (f".{fraction:03d}".rstrip("0") if fraction else "")
        parts.append(f"{text}ms")
    return "".join(parts)


def milliseconds(value: timedelta) -> int:
    """``value`` in whole milliseconds (ValueError when it is not a whole number of them)."""
    whole, rest = divmod(value, timedelta(milliseconds=1))
    if rest:
        raise ValueError(f"{format_duration(value)} is not a whole number of milliseconds")
    return int(whole)


def _shown(text: str) -> str:
    """The text as an error line quotes it: shortened, control characters escaped."""
    short = text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "..."
    return repr(short)
