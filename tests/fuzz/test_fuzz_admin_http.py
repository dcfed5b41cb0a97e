"""Fuzz: the admin HTTP server (issue 10, must-shows 4 and 8) over a raw socket.

Generated request lines (methods, paths, versions), header names and values (Authorization
with near-miss tokens, Content-Length, Transfer-Encoding, Expect, junk), bodies, line
endings, oversize lines and heads, and raw bytes, against two real servers: one with a
step-down token and one without. Every answer is one well-formed HTTP answer whose status is
documented (docs/admin-http.md; never 500) with no traceback, whose body is one line of JSON
(``{"error": ...}`` for errors; only ``/metrics`` answers Prometheus text and ``/`` the status
page's HTML), and step-down runs
only on a ``202``, which only a request carrying ``Bearer <the token>`` to the server that has
it gets: no other input changes the node's state.

Inputs (``ci`` profile, derandomized): 300 structured requests and 200 raw byte strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CONTENT_TYPE_LATEST

from allocator.http import server as httpd
from allocator.http import status_page
from allocator.http.admin import STATUSES
from tests.admin_server import TOKEN, Answer, Served, served
from tests.fuzz.profiles import examples

STRUCTURED_EXAMPLES = 300
RAW_EXAMPLES = 200
ANSWERS = STATUSES - {500}  # 500 is a bug

METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "get", "Post", "CONNECT"]
PATHS = [
    "/metrics",
    "/healthz",
    "/readyz",
    "/status",
    "/cluster",
    "/step-down",
    "/step-down/",
    "/step-down?x=1",
    "//step-down",
    "/%73tep-down",
    "/STEP-DOWN",
    "/",
    "*",
    "http://127.0.0.1/step-down",
    "/metrics?name[]=allocator_is_leader",
    "/../step-down",
]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1.1", "http/1.1", "HTTP/01.1"]
HEADER_NAMES = [
    "Authorization",
    "authorization",
    "AUTHORIZATION",
    "Content-Length",
    "Transfer-Encoding",
    "Expect",
    "Connection",
    "Host",
    "X-Forwarded-For",
    "Authorization ",
    " Authorization",
]
AUTH_VALUES = [
    f"Bearer {TOKEN}",
    f"bearer {TOKEN}",
    f"Bearer  {TOKEN}  ",
    f"Bearer {TOKEN[:-1]}",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN.upper()}",
    f"Basic {TOKEN}",
    TOKEN,
    "Bearer",
    "Bearer ",
    f"Bearer\t{TOKEN}",
    f"Bearer {TOKEN}\x00",
    "Bearer é" + TOKEN,
]
OTHER_VALUES = ["0", "2", "-1", "1e3", "99999999999999999999", "chunked", "100-continue", "close"]

text = st.text(st.characters(codec="utf-8"), max_size=40)
token_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)


def mostly(common: list[str], odd: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Three times in four one of ``common`` (so that requests get past the request line to
    the routes and the token check), else something ``odd``."""
    return st.sampled_from([True, True, True, False]).flatmap(
        lambda usual: st.sampled_from(common) if usual else odd
    )


STEP_DOWN_TARGETS = [("POST", "/step-down")] * 6 + [
    ("POST", "/step-down?x=1"),
    ("POST", "//step-down"),
    ("post", "/step-down"),
    ("GET", "/step-down"),
]
methods = mostly(METHODS, token_text | text)
paths = mostly(
    PATHS,
    st.builds(lambda p: "/" + p, text)
    | st.builds(lambda n: "/" + "a" * n, st.integers(httpd.MAX_REQUEST_LINE_BYTES - 20, 6000)),
)
versions = mostly(["HTTP/1.1", "HTTP/1.0"], st.sampled_from(VERSIONS) | token_text)
headers = st.lists(
    st.tuples(st.just("Authorization"), mostly(AUTH_VALUES, text))
    | st.tuples(mostly(HEADER_NAMES, token_text | text), mostly(OTHER_VALUES, text)),
    max_size=4,
)
padding = st.sampled_from([0] * 12 + [50, 101, 400])  # extra header lines: 101+ is too many
bodies = (
    st.sampled_from([b""] * 4).flatmap(st.just)
    | st.binary(max_size=64)
    | st.binary(min_size=1000, max_size=3000)
)
endings = st.sampled_from(["\r\n", "\r\n", "\r\n", "\n"])


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Served, Served]]:
    with served() as guarded, served(token="") as disabled:
        yield guarded, disabled


def check(served: Served, raw: bytes, before: int) -> Answer:
    answer = served.exchange(raw)
    assert answer.status in ANSWERS, (answer, raw[:300])
    assert b"Traceback" not in answer.body
    if answer.headers["content-type"] != "application/json":  # only /metrics and / are not
        assert answer.status == 200
        assert answer.headers["content-type"] in (CONTENT_TYPE_LATEST, status_page.CONTENT_TYPE)
    elif answer.body:  # HEAD: none
        assert b"\n" not in answer.body
        document = json.loads(answer.body)
        if answer.status >= 400:
            assert isinstance(document["error"], str)
            assert document["error"]
    stepped = served.stubs.step_downs - before
    if answer.status == 202:
        assert stepped == 1
        assert TOKEN.encode() in raw
        assert served.token
    else:
        assert stepped == 0, (answer, raw[:300])
    return answer


@settings(max_examples=examples(STRUCTURED_EXAMPLES))
@given(
    choice=st.sampled_from([0, 1]),
    target=st.tuples(methods, paths) | st.sampled_from(STEP_DOWN_TARGETS),
    version=versions,
    auth=st.none() | mostly(AUTH_VALUES, text),
    header_list=headers,
    extra=padding,
    body=bodies,
    eol=endings,
    content_length=st.booleans(),
)
def test_every_request_gets_a_documented_answer_and_no_unauthorised_step_down(
    servers: tuple[Served, Served],
    choice: int,
    target: tuple[str, str],
    version: str,
    auth: str | None,
    header_list: list[tuple[str, str]],
    extra: int,
    body: bytes,
    eol: str,
    content_length: bool,
) -> None:
    server = servers[choice]
    method, path = target
    lines = [f"{method} {path} {version}".rstrip()]
    lines += [] if auth is None else [f"Authorization: {auth}"]
    lines += [f"{name}: {value}" for name, value in header_list]
    lines += [f"X-Pad-{i}: {i}" for i in range(extra)]
    if content_length and body:
        lines.append(f"Content-Length: {len(body)}")
    raw = (eol.join(lines) + eol + eol).encode("utf-8", "surrogatepass") + body
    check(server, raw, server.stubs.step_downs)


@settings(max_examples=examples(RAW_EXAMPLES))
@given(choice=st.sampled_from([0, 1]), raw=st.binary(min_size=1, max_size=2000))
def test_raw_bytes_get_a_documented_answer(
    servers: tuple[Served, Served], choice: int, raw: bytes
) -> None:
    # half-closing ends the request: incomplete heads are answered 400 at once
    server = servers[choice]
    if raw.strip():
        check(server, raw, server.stubs.step_downs)


def test_the_right_request_is_the_one_that_steps_down(servers: tuple[Served, Served]) -> None:
    """The oracle above can see a 202: the fuzzer's token is the server's."""
    guarded, disabled = servers
    raw = f"POST /step-down HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    before = guarded.stubs.step_downs
    assert check(guarded, raw, before).status == 202
    assert check(disabled, raw, disabled.stubs.step_downs).status == 403
