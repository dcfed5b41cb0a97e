"""Logging: structured events through structlog, one line each; ``text`` for people,
``json`` for machines.

Every event is one stdlib :class:`logging.LogRecord`, so ``caplog``, an embedding
application's handlers and the records of kazoo, APScheduler and psycopg share one stream;
every line leaves with its secrets masked (docs/design.md §7).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import structlog
from structlog.typing import EventDict, WrappedLogger

from allocator.core import redact

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
FIELDS_ATTR: Final = "event_fields"
"""The :class:`logging.LogRecord` attribute holding an event's fields (``event`` included)."""
_STDLIB_KEYS: Final = ("exc_info", "stack_info", "stacklevel")
_LOGFMT: Final = structlog.processors.LogfmtRenderer(key_order=["event"], bool_as_flag=False)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structured logger writing to the stdlib logger ``name``.

    ``log.info("fence_taken", name=self.name, epoch=token.epoch)``: the first argument is
    the event's stable name (past tense or a state: ``elected``, ``session_lost``,
    ``refill``); operators, alerts, docs and tests grep for it, so it never changes
    casually. Keyword arguments are the event's typed fields (an int stays an int, a string
    keeps its spaces); a sentence for people goes in ``note``, an exception in ``error``
    (``str(exc)``, or ``repr(exc)`` when its text says nothing); ``exc_info`` attaches a
    traceback. No event has a field named ``timestamp``, ``level``, ``logger`` or
    ``exception`` (a unit test checks).
    """
    return structlog.stdlib.BoundLogger(
        logging.getLogger(name),
        [structlog.stdlib.filter_by_level, _to_record],
        context={},
    )


def safe_value(value: object) -> object:
    """``value`` as a log field: JSON types kept (a non-finite float becomes a string),
    strings redacted, containers walked, anything else its redacted ``str``."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return redact.redact(value)
    if isinstance(value, Mapping):
        return {redact.redact(str(k)): safe_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset) and not hasattr(value, "_fields"):
        return [safe_value(item) for item in value]  # (a NamedTuple's str says more)
    return redact.redact(str(value))


def _to_record(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> Any:
    """The last processor: the stdlib call's arguments.

    The message is the event in logfmt (``event=<name> key=value ...``, a value with a
    space, ``=`` or ``"`` quoted); the fields ride on the record (:data:`FIELDS_ATTR`),
    redacted when the event is made, so neither the message nor the fields hold a secret;
    the stdlib keywords such as ``exc_info`` are passed on.
    """
    stdlib = {key: event_dict.pop(key) for key in _STDLIB_KEYS if key in event_dict}
    fields = {str(key): safe_value(value) for key, value in event_dict.items()}
    message = _LOGFMT(logger, method_name, dict(fields))  # (it pops the keys it renders)
    return (message,), {**stdlib, "extra": {FIELDS_ATTR: fields}}


# -- JSON lines -------------------------------------------------------------------------------


def _from_record(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """The event of a record: its fields (ours) or its message (a library's), after the
    timestamp (from the record, in UTC), the level and the logger name."""
    record: logging.LogRecord = event_dict["_record"]
    moment = datetime.fromtimestamp(record.created, tz=UTC)
    result: EventDict = {
        "timestamp": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "level": record.levelname.lower(),
        "logger": record.name,
    }
    fields = getattr(record, FIELDS_ATTR, None)
    if isinstance(fields, dict):
        result["event"] = fields.get("event")
        result.update({k: v for k, v in fields.items() if k not in result})
    else:
        result["event"] = event_dict["event"]
    if record.exc_info:  # (the formatter clears the record's copy after this chain)
        result["exc_info"] = record.exc_info
    if record.stack_info:
        result["stack_info"] = record.stack_info
    return result


def _safe_fields(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    return {key: safe_value(value) for key, value in event_dict.items()}


def _dumps(obj: object, **kw: Any) -> str:
    return json.dumps(obj, allow_nan=False, **kw)


class JsonFormatter(structlog.stdlib.ProcessorFormatter):
    """One JSON object per record, secrets masked value by value.

    ``timestamp`` (ISO-8601 UTC, milliseconds, ``Z``), ``level`` (lower case), ``logger``,
    ``event``, then the fields with their types; a foreign record carries its message as
    ``event``; a traceback is the ``exception`` field, a stack ``stack_info``; a non-finite
    float is a string (JSON has no NaN). Masking value by value, not the rendered line,
    keeps every JSON string whole.
    """

    def __init__(self) -> None:
        super().__init__(
            foreign_pre_chain=[_from_record],
            processors=[
                structlog.processors.format_exc_info,
                _safe_fields,
                structlog.processors.JSONRenderer(serializer=_dumps),
            ],
        )


# -- text lines -------------------------------------------------------------------------------


class RedactingFormatter(logging.Formatter):
    """``inner``'s line with every secret masked (:func:`allocator.core.redact.redact`).

    Masks the whole line, tracebacks and a library's own message included.
    """

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return redact.redact(self._inner.format(record))


def formatter(log_format: str = "text") -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``), secrets masked."""
    if log_format == "json":
        return JsonFormatter()
    return RedactingFormatter(logging.Formatter(TEXT_FORMAT))


def handler(log_format: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """A stream handler (stderr by default) writing ``log_format`` lines, secrets masked."""
    result = logging.StreamHandler(stream or sys.stderr)
    result.setFormatter(formatter(log_format))
    return result


def configure(log_format: str, level: int = logging.INFO) -> None:
    """The root logger to stderr in ``log_format`` (what ``allocator run`` calls).

    Quiets kazoo's and APScheduler's chatter and routes :mod:`warnings`, the tracebacks of
    threads that die and the exceptions Python ignores (``sys.unraisablehook``) through
    logging, so even those lines are in the format and masked.
    """
    root = logging.getLogger()
    root.handlers[:] = [handler(log_format)]
    root.setLevel(level)
    # kazoo logs every reconnect attempt; our own session events say what matters.
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    sys.unraisablehook = _log_unraisable


_log = get_logger(__name__)


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """A thread died of an exception: its traceback as a log line (formatted, masked)."""
    if args.exc_type is SystemExit:
        return
    exc_info = (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)
    thread = args.thread.name if args.thread is not None else None
    _log.critical("thread_died", thread=thread, exc_info=exc_info)


def _log_unraisable(args: sys.UnraisableHookArgs) -> None:
    """An exception Python could not raise (a finaliser's): logged instead of printed."""
    exc_info = (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)
    _log.error("exception_ignored", where=args.err_msg or repr(args.object), exc_info=exc_info)
