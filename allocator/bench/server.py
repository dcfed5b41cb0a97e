"""Where a bench connects (:class:`Server`), the databases it makes there, and the numbers
every bench computes the same way.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from allocator.core.errors import AllocatorError, PrerequisiteError
from allocator.postgres import errors as db_errors

CONSUMER_GROUP = "allocator_consumer"
SERVER_SETTINGS: Final = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "commit_siblings",
    "wal_writer_delay",
    "wal_buffers",
    "shared_buffers",
    "max_wal_size",
    "autovacuum",
    "autovacuum_naptime",
)


class BenchError(AllocatorError):
    """The benchmark could not run (pgbench failed, the server refused a setup step)."""


@dataclass
class Server:
    """Where the bench connects: the superuser URL, and how claim_blocks logs in.

    The superuser URL is only used for the bench's own databases (created and dropped by
    name, never the allocator's)."""

    superuser_url: str
    consumer_url: str | None = None
    """A login role granted allocator_consumer (the embedded ``allocator_app``); None: the
    superuser with ``role=allocator_consumer``."""
    pgbench: Path = field(default_factory=lambda: find_pgbench())

    def url(self, database: str) -> str:
        """The superuser URL of ``database``."""
        return with_database(self.superuser_url, database)

    def claim_conninfo(self, database: str) -> tuple[str, dict[str, str]]:
        """How claims log in to ``database``: the consumer URL, or the superuser with
        ``role=allocator_consumer`` (in ``PGOPTIONS``); the URL and the extra environment."""
        if self.consumer_url:
            return with_database(self.consumer_url, database), {}
        return self.url(database), {"PGOPTIONS": f"-c role={CONSUMER_GROUP}"}

    def claim_role(self) -> str:
        """Who claims, for the report."""
        if self.consumer_url:
            return urlsplit(self.consumer_url).username or "?"
        return f"{urlsplit(self.superuser_url).username} as {CONSUMER_GROUP}"


def find_pgbench() -> Path:
    """The embedded PostgreSQL's pgbench, else the one on PATH (PrerequisiteError if none)."""
    try:
        from allocator.local import postgres

        candidate = postgres.find_bin_dir() / "pgbench"
        if candidate.is_file():
            return candidate
    except PrerequisiteError:
        pass
    if found := shutil.which("pgbench"):
        return Path(found)
    raise PrerequisiteError("pgbench is not installed (it comes with the PostgreSQL client)")


def with_database(url: str, database: str) -> str:
    """``url`` naming ``database`` instead."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def admin(server: Server) -> psycopg.Connection[tuple[Any, ...]]:
    """A superuser connection to the server's ``postgres`` database; a server that does not
    answer is :class:`~allocator.core.errors.DatabaseUnavailableError` (one line, exit 75)."""
    try:
        return psycopg.connect(server.url("postgres"), autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise db_errors.translate(exc, "connect to the bench's PostgreSQL server") from exc


def drop_database(server: Server, name: str) -> None:
    """Drops one of the bench's own databases, forcing its sessions out; none is fine."""
    with admin(server) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def server_settings(server: Server) -> dict[str, str]:
    """The server settings a report shows (:data:`SERVER_SETTINGS`)."""
    with admin(server) as conn:
        return {
            name: str(row[0])
            for name in SERVER_SETTINGS
            if (row := conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone())
        }


def percentile_ms(sorted_us: Sequence[int], q: float) -> float:
    """Nearest rank: the smallest sample with at least ``q`` of all samples at or below."""
    if not sorted_us:
        return 0.0
    rank = max(1, min(len(sorted_us), math.ceil(q * len(sorted_us))))
    return round(sorted_us[rank - 1] / 1000, 3)
