"""The drill's report (``--report DIR``): its three files, and the Markdown summary.

``drill.json`` (the run document), ``drill.md`` (:func:`markdown`) and ``drill.png`` (the
timeline, :mod:`.report_png`). Pure but for writing the files: reads only the document.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from allocator.core import files as files_mod
from allocator.drill import report_png
from allocator.drill.report_document import (
    NULL,
    all_violations,
    as_mapping,
    as_number,
    as_records,
    as_text,
    fmt,
    node_names,
    plural,
    verdict_word,
)

JSON_NAME: Final = "drill.json"
MARKDOWN_NAME: Final = "drill.md"
PNG_NAME: Final = "drill.png"
FILE_MODE: Final = 0o644

HANDOVER_KEYS: Final = ("p50", "p90", "p99", "max")
# resources.growth key -> resources.bound key
GROWTH_BOUNDS: Final = {
    "rss_mib": "rss_growth_mib",
    "open_files": "fd_growth",
    "threads": "thread_growth",
}


@dataclass(frozen=True)
class ReportFiles:
    """Where :func:`write_report` put the three files."""

    json: Path
    markdown: Path
    png: Path


def write_report(directory: Path, document: Mapping[str, Any]) -> ReportFiles:
    """Write ``drill.json``, ``drill.md`` and ``drill.png`` for ``document`` into ``directory``.

    Creates ``directory`` (parents too). ``drill.json`` is the document, indented;
    ``drill.md`` the same text :func:`markdown` returns, embedding the picture. Every file is
    written atomically: a temporary file in ``directory``, flushed and fsynced, then renamed
    over the final name, so a reader sees the previous file or the whole new one.
    ``drill.json`` is written first, so the data survives a picture that fails to render.
    """
    directory.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        json=directory / JSON_NAME, markdown=directory / MARKDOWN_NAME, png=directory / PNG_NAME
    )
    files_mod.write_atomic(
        files.json, (json.dumps(document, indent=2) + "\n").encode(), mode=FILE_MODE
    )
    files_mod.write_atomic(files.markdown, markdown(document).encode(), mode=FILE_MODE)
    files_mod.write_atomic(files.png, report_png.png(document), mode=FILE_MODE)
    return files


def markdown(document: Mapping[str, Any]) -> str:
    """The Markdown summary of a run document (the text of ``drill.md``).

    A null or missing value shows as ``—``; the picture is embedded as ``drill.png``.
    """
    sections = [
        _md_header(document),
        _md_scenarios(document),
        _md_violations(document),
        _md_runway(document),
        _md_resources(document),
        f"![timeline]({PNG_NAME})",
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _kinds(kinds: Any) -> str:
    items = sorted(as_mapping(kinds).items())
    return ", ".join(f"{kind}: {fmt(count)}" for kind, count in items)


def _claim_errors(record: Mapping[str, Any], noun: str = "") -> str:
    """``"3 (08006: 3)"``; with a noun ``"3 claim errors (08006: 3)"``."""
    kinds = _kinds(record.get("claim_error_kinds"))
    count = fmt(record.get("claim_errors"))
    counted = f"{count} {noun}" if noun else count
    return f"{counted} ({kinds})" if kinds else counted


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = [_row(header), _row("---" for _ in header)]
    lines.extend(_row(row) for row in rows)
    return "\n".join(lines)


def _md_header(document: Mapping[str, Any]) -> str:
    verdict = as_mapping(document.get("verdict"))
    facts = " · ".join(
        [
            f"Started {as_text(document.get('started_at'))}",
            f"duration {fmt(document.get('duration_s'), '.1f')} s",
            f"seed {as_text(document.get('seed'))}",
            f"session timeout {fmt(document.get('session_timeout_ms'))} ms",
            f"nodes {', '.join(node_names(document)) or NULL}",
        ]
    )
    summary = ", ".join(
        [
            plural(len(all_violations(document)), "violation"),
            plural(verdict.get("failed_rounds"), "failed round"),
            f"{fmt(verdict.get('claims'))} claims",
            _claim_errors(verdict, "claim errors"),
            f"{fmt(verdict.get('pool_empty'))} pool-empty answers",
            f"{fmt(verdict.get('stale_writes_rejected'))} stale writes rejected",
            f"{fmt(verdict.get('leaderless_s'), '.1f')} s without a leader",
        ]
    )
    return f"# Drill report\n\n{facts}\n\n**Verdict: {verdict_word(document)}** — {summary}"


SCENARIO_HEADER: Final = (
    "scenario",
    "rounds",
    "failed",
    "handover p50 ms",
    "p90 ms",
    "p99 ms",
    "max ms",
    "leaderless s",
    "claims",
    "claim errors",
    "pool empty",
    "stale writes rejected",
    "violations",
)


def _scenario_row(record: Mapping[str, Any]) -> list[str]:
    handover = as_mapping(record.get("handover_ms"))
    violations = record.get("violations")
    return [
        as_text(record.get("scenario")),
        fmt(record.get("rounds")),
        fmt(record.get("failed_rounds")),
        *(fmt(handover.get(key)) for key in HANDOVER_KEYS),
        fmt(record.get("leaderless_s"), ".1f"),
        fmt(record.get("claims")),
        _claim_errors(record),
        fmt(record.get("pool_empty")),
        fmt(record.get("stale_writes_rejected")),
        str(len(as_records(violations))),
    ]


def _md_scenarios(document: Mapping[str, Any]) -> str:
    rows = [_scenario_row(record) for record in as_records(document.get("scenarios"))]
    if not rows:
        return "## Scenarios\n\nNo scenario ran."
    return "## Scenarios\n\n" + _table(SCENARIO_HEADER, rows)


def _md_violations(document: Mapping[str, Any]) -> str:
    found = all_violations(document)
    if not found:
        return "## Violations\n\nNone."
    lines = [f"- {scenario}: {invariant}: {message}" for scenario, invariant, message in found]
    return "## Violations\n\n" + "\n".join(lines)


def _md_runway(document: Mapping[str, Any]) -> str:
    worst = as_mapping(as_mapping(document.get("verdict")).get("worst_runway"))
    if as_number(worst.get("at_s")) is None and as_number(worst.get("available_blocks")) is None:
        return "## Worst runway\n\nNot measured."
    return (
        f"## Worst runway\n\n{fmt(worst.get('available_blocks'))} blocks available"
        f" at {fmt(worst.get('at_s'), '.1f')} s"
        f" (runway {fmt(worst.get('runway_s'), '.1f')} s)"
    )


RESOURCE_HEADER: Final = (
    "node",
    "RSS MiB first → last",
    "open files first → last",
    "threads first → last",
    "growth RSS MiB / files / threads",
    "bound",
    "ok",
)


def _first_last(samples: list[Mapping[str, Any]], key: str, spec: str) -> str:
    values = [sample.get(key) for sample in samples if as_number(sample.get(key)) is not None]
    if not values:
        return NULL
    return f"{fmt(values[0], spec)} → {fmt(values[-1], spec)}"


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no"}[value] if isinstance(value, bool) else NULL


def _within_bound(growth: Mapping[str, Any], bound: Mapping[str, Any]) -> str:
    pairs = [(as_number(growth.get(g)), as_number(bound.get(b))) for g, b in GROWTH_BOUNDS.items()]
    checks = [None if g is None or b is None else g <= b for g, b in pairs]
    if None in checks:
        return NULL
    return _yes_no(all(checks))


def _resource_row(node: str, resources: Mapping[str, Any]) -> list[str]:
    samples = as_records(as_mapping(resources.get("nodes")).get(node))
    growth = as_mapping(as_mapping(resources.get("growth")).get(node))
    bound = as_mapping(resources.get("bound"))
    return [
        node,
        _first_last(samples, "rss_mib", ".1f"),
        _first_last(samples, "open_files", ".0f"),
        _first_last(samples, "threads", ".0f"),
        " / ".join(
            fmt(growth.get(key), ".1f" if key == "rss_mib" else ".0f") for key in GROWTH_BOUNDS
        ),
        " / ".join(fmt(bound.get(key)) for key in GROWTH_BOUNDS.values()),
        _within_bound(growth, bound),
    ]


def _md_resources(document: Mapping[str, Any]) -> str:
    resources = document.get("resources")
    if not isinstance(resources, Mapping):
        return ""
    names = list(
        dict.fromkeys([*as_mapping(resources.get("nodes")), *as_mapping(resources.get("growth"))])
    )
    ok = _yes_no(resources.get("ok"))
    table = _table(RESOURCE_HEADER, [_resource_row(str(name), resources) for name in names])
    return f"## Resources\n\nWithin bound: **{ok}**\n\n{table}"
