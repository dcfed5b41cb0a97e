"""A cuttable TCP proxy on 127.0.0.1, for cutting one node's link to ZooKeeper or PostgreSQL.

It serves ``allocator drill`` (:mod:`allocator.drill.links` puts one in front of every
server a node talks to) and the chaos tests (``tests/chaos``), which drive it directly;
psycopg's ``fix_proxy.py`` idea, on plain sockets and threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import select
import socket
import struct
import threading
from types import TracebackType

from allocator.local.tcp_ports import LOOPBACK

SELECT_TIMEOUT_S = 0.2
CHUNK_BYTES = 65536
BACKLOG = 64

# <linux/filter.h>, <asm-generic/socket.h>: Python's socket module does not name them.
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
_BPF_RET_K = 0x06  # BPF_RET | BPF_K: "return k", the number of bytes to keep; 0 drops
_DROP_ALL = ctypes.create_string_buffer(struct.pack("HBBI", _BPF_RET_K, 0, 0, 0))
_DROP_ALL_PROG = struct.pack("HP", 1, ctypes.addressof(_DROP_ALL))  # struct sock_fprog


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), so the peer notices at once; harmless if closed."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


def _drop_incoming(sock: socket.socket) -> None:
    """From now on the kernel discards every segment arriving for ``sock`` (no ACK, no RST)."""
    with contextlib.suppress(OSError):
        if sock.fileno() < 0:
            return  # closed under us: nothing arrives for it any more
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, _DROP_ALL_PROG)


def _accept_incoming(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed, or no filter attached
        sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)


class Proxy:
    """``Proxy(upstream_port)``: forwards ``127.0.0.1:self.port`` to ``127.0.0.1:upstream_port``.

    Both ends are loopback only: the address is fixed, never taken from the caller."""

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
        self._flowing = threading.Event()
        """Clear while frozen or black-holed: nothing reaches a peer."""
        self._flowing.set()
        self._dropping = False
        """Black-holed: the listener and every live socket drop what arrives (under _lock)."""
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

    @property
    def is_blackholed(self) -> bool:
        return self._dropping

    def cut(self) -> None:
        """Break every live connection and refuse new ones until :meth:`restore`.

        Both sides are closed with a reset, so the peer sees the break at once; a new
        connection is accepted and reset at once, which the client sees like a refusal."""
        with self._lock:
            self._cut.set()
            live, self._live = self._live, set()
        for sock in live:
            _reset(sock)

    def freeze(self) -> None:
        """Forward nothing and answer nobody, without closing anything (a hung peer).

        A close or reset by one side is not passed on; new connections wait unanswered in the
        listen backlog. The kernel still acknowledges what arrives (data, keepalive probes),
        so the peer's TCP believes the path is fine: only an application timeout tells it."""
        self._flowing.clear()

    def blackhole(self) -> None:
        """Drop every packet either way, without closing anything (a partition).

        Everything :meth:`freeze` does, and the kernel drops every segment reaching the
        listener or a live socket before TCP sees it (a classic BPF socket filter keeping 0
        bytes; Linux, no privilege needed on one's own sockets). Nothing is acknowledged, no
        FIN or RST sent, a SYN gets no SYN-ACK: ``tcp_user_timeout``, keepalives and connect
        timeouts end the peer's connections exactly as on a real partition."""
        self._flowing.clear()
        with self._lock:
            self._dropping = True
            for sock in (self._listener, *self._live):
                _drop_incoming(sock)

    def restore(self) -> None:
        """Accept and forward again (after :meth:`cut`, :meth:`freeze` or :meth:`blackhole`).

        What the proxy had read when a fault began is held, never lost, and forwarded now,
        like TCP delivering its retransmissions once a path heals; a connection the peer
        gave up on meanwhile is then reset."""
        with self._lock:
            self._dropping = False
            for sock in (self._listener, *self._live):
                _accept_incoming(sock)
        self._cut.clear()
        self._flowing.set()

    def close(self) -> None:
        """Stops every thread (the accept loop, two pumps per connection: daemons bounded by
        their sockets and a short ``select`` timeout) and closes every socket."""
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

    def _wait_flowing(self) -> bool:
        """Until nothing is frozen or black-holed (True) or the proxy closes (False)."""
        while not self._flowing.wait(SELECT_TIMEOUT_S):
            if self._closed.is_set():
                return False
        return not self._closed.is_set()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            if not self._flowing.is_set() and not self._dropping:
                self._closed.wait(SELECT_TIMEOUT_S)  # frozen: leave them in the backlog
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
                if self._dropping:  # completed its handshake just before the black hole
                    _drop_incoming(client)
                    _drop_incoming(upstream)
                self._live |= {client, upstream}
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while self._wait_flowing():
                ready, _, _ = select.select([src], [], [], SELECT_TIMEOUT_S)
                if not ready:
                    continue
                data = src.recv(CHUNK_BYTES)
                # Read just as a fault began: hold it (and an end of stream) until restored.
                if not self._wait_flowing() or not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            # Cut, reset or closed under us; passed on, like an end of stream, once flowing.
            self._wait_flowing()
        finally:
            with self._lock:
                self._live -= {src, dst}
            _reset(src)
            _reset(dst)
