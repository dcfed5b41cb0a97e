"""The drill's report: one run document turned into files a person reads (``--report DIR``).

Rules:

- :func:`write_report` creates ``DIR`` (parents too) and writes three files there:
  ``drill.json`` (the document, indented), ``drill.md`` (a Markdown summary, the same text
  :func:`markdown` returns, embedding the picture) and ``drill.png`` (the timeline).
- Every file is written atomically: a temporary file in ``DIR``, flushed and fsynced, then
  renamed over the final name, so a reader sees the previous file or the whole new one.
  ``drill.json`` is written first, so the data survives a picture that fails to render.
- The PNG is always ``PNG_WIDTH_PX`` x ``PNG_HEIGHT_PX``: a fixed figure size and dpi, no
  "tight" bounding box. Three stacked panels share the x axis (seconds since the run
  started): one lane per node showing when it led (epoch written in wide bars) with the
  faults as vertical lines (red when the fault's round failed), their healing shaded and a
  mark on the lane of their target; the pool level with the worst-runway moment; claims/s.
  Fault lines carry a short label (scenario, handover ms when known) and repeat, dotted, on
  the lower panels. Past ``MAX_FAULT_LABELS`` faults (a long mixed run) only failed faults
  are labelled, shaded and repeated; the others stay thin lines on the lanes.
- Nulls: any value of the document may be null or missing. The Markdown shows ``—``; the
  picture skips the point (lines break there), interval, shading or label.
- Pure: reads only the document (no network, no cluster, no clock). matplotlib through its
  object API (``Figure`` + ``FigureCanvasAgg``): no pyplot, no global backend state.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from matplotlib import transforms
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from allocator.core import files as files_mod

JSON_NAME: Final = "drill.json"
MARKDOWN_NAME: Final = "drill.md"
PNG_NAME: Final = "drill.png"

FIGSIZE_IN: Final = (16.0, 10.0)
DPI: Final = 100
PNG_WIDTH_PX: Final = 1600
PNG_HEIGHT_PX: Final = 1000
MAX_FAULT_LABELS: Final = 40
FILE_MODE: Final = 0o644

NULL: Final = "—"
LED_COLOR: Final = "tab:blue"
FAULT_COLOR: Final = "dimgray"
FAILED_COLOR: Final = "tab:red"
HEAL_COLOR: Final = "tab:orange"
OK_COLOR: Final = "tab:green"

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
    """Write ``drill.json``, ``drill.md`` and ``drill.png`` for ``document`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        json=directory / JSON_NAME, markdown=directory / MARKDOWN_NAME, png=directory / PNG_NAME
    )
    files_mod.write_atomic(
        files.json, (json.dumps(document, indent=2) + "\n").encode(), mode=FILE_MODE
    )
    files_mod.write_atomic(files.markdown, markdown(document).encode(), mode=FILE_MODE)
    files_mod.write_atomic(files.png, png(document), mode=FILE_MODE)
    return files


# -- reading the document (null-tolerant) ----------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Any]:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        return []
    return list(value)


def _records(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in _items(value) if isinstance(item, Mapping)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def _fmt(value: Any, spec: str = ".0f") -> str:
    number = _number(value)
    return NULL if number is None else format(number, spec)


def _text(value: Any) -> str:
    return NULL if value is None else str(value)


def _counted(value: Any, noun: str) -> str:
    """``"1 violation"``, ``"2 violations"``, ``"— violations"``."""
    text = _fmt(value)
    return f"{text} {noun}" if text == "1" else f"{text} {noun}s"


def _passed(document: Mapping[str, Any]) -> bool:
    return _mapping(document.get("verdict")).get("ok") is True


def _verdict_word(document: Mapping[str, Any]) -> str:
    return "PASS" if _passed(document) else "FAIL"


def _kinds(kinds: Any) -> str:
    items = sorted(_mapping(kinds).items())
    return ", ".join(f"{kind}: {_fmt(count)}" for kind, count in items)


def _claim_errors(record: Mapping[str, Any], noun: str = "") -> str:
    """``"3 (08006: 3)"``; with a noun ``"3 claim errors (08006: 3)"``."""
    kinds = _kinds(record.get("claim_error_kinds"))
    count = _fmt(record.get("claim_errors"))
    counted = f"{count} {noun}" if noun else count
    return f"{counted} ({kinds})" if kinds else counted


def _violations(document: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(scenario, invariant, message) of every violation, the verdict's first, no repeats."""
    found: list[tuple[str, str, str]] = []
    for item in _records(_mapping(document.get("verdict")).get("violations")):
        found.append(
            (_text(item.get("scenario")), _text(item.get("invariant")), _text(item.get("message")))
        )
    for scenario in _records(document.get("scenarios")):
        for item in _records(scenario.get("violations")):
            name = item.get("scenario", scenario.get("scenario"))
            found.append((_text(name), _text(item.get("invariant")), _text(item.get("message"))))
    return list(dict.fromkeys(found))


def _nodes(document: Mapping[str, Any]) -> list[str]:
    """The document's nodes in order, then any other node the timeline names."""
    names = [str(name) for name in _items(document.get("nodes")) if name is not None]
    timeline = _mapping(document.get("timeline"))
    for interval in _records(timeline.get("leadership")):
        node = interval.get("node")
        if node is not None and str(node) not in names:
            names.append(str(node))
    return names


# -- Markdown --------------------------------------------------------------------------------


def markdown(document: Mapping[str, Any]) -> str:
    """The Markdown summary of a run document (the text of ``drill.md``)."""
    sections = [
        _md_header(document),
        _md_scenarios(document),
        _md_violations(document),
        _md_runway(document),
        _md_resources(document),
        f"![timeline]({PNG_NAME})",
    ]
    return "\n\n".join(section for section in sections if section) + "\n"


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = [_row(header), _row("---" for _ in header)]
    lines.extend(_row(row) for row in rows)
    return "\n".join(lines)


def _md_header(document: Mapping[str, Any]) -> str:
    verdict = _mapping(document.get("verdict"))
    facts = " · ".join(
        [
            f"Started {_text(document.get('started_at'))}",
            f"duration {_fmt(document.get('duration_s'), '.1f')} s",
            f"seed {_text(document.get('seed'))}",
            f"session timeout {_fmt(document.get('session_timeout_ms'))} ms",
            f"nodes {', '.join(_nodes(document)) or NULL}",
        ]
    )
    summary = ", ".join(
        [
            _counted(len(_violations(document)), "violation"),
            _counted(verdict.get("failed_rounds"), "failed round"),
            f"{_fmt(verdict.get('claims'))} claims",
            _claim_errors(verdict, "claim errors"),
            f"{_fmt(verdict.get('pool_empty'))} pool-empty answers",
            f"{_fmt(verdict.get('stale_writes_rejected'))} stale writes rejected",
            f"{_fmt(verdict.get('leaderless_s'), '.1f')} s without a leader",
        ]
    )
    return f"# Drill report\n\n{facts}\n\n**Verdict: {_verdict_word(document)}** — {summary}"


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
    handover = _mapping(record.get("handover_ms"))
    violations = record.get("violations")
    return [
        _text(record.get("scenario")),
        _fmt(record.get("rounds")),
        _fmt(record.get("failed_rounds")),
        *(_fmt(handover.get(key)) for key in HANDOVER_KEYS),
        _fmt(record.get("leaderless_s"), ".1f"),
        _fmt(record.get("claims")),
        _claim_errors(record),
        _fmt(record.get("pool_empty")),
        _fmt(record.get("stale_writes_rejected")),
        str(len(_records(violations))),
    ]


def _md_scenarios(document: Mapping[str, Any]) -> str:
    rows = [_scenario_row(record) for record in _records(document.get("scenarios"))]
    if not rows:
        return "## Scenarios\n\nNo scenario ran."
    return "## Scenarios\n\n" + _table(SCENARIO_HEADER, rows)


def _md_violations(document: Mapping[str, Any]) -> str:
    found = _violations(document)
    if not found:
        return "## Violations\n\nNone."
    lines = [f"- {scenario}: {invariant}: {message}" for scenario, invariant, message in found]
    return "## Violations\n\n" + "\n".join(lines)


def _md_runway(document: Mapping[str, Any]) -> str:
    worst = _mapping(_mapping(document.get("verdict")).get("worst_runway"))
    if _number(worst.get("at_s")) is None and _number(worst.get("available_blocks")) is None:
        return "## Worst runway\n\nNot measured."
    return (
        f"## Worst runway\n\n{_fmt(worst.get('available_blocks'))} blocks available"
        f" at {_fmt(worst.get('at_s'), '.1f')} s"
        f" (runway {_fmt(worst.get('runway_s'), '.1f')} s)"
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
    values = [sample.get(key) for sample in samples if _number(sample.get(key)) is not None]
    if not values:
        return NULL
    return f"{_fmt(values[0], spec)} → {_fmt(values[-1], spec)}"


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no"}[value] if isinstance(value, bool) else NULL


def _within_bound(growth: Mapping[str, Any], bound: Mapping[str, Any]) -> str:
    pairs = [(_number(growth.get(g)), _number(bound.get(b))) for g, b in GROWTH_BOUNDS.items()]
    checks = [None if g is None or b is None else g <= b for g, b in pairs]
    if None in checks:
        return NULL
    return _yes_no(all(checks))


def _resource_row(node: str, resources: Mapping[str, Any]) -> list[str]:
    samples = _records(_mapping(resources.get("nodes")).get(node))
    growth = _mapping(_mapping(resources.get("growth")).get(node))
    bound = _mapping(resources.get("bound"))
    return [
        node,
        _first_last(samples, "rss_mib", ".1f"),
        _first_last(samples, "open_files", ".0f"),
        _first_last(samples, "threads", ".0f"),
        " / ".join(
            _fmt(growth.get(key), ".1f" if key == "rss_mib" else ".0f") for key in GROWTH_BOUNDS
        ),
        " / ".join(_fmt(bound.get(key)) for key in GROWTH_BOUNDS.values()),
        _within_bound(growth, bound),
    ]


def _md_resources(document: Mapping[str, Any]) -> str:
    resources = document.get("resources")
    if not isinstance(resources, Mapping):
        return ""
    names = list(
        dict.fromkeys([*_mapping(resources.get("nodes")), *_mapping(resources.get("growth"))])
    )
    ok = _yes_no(resources.get("ok"))
    table = _table(RESOURCE_HEADER, [_resource_row(str(name), resources) for name in names])
    return f"## Resources\n\nWithin bound: **{ok}**\n\n{table}"


# -- the picture -----------------------------------------------------------------------------


def png(document: Mapping[str, Any]) -> bytes:
    """The timeline picture of a run document, PNG_WIDTH_PX x PNG_HEIGHT_PX."""
    figure = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(figure)  # attaches itself: Agg renders this figure, whatever the backend
    lanes, pool, claims = figure.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1.0, 1.0]}
    )
    figure.subplots_adjust(left=0.07, right=0.86, top=0.92, bottom=0.06, hspace=0.08)
    _title(figure, document)
    _draw_lanes(lanes, document)
    _draw_pool(pool, document)
    _draw_claims(claims, document)
    for axes in (pool, claims):
        _draw_fault_lines(axes, document, lanes=False)
    claims.set_xlim(0.0, _x_end(document))
    claims.set_xlabel("seconds since start")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _title(figure: Figure, document: Mapping[str, Any]) -> None:
    passed = _passed(document)
    verdict = _mapping(document.get("verdict"))
    text = (
        f"Drill {_verdict_word(document)} — {_counted(len(_violations(document)), 'violation')}, "
        f"{_counted(verdict.get('failed_rounds'), 'failed round')}, "
        f"{_fmt(verdict.get('leaderless_s'), '.1f')} s without a leader · "
        f"started {_text(document.get('started_at'))}, seed {_text(document.get('seed'))}, "
        f"session timeout {_fmt(document.get('session_timeout_ms'))} ms"
    )
    figure.suptitle(text, fontsize=13, color=OK_COLOR if passed else FAILED_COLOR)


def _x_end(document: Mapping[str, Any]) -> float:
    """The right end of the x axis: the run's duration, else the last time the document names."""
    duration = _number(document.get("duration_s"))
    if duration is not None and duration > 0:
        return duration
    timeline = _mapping(document.get("timeline"))
    times = [
        _number(record.get(key))
        for name, keys in (
            ("leadership", ("to_s",)),
            ("faults", ("at_s", "healed_s")),
            ("samples", ("t_s",)),
        )
        for record in _records(timeline.get(name))
        for key in keys
    ]
    known = [time for time in times if time is not None]
    return max([*known, 1.0])


def _lane_y(nodes: list[str]) -> dict[str, int]:
    """The first node on top."""
    return {node: len(nodes) - 1 - index for index, node in enumerate(nodes)}


def _draw_lanes(axes: Axes, document: Mapping[str, Any]) -> None:
    nodes = _nodes(document)
    lane_y = _lane_y(nodes)
    end = _x_end(document)
    for y in lane_y.values():
        axes.axhline(y, color="lightgray", linewidth=0.8, zorder=0)
    intervals = _records(_mapping(document.get("timeline")).get("leadership"))
    for interval in intervals:
        _draw_leadership(axes, interval, lane_y, end)
    _draw_fault_lines(axes, document, lanes=True)
    _draw_fault_targets(axes, document, lane_y)
    axes.set_yticks(list(lane_y.values()), list(lane_y))
    # headroom above the top lane for the fault labels
    axes.set_ylim(-0.6, max(len(nodes), 1) - 0.4 + max(1.2, 0.45 * len(nodes)))
    axes.set_ylabel("leader")
    if not intervals:
        _say(axes, "no leadership recorded" if nodes else "no nodes")
    axes.legend(handles=_lane_legend(), loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9)


def _draw_leadership(
    axes: Axes, interval: Mapping[str, Any], lane_y: Mapping[str, int], end: float
) -> None:
    start, stop = _number(interval.get("from_s")), _number(interval.get("to_s"))
    node = interval.get("node")
    if start is None or node is None or str(node) not in lane_y:
        return
    stop = end if stop is None else stop
    if stop <= start:
        return
    y = lane_y[str(node)]
    axes.broken_barh([(start, stop - start)], (y - 0.3, 0.6), facecolors=LED_COLOR, alpha=0.85)
    epoch = interval.get("epoch")
    if epoch is not None and stop - start > 0.04 * end:
        # at the bar's start: a fault's target mark sits at its end
        axes.text(
            start + 0.005 * end,
            y,
            f"epoch {epoch}",
            ha="left",
            va="center",
            fontsize=8,
            color="white",
        )


def _faults(document: Mapping[str, Any]) -> list[tuple[float, Mapping[str, Any]]]:
    """(at_s, fault) of every fault with a known time."""
    faults = _records(_mapping(document.get("timeline")).get("faults"))
    timed = [(_number(fault.get("at_s")), fault) for fault in faults]
    return [(at, fault) for at, fault in timed if at is not None]


def _failed(fault: Mapping[str, Any]) -> bool:
    return fault.get("ok") is False


def _fault_color(fault: Mapping[str, Any]) -> str:
    return FAILED_COLOR if _failed(fault) else FAULT_COLOR


def _fault_label(fault: Mapping[str, Any]) -> str:
    handover = _number(fault.get("handover_ms"))
    name = _text(fault.get("scenario"))
    return name if handover is None else f"{name} {handover:.0f} ms"


def _draw_fault_lines(axes: Axes, document: Mapping[str, Any], *, lanes: bool) -> None:
    """Each fault as a vertical line, shaded until healed; labelled on the lanes panel."""
    faults = _faults(document)
    dense = len(faults) > MAX_FAULT_LABELS
    for at, fault in faults:
        failed = _failed(fault)
        if dense and not failed and not lanes:
            continue
        healed = _number(fault.get("healed_s"))
        if healed is not None and healed > at and (failed or not dense):
            shade = FAILED_COLOR if failed else HEAL_COLOR
            axes.axvspan(at, healed, color=shade, alpha=0.18, linewidth=0, zorder=0)
        width = 1.6 if failed else 0.5 if dense else 0.9
        style = "-" if lanes else ":"
        axes.axvline(at, color=_fault_color(fault), linewidth=width, linestyle=style, zorder=1)
        if lanes and (failed or not dense):
            _label_fault(axes, at, fault)


def _label_fault(axes: Axes, at: float, fault: Mapping[str, Any]) -> None:
    # x in data, y in axes coordinates: the label hangs from the top of the panel
    top = transforms.blended_transform_factory(axes.transData, axes.transAxes)
    axes.text(
        at,
        0.985,
        " " + _fault_label(fault),
        transform=top,
        rotation=90,
        ha="right",
        va="top",
        fontsize=8,
        color=_fault_color(fault),
        fontweight="bold" if _failed(fault) else "normal",
    )


def _draw_fault_targets(axes: Axes, document: Mapping[str, Any], lane_y: Mapping[str, int]) -> None:
    for at, fault in _faults(document):
        target = fault.get("target")
        if target is not None and str(target) in lane_y:
            axes.plot(
                [at],
                [lane_y[str(target)]],
                marker="X",
                markersize=9,
                color=_fault_color(fault),
                markeredgecolor="white",
                linestyle="none",
                zorder=5,
            )


def _lane_legend() -> list[Line2D | Patch]:
    return [
        Patch(facecolor=LED_COLOR, label="led (epoch)"),
        Line2D([], [], color=FAULT_COLOR, label="fault"),
        Line2D([], [], color=FAILED_COLOR, linewidth=1.6, label="fault, round failed"),
        Line2D([], [], marker="X", color=FAULT_COLOR, linestyle="none", label="fault target"),
        Patch(facecolor=HEAL_COLOR, alpha=0.3, label="until healed"),
    ]


def _series(document: Mapping[str, Any], key: str) -> tuple[list[float], list[float]]:
    """(t, value) of the samples; a null value becomes NaN, so the line breaks there."""
    times: list[float] = []
    values: list[float] = []
    for sample in _records(_mapping(document.get("timeline")).get("samples")):
        time = _number(sample.get("t_s"))
        if time is None:
            continue
        value = _number(sample.get(key))
        times.append(time)
        values.append(math.nan if value is None else value)
    return times, values


def _draw_pool(axes: Axes, document: Mapping[str, Any]) -> None:
    times, values = _series(document, "available_blocks")
    axes.plot(times, values, color="tab:purple", linewidth=1.2, label="available blocks")
    _mark_worst_runway(axes, _mapping(_mapping(document.get("verdict")).get("worst_runway")))
    _finish_series(axes, values, "pool (blocks)")


def _mark_worst_runway(axes: Axes, worst: Mapping[str, Any]) -> None:
    at, level = _number(worst.get("at_s")), _number(worst.get("available_blocks"))
    if at is None:
        return
    if level is None:
        axes.axvline(at, color=FAILED_COLOR, linewidth=1.5, label="worst runway")
        return
    axes.plot([at], [level], "v", markersize=10, color=FAILED_COLOR, label="worst runway")
    runway = _number(worst.get("runway_s"))
    note = f"{level:.0f} blocks" + ("" if runway is None else f", runway {runway:.1f} s")
    axes.annotate(
        note,
        (at, level),
        xytext=(8, 4),
        textcoords="offset points",
        fontsize=9,
        color=FAILED_COLOR,
        va="bottom",
    )


def _draw_claims(axes: Axes, document: Mapping[str, Any]) -> None:
    times, values = _series(document, "claims_per_s")
    axes.plot(times, values, color="tab:green", linewidth=1.0, label="claims/s")
    _finish_series(axes, values, "claims/s")


def _finish_series(axes: Axes, values: list[float], ylabel: str) -> None:
    axes.set_ylabel(ylabel)
    if all(math.isnan(value) for value in values):
        axes.set_ylim(0, 1)
        _say(axes, "no samples")
    else:
        axes.set_ylim(bottom=0)
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=9)


def _say(axes: Axes, text: str) -> None:
    """A note in the middle of an empty panel."""
    axes.text(0.5, 0.5, text, transform=axes.transAxes, ha="center", va="center", color="gray")
