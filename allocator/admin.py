"""The node's admin HTTP server: /metrics, /healthz, /readyz, /status, POST /step-down.

Rules: binds where ``node.admin_address`` says (loopback by default); read endpoints are
open, the admin action needs ``Authorization: Bearer <node.admin_token>`` and is refused
outright (403) when no token is configured. Handlers only read snapshots and set flags: they
never block on ZooKeeper or PostgreSQL. One thread, started and stopped by the node.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from allocator.metrics import NodeMetrics

log = logging.getLogger(__name__)


class AdminServer:
    def __init__(
        self,
        address: str,
        token: str,
        metrics: NodeMetrics,
        snapshot: Callable[[], dict[str, Any]],
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        step_down: Callable[[], bool],
    ) -> None:
        host, _, port = address.rpartition(":")
        self._bind = (host.strip("[]") or "127.0.0.1", int(port))
        self._token = token
        self._metrics = metrics
        self._snapshot = snapshot
        self._healthy = healthy
        self._ready = ready
        self._step_down = step_down
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            return ""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        server = ThreadingHTTPServer(self._bind, self._handler_class())
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="admin-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet access log
                log.debug("admin_http " + format, *args)

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, generate_latest(admin._metrics.registry), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    ok = admin._healthy()
                    self._json(200 if ok else 503, {"healthy": ok})
                elif self.path == "/readyz":
                    ok = admin._ready()
                    self._json(200 if ok else 503, {"ready": ok})
                elif self.path == "/status":
                    self._json(200, admin._snapshot())
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                if self.path != "/step-down":
                    self._json(404, {"error": "not found"})
                    return
                if not admin._token:
                    self._json(403, {"error": "admin actions are disabled: set node.admin_token"})
                    return
                given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                if not hmac.compare_digest(given.encode(), admin._token.encode()):
                    self._json(401, {"error": "bad or missing admin token"})
                    return
                leading = admin._step_down()
                self._json(202 if leading else 409, {"stepping_down": leading})

            def _json(self, code: int, body: dict[str, Any]) -> None:
                self._send(code, json.dumps(body).encode(), "application/json")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
