"""The drill's report (issue 11, "a picture"): the three files, their content, the PNG's size.

Pure: synthetic run documents, no cluster. One realistic document (three nodes, faults of
which one failed and one never healed, samples with nulls, a violation, resources) and one
edge case (one node, empty timeline, nulls in the verdict).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from allocator.drill import report, report_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, the first chunk after the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", head[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def leadership(schedule: list[tuple[str, int, float, float]]) -> list[dict[str, Any]]:
    return [
        {"node": node, "epoch": epoch, "from_s": start, "to_s": stop}
        for node, epoch, start, stop in schedule
    ]


def samples(duration_s: float) -> list[dict[str, Any]]:
    """Every 0.5 s; the database unreadable for a while, no leader during handovers."""
    out: list[dict[str, Any]] = []
    for index in range(int(duration_s * 2)):
        t = index * 0.5
        unreadable = 70.0 <= t < 74.0
        leaderless = any(start <= t < start + 4.2 for start in (20.0, 60.0, 95.0))
        out.append(
            {
                "t_s": t,
                "available_blocks": None if unreadable else 2000 - (index * 37) % 1700,
                "claims_per_s": None if unreadable else (20.0 if leaderless else 98.0),
                "leader": None if leaderless else "node-1",
            }
        )
    return out


def realistic_document() -> dict[str, Any]:
    duration = 130.0
    violation = {"invariant": "I3", "message": "block 42 cut under epoch 5 after epoch 6 | late"}
    return {
        "started_at": "2026-12-02T01:00:00+00:00",
        "duration_s": duration,
        "seed": 7,
        "session_timeout_ms": 4000,
        "nodes": ["node-1", "node-2", "node-3"],
        "verdict": {
            "ok": False,
            "violations": [{**violation, "scenario": "pg-partition"}],
            "failed_rounds": 1,
            "stale_writes_rejected": 2,
            "claims": 12000,
            "claim_errors": 3,
            "claim_error_kinds": {"08006": 3},
            "pool_empty": 1,
            "leaderless_s": 12.6,
            "worst_runway": {"at_s": 72.0, "available_blocks": 310, "runway_s": None},
        },
        "scenarios": [
            {
                "scenario": "kill",
                "rounds": 2,
                "failed_rounds": 0,
                "handover_ms": {"p50": 4100.0, "p90": 4300.0, "p99": 4300.0, "max": 4300.0},
                "leaderless_s": 8.4,
                "claims": 5000,
                "claim_errors": 0,
                "claim_error_kinds": {},
                "pool_empty": 0,
                "stale_writes_rejected": 0,
                "violations": [],
                "round_results": [],
            },
            {
                "scenario": "pg-partition",
                "rounds": 2,
                "failed_rounds": 1,
                "handover_ms": {"p50": 4200.0, "p90": None, "p99": None, "max": 4200.0},
                "leaderless_s": 4.2,
                "claims": 4000,
                "claim_errors": 3,
                "claim_error_kinds": {"08006": 3},
                "pool_empty": 1,
                "stale_writes_rejected": 2,
                "violations": [violation],
                "round_results": [],
            },
            {
                "scenario": "host-death",
                "rounds": 1,
                "failed_rounds": 0,
                "handover_ms": {"p50": 4400.0, "p90": 4400.0, "p99": 4400.0, "max": 4400.0},
                "leaderless_s": None,
                "claims": 3000,
                "claim_errors": 0,
                "claim_error_kinds": {},
                "pool_empty": 0,
                "stale_writes_rejected": 0,
                "violations": [],
                "round_results": [],
            },
        ],
        "timeline": {
            "leadership": leadership(
                [
                    ("node-1", 5, 0.0, 20.0),
                    ("node-2", 6, 24.1, 60.0),
                    ("node-3", 7, 64.2, 95.0),
                    ("node-1", 8, 99.4, duration),
                ]
            ),
            "faults": [
                {
                    "scenario": "kill",
                    "round": 1,
                    "at_s": 20.0,
                    "healed_s": 21.0,
                    "target": "node-1",
                    "handover_ms": 4100.0,
                    "ok": True,
                },
                {
                    "scenario": "pg-partition",
                    "round": 1,
                    "at_s": 60.0,
                    "healed_s": 75.0,
                    "target": "node-2",
                    "handover_ms": 4200.0,
                    "ok": True,
                },
                {
                    "scenario": "pg-partition",
                    "round": 2,
                    "at_s": 80.0,
                    "healed_s": 88.0,
                    "target": "node-3",
                    "handover_ms": None,
                    "ok": False,
                },
                {
                    "scenario": "host-death",
                    "round": 1,
                    "at_s": 95.0,
                    "healed_s": None,
                    "target": "node-3",
                    "handover_ms": 4400.0,
                    "ok": True,
                },
                {
                    "scenario": "zk-server-kill",
                    "round": 1,
                    "at_s": None,
                    "healed_s": None,
                    "target": "zk-2",
                    "handover_ms": None,
                    "ok": None,
                },
            ],
            "samples": samples(duration),
        },
        "resources": {
            "bound": {"rss_growth_mib": 64, "fd_growth": 32, "thread_growth": 16},
            "nodes": {
                node: [
                    {
                        "t_s": 0.0,
                        "pid": 100 + index,
                        "rss_mib": 61.2,
                        "open_files": 24,
                        "threads": 9,
                    },
                    {
                        "t_s": 60.0,
                        "pid": 100 + index,
                        "rss_mib": None,
                        "open_files": None,
                        "threads": None,
                    },
                    {
                        "t_s": 120.0,
                        "pid": 100 + index,
                        "rss_mib": 64.3,
                        "open_files": 24,
                        "threads": 9,
                    },
                ]
                for index, node in enumerate(["node-1", "node-2", "node-3"])
            },
            "growth": {
                node: {"rss_mib": 3.1, "open_files": 0, "threads": 0}
                for node in ["node-1", "node-2", "node-3"]
            },
            "ok": True,
        },
        "cluster": {"state_dir": "state", "pids": [1, 2], "stopped": True, "left_running": []},
    }


def sparse_document() -> dict[str, Any]:
    """One node, nothing happened, nulls where a value could be missing."""
    return {
        "started_at": "2026-12-02T01:00:00+00:00",
        "duration_s": None,
        "seed": None,
        "session_timeout_ms": 4000,
        "nodes": ["node-1"],
        "verdict": {
            "ok": True,
            "violations": [],
            "failed_rounds": 0,
            "stale_writes_rejected": 0,
            "claims": 0,
            "claim_errors": 0,
            "claim_error_kinds": {},
            "pool_empty": 0,
            "leaderless_s": None,
            "worst_runway": {"at_s": None, "available_blocks": None, "runway_s": None},
        },
        "scenarios": [],
        "timeline": {"leadership": [], "faults": [], "samples": []},
        "cluster": {"state_dir": "state", "pids": [], "stopped": True, "left_running": []},
    }


@pytest.fixture
def realistic() -> dict[str, Any]:
    return realistic_document()


@pytest.fixture
def sparse() -> dict[str, Any]:
    return sparse_document()


def test_writes_the_three_files(tmp_path: Path, realistic: dict[str, Any]) -> None:
    files = report.write_report(tmp_path / "a" / "b", realistic)

    assert files.json == tmp_path / "a" / "b" / "drill.json"
    assert sorted(path.name for path in files.json.parent.iterdir()) == [
        "drill.json",
        "drill.md",
        "drill.png",
    ]  # no temporary file left behind
    assert json.loads(files.json.read_text()) == realistic
    assert files.markdown.read_text() == report.markdown(realistic)
    assert png_size(files.png) == (report_png.PNG_WIDTH_PX, report_png.PNG_HEIGHT_PX)


def test_markdown_names_the_verdict_scenarios_and_violation(realistic: dict[str, Any]) -> None:
    text = report.markdown(realistic)

    assert "**Verdict: FAIL**" in text
    for scenario in ("kill", "pg-partition", "host-death"):
        assert f"| {scenario} |" in text
    # named once although the verdict and its scenario both list it
    violation = "- pg-partition: I3: block 42 cut under epoch 5 after epoch 6 | late"
    assert text.count(violation) == 1
    assert "3 claim errors (08006: 3)" in text
    assert "| 3 (08006: 3) |" in text
    assert "| 4200 | — | — | 4200 |" in text  # null percentiles
    assert "310 blocks available at 72.0 s (runway — s)" in text
    assert "| node-2 | 61.2 → 64.3 | 24 → 24 | 9 → 9 | 3.1 / 0 / 0 | 64 / 32 / 16 | yes |" in text
    assert "![timeline](drill.png)" in text


def test_rewriting_replaces_the_files(tmp_path: Path, realistic: dict[str, Any]) -> None:
    report.write_report(tmp_path, realistic)
    realistic["verdict"]["ok"] = True
    realistic["verdict"]["violations"] = []
    realistic["scenarios"][1]["violations"] = []

    files = report.write_report(tmp_path, realistic)

    assert "**Verdict: PASS**" in files.markdown.read_text()
    assert "None." in files.markdown.read_text()
    assert len(list(tmp_path.iterdir())) == 3


def test_an_empty_run_still_reports(tmp_path: Path, sparse: dict[str, Any]) -> None:
    files = report.write_report(tmp_path, sparse)

    assert json.loads(files.json.read_text()) == sparse
    assert png_size(files.png) == (report_png.PNG_WIDTH_PX, report_png.PNG_HEIGHT_PX)
    text = files.markdown.read_text()
    assert "**Verdict: PASS**" in text
    assert "No scenario ran." in text
    assert "## Resources" not in text  # not a soak
    assert "seed —" in text
    assert "Worst runway\n\nNot measured." in text


def test_a_bare_document_still_reports(tmp_path: Path) -> None:
    """Nothing but nulls and missing keys: the report says so instead of failing."""
    files = report.write_report(tmp_path, {"nodes": [], "verdict": None, "timeline": None})

    assert "**Verdict: FAIL**" in files.markdown.read_text()
    assert png_size(files.png) == (report_png.PNG_WIDTH_PX, report_png.PNG_HEIGHT_PX)
