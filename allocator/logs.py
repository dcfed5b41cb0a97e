"""Logging setup: one line per event, ``event=<name> key=value ...``; ``json`` for machines.

Rules: modules log with %-style arguments and a stable ``event=`` name first (past tense or
a state: ``elected``, ``fence_taken``, ``session_lost``, ``refill`` ...). The JSON format
lifts the ``key=value`` pairs of the message into fields, so both formats carry the same
facts.
"""

from __future__ import annotations

import json
import logging
import re
import sys

_PAIR = re.compile(r"(\w+)=(\S+)")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
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


def configure(log_format: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kazoo logs every reconnect attempt; our own session events say what matters.
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
