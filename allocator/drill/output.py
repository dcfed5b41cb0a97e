"""The drill's outputs: the table, the violation lines, the run document (JSON), as pure
functions of the results; files are written atomically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from allocator.core import files
from allocator.drill import upgrade_judge
from allocator.drill.results import ScenarioResult

TABLE_COLUMNS: Final = (
    ("scenario", 18),
    ("rounds", 6),
    ("failed", 6),
    ("handovers", 9),
    ("p50 ms", 8),
    ("p90 ms", 8),
    ("p99 ms", 8),
    ("max ms", 8),
    ("session timeout ms", 18),
    ("claims", 7),
    ("claim errors", 12),
    ("pool empty", 10),
    ("leaderless s", 12),
    ("node restarts", 13),
    ("stale writes rejected", 21),
    ("violations", 10),
)


def render_table(results: Sequence[ScenarioResult]) -> list[str]:
    """One header line and one line per scenario (the numbers of :meth:`ScenarioResult.to_json`)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        "  ".join(
            f"{name:>{width}}" if i else f"{name:<{width}}"
            for i, (name, width) in enumerate(TABLE_COLUMNS)
        )
    ]
    for r in results:
        summary = r.handover_summary()
        cells = [
            r.scenario,
            str(len(r.rounds)),
            str(r.failed_rounds),
            str(len(r.handover_times_ms())),
            ms(summary["p50"]),
            ms(summary["p90"]),
            ms(summary["p99"]),
            ms(summary["max"]),
            str(r.session_timeout_ms),
            str(r.claims),
            str(r.claim_errors),
            str(r.pool_empty),
            f"{r.leaderless_s:.1f}",
            str(r.node_restarts),
            str(r.stale_writes_rejected),
            str(len(r.violations)),
        ]
        lines.append(
            "  ".join(
                f"{cell:>{width}}" if i else f"{cell:<{width}}"
                for i, (cell, (_name, width)) in enumerate(zip(cells, TABLE_COLUMNS, strict=True))
            )
        )
    return lines


def render_by_fault(results: Sequence[ScenarioResult]) -> list[str]:
    """For a mixed schedule: one line per fault kind (rounds it was in, handover times,
    claim errors and pool-empty answers of those rounds); nothing otherwise."""
    lines: list[str] = []
    for r in results:
        if r.scenario != "mixed":
            continue
        lines.append(
            f"{'fault':<20}{'rounds':>7}{'failed':>7}{'handovers':>10}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'max ms':>9}{'claim errors':>13}{'pool empty':>11}"
        )
        for kind, row in r.by_fault().items():
            summary = row["handover_ms"]
            cells = [summary[k] for k in ("p50", "p99", "max")]
            shown = ["-" if v is None else f"{v:.0f}" for v in cells]
            lines.append(
                f"{kind:<20}{row['rounds']:>7}{row['failed_rounds']:>7}{row['handovers']:>10}"
                f"{shown[0]:>9}{shown[1]:>9}{shown[2]:>9}{row['claim_errors']:>13}"
                f"{row['pool_empty']:>11}"
            )
    return lines


def render_upgrades(results: Sequence[ScenarioResult]) -> list[str]:
    """For a rolling upgrade: its schema revisions, handover and swaps; nothing otherwise."""
    return [line for r in results if r.upgrade for line in upgrade_judge.render(r.upgrade)]


def render_violations(results: Sequence[ScenarioResult]) -> list[str]:
    """One line per violation, named: ``<scenario>: <invariant>: <message>``."""
    return [f"{r.scenario}: {v}" for r in results for v in r.violations]


def verdict(
    results: Sequence[ScenarioResult], leaderless_s: float, worst_runway: Any
) -> dict[str, Any]:
    """The run's verdict over every scenario (see the document schema)."""
    kinds: dict[str, int] = {}
    for r in results:
        for kind, n in r.claim_error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + n
    violations = [{**v.to_json(), "scenario": r.scenario} for r in results for v in r.violations]
    failed = sum(r.failed_rounds for r in results)
    return {
        "ok": not violations and not failed,
        "violations": violations,
        "failed_rounds": failed,
        "stale_writes_rejected": sum(r.stale_writes_rejected for r in results),
        "claims": sum(r.claims for r in results),
        "claim_errors": sum(r.claim_errors for r in results),
        "claim_error_kinds": kinds,
        "pool_empty": sum(r.pool_empty for r in results),
        "leaderless_s": round(leaderless_s, 1),
        "worst_runway": worst_runway,
    }


def document(
    results: Sequence[ScenarioResult],
    *,
    run: Mapping[str, Any],
    verdict: Mapping[str, Any],
    timeline: Mapping[str, Any],
    cluster: Mapping[str, Any],
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The run document: ``run`` (started_at, duration_s, seed, session_timeout_ms, nodes)
    + verdict, scenarios, timeline, cluster (+ resources); one scenario's keys on top (but
    ``run``'s own). Its shape is docs/schemas/drill.schema.json, which tests hold real output
    to, and what the report reads (:mod:`allocator.drill.report`)."""
    data: dict[str, Any] = {}
    if len(results) == 1:
        data.update(results[0].to_json())
    data.update(run)
    data["verdict"] = dict(verdict)
    data["scenarios"] = [r.to_json() for r in results]
    data["timeline"] = dict(timeline)
    data["cluster"] = dict(cluster)
    if resources is not None:
        data["resources"] = dict(resources)
    return data


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())
