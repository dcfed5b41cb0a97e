"""The node's admin HTTP server: /metrics, /healthz, /readyz, /status, /cluster, the status
page at / and POST /step-down (docs/design.md §7; each status in docs/admin-http.md).
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from allocator.core import logs
from allocator.http import status_page
from allocator.http.server import BoundedHTTPServer, Handler
from allocator.metrics import NodeMetrics

log = logs.get_logger(__name__)

DEFAULT_MAX_THREADS = 8
DEFAULT_TIMEOUT_S = 5.0
READ_METHODS = ("GET", "HEAD")
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
STEP_DOWN_PATH = "/step-down"
# Every status the admin server can answer (docs/admin-http.md).
STATUSES = frozenset(
    {200, 202, 400, 401, 403, 404, 405, 408, 409, 411, 413, 414, 431, 500, 503, 505}
)


class AdminServer:
    """The admin endpoints on a :class:`BoundedHTTPServer`, started and stopped by the node.

    Binds ``address`` (``node.admin_address``, loopback by default). The read endpoints (GET,
    HEAD) are open to whoever reaches the address, so a remote Prometheus can scrape a node
    bound to ``0.0.0.0:<port>`` or one interface. Handlers only read snapshots and set flags:
    they never block on ZooKeeper or PostgreSQL. Every body is one line of JSON but
    ``/metrics`` (Prometheus text) and ``/`` (:mod:`allocator.http.status_page`, which reads
    ``/status`` and ``/cluster``: the cluster as this node last read it). The bounds and the
    other error answers (400, 408, 411, 413, 414, 431, 503, 505; 500 for a bug) are
    :mod:`allocator.http.server`'s: ``max_threads`` workers, a total deadline of
    ``timeout_s`` per request.
    """

    def __init__(
        self,
        address: str,
        token: str,
        metrics: NodeMetrics,
        snapshot: Callable[[], dict[str, Any]],
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        step_down: Callable[[], bool],
        cluster: Callable[[], dict[str, Any]],
        *,
        max_threads: int = DEFAULT_MAX_THREADS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._bind = (host.strip("[]") or "127.0.0.1", int(port))
        self._token = token.encode()
        self._metrics = metrics
        self._snapshot = snapshot
        self._healthy = healthy
        self._ready = ready
        self._step_down = step_down
        self._cluster = cluster
        self._max_threads = max_threads
        self._timeout_s = timeout_s
        self._server: BoundedHTTPServer | None = None

    @property
    def url(self) -> str:
        """Where others reach this server (published in the election znode); bound to a
        wildcard address, that is this host's name."""
        if self._server is None:
            return ""
        host, port = self._server.server_address[:2]
        if host in WILDCARD_HOSTS:
            host = socket.gethostname()
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        """Binds and starts serving (raises OSError when the address is taken)."""
        server = BoundedHTTPServer(
            self._bind,
            self._handler_class(),
            max_threads=self._max_threads,
            timeout_s=self._timeout_s,
        )
        server.start()
        self._server = server

    def stop(self) -> None:
        """Closes every connection; a no-op when not started."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    # -- endpoints ---------------------------------------------------------------------------

    def _metrics_page(self, request: Handler) -> None:
        request.reply(200, generate_latest(self._metrics.registry), CONTENT_TYPE_LATEST)

    def _healthz(self, request: Handler) -> None:
        ok = self._healthy()
        request.reply_json(200 if ok else 503, {"healthy": ok})

    def _readyz(self, request: Handler) -> None:
        ok = self._ready()
        request.reply_json(200 if ok else 503, {"ready": ok})

    def _status(self, request: Handler) -> None:
        request.reply_json(200, self._snapshot())

    def _cluster_page(self, request: Handler) -> None:
        request.reply_json(200, self._cluster())

    def _status_page(self, request: Handler) -> None:
        request.reply(200, status_page.PAGE, status_page.CONTENT_TYPE, status_page.HEADERS)

    def _step_down_page(self, request: Handler) -> None:
        """``POST /step-down``: needs ``Authorization: Bearer <node.admin_token>``.

        The token is compared in constant time. No header or another scheme is 401 with
        ``WWW-Authenticate: Bearer``; a wrong token 403; no token configured means step-down
        is disabled (403). 202 when the node leads and will hand over, 409 when it does not.
        """
        if not self._token:
            request.reply_error(403, "step-down is disabled: node.admin_token is not set")
            return
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            request.reply_error(
                401,
                "step-down needs Authorization: Bearer <node.admin_token>",
                (("WWW-Authenticate", 'Bearer realm="allocator"'),),
            )
            return
        # latin-1: the header was decoded so, and every byte maps back
        if not hmac.compare_digest(given.strip().encode("latin-1"), self._token):
            log.warning("admin_token_rejected", client=request.client_address)
            request.reply_error(403, "wrong admin token")
            return
        leading = self._step_down()
        request.reply_json(202 if leading else 409, {"stepping_down": leading})

    def _routes(self) -> dict[str, dict[str, Callable[[Handler], None]]]:
        return {
            "/metrics": dict.fromkeys(READ_METHODS, self._metrics_page),
            "/healthz": dict.fromkeys(READ_METHODS, self._healthz),
            "/readyz": dict.fromkeys(READ_METHODS, self._readyz),
            "/status": dict.fromkeys(READ_METHODS, self._status),
            "/cluster": dict.fromkeys(READ_METHODS, self._cluster_page),
            "/": dict.fromkeys(READ_METHODS, self._status_page),
            STEP_DOWN_PATH: {"POST": self._step_down_page},
        }

    def _handler_class(self) -> type[Handler]:
        routes = self._routes()

        class AdminHandler(Handler):
            def route(self) -> None:
                # unknown path 404; a known path with another method 405 with Allow
                methods = routes.get(self.path.partition("?")[0])
                if methods is None:
                    self.reply_error(404, "not found")
                    return
                endpoint = methods.get(self.command)
                if endpoint is None:
                    allow = ", ".join(methods)
                    self.reply_error(405, f"method not allowed; use {allow}", (("Allow", allow),))
                    return
                endpoint(self)

        return AdminHandler
