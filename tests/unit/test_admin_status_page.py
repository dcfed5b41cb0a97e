"""The status page at ``/`` (issue 12, must-show 7) as the admin server serves it: one
self-contained, read-only HTML document under a Content-Security-Policy that allows exactly
its own inline script and style, and nothing from elsewhere. The browser test is
tests/integration/test_status_page.py."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest

from allocator.http import status_page
from tests.admin_server import Served, served


@pytest.fixture
def server() -> Iterator[Served]:
    with served() as running:
        yield running


class _Page(HTMLParser):
    """The inline scripts and styles of a page, and every attribute that names a URL."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks: dict[str, list[str]] = {"script": [], "style": []}
        self.urls: list[str] = []
        self.tags: set[str] = set()
        self._open: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.urls += [v or "" for k, v in attrs if k in ("src", "href", "action", "formaction")]
        if tag in self.blocks:
            self._open = tag
            self.blocks[tag].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == self._open:
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.blocks[self._open][-1] += data


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def directives(policy: str) -> dict[str, list[str]]:
    parsed = {}
    for part in policy.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


def test_the_page_is_html_under_a_policy_that_allows_only_its_own_script_and_style(
    server: Served,
) -> None:
    answer = server.request("GET", "/")
    assert answer.status == 200
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["cache-control"] == "no-store"
    assert answer.body.startswith(b"<!doctype html>")
    policy = directives(answer.headers["content-security-policy"])
    assert policy["default-src"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["form-action"] == ["'none'"]
    page = _Page()
    page.feed(answer.body.decode())
    scripts, styles = page.blocks["script"], page.blocks["style"]
    assert len(scripts) == 1
    assert len(styles) == 1
    assert policy["script-src"] == [sha256_source(scripts[0])]
    assert policy["style-src"] == [sha256_source(styles[0])]


def test_the_page_fetches_nothing_from_elsewhere_and_changes_nothing(server: Served) -> None:
    body = server.request("GET", "/").body.decode()
    page = _Page()
    page.feed(body)
    assert all(url.startswith("data:") for url in page.urls), page.urls
    assert not re.search(r"(?i)\b(https?|wss?|ftp):", body)
    assert not re.search(r"""["'`]//""", body)  # no protocol-relative URL either
    assert not page.tags & {"form", "button", "input", "iframe", "img", "object", "embed"}
    assert "post" not in body.lower()
    assert "step-down" not in body
    assert "innerHTML" not in body  # values reach the page as text only


def test_head_and_other_methods(server: Served) -> None:
    head = server.request("HEAD", "/")
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-security-policy"] == status_page.CONTENT_SECURITY_POLICY
    refused = server.request("POST", "/")
    assert refused.status == 405
    assert refused.headers["allow"] == "GET, HEAD"
    assert server.stubs.step_downs == 0


def test_the_cluster_view_is_json_beside_the_node_status(server: Served) -> None:
    server.stubs.cluster = lambda: {"leader": {"name": "a"}, "contenders": []}
    answer = server.request("GET", "/cluster")
    assert answer.status == 200
    assert answer.headers["content-type"] == "application/json"
    assert json.loads(answer.body) == {"leader": {"name": "a"}, "contenders": []}
    assert server.request("GET", "/cluster?x=1").status == 200
