"""The project's own exceptions, each carrying the exit code the CLI ends with for it.

The codes are rows of the one table, :mod:`allocator.core.exits`; messages are one line a
user can act on.
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.core import redact
from allocator.core.exits import Exit


class AllocatorError(Exception):
    """Base of every error this project raises on purpose; ``exit_code`` is a row of
    :mod:`allocator.core.exits`.

    Driver and library errors are translated into these at the boundary, keeping
    ``__cause__``, so callers and the CLI never see a raw psycopg or kazoo exception.
    """

    exit_code: int = Exit.FAILED


class UsageError(AllocatorError):
    """Bad input from a user: a flag, an argument, a value."""

    exit_code = Exit.USAGE


class InvalidIdError(UsageError):
    """A value given as a Snowflake ID is not one (not an integer, negative, too large)."""


class InvalidDurationError(UsageError):
    """A value given as a duration is not one (:mod:`allocator.core.durations`)."""


class ConfigError(AllocatorError):
    """A configuration value is missing or invalid; the message names the key."""

    exit_code = Exit.CONFIG


class InvalidConfigError(ConfigError):
    """Configuration failed validation; ``problems`` holds one line per bad key."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        # One line, as the CLI prints errors; ``allocator config check`` lists one per line.
        if len(self.problems) == 1:
            message = f"invalid configuration: {self.problems[0]}"
        else:
            joined = "; ".join(self.problems)
            message = f"invalid configuration ({len(self.problems)} problems): {joined}"
        super().__init__(message)


class LayoutError(ConfigError):
    """A Snowflake layout is invalid, or a value does not fit it; ``field`` names the culprit."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class PrerequisiteError(AllocatorError):
    """Something the machine must provide is missing (a package, a binary)."""

    exit_code = Exit.UNAVAILABLE


class ServerStartError(AllocatorError):
    """A server we started (ZooKeeper, PostgreSQL) did not come up; carries its log tail."""

    exit_code = Exit.SOFTWARE


class PortInUseError(AllocatorError):
    """A TCP port a server must listen on is taken; the message names the port."""

    exit_code = Exit.TEMPFAIL


class LocalClusterError(AllocatorError):
    """The embedded cluster's recorded state does not allow the request (``allocator local``)."""


class DatabaseError(AllocatorError):
    """PostgreSQL refused or failed a request and retrying will not help (the cause says why)."""


class DatabaseUnavailableError(DatabaseError):
    """PostgreSQL is unreachable or too slow: connection failure, lock or statement timeout,
    shutdown, deadlock. Retryable. After a write, its outcome is unknown (it may have
    committed): re-read the high-water mark before cutting again."""

    exit_code = Exit.TEMPFAIL


class DatabaseLoginError(ConfigError, DatabaseUnavailableError):
    """PostgreSQL refused the login: a wrong or missing password, a role that does not exist
    or may not log in, no ``pg_hba.conf`` line for it. A configuration error (exit 78) naming
    ``role`` (None when unknown): a retry with the same settings fails the same way. It is
    also a :class:`DatabaseUnavailableError`, so a running node or client treats it as a
    database it cannot use (it keeps probing and says why) instead of stopping."""

    exit_code = Exit.CONFIG

    def __init__(self, message: str, *, role: str | None) -> None:
        super().__init__(message)
        self.role = role


class SchemaMismatchError(ConfigError):
    """The database's schema revision is one this release's node cannot use (older than it
    needs, missing, or newer and closed to it by a contract): exit 78, the message names
    the database's revision, the range this release accepts and the way out
    (:mod:`allocator.postgres.compat`, docs/upgrades.md)."""


class MigrationLockTimeoutError(DatabaseUnavailableError):
    """Another ``allocator migrate`` held the migration lock for longer than
    ``--lock-timeout``: retry once it is done (exit 75, the holder named)."""


class DatabaseBehindError(DatabaseError):
    """The database lies below ZooKeeper's watermark (restored from a backup, or failed over
    to a standby that missed commits): a takeover found it so and wrote nothing. ``reason``
    says which part; ``generation``, ``epoch`` and ``high_water_id`` are what it holds."""

    def __init__(self, reason: str, *, generation: int, epoch: int, high_water_id: int) -> None:
        super().__init__(f"the database is below ZooKeeper's watermark: {reason}")
        self.reason = reason
        self.generation = generation
        self.epoch = epoch
        self.high_water_id = high_water_id


class FenceError(AllocatorError):
    """PostgreSQL refused a leader's write under the fence protocol (docs/design.md §3)."""

    sqlstate = ""


class FencedError(FenceError):
    """AL100: the write's epoch does not hold the fence; this node is no longer leader."""

    sqlstate = "AL100"


class StaleTakeoverError(FenceError):
    """AL101: the fence already holds an equal or newer epoch; this node must step down."""

    sqlstate = "AL101"


class BehindHighWaterError(FenceError):
    """AL102: a block starts at or behind the persisted high-water mark (I2); re-read it."""

    sqlstate = "AL102"


class InvalidBatchError(AllocatorError):
    """AL103: the database rejected the arguments of a node write (a bug in the caller)."""

    exit_code = Exit.SOFTWARE
    sqlstate = "AL103"


class LayoutMismatchError(AllocatorError):
    """AL104: the node's layout or datacenter differs from the one the database recorded."""

    exit_code = Exit.CONFIG  # the node's [layout] / cluster.datacenter_id must be fixed
    sqlstate = "AL104"


class ClockAheadError(AllocatorError):
    """AL105: a block lies past the database clock plus the allowed lead (the node's clock
    runs ahead of the database server's)."""

    exit_code = Exit.TEMPFAIL
    sqlstate = "AL105"


class InvalidRequestError(UsageError):
    """AL106: an operator command's arguments were refused (e.g. an empty reason)."""

    sqlstate = "AL106"


class ClockBehindError(AllocatorError):
    """The leader's clock is behind the high-water mark by more than the allowed bound.

    Cutting stops (I5); the leader raises an alert and keeps serving the existing pool.
    """

    exit_code = Exit.TEMPFAIL  # the clock may catch up

    def __init__(self, message: str, *, now_ms: int, mark_ms: int, bound_ms: int) -> None:
        super().__init__(message)
        self.now_ms = now_ms
        self.mark_ms = mark_ms
        self.bound_ms = bound_ms

    @property
    def behind_ms(self) -> int:
        """How far the clock is behind the mark's millisecond."""
        return self.mark_ms - self.now_ms


class TimeRangeExhaustedError(AllocatorError):
    """No ID can be cut: the next one would need a millisecond past the layout's time range."""

    exit_code = Exit.CONFIG  # only another layout (a new cluster) can continue


class ZooKeeperUnavailableError(AllocatorError):
    """No ZooKeeper server answered in time."""

    exit_code = Exit.TEMPFAIL


class LeaderUnavailableError(AllocatorError):
    """No leader answered: none in the election, its admin address unreachable, or it no
    longer leads. Retryable."""

    exit_code = Exit.TEMPFAIL


class WriteAbandonedError(AllocatorError):
    """A fenced write rolled back before commit because leadership came into doubt (I6)."""


def describe(exc: BaseException) -> str:
    """One line: each message's first line, then its cause chain (``a: b: c``), no
    traceback.

    A message's further lines (e.g. a server log's tail) are :func:`details`. Safe to print:
    a driver's message that echoes a connection string or a registered secret comes out
    masked (:mod:`allocator.core.redact`).
    """
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        first, _, rest = str(current).strip().partition("\n")
        # A foreign error's extra lines are part of its sentence (psycopg); ours are details.
        text = first if isinstance(current, AllocatorError) else f"{first} {rest}"
        text = " ".join(text.split()) or type(current).__name__
        if not parts or text not in parts[-1]:
            parts.append(text)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return redact.redact(": ".join(parts))


def details(exc: BaseException) -> list[str]:
    """The lines after the first of an error's own message (a log tail), for the CLI;
    secrets masked."""
    return [redact.redact(line) for line in str(exc).strip().splitlines()[1:]]
