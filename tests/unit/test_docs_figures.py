"""Every throughput figure in the README and docs says what it is (issue 21): a burst or a
sustained rate, under a heading or in a paragraph that says so, and nothing above the
default layout's cutting ceiling is left without the word "burst"."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RATE = re.compile(r"(\d[\d,.]*)\s*([MK]?)\s*(?:IDs|claims|calls|blocks)/s\b")
CEILING_IDS_PER_S = 2**17 * 1000  # default layout: 2^(lane_bits + sequence_bits) per ms
SAYS_WHAT = re.compile(r"\b(burst|sustain\w*|ceiling|say,)", re.IGNORECASE)


def paragraphs(text: str) -> Iterator[tuple[str, str]]:
    """(the nearest heading, the paragraph) for every blank-line separated paragraph."""
    heading = ""
    for block in re.split(r"\n\s*\n", text):
        for line in block.splitlines():
            if line.startswith("#"):
                heading = line
        yield heading, block


def figures(path: Path) -> Iterator[tuple[str, str, float]]:
    for heading, block in paragraphs(path.read_text()):
        for match in RATE.finditer(block):
            value = float(match.group(1).replace(",", ""))
            value *= {"M": 1e6, "K": 1e3, "": 1}[match.group(2)]
            yield heading, block, value


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_rate_says_whether_it_is_a_burst_or_sustained(path: Path) -> None:
    unlabelled = [
        block.strip()[:120]
        for heading, block, _ in figures(path)
        if not SAYS_WHAT.search(heading) and not SAYS_WHAT.search(block)
    ]
    assert unlabelled == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_nothing_above_the_cutting_ceiling_passes_for_a_sustained_rate(path: Path) -> None:
    above = [
        block.strip()[:120]
        for heading, block, value in figures(path)
        if value > CEILING_IDS_PER_S and "IDs/s" in block and "burst" not in (heading + block)
    ]
    assert above == []


def test_the_checker_catches_an_unlabelled_rate(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Speed\n\nIt hands out 245M IDs/s.\n")
    assert [v for *_, v in figures(page)] == [245e6]
    assert not SAYS_WHAT.search("# Speed")
    assert not SAYS_WHAT.search("It hands out 245M IDs/s.")
