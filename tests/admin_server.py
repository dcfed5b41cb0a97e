"""A real :class:`~allocator.http.admin.AdminServer` on 127.0.0.1 with stub callables, and a raw
socket client that checks every answer is well-formed HTTP; shared by the admin HTTP tests and
its fuzzer."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from allocator.http.admin import AdminServer
from allocator.metrics import NodeMetrics

TOKEN = "test-token-0123456789-abcdefghij"
ANSWER_TIMEOUT_S = 15.0  # generous: only a broken server comes near it

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) [^\r\n]*\r\n")


@dataclass
class Stubs:
    """What the server's callables answer, and how often step-down was asked for."""

    healthy: bool = True
    ready: bool = True
    leading: bool = True
    snapshot: Callable[[], dict[str, Any]] = lambda: {"role": "leader"}
    cluster: Callable[[], dict[str, Any]] = lambda: {"leader": None, "contenders": []}
    step_downs: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def step_down(self) -> bool:
        with self.lock:
            self.step_downs += 1
        return self.leading


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Served:
    server: AdminServer
    stubs: Stubs
    token: str

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def exchange(self, data: bytes) -> Answer:
        """Sends ``data``, half-closes, and reads the whole answer."""
        with socket.create_connection(self.address, timeout=ANSWER_TIMEOUT_S) as sock:
            with contextlib.suppress(OSError):  # the server may refuse before all is sent
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            return parse(read_all(sock))

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Answer:
        lines = [f"{method} {path} HTTP/1.1", "Host: test"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        return self.exchange(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


@contextlib.contextmanager
def served(token: str = TOKEN, stubs: Stubs | None = None, **kwargs: Any) -> Iterator[Served]:
    stubs = stubs or Stubs()
    server = AdminServer(
        "127.0.0.1:0",
        token,
        NodeMetrics(),
        snapshot=lambda: stubs.snapshot(),
        healthy=lambda: stubs.healthy,
        ready=lambda: stubs.ready,
        step_down=stubs.step_down,
        cluster=lambda: stubs.cluster(),
        **kwargs,
    )
    server.start()
    try:
        yield Served(server, stubs, token)
    finally:
        server.stop()


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def parse(raw: bytes) -> Answer:
    """The answer in ``raw``; fails the test unless it is one well-formed HTTP answer."""
    match = _STATUS_LINE.match(raw)
    assert match, f"no HTTP status line in {raw[:200]!r}"
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no end of head in {raw[:200]!r}"
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.decode("latin-1").partition(":")
        assert colon, f"bad header line {line!r}"
        headers[name.strip().lower()] = value.strip()
    assert headers.get("connection") == "close"
    assert int(headers["content-length"]) == len(body) or body == b"", (headers, body)
    return Answer(int(match[1]), headers, body)
