"""The alert rules' runbook links: where each ``runbook_url`` points, and pointing them
elsewhere (``allocator alerts render``).

The rules in deploy/prometheus/ and the PrometheusRule in deploy/k8s/ carry
:data:`DEFAULT_RUNBOOK`, where the project publishes docs/operations.md, so Alertmanager's
links resolve as shipped; :func:`with_runbook` rewrites them for a copy of the runbook
elsewhere (a wiki, the docs of the release you run).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

DEFAULT_RUNBOOK = (
    "https://github.com/snowflake-block-allocator/snowflake-block-allocator/blob/main/docs/"
    "operations.md"
)
"""Where docs/operations.md is published: the base of every shipped ``runbook_url``."""

_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?\[\]@!$&'()*+,;=%]+")
_RUNBOOK_LINE = re.compile(r"^(?P<key>\s*(?:-\s+)?runbook_url:\s*)(?P<value>.*?)\s*$")
_VALUE = re.compile(r"(?P<quote>['\"]?)(?P<url>[^#'\"\s]*)#(?P<anchor>[A-Za-z0-9_-]+)(?P=quote)")


def check_runbook(url: str) -> str:
    """``url`` if it can be the base of every ``runbook_url``; else a ValueError saying what
    is wrong.

    Absolute (``https://`` or ``http://``), with a host, no ``#`` (the anchor is appended)
    and only the characters RFC 3986 allows, so it stays one YAML plain scalar and holds
    nothing Prometheus' templates would expand.
    """
    if not url:
        raise ValueError("the runbook URL is empty")
    if "#" in url:
        raise ValueError(f"{url!r} has a '#': give the page's URL, the alert's anchor is added")
    if not _URL_CHARS.fullmatch(url):
        raise ValueError(f"{url!r} has characters a URL may not hold (spaces, quotes, braces)")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise ValueError(f"{url!r} is not an absolute http(s) URL, e.g. https://wiki.example/ops")
    return url


def runbook_links(text: str) -> list[tuple[str, str]]:
    """(runbook URL, anchor) of every ``runbook_url`` in ``text``, in order; ValueError for
    one without an anchor, or when there is none."""
    links = [
        (link[1], link[2])
        for number, line in enumerate(text.splitlines(), start=1)
        if (link := _link(line, number)) is not None
    ]
    if not links:
        raise ValueError("no runbook_url in it: not an alert rules file")
    return links


def with_runbook(text: str, runbook: str) -> str:
    """``text`` (a rules file or a PrometheusRule) with every ``runbook_url`` pointing at
    ``runbook``, each keeping its anchor.

    A ``runbook_url`` is a runbook's URL plus ``#`` and the alert's section (its name in
    lower case, the anchor docs/operations.md's heading gets). The rewrite is textual, a
    line at a time: only the value of each ``runbook_url:`` line changes, so comments, order
    and the PrometheusRule's indentation stay. Text with no ``runbook_url``, or one without
    an anchor, is a ValueError naming the line.
    """
    check_runbook(runbook)
    runbook_links(text)  # one at least, each with an anchor
    lines = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        body = line.rstrip("\r\n")
        link = _link(body, number)
        if link is not None:
            key, _old, anchor = link
            line = f"{key}{runbook}#{anchor}{line[len(body) :]}"
        lines.append(line)
    return "".join(lines)


def _link(line: str, number: int) -> tuple[str, str, str] | None:
    """(the line up to the value, runbook URL, anchor) if ``line`` is a ``runbook_url``."""
    found = _RUNBOOK_LINE.match(line)
    if found is None:
        return None
    value = _VALUE.fullmatch(found["value"])
    if value is None:
        raise ValueError(f"line {number}: a runbook_url without an #anchor: {line.strip()}")
    return found["key"], value["url"], value["anchor"]
