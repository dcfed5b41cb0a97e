"""The admin HTTP server (issue 10, must-show 4): open read endpoints, a Bearer-guarded
step-down refused with 401/403, bounded threads, connections, time and size, and a slowloris
that cannot keep /healthz from answering. Real server on 127.0.0.1, stub callables."""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.http import server as httpd
from allocator.http.admin import DEFAULT_MAX_THREADS, STATUSES
from tests.admin_server import ANSWER_TIMEOUT_S, TOKEN, Answer, Served, Stubs, parse, read_all
from tests.admin_server import served as serve


@pytest.fixture
def served() -> Iterator[Served]:
    with serve() as running:
        yield running


def error_of(answer: Answer) -> str:
    assert answer.headers["content-type"] == "application/json"
    assert b"\n" not in answer.body
    assert b"Traceback" not in answer.body
    message = json.loads(answer.body)["error"]
    assert isinstance(message, str)
    assert message
    return message


def test_read_endpoints_answer_anyone(served: Served) -> None:
    metrics = served.request("GET", "/metrics")
    assert metrics.status == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert b"allocator_is_leader" in metrics.body
    assert served.request("GET", "/metrics?name[]=allocator_is_leader").status == 200
    assert (served.request("GET", "/healthz").status, served.request("GET", "/readyz").status) == (
        200,
        200,
    )
    status = served.request("GET", "/status")
    assert (status.status, json.loads(status.body)) == (200, {"role": "leader"})
    head = served.request("HEAD", "/healthz")
    assert (head.status, head.body) == (200, b"")


def test_health_and_readiness_say_503_when_not_ok(served: Served) -> None:
    served.stubs.healthy = served.stubs.ready = False
    assert json.loads(served.request("GET", "/healthz").body) == {"healthy": False}
    assert served.request("GET", "/healthz").status == 503
    assert served.request("GET", "/readyz").status == 503


@pytest.mark.parametrize(
    "authorization",
    [None, "", f"Basic {TOKEN}", TOKEN, "Bearer", "Bearer    ", f"Token {TOKEN}"],
)
def test_step_down_without_a_bearer_token_is_401(served: Served, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = served.request("POST", "/step-down", headers)
    assert answer.status == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert "Bearer" in error_of(answer)
    assert served.stubs.step_downs == 0


@pytest.mark.parametrize(
    "token", ["wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), f"{TOKEN} {TOKEN}", "é" * 30]
)
def test_step_down_with_a_wrong_token_is_403(served: Served, token: str) -> None:
    answer = served.request("POST", "/step-down", {"Authorization": f"Bearer {token}"})
    assert answer.status == 403
    assert error_of(answer) == "wrong admin token"
    assert served.stubs.step_downs == 0


def test_step_down_with_the_token_is_202_or_409_when_not_leading(served: Served) -> None:
    for scheme in ("Bearer", "bearer"):
        answer = served.request("POST", "/step-down", {"Authorization": f"{scheme} {TOKEN}"})
        assert (answer.status, json.loads(answer.body)) == (202, {"stepping_down": True})
    served.stubs.leading = False
    answer = served.request("POST", "/step-down", {"Authorization": f"Bearer {TOKEN}"})
    assert (answer.status, json.loads(answer.body)) == (409, {"stepping_down": False})
    assert served.stubs.step_downs == 3


def test_step_down_is_disabled_without_a_configured_token() -> None:
    with serve(token="") as served:
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Bearer {TOKEN}"}):
            answer = served.request("POST", "/step-down", headers)
            assert answer.status == 403
            assert "disabled" in error_of(answer)
        assert served.stubs.step_downs == 0


def test_unknown_paths_are_404_and_wrong_methods_405_with_allow(served: Served) -> None:
    for method, path in [("GET", "/x"), ("GET", "/nothing"), ("POST", "/metrics/x"), ("X", "/y")]:
        answer = served.request(method, path)
        assert (answer.status, error_of(answer)) == (404, "not found")
    for method, path, allow in [
        ("GET", "/step-down", "POST"),
        ("PUT", "/step-down", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        ("DELETE", "/metrics", "GET, HEAD"),
        ("get", "/status", "GET, HEAD"),
        ("POST", "/", "GET, HEAD"),
    ]:
        answer = served.request(method, path, {"Authorization": f"Bearer {TOKEN}"})
        assert (answer.status, answer.headers["allow"]) == (405, allow)
        error_of(answer)
    assert served.stubs.step_downs == 0


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /" + b"a" * httpd.MAX_REQUEST_LINE_BYTES + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /healthz HTTP/1.1\r\nX: " + b"a" * httpd.MAX_HEAD_BYTES + b"\r\n\r\n", 431),
        (b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431),
        (
            b"POST /step-down HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + b"z" * 100_000,
            413,
        ),
        (b"POST /step-down HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 411),
        (b"POST /step-down HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /step-down HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
        (b"GET /healthz HTTP/x\r\n\r\n", 400),
        (b"\r\n\r\n", 400),
        (b"GET /healthz", 400),  # the client closed before the head ended
        (b"one two three four\r\n\r\n", 400),
    ],
)
def test_oversize_and_malformed_requests_get_a_one_line_error(
    served: Served, raw: bytes, status: int
) -> None:
    answer = served.exchange(raw)
    assert answer.status == status
    error_of(answer)
    assert served.stubs.step_downs == 0


def test_a_small_body_is_ignored_and_the_answer_still_read(served: Served) -> None:
    answer = served.request("POST", "/step-down", {"Authorization": f"Bearer {TOKEN}"}, b"{}")
    assert answer.status == 202


def test_a_failing_callable_is_a_logged_500_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> dict[str, object]:
        raise RuntimeError("boom")

    with serve(stubs=Stubs(snapshot=broken)) as served:
        answer = served.request("GET", "/status")
    assert (answer.status, error_of(answer)) == (500, "internal error")
    assert b"boom" not in answer.body
    assert "event=admin_http_handler_failed" in caplog.text


def test_the_authorization_header_is_never_logged(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    served.request("POST", "/step-down", {"Authorization": f"Bearer {TOKEN}"})
    served.request("POST", "/step-down", {"Authorization": "Bearer not-the-token-0123456789"})
    served.request("GET", "/nothing", {"Authorization": f"Bearer {TOKEN}"})
    assert "event=admin_http_request" in caplog.text  # the access log is there ...
    assert TOKEN not in caplog.text  # ... without the header
    assert "not-the-token" not in caplog.text


def test_every_status_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "admin-http.md").read_text()
    assert {200, 202, 401, 403, 404, 405, 408, 413, 414, 431, 503} <= STATUSES
    for status in sorted(STATUSES):
        assert f"| {status} " in doc, status


# -- bounds ------------------------------------------------------------------------------


@contextlib.contextmanager
def connections(served: Served, count: int) -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(served.address, timeout=ANSWER_TIMEOUT_S))
        yield socks
    finally:
        for sock in socks:
            sock.close()


def answered(sock: socket.socket) -> bool:
    """The server has written to (or closed) ``sock``, without waiting."""
    return bool(select.select([sock], [], [], 0)[0])


def test_a_slowloris_does_not_stop_healthz() -> None:
    """Twice as many connections as the thread bound, each sending one byte a second: each
    holds a socket, never a thread, and is cut off with 408 once its deadline passes."""
    request = b"GET /healthz HTTP/1.1\r\nHost: slow\r\n\r\n"
    with serve() as served, connections(served, 2 * DEFAULT_MAX_THREADS) as slow:
        health = []
        for second in range(6):
            for sock in slow:
                if not answered(sock):
                    with contextlib.suppress(OSError):
                        sock.send(request[second : second + 1])
            health.append(served.request("GET", "/healthz").status)
            if second == 0:  # well inside the 5 s deadline: they are all still waiting
                assert not any(answered(sock) for sock in slow)
            time.sleep(1)  # the slowloris's pace, not a wait for the server
        assert health == [200] * 6
        for sock in slow:
            answer = parse(read_all(sock))
            assert (answer.status, error_of(answer)) == (408, "the request did not arrive in time")


def test_connections_beyond_the_bound_get_503_at_once() -> None:
    with serve(max_threads=1) as served:
        bound = httpd.CONNECTIONS_PER_THREAD  # one thread
        with connections(served, bound) as idle, connections(served, 1) as (extra,):
            answer = parse(read_all(extra))
            assert (answer.status, error_of(answer)) == (503, "too many connections")
            assert not any(answered(sock) for sock in idle)
        # the server frees their places once it has seen them close
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        statuses = [served.request("GET", "/healthz").status]
        while statuses[-1] == 503 and time.monotonic() < deadline:
            statuses.append(served.request("GET", "/healthz").status)
        assert set(statuses) <= {503, 200}
        assert statuses[-1] == 200


def test_requests_beyond_the_queue_get_503_and_the_rest_are_served() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_snapshot() -> dict[str, object]:
        entered.set()
        release.wait(ANSWER_TIMEOUT_S)
        return {"role": "leader"}

    queued = httpd.QUEUE_PER_THREAD  # one thread
    with (
        serve(stubs=Stubs(snapshot=slow_snapshot), max_threads=1) as served,
        connections(served, 1) as (busy,),
        connections(served, queued + 2) as waiting,
    ):
        try:
            busy.sendall(b"GET /status HTTP/1.1\r\n\r\n")
            assert entered.wait(ANSWER_TIMEOUT_S)  # the one thread is busy
            for sock in waiting:
                sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            refused: list[socket.socket] = []
            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            while len(refused) < 2 and time.monotonic() < deadline:
                refused += select.select([s for s in waiting if s not in refused], [], [], 1)[0]
            assert [parse(read_all(sock)).status for sock in refused] == [503, 503]
        finally:
            release.set()
        assert parse(read_all(busy)).status == 200
        statuses = [parse(read_all(sock)).status for sock in waiting if sock not in refused]
        assert statuses == [200] * queued
