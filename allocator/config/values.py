"""What one configuration value may be: the bounded number types and the address checks.

A valid config holds only values a node can use (:data:`Int`, :data:`Float`).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

MAX_INT = 2**63 - 1
MAX_DURATION_S = 10 * 365 * 86_400.0
PG_INT_MAX = 2**31 - 1
"""PostgreSQL's ``integer`` settings (statement_timeout, ...) and ZooKeeper's session
timeout (an int32 on the wire) hold at most this."""

NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]*)?")
"""Text that reads as a number (shown unquoted in a problem line)."""
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?")
_ZNODE_PATH = re.compile(r"(/[^/\x00-\x1f\x7f]+)+")


def _not_bool(value: object) -> object:
    # pydantic would read TOML `true` as 1; no key here is a flag, so that is always a mistake.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


def _int64(value: int) -> int:
    # Integers go to PostgreSQL bigints, struct fields and timers: 64 bits at most.
    if not -MAX_INT <= value <= MAX_INT:
        raise ValueError("must fit in 64 bits (at most 2^63-1)")
    return value


def _duration(value: float) -> float:
    # A wait, a timer or a timedelta of a longer time overflows (threading.TIMEOUT_MAX).
    if value > MAX_DURATION_S:
        raise ValueError(f"must be <= {MAX_DURATION_S:.0f} (10 years)")
    return value


Int = Annotated[int, BeforeValidator(_not_bool), AfterValidator(_int64)]
"""Every integer key fits in 64 bits (the PostgreSQL settings and ZooKeeper's session timeout
in 32, by their ``le=PG_INT_MAX``); TOML's ``true``/``false`` is never a number."""
Float = Annotated[float, BeforeValidator(_not_bool), AfterValidator(_duration)]
"""Every float key is a duration in seconds (``*_s``), at most :data:`MAX_DURATION_S` (10
years: a wait, timer or ``timedelta`` of it never overflows); never ``true``/``false``."""


def check_host_port(text: str, *, min_port: int, port_required: bool) -> None:
    """Raises ValueError unless ``text`` is ``host[:port]`` (``host:port`` when
    ``port_required``) with a port in ``min_port..65535``."""
    match = _HOST_PORT.fullmatch(text)
    if match is None or (port_required and match["port"] is None):
        shape = "host:port" if port_required else "host[:port]"
        raise ValueError(f"{text!r} is not {shape}")
    if match["port"] is not None and not min_port <= int(match["port"]) <= 65535:
        raise ValueError(f"port of {text!r} must be in {min_port}..65535")


def check_znode_path(text: str, what: str) -> None:
    """Raises ValueError unless ``text`` is an absolute znode path outside ``/zookeeper``;
    ``what`` names it in the message."""
    if not _ZNODE_PATH.fullmatch(text):
        raise ValueError(
            f"{what} must be an absolute znode path like /a/b, without a trailing slash "
            f"(got {text!r})"
        )
    segments = text.split("/")[1:]
    if any(segment in {".", ".."} for segment in segments):
        raise ValueError(f"{what} must not contain '.' or '..' (got {text!r})")
    if segments[0] == "zookeeper":
        raise ValueError(f"{what} must not be under /zookeeper, which ZooKeeper reserves")
