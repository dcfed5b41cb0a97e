"""A small HTTP/1.1 server with hard bounds, for the node's admin endpoints (docs/design.md §7).

One loop thread reads request heads without blocking, so a client that dribbles bytes
(slowloris) holds a socket, never a thread; a bounded pool of workers answers whole heads.
"""

from __future__ import annotations

import contextlib
import io
import json
import queue
import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from allocator.core import logs

log = logs.get_logger(__name__)

MAX_REQUEST_LINE_BYTES = 4096
MAX_HEAD_BYTES = 8192
MAX_BODY_BYTES = 1024
MAX_DRAIN_BYTES = 65536
LINGER_S = 2.0
LOOP_TICK_S = 1.0
QUEUE_PER_THREAD = 4
CONNECTIONS_PER_THREAD = 16
LISTEN_BACKLOG = 128

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")


def answer_bytes(code: int, message: str) -> bytes:
    """A complete ``Connection: close`` error answer, for the loop to send without a handler."""
    body = json.dumps({"error": message}).encode()
    phrase = HTTPStatus(code).phrase
    return (
        f"HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def frame_head(buf: bytes | bytearray, start: int = 0) -> int | tuple[int, str] | None:
    """Where the request head in ``buf`` ends, an error (status, message), or None: need more.

    ``start`` is where to resume looking for the end of the head (bytes before it were looked at).
    A request line over ``MAX_REQUEST_LINE_BYTES`` is 414, a head over ``MAX_HEAD_BYTES`` 431.
    """
    line_end = buf.find(b"\n", 0, MAX_REQUEST_LINE_BYTES + 1)
    if line_end < 0:
        if len(buf) > MAX_REQUEST_LINE_BYTES:
            return 414, f"request line over {MAX_REQUEST_LINE_BYTES} bytes"
        return None
    end = _HEAD_END.search(buf, max(0, start - 3))
    if end is None:
        if len(buf) > MAX_HEAD_BYTES:
            return 431, f"request head over {MAX_HEAD_BYTES} bytes"
        return None
    if end.end() > MAX_HEAD_BYTES:
        return 431, f"request head over {MAX_HEAD_BYTES} bytes"
    return end.end()


@dataclass
class _Conn:
    sock: socket.socket
    peer: Any
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    draining: bool = False
    drained: int = 0


@dataclass(frozen=True)
class Exchange:
    """What a worker gets: the socket, the complete request head and the answer's deadline."""

    sock: socket.socket
    peer: Any
    head: bytes
    deadline: float


class _DeadlineWriter(io.BufferedIOBase):
    """A write-only file on a socket that gives up once ``deadline`` (monotonic) has passed."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        sent = 0
        while sent < len(view):
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the client did not take the answer in time")
            self._sock.settimeout(remaining)
            sent += self._sock.send(view[sent:])
        return sent


class Handler(BaseHTTPRequestHandler):
    """Base of the handlers :class:`BoundedHTTPServer` serves: subclasses implement :meth:`route`.

    ``self.request`` is the :class:`Exchange`; the head is parsed by the standard library, the
    answer is written under the exchange's deadline, and every answer goes through
    :meth:`reply` (errors through :meth:`reply_error`). Every answer, errors included, has a
    one-line JSON body (``{"error": "..."}``) but what a route sends itself; never a traceback.
    """

    server_version = "allocator"
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # never answer without a status line (HTTP/0.9)

    def setup(self) -> None:
        self._answered = False
        exchange: Exchange = self.request
        self.rfile = io.BytesIO(exchange.head)
        self.wfile = _DeadlineWriter(exchange.sock, exchange.deadline)

    def finish(self) -> None:  # nothing is buffered
        pass

    def handle(self) -> None:
        self.close_connection = True
        try:
            self._handle()
        except OSError as exc:  # the client went away or did not take the answer in time
            log.debug("admin_http_dropped", error=type(exc).__name__)

    def route(self) -> None:
        """Answers the parsed request; the default knows no path."""
        self.reply_error(404, "not found")

    def _handle(self) -> None:
        """Parses, checks framing and routes; a route that raises is logged and answered 500."""
        self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE_BYTES + 1)
        if not self.parse_request():
            if not self._answered:
                self.reply_error(400, "bad request line")
            return
        if self.request_version == "HTTP/0.9":
            self.reply_error(505, "http version not supported")
            return
        problem = self._check_framing()
        if problem is not None:
            self.reply_error(*problem)
            return
        try:
            self.route()
        except OSError:
            raise
        except Exception:
            log.exception("admin_http_handler_failed", request=self.requestline)
            if not self._answered:
                self.reply_error(500, "internal error")

    def _check_framing(self) -> tuple[int, str] | None:
        """No ``Transfer-Encoding`` (411); one well-formed ``Content-Length`` up to
        ``MAX_BODY_BYTES`` (else 400, 413). The body itself is never read."""
        if self.headers.get("Transfer-Encoding") is not None:
            return 411, "send Content-Length; Transfer-Encoding is not accepted"
        lengths = {value.strip() for value in self.headers.get_all("Content-Length") or ()}
        if not lengths:
            return None
        (length, *others) = lengths
        if others or not _CONTENT_LENGTH.fullmatch(length):
            return 400, "bad Content-Length"
        if int(length) > MAX_BODY_BYTES:
            return 413, f"request body over {MAX_BODY_BYTES} bytes"
        return None

    def reply(
        self,
        code: int,
        body: bytes,
        content_type: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Sends one whole answer; one request per connection, so always ``Connection: close``."""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def reply_json(
        self, code: int, document: object, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Sends ``document`` as a one-line JSON body."""
        self.reply(code, json.dumps(document).encode(), "application/json", headers)

    def reply_error(
        self, code: int, message: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Sends ``{"error": message}``."""
        self.reply_json(code, {"error": message}, headers)

    # -- the standard library's hooks ------------------------------------------------------

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # parse_request's own errors (400, 431, 505): a short fixed line, not its HTML page
        self.reply_error(code, HTTPStatus(code).phrase.lower())

    def send_response_only(self, code: int, message: str | None = None) -> None:
        self._answered = True
        if self.request_version == "HTTP/0.9":  # never answer without a status line
            self.request_version = "HTTP/1.0"
        super().send_response_only(code, message)

    def handle_expect_100(self) -> bool:
        return True  # the body is never read: answer at once instead of "100 Continue"

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        # the request line and status only; headers (Authorization) are never logged
        log.debug("admin_http_request", request=format % args)


class BoundedHTTPServer:
    """Serves ``handler_class`` (a :class:`Handler`) under hard bounds; binds at once, serves
    once :meth:`start` is called, and :meth:`stop` closes every socket.

    - A request goes to the ``max_threads`` workers only once its whole head has arrived;
      heads waiting for a worker queue up to ``QUEUE_PER_THREAD * max_threads``, beyond that
      the loop answers 503 itself.
    - Every connection has a total deadline: the whole head within ``timeout_s`` of the accept
      (else 408), the answer written within ``timeout_s`` of its start (else dropped). A
      per-recv timeout would restart on every byte; this one does not.
    - At most ``max_connections`` (default ``CONNECTIONS_PER_THREAD * max_threads``) sockets
      are open (being read, in a worker, or lingering); one more gets 503 and is closed.
    """

    def __init__(
        self,
        bind: tuple[str, int],
        handler_class: type[Handler],
        *,
        max_threads: int,
        timeout_s: float,
        max_connections: int | None = None,
    ) -> None:
        if max_threads < 1 or timeout_s <= 0:
            raise ValueError("max_threads must be >= 1 and timeout_s > 0")
        self._handler_class = handler_class
        self.max_threads = max_threads
        self.timeout_s = timeout_s
        self.max_connections = max_connections or CONNECTIONS_PER_THREAD * max_threads
        host, port = bind
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._listener = socket.create_server(bind, family=family, backlog=LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self.server_address: tuple[Any, ...] = self._listener.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._tasks: queue.Queue[Exchange | None] = queue.Queue(QUEUE_PER_THREAD * max_threads)
        self._returned: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._busy = 0  # sockets in the queue or a worker; loop thread only
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Starts the loop thread and the workers."""
        loop = threading.Thread(target=self._loop, name="admin-http", daemon=True)
        workers = [
            threading.Thread(target=self._work, name=f"admin-http-{i}", daemon=True)
            for i in range(self.max_threads)
        ]
        self._threads = [loop, *workers]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops accepting, closes every connection, and waits for the threads."""
        self._stopping.set()
        self._wake()
        if self._threads:
            self._threads[0].join(timeout_s)  # the loop closes the listener and its sockets
        else:
            self._selector.close()
            self._listener.close()
        workers = self._threads[1:]
        while True:  # heads no worker took yet: the loop is gone, nobody adds more
            try:
                waiting = self._tasks.get_nowait()
            except queue.Empty:
                break
            if waiting is not None:
                waiting.sock.close()
        for _ in workers:
            self._tasks.put_nowait(None)
        for worker in workers:
            worker.join(timeout_s)
        for sock in _drain(self._returned):
            sock.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the loop thread -------------------------------------------------------------------

    def _loop(self) -> None:
        """Owns the listener and every connection not in a worker; never blocks on a client."""
        sel = self._selector
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                for key, _ in sel.select(self._tick()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._take_returned()
                    else:
                        self._read(key.data)
                self._expire()
        except Exception:  # a bug: leave a trace, and do not leave sockets behind
            log.exception("admin_http_loop_failed")
        finally:
            for key in list(sel.get_map().values()):
                if isinstance(key.data, _Conn):
                    key.data.sock.close()
            sel.close()
            self._listener.close()

    def _tick(self) -> float:
        conns = self._conns()
        now = time.monotonic()
        soonest = min((c.deadline for c in conns), default=now + LOOP_TICK_S)
        return max(0.0, min(LOOP_TICK_S, soonest - now))

    def _conns(self) -> list[_Conn]:
        return [k.data for k in self._selector.get_map().values() if isinstance(k.data, _Conn)]

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again on the next tick
                log.warning("admin_http_accept_failed", error=str(exc))
                return
            sock.setblocking(False)
            open_now = len(self._selector.get_map()) - 2 + self._busy  # - listener, wake
            if open_now >= self.max_connections:
                _send_now(sock, answer_bytes(503, "too many connections"))
                sock.close()
                continue
            conn = _Conn(sock, peer, time.monotonic() + self.timeout_s)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        want = MAX_DRAIN_BYTES if conn.draining else MAX_HEAD_BYTES + 1 - len(conn.buf)
        try:
            chunk = conn.sock.recv(want)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.draining:
            conn.drained += len(chunk)
            if not chunk or conn.drained > MAX_DRAIN_BYTES:
                self._close(conn)
            return
        if not chunk:  # the client closed its side
            if conn.buf.strip():
                self._refuse(conn, 400, "incomplete request head", linger=False)
            else:
                self._close(conn)
            return
        seen = len(conn.buf)
        conn.buf += chunk
        framed = frame_head(conn.buf, seen)
        if framed is None:
            return
        if isinstance(framed, tuple):
            self._refuse(conn, *framed, linger=True)
            return
        self._selector.unregister(conn.sock)
        deadline = time.monotonic() + self.timeout_s
        exchange = Exchange(conn.sock, conn.peer, bytes(conn.buf[:framed]), deadline)
        try:
            self._tasks.put_nowait(exchange)
        except queue.Full:
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._refuse(conn, 503, "the admin server is busy; try again", linger=True)
            return
        self._busy += 1

    def _refuse(self, conn: _Conn, code: int, message: str, *, linger: bool) -> None:
        log.debug("admin_http_refused", status=code, reason=message)
        _send_now(conn.sock, answer_bytes(code, message))
        if linger:
            self._linger(conn)
        else:
            self._close(conn)

    def _linger(self, conn: _Conn) -> None:
        """After an answer, discards what the client still sends (at most ``MAX_DRAIN_BYTES``
        for at most ``LINGER_S``) so that it sees the answer rather than a reset."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.draining = True
        conn.deadline = time.monotonic() + LINGER_S

    def _take_returned(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        for sock in _drain(self._returned):
            self._busy -= 1
            conn = _Conn(sock, None, time.monotonic() + LINGER_S, draining=True)
            try:
                self._selector.register(sock, selectors.EVENT_READ, conn)
            except (ValueError, OSError):  # closed by the worker after an error
                sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in self._conns():
            if conn.deadline > now:
                continue
            if conn.draining:
                self._close(conn)
            else:
                self._refuse(conn, 408, "the request did not arrive in time", linger=True)

    def _close(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already awake (buffer full) or closed
            self._wake_w.send(b"\0")

    # -- worker threads --------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            exchange = self._tasks.get()
            if exchange is None:
                return
            sock = exchange.sock
            try:
                sock.setblocking(True)
                self._handler_class(exchange, exchange.peer, self)  # type: ignore[arg-type]
            except Exception:  # the handler answers its own errors; this is a bug
                log.exception("admin_http_handler_failed")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            if self._stopping.is_set():
                sock.close()
                continue
            sock.setblocking(False)
            self._returned.put(sock)
            self._wake()


def _send_now(sock: socket.socket, data: bytes) -> None:
    """Sends what fits without blocking (a short answer on a fresh socket always fits)."""
    try:
        sock.setblocking(False)
        sock.send(data)
    except OSError:
        pass


def _drain(q: queue.SimpleQueue[socket.socket]) -> list[socket.socket]:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items
