"""The README's first screen answers "why" before "how to run it" (issue 21): within its
first 40 lines, what it is, how an application gets IDs, the comparison, when not to use it,
the architecture picture, then the two commands (which must be the Makefile's targets)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_SCREEN = ROOT.joinpath("README.md").read_text().splitlines()[:40]


def line_of(pattern: str) -> int:
    """The first line of the first screen that matches ``pattern`` (fails if none does)."""
    found = [n for n, line in enumerate(FIRST_SCREEN) if re.search(pattern, line)]
    assert found, f"the README's first 40 lines do not show {pattern!r}"
    return found[0]


def test_the_first_screen_says_what_it_is_and_how_to_get_ids() -> None:
    line_of(r"allocator\.claim_blocks\(")
    line_of(r"from allocator\.client import IdClient")
    line_of(r"next_id\(\)")


def test_the_first_screen_compares_it_with_the_alternatives() -> None:
    for alternative in ("PostgreSQL sequence", "UUIDv7", "Sonyflake", "Leaf", "Tinyid"):
        line_of(rf"^\|.*{alternative}")
    header = FIRST_SCREEN[line_of(r"^\| *\| *ordering")]
    for column in ("ordering", "coordination", "crash", "time", "needs"):
        assert column in header


def test_then_when_not_to_use_it_a_picture_and_the_two_commands() -> None:
    when_not = line_of(r"When not to use it")
    picture = line_of(r"^!\[.+\]\(docs/images/[\w-]+\.(svg|png)\)")
    demo, test = line_of(r"^make demo\b"), line_of(r"^make test\b")
    assert line_of(r"^\| \*\*allocator\*\*") < when_not < picture < demo < test
    image = re.search(r"\((docs/images/[^)]+)\)", FIRST_SCREEN[picture])
    assert image is not None
    assert (ROOT / image.group(1)).is_file()
    targets = ROOT.joinpath("Makefile").read_text()
    assert re.search(r"^demo:", targets, re.M)
    assert re.search(r"^test:", targets, re.M)
