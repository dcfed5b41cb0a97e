"""The drill report's picture, ``drill.png``: the run's timeline in three panels.

Pure: reads only the run document (no network, no cluster, no clock). matplotlib through its
object API (``Figure`` + ``FigureCanvasAgg``): no pyplot, no global backend state.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any, Final

from matplotlib import transforms
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from allocator.drill.report_document import (
    all_violations,
    as_mapping,
    as_number,
    as_records,
    as_text,
    fmt,
    node_names,
    plural,
    verdict_ok,
    verdict_word,
)

FIGSIZE_IN: Final = (16.0, 10.0)
DPI: Final = 100
PNG_WIDTH_PX: Final = 1600
PNG_HEIGHT_PX: Final = 1000
MAX_FAULT_LABELS: Final = 40

LED_COLOR: Final = "tab:blue"
FAULT_COLOR: Final = "dimgray"
FAILED_COLOR: Final = "tab:red"
HEAL_COLOR: Final = "tab:orange"
OK_COLOR: Final = "tab:green"


def png(document: Mapping[str, Any]) -> bytes:
    """The timeline picture of a run document, ``PNG_WIDTH_PX`` x ``PNG_HEIGHT_PX``.

    Always that size: a fixed figure size and dpi, no "tight" bounding box. Three stacked
    panels share the x axis (seconds since the run started): one lane per node showing when
    it led (epoch written in wide bars) with the faults as vertical lines (red when the
    fault's round failed), their healing shaded and a mark on the lane of their target; the
    pool level with the worst-runway moment; claims/s. Fault lines carry a short label
    (scenario, handover ms when known) and repeat, dotted, on the lower panels. Past
    ``MAX_FAULT_LABELS`` faults (a long mixed run) only failed faults are labelled, shaded
    and repeated; the others stay thin lines on the lanes. A null or missing value is
    skipped: the point (lines break there), interval, shading or label.
    """
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
    passed = verdict_ok(document)
    verdict = as_mapping(document.get("verdict"))
    text = (
        f"Drill {verdict_word(document)} — {plural(len(all_violations(document)), 'violation')}, "
        f"{plural(verdict.get('failed_rounds'), 'failed round')}, "
        f"{fmt(verdict.get('leaderless_s'), '.1f')} s without a leader · "
        f"started {as_text(document.get('started_at'))}, seed {as_text(document.get('seed'))}, "
        f"session timeout {fmt(document.get('session_timeout_ms'))} ms"
    )
    figure.suptitle(text, fontsize=13, color=OK_COLOR if passed else FAILED_COLOR)


def _x_end(document: Mapping[str, Any]) -> float:
    """The right end of the x axis: the run's duration, else the last time the document names."""
    duration = as_number(document.get("duration_s"))
    if duration is not None and duration > 0:
        return duration
    timeline = as_mapping(document.get("timeline"))
    times = [
        as_number(record.get(key))
        for name, keys in (
            ("leadership", ("to_s",)),
            ("faults", ("at_s", "healed_s")),
            ("samples", ("t_s",)),
        )
        for record in as_records(timeline.get(name))
        for key in keys
    ]
    known = [time for time in times if time is not None]
    return max([*known, 1.0])


def _lane_y(nodes: list[str]) -> dict[str, int]:
    """The first node on top."""
    return {node: len(nodes) - 1 - index for index, node in enumerate(nodes)}


def _draw_lanes(axes: Axes, document: Mapping[str, Any]) -> None:
    nodes = node_names(document)
    lane_y = _lane_y(nodes)
    end = _x_end(document)
    for y in lane_y.values():
        axes.axhline(y, color="lightgray", linewidth=0.8, zorder=0)
    intervals = as_records(as_mapping(document.get("timeline")).get("leadership"))
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
    start, stop = as_number(interval.get("from_s")), as_number(interval.get("to_s"))
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
    faults = as_records(as_mapping(document.get("timeline")).get("faults"))
    timed = [(as_number(fault.get("at_s")), fault) for fault in faults]
    return [(at, fault) for at, fault in timed if at is not None]


def _failed(fault: Mapping[str, Any]) -> bool:
    return fault.get("ok") is False


def _fault_color(fault: Mapping[str, Any]) -> str:
    return FAILED_COLOR if _failed(fault) else FAULT_COLOR


def _fault_label(fault: Mapping[str, Any]) -> str:
    handover = as_number(fault.get("handover_ms"))
    name = as_text(fault.get("scenario"))
    return name if handover is None else f"{name} {handover:.0f} ms"


def _draw_fault_lines(axes: Axes, document: Mapping[str, Any], *, lanes: bool) -> None:
    """Each fault as a vertical line, shaded until healed; labelled on the lanes panel."""
    faults = _faults(document)
    dense = len(faults) > MAX_FAULT_LABELS
    for at, fault in faults:
        failed = _failed(fault)
        if dense and not failed and not lanes:
            continue
        healed = as_number(fault.get("healed_s"))
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
    for sample in as_records(as_mapping(document.get("timeline")).get("samples")):
        time = as_number(sample.get("t_s"))
        if time is None:
            continue
        value = as_number(sample.get(key))
        times.append(time)
        values.append(math.nan if value is None else value)
    return times, values


def _draw_pool(axes: Axes, document: Mapping[str, Any]) -> None:
    times, values = _series(document, "available_blocks")
    axes.plot(times, values, color="tab:purple", linewidth=1.2, label="available blocks")
    _mark_worst_runway(axes, as_mapping(as_mapping(document.get("verdict")).get("worst_runway")))
    _finish_series(axes, values, "pool (blocks)")


def _mark_worst_runway(axes: Axes, worst: Mapping[str, Any]) -> None:
    at, level = as_number(worst.get("at_s")), as_number(worst.get("available_blocks"))
    if at is None:
        return
    if level is None:
        axes.axvline(at, color=FAILED_COLOR, linewidth=1.5, label="worst runway")
        return
    axes.plot([at], [level], "v", markersize=10, color=FAILED_COLOR, label="worst runway")
    runway = as_number(worst.get("runway_s"))
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
