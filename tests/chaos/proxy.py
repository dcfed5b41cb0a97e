"""A cuttable TCP proxy on 127.0.0.1, for cutting one node's link to ZooKeeper (or PostgreSQL).

Rules (psycopg's ``fix_proxy.py`` idea, on plain sockets and threads):

- Listens on ``127.0.0.1:<free port>`` and forwards every accepted connection to one
  upstream ``127.0.0.1:<port>``; both ends are loopback only (asserted).
- :meth:`Proxy.cut` closes every live connection at once (both sides, with a reset, so the
  peer sees the break immediately) and refuses new ones until :meth:`Proxy.restore`: a new
  connection is accepted and reset at once, which the client sees like a refusal.
- :meth:`Proxy.freeze` is the silent partition: live connections stay open but nothing is
  forwarded either way (a close or reset by one side is not passed on either), and new
  connections are left unanswered in the listen backlog. Only a timeout tells a peer.
  :meth:`Proxy.restore` ends either fault.
- Threads: one accept loop, two pumps per connection; all are daemons, all stop on
  :meth:`Proxy.close` (also the context manager's exit). Loops are bounded by the sockets'
  lifetimes and a short ``select`` timeout, so nothing spins and nothing outlives ``close``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from types import TracebackType

from allocator.local.ports import LOOPBACK

SELECT_TIMEOUT_S = 0.2
CHUNK_BYTES = 65536
BACKLOG = 64


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), so the peer notices at once; harmless if closed."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Proxy:
    """``Proxy(upstream_port)``: forwards ``127.0.0.1:self.port`` to ``127.0.0.1:upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = (LOOPBACK, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(BACKLOG)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._cut = threading.Event()
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self.accepted = 0
        self.refused = 0
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="proxy-accept", daemon=True
        )
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def cut(self) -> None:
        """Break every live connection and refuse new ones."""
        with self._lock:
            self._cut.set()
            live, self._live = self._live, set()
        for sock in live:
            _reset(sock)

    def freeze(self) -> None:
        """Forward nothing and answer nobody, without closing anything."""
        self._frozen.set()

    def restore(self) -> None:
        """Accept and forward again (after :meth:`cut` or :meth:`freeze`)."""
        self._cut.clear()
        self._frozen.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(2.0)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            if self._frozen.is_set():
                self._closed.wait(SELECT_TIMEOUT_S)
                continue
            try:
                ready, _, _ = select.select([self._listener], [], [], SELECT_TIMEOUT_S)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            if self._cut.is_set():
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=2.0)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._cut.is_set():
                    _reset(client)
                    _reset(upstream)
                    continue
                self._live |= {client, upstream}
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                if self._frozen.is_set():
                    self._closed.wait(SELECT_TIMEOUT_S)
                    continue
                ready, _, _ = select.select([src], [], [], SELECT_TIMEOUT_S)
                if not ready:
                    continue
                data = src.recv(CHUNK_BYTES)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass  # cut, reset or closed under us
        finally:
            with self._lock:
                self._live -= {src, dst}
            _reset(src)
            _reset(dst)
