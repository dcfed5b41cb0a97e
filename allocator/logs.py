"""Logging setup: one line per event, ``event=<name> key=value ...``; ``json`` for machines.

Rules: modules log with %-style arguments and a stable ``event=`` name first (past tense or
a state: ``elected``, ``fence_taken``, ``session_lost``, ``refill`` ...). The JSON format
lifts the ``key=value`` pairs of the message into fields, so both formats carry the same
facts. Every line, whatever its format (tracebacks included), leaves through
:class:`RedactingFormatter`: connection-string passwords and every secret value the
configuration registered are masked (:mod:`allocator.redact`), whatever a library put in
its message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import TextIO

from allocator import redact

_PAIR = re.compile(r"(\w+)=(\S+)")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # Masked before the pairs are lifted: `password=x` must not become a field "x".
        message = redact.redact(record.getMessage())
        body: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        body.update(_PAIR.findall(message))
        body["msg"] = message
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body)


class RedactingFormatter(logging.Formatter):
    """``inner``'s line with every secret masked (:func:`allocator.redact.redact`)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact.redact(self._inner.format(record))


def handler(log_format: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """A stream handler (stderr by default) writing ``log_format`` lines, secrets masked."""
    inner = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    result = logging.StreamHandler(stream or sys.stderr)
    result.setFormatter(RedactingFormatter(inner))
    return result


def configure(log_format: str, level: int = logging.INFO) -> None:
    root = logging.getLogger()
    root.handlers[:] = [handler(log_format)]
    root.setLevel(level)
    # kazoo logs every reconnect attempt; our own session events say what matters.
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
