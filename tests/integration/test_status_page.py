"""The status page (issue 12, must-show 7) in a real headless browser: Debian's chromium,
driven by Playwright, against two nodes in threads on the real ensemble and PostgreSQL. The
page of the follower shows who leads, the queue, the pool and the handovers; after the
leader steps down over the admin API it shows the new leader by itself, in the same document
(no reload), and the browser reports no error (a script or style the policy blocked would be
one).

Chromium comes from ``scripts/install-system-deps.sh`` (``playwright install`` cannot
download a browser here); without it the test fails, never skips. It runs as root in CI,
hence ``--no-sandbox``.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Locator, Page, expect, sync_playwright

from tests.fixtures.nodes import DEADLINE_S, MakeNode, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
POOL_LEVEL = re.compile(r"^[1-9][0-9,]*$")
"""Blocks the leader has cut: digits (with thousands separators), never the dash."""
TOKEN = "status-page-0123456789-abcdefghij"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-system-deps.sh")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def holder(db_url: str) -> str | None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT holder FROM allocator.fence").fetchone()
    return None if row is None else row[0]


def step_down(admin_url: str) -> int:
    request = urllib.request.Request(  # noqa: S310 (a loopback http URL of our own node)
        f"{admin_url}/step-down", method="POST", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
        return int(answer.status)


def cell(page: Page, table: str, row: int, column: int) -> Locator:
    """The cell of a table body on the page, counted from 1."""
    return page.locator(f"#{table} tr:nth-child({row}) td:nth-child({column})")


def test_the_page_shows_the_leader_and_follows_a_handover_by_itself(
    make_node: MakeNode, db_url: str, browser: Browser
) -> None:
    a = make_node("a", **{"node.admin_token": TOKEN})
    wait_for(lambda: holder(db_url) == "a", "a to lead")
    b = make_node("b", **{"node.admin_token": TOKEN})
    wait_for(lambda: b.node.snapshot()["role"] == "follower", "b to queue")

    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"console {message.type}: {message.text}")

    page.on("console", on_console)
    timeout_ms = DEADLINE_S * 1000
    answer = page.goto(f"{b.admin_url}/")
    assert answer is not None
    assert answer.status == 200
    # b's own page: the cluster as b sees it
    expect(page.locator("#node-name")).to_have_text("b", timeout=timeout_ms)
    expect(page.locator("#leader-name")).to_have_text("a", timeout=timeout_ms)
    expect(page.locator("#queue tr")).to_have_count(2, timeout=timeout_ms)
    expect(cell(page, "queue", 1, 2)).to_have_text("a")
    expect(cell(page, "queue", 2, 2)).to_have_text("b")
    expect(page.locator("#pool-blocks")).to_have_text(POOL_LEVEL, timeout=timeout_ms)
    expect(page.locator("#pool-runway")).not_to_have_text("\u2014")
    expect(page.locator("#leader-since")).not_to_have_text("\u2014", timeout=timeout_ms)
    expect(cell(page, "handovers", 1, 1)).to_have_text("a")
    expect(page).to_have_title("allocator \u2014 a leads")
    page.evaluate("window.sameDocument = true")  # gone if the page reloaded

    assert step_down(a.admin_url) == 202
    expect(page.locator("#leader-name")).to_have_text("b", timeout=timeout_ms)
    expect(page).to_have_title("allocator \u2014 b leads")
    expect(cell(page, "queue", 1, 2)).to_have_text("b", timeout=timeout_ms)
    expect(cell(page, "queue", 2, 2)).to_have_text("a", timeout=timeout_ms)  # a rejoined
    expect(cell(page, "handovers", 1, 1)).to_have_text("b", timeout=timeout_ms)
    expect(cell(page, "handovers", 2, 1)).to_have_text("a")
    expect(cell(page, "handovers", 2, 5)).to_have_text("stepped_down")
    assert page.evaluate("window.sameDocument") is True
    assert page.locator("#unreachable").is_hidden()
    assert problems == []
    page.close()
