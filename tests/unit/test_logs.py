"""allocator.logs: structured events through structlog, rendered as text or JSON lines.

Must hold: a JSON line is one valid object with an ISO-8601 UTC timestamp, the level, the
logger and the stable event name, then the fields with their types (ints, floats, bools,
null, lists) and strings with their spaces, quotes and line breaks intact; a library's
stdlib record and a traceback come out as JSON too; a text line keeps ``event=<name>``
first, as operators and tests grep for it; every log call of the product is a structured
event, and every event name the docs and alerts mention is one a call site logs.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import logging
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from allocator.core import logs
from allocator.fence import Token

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"debug", "info", "warning", "error", "critical", "exception"}
EVENT_NAME = re.compile(r"[a-z][a-z0-9_]*")
RESERVED = {"timestamp", "level", "logger", "exception"}
"""Keys of a JSON line that are not an event's fields."""


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO, io.StringIO]]:
    """A stdlib logger named ``tests.logs`` writing to a text and a JSON stream."""
    stdlib = logging.getLogger("tests.logs")
    text, json_lines = io.StringIO(), io.StringIO()
    handlers = [logs.handler("text", text), logs.handler("json", json_lines)]
    for handler in handlers:
        stdlib.addHandler(handler)
    stdlib.setLevel(logging.DEBUG)
    try:
        yield stdlib, text, json_lines
    finally:
        for handler in handlers:
            stdlib.removeHandler(handler)
        stdlib.setLevel(logging.NOTSET)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_carries_utc_time_level_logger_event_and_typed_fields(
    captured: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    _stdlib, _text, stream = captured
    before = datetime.now(UTC)
    logs.get_logger("tests.logs").info(
        "elected",
        name="node one",
        epoch=7,
        runway_s=2.5,
        ready=True,
        leader=None,
        pids=[1, 2],
        token=Token(3, 26),
        note='said "hi"\nthen left',
        ratio=float("nan"),
    )
    (line,) = lines(stream)
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]
    timestamp = str(line.pop("timestamp"))
    assert timestamp.endswith("Z")
    moment = datetime.fromisoformat(timestamp)
    assert moment.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= moment <= datetime.now(UTC) + timedelta(seconds=1)
    assert line == {
        "level": "info",
        "logger": "tests.logs",
        "event": "elected",
        "name": "node one",
        "epoch": 7,
        "runway_s": 2.5,
        "ready": True,
        "leader": None,
        "pids": [1, 2],
        "token": "3:0x1a",
        "note": 'said "hi"\nthen left',
        "ratio": "nan",  # JSON has no NaN
    }


def test_a_text_line_keeps_the_event_first_and_quotes_values_with_spaces(
    captured: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    _stdlib, text, _json = captured
    logs.get_logger("tests.logs").warning("handing_over", name="n1", reason="clock skew", to="n2")
    (line,) = text.getvalue().splitlines()
    assert line.endswith(
        ' WARNING tests.logs event=handing_over name=n1 reason="clock skew" to=n2'
    ), line


def test_a_record_carries_the_logfmt_message_and_the_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tests.logs")
    logs.get_logger("tests.logs").info("refill", epoch=3, blocks=120)
    (record,) = caplog.records
    assert record.getMessage() == "event=refill epoch=3 blocks=120"
    assert getattr(record, logs.FIELDS_ATTR) == {"event": "refill", "epoch": 3, "blocks": 120}


def test_a_level_below_the_loggers_is_dropped(
    captured: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    stdlib, text, stream = captured
    stdlib.setLevel(logging.INFO)
    logs.get_logger("tests.logs").debug("admin_http_request", request="GET /status")
    assert text.getvalue() == stream.getvalue() == ""


def test_library_records_and_tracebacks_are_json_lines_too(
    captured: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    stdlib, _text, stream = captured
    stdlib.warning("Connection dropped: %s", "socket error")  # what kazoo writes
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        logs.get_logger("tests.logs").exception("admin_http_handler_failed", request="GET /")
        stdlib.exception("a library's own traceback")
    library, ours, library_traceback = lines(stream)
    assert library["event"] == "Connection dropped: socket error"
    assert library["level"] == "warning"
    assert ours["event"] == "admin_http_handler_failed"
    assert ours["request"] == "GET /"
    assert str(ours["exception"]).startswith("Traceback (most recent call last)")
    assert str(ours["exception"]).endswith("ValueError: bad\nthing")
    assert library_traceback["exception"] == ours["exception"]


def test_a_masked_url_at_the_end_of_a_line_leaves_valid_json(
    captured: tuple[logging.Logger, io.StringIO, io.StringIO],
) -> None:
    """Masking the rendered line would eat the closing quote (a password with a "/" in it
    hides everything after the scheme); values are masked before rendering."""
    stdlib, _text, stream = captured
    logs.get_logger("tests.logs").error("db_failed", url="postgresql://u:pa/ss@h/db")
    stdlib.error("url %s", "postgresql://u:pa/ss@h/db")
    first, second = lines(stream)
    assert first["url"] == "postgresql://***"
    assert second["event"] == "url postgresql://***"


def test_configure_routes_warnings_and_dying_threads_through_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = {name: logging.getLogger(name).level for name in ("kazoo", "apscheduler")}
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    try:
        logs.configure("json")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("careful now", UserWarning, stacklevel=1)
        thread = threading.Thread(target=lambda: 1 / 0, name="doomed")
        thread.start()
        thread.join()
    finally:
        logging.captureWarnings(False)
        root.handlers[:], root.level = saved
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    warned, died = lines(stream)
    assert warned["logger"] == "py.warnings"
    assert "careful now" in str(warned["event"])
    assert died["event"] == "thread_died"
    assert died["thread"] == "doomed"
    assert "ZeroDivisionError" in str(died["exception"])


# -- every call site -------------------------------------------------------------------------


@functools.cache
def product_modules() -> list[tuple[Path, ast.Module]]:
    """Every module of ``allocator`` and ``jobs``, parsed (once: parsing is the slow part)."""
    paths = sorted([*(ROOT / "allocator").rglob("*.py"), *(ROOT / "jobs").rglob("*.py")])
    return [(path, ast.parse(path.read_text(), filename=str(path))) for path in paths]


def stdlib_loggers(tree: ast.Module) -> set[str]:
    """Module-level names bound to ``logging.getLogger(...)``."""
    names: set[str] = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "logging.getLogger"
        ):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def log_calls(tree: ast.Module) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LEVELS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in {"log", "logger", "_log"}
        ):
            yield node


def test_every_log_call_is_a_structured_event() -> None:
    """No %-style message, no ``key=value`` text: an event name and keyword fields, none
    named like the keys a JSON line has anyway."""
    problems: list[str] = []
    for path, tree in product_modules():
        where = path.relative_to(ROOT)
        for name in stdlib_loggers(tree):
            for call in ast.walk(tree):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr in LEVELS
                    and ast.unparse(call.func.value) == name
                ):
                    problems.append(f"{where}:{call.lineno}: a stdlib logger ({name})")
        for call in log_calls(tree):
            first = call.args[0] if call.args else None
            if len(call.args) != 1:
                problems.append(f"{where}:{call.lineno}: positional arguments")
            elif isinstance(first, ast.Constant) and not (
                isinstance(first.value, str) and EVENT_NAME.fullmatch(first.value)
            ):
                problems.append(f"{where}:{call.lineno}: event name {first.value!r}")
            reserved = {k.arg for k in call.keywords} & RESERVED
            if reserved:
                problems.append(f"{where}:{call.lineno}: reserved field {sorted(reserved)}")
    assert not problems, problems


def logged_event_names() -> tuple[set[str], set[str]]:
    """Event names the product logs, and the prefixes of names built at run time."""
    names: set[str] = set()
    prefixes: set[str] = set()
    for _path, tree in product_modules():
        for call in log_calls(tree):
            first = call.args[0]
            for node in ast.walk(first):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    names.add(node.value)
            if isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                prefixes.add(str(first.values[0].value))
    return names, prefixes


def test_the_event_names_the_docs_and_alerts_mention_are_logged() -> None:
    names, prefixes = logged_event_names()
    documents = [
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "deploy").rglob("*.yml"),
        *(ROOT / "deploy").rglob("*.yaml"),
        ROOT / "README.md",
    ]
    mentioned = {
        (str(path.relative_to(ROOT)), match)
        for path in documents
        for match in re.findall(r"\bevent=([a-z][a-z0-9_]*)", path.read_text())
    }
    assert mentioned, "the docs name events"
    unknown = sorted(
        (where, name)
        for where, name in mentioned
        if name not in names and not any(name.startswith(p) for p in prefixes)
    )
    assert not unknown, unknown
