"""A drill's run document as its report reads it: null-tolerant, in the report's words.

Any value of the document may be null or missing: these readers turn that into an empty
mapping or list, None (a number), or :data:`NULL` (text). Shared by the Markdown summary
(:mod:`.report`) and the picture (:mod:`.report_png`); pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

NULL: Final = "—"


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def as_items(value: Any) -> list[Any]:
    """``value`` as a list if a sequence (text is not), else an empty list."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return []
    return list(value)


def as_records(value: Any) -> list[Mapping[str, Any]]:
    """The mappings among ``value``'s items."""
    return [item for item in as_items(value) if isinstance(item, Mapping)]


def as_number(value: Any) -> float | None:
    """``value`` if a finite number (a boolean is not), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def fmt(value: Any, spec: str = ".0f") -> str:
    """``value`` formatted by ``spec`` if a number, else :data:`NULL`."""
    number = as_number(value)
    return NULL if number is None else format(number, spec)


def as_text(value: Any) -> str:
    """``value`` as text, :data:`NULL` for None."""
    return NULL if value is None else str(value)


def plural(value: Any, noun: str) -> str:
    """``"1 violation"``, ``"2 violations"``, ``"— violations"``."""
    text = fmt(value)
    return f"{text} {noun}" if text == "1" else f"{text} {noun}s"


def verdict_ok(document: Mapping[str, Any]) -> bool:
    """Whether the document's verdict says ok (a missing verdict is not)."""
    return as_mapping(document.get("verdict")).get("ok") is True


def verdict_word(document: Mapping[str, Any]) -> str:
    """``PASS`` or ``FAIL``."""
    return "PASS" if verdict_ok(document) else "FAIL"


def all_violations(document: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(scenario, invariant, message) of every violation, the verdict's first, no repeats."""
    found: list[tuple[str, str, str]] = []
    for item in as_records(as_mapping(document.get("verdict")).get("violations")):
        found.append(
            (
                as_text(item.get("scenario")),
                as_text(item.get("invariant")),
                as_text(item.get("message")),
            )
        )
    for scenario in as_records(document.get("scenarios")):
        for item in as_records(scenario.get("violations")):
            name = item.get("scenario", scenario.get("scenario"))
            found.append(
                (as_text(name), as_text(item.get("invariant")), as_text(item.get("message")))
            )
    return list(dict.fromkeys(found))


def node_names(document: Mapping[str, Any]) -> list[str]:
    """The document's nodes in order, then any other node the timeline names."""
    names = [str(name) for name in as_items(document.get("nodes")) if name is not None]
    timeline = as_mapping(document.get("timeline"))
    for interval in as_records(timeline.get("leadership")):
        node = interval.get("node")
        if node is not None and str(node) not in names:
            names.append(str(node))
    return names
