"""Configuration: one validated, frozen :class:`Config` from a TOML file, the environment and flags.

Rules:

- Sources, lowest precedence first: built-in defaults < the TOML file (``--config PATH`` or
  ``ALLOCATOR_CONFIG``; optional, but a file that was named must exist) < ``ALLOCATOR_*``
  environment variables < explicit overrides from command-line flags (``--set`` and
  dedicated flags).
- Keys are ``section.key``. The environment variable of a key is ``ALLOCATOR_`` followed by
  the section and the key, upper-cased and joined by ``_``: ``zookeeper.session_timeout_ms``
  is ``ALLOCATOR_ZOOKEEPER_SESSION_TIMEOUT_MS``. An ``ALLOCATOR_<SECTION>_*`` variable that
  names no key is an error, like an unknown key in the file or in the overrides.
- Every value is validated when the config is loaded; rules between keys are checked too
  (once the keys involved are valid themselves). A failure raises
  :class:`~allocator.errors.InvalidConfigError` whose ``problems`` lists every problem,
  one line each, naming its dotted key, the bad value and where it came from, e.g.
  ``pool.min_blocks: must be >= 1 (got 0, from ALLOCATOR_POOL_MIN_BLOCKS)``; "default"
  when a key nobody set breaks a rule with one that was set. A key or value that holds a
  line break or another odd character is shown quoted, so a problem is always one line;
  a file that is not TOML (or not UTF-8) is one :class:`~allocator.errors.ConfigError`.
- A valid config holds only values a node can use: every float key is a duration in
  seconds, at most :data:`MAX_DURATION_S` (10 years: a wait, timer or ``timedelta`` of it
  never overflows); every integer fits in 64 bits, the PostgreSQL settings and ZooKeeper's
  session timeout in 32 (:data:`PG_INT_MAX`), the TCP keepalive settings in Linux's
  bounds, the layout's bit widths in 63.
- Secrets (``postgres.url``'s password and every other libpq secret parameter in it,
  ``zookeeper.auth``, ``node.admin_token``) are ``SecretStr``, never echoed in errors, and
  masked by :meth:`Config.masked_dict`. Loading registers their values with
  :func:`allocator.redact.register` as soon as it reads them, so no log line or error
  message of the process prints them. Each can also come from a file named by its variable
  plus ``_FILE`` (:func:`secret_file_env`: ``ALLOCATOR_NODE_ADMIN_TOKEN_FILE``,
  ``ALLOCATOR_ZOOKEEPER_AUTH_FILE``, ``ALLOCATOR_POSTGRES_URL_FILE``; systemd credentials,
  Kubernetes and compose secrets, ``allocator local env``): the file's text, stripped, on
  one line, in the environment's place in the order; both the variable and its ``_FILE``
  is a :class:`~allocator.errors.ConfigError`, like a file that cannot be read.
- Loading reads the file and the clock (the layout epoch must not be in the future), nothing
  else: ``node.name`` left empty becomes ``<hostname>-<pid>`` only when
  :meth:`NodeConfig.resolved_name` is called.
- This is the only module of the product that reads the process environment
  (``os.environ``); any other gets a copy from :func:`process_environment`. An AST test
  holds it (``tests/unit/test_boundaries.py``).
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from allocator import layout as layout_mod
from allocator import redact
from allocator.errors import ConfigError, InvalidConfigError, LayoutError, UsageError

ENV_PREFIX = "ALLOCATOR_"
CONFIG_PATH_ENV = "ALLOCATOR_CONFIG"
DEFAULT_ZK_HOSTS = "127.0.0.1:2181"
DEFAULT_POSTGRES_URL = "postgresql://allocator_node@127.0.0.1:5432/allocator"
DEFAULT_ADMIN_ADDRESS = "127.0.0.1:8470"
MASK = redact.MASK
SECRET_KEYS = frozenset({"postgres.url", "zookeeper.auth", "node.admin_token"})
MAX_NODE_NAME_CHARS = 64
MAX_INT = 2**63 - 1
MAX_DURATION_S = 10 * 365 * 86_400.0
PG_INT_MAX = 2**31 - 1
"""PostgreSQL's ``integer`` settings (statement_timeout, ...) and ZooKeeper's session
timeout (an int32 on the wire) hold at most this."""
MIN_ADMIN_TOKEN_CHARS = 24
MIN_ADMIN_TOKEN_DISTINCT = 8
"""A random token of 24 characters has far more distinct ones (base64: ~20, hex: ~13); a
token with fewer was typed, not generated."""

_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?")
_ZNODE_PATH = re.compile(r"(/[^/\x00-\x1f\x7f]+)+")
_NODE_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_NODE_NAME_CHARS}}}")
_ADMIN_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")
_NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]*)?")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_ID_BITS = layout_mod.ID_BITS


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
Float = Annotated[float, BeforeValidator(_not_bool), AfterValidator(_duration)]
"""Every float key is a duration in seconds (``*_s``), bounded by :data:`MAX_DURATION_S`."""


def _check_host_port(text: str, *, min_port: int, port_required: bool) -> None:
    match = _HOST_PORT.fullmatch(text)
    if match is None or (port_required and match["port"] is None):
        shape = "host:port" if port_required else "host[:port]"
        raise ValueError(f"{text!r} is not {shape}")
    if match["port"] is not None and not min_port <= int(match["port"]) <= 65535:
        raise ValueError(f"port of {text!r} must be in {min_port}..65535")


def _check_znode_path(text: str, what: str) -> None:
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


def mask_url(url: str) -> str:
    """``url`` with every libpq secret parameter masked (:func:`allocator.redact.mask_conninfo`)."""
    return redact.mask_conninfo(url)


def _register_secrets(values: Mapping[str, object]) -> None:
    """Hands the secrets among ``values`` (dotted keys) to :func:`allocator.redact.register`,
    so no log line or error message of this process can print them."""
    for key in SECRET_KEYS:
        value = values.get(key)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not isinstance(value, str) or not value:
            continue
        if key == "postgres.url":
            redact.register(*redact.url_secrets(value))
        elif key == "zookeeper.auth":
            redact.register(value, value.partition(":")[2])
        else:
            redact.register(value)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ClusterConfig(_Section):
    """``[cluster]``: which cluster this is."""

    datacenter_id: Int = Field(default=0, ge=0)
    """The datacenter field of every ID; names the cluster. At most ``layout.max_datacenter``."""


class LayoutConfig(_Section):
    """``[layout]``: the Snowflake layout (see :mod:`allocator.layout`) and the block size."""

    epoch: Int = Field(default=layout_mod.DEFAULT_EPOCH_MS, ge=0)
    """Unix milliseconds; given as ISO-8601 with an offset, a TOML datetime, or Unix ms."""
    # Each width at most the ID's 63 bits (a huge one would make 2^width exhaust memory).
    timestamp_bits: Int = Field(default=layout_mod.DEFAULT_TIMESTAMP_BITS, ge=1, le=_ID_BITS)
    datacenter_bits: Int = Field(default=layout_mod.DEFAULT_DATACENTER_BITS, ge=0, le=_ID_BITS)
    lane_bits: Int = Field(default=layout_mod.DEFAULT_LANE_BITS, ge=0, le=_ID_BITS)
    sequence_bits: Int = Field(default=layout_mod.DEFAULT_SEQUENCE_BITS, ge=1, le=_ID_BITS)
    block_size: Int = Field(default=4096, ge=1)
    """IDs per block: a power of two, at most ``2^sequence_bits``."""

    @field_validator("epoch", mode="before")
    @classmethod
    def _parse_epoch(cls, value: object) -> object:
        if isinstance(value, str) and not _NUMBER.fullmatch(value.strip()):
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError(
                    "must be ISO-8601 with a UTC offset (2020-01-01T00:00:00Z) or Unix ms"
                ) from None
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError("must carry a UTC offset, e.g. 2020-01-01T00:00:00Z")
            return (value - layout_mod.utc_from_ms(0)) // timedelta(milliseconds=1)
        return value


class ZookeeperConfig(_Section):
    """``[zookeeper]``: the ensemble and the election."""

    hosts: str = DEFAULT_ZK_HOSTS
    """``host[:port],...`` with an optional chroot suffix ``/a/b`` isolating this cluster."""
    election_path: str = "/election"
    session_timeout_ms: Int = Field(default=10_000, ge=400, le=PG_INT_MAX)
    connect_timeout_s: Float = Field(default=10.0, gt=0)
    max_reconnect_delay_s: Float = Field(default=5.0, gt=0, le=60)
    auth: SecretStr = SecretStr("")
    """``user:password`` for digest authentication: the cluster's identity, which alone has
    any right on the chroot and every znode below it that the cluster creates
    (:mod:`allocator.zkclient`). From the environment (``ALLOCATOR_ZOOKEEPER_AUTH``) or the
    config file, never a flag. Empty: no ACLs, and ``allocator run`` refuses to start
    unless ``insecure`` is set."""
    world_readable: bool = False
    """Also let anyone (unauthenticated) read, never write, the cluster's znodes."""
    insecure: bool = False
    """Run a node without ``auth``: its znodes are open to anyone who reaches ZooKeeper, who
    can stall the election. Warned about at every start; an error together with ``auth``."""

    @field_validator("hosts")
    @classmethod
    def _check_hosts(cls, value: str) -> str:
        servers, slash, chroot = value.partition("/")
        if not servers.strip():
            raise ValueError("must name at least one server, e.g. zk1:2181,zk2:2181/allocator")
        for server in servers.split(","):
            _check_host_port(server.strip(), min_port=1, port_required=False)
        if slash:
            _check_znode_path(slash + chroot, "the chroot")
        return value

    @field_validator("election_path")
    @classmethod
    def _check_election_path(cls, value: str) -> str:
        _check_znode_path(value, "the path")
        return value

    @field_validator("auth")
    @classmethod
    def _check_auth(cls, value: SecretStr) -> SecretStr:
        user, colon, password = value.get_secret_value().partition(":")
        if (user or colon) and not (user and password):
            raise ValueError("must be user:password (digest) or empty")
        return value


class PostgresConfig(_Section):
    """``[postgres]``: the database the leader writes blocks to."""

    url: SecretStr = SecretStr(DEFAULT_POSTGRES_URL)
    pool_min_size: Int = Field(default=1, ge=0)
    pool_max_size: Int = Field(default=4, ge=1)
    statement_timeout_ms: Int = Field(default=5000, gt=0, le=PG_INT_MAX)
    idle_in_transaction_timeout_ms: Int = Field(default=2000, gt=0, le=PG_INT_MAX)
    """How long a node's transaction may sit idle. A node frozen between a fenced write and
    its COMMIT (SIGSTOP, a VM pause) holds the fence row this long, and its successor's
    takeover waits for it: keep it below ``zookeeper.session_timeout_ms`` or a frozen
    leader delays the handover past the session timeout (the drill's ``host-death`` found
    5 s handovers at a 4 s session timeout with the old default of 5000)."""
    connect_timeout_s: Float = Field(default=5.0, gt=0)
    tcp_user_timeout_ms: Int = Field(default=5000, ge=0, le=PG_INT_MAX)
    """libpq ``tcp_user_timeout``: how long sent data may stay unacknowledged before the
    connection is dropped (a black-holed path); 0 leaves the system default."""
    # Linux's bounds for TCP_KEEPIDLE, TCP_KEEPINTVL and TCP_KEEPCNT (tcp(7)).
    keepalives_idle_s: Int = Field(default=2, ge=1, le=32_767)
    keepalives_interval_s: Int = Field(default=1, ge=1, le=32_767)
    keepalives_count: Int = Field(default=3, ge=1, le=127)
    allow_async_replication: bool = False
    """Cut even when the database has standbys that no commit waits for. A failover to such
    a standby loses acknowledged claims (handed out again) and moves the mark back: only for
    an operator who accepts duplicates. Nodes warn at every start and export
    ``allocator_async_replication_allowed``."""

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        scheme = url.partition("://")[0]
        if scheme not in {"postgresql", "postgres"} or "://" not in url:
            raise ValueError("must be a postgresql:// or postgres:// URL")
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            raise ValueError("has an invalid host or port") from None
        # A multi-host URL (a primary and its standbys) lists its ports comma-separated.
        for port in filter(None, str(params.get("port", "")).split(",")):
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ValueError("has an invalid host or port")
        return value


class NodeConfig(_Section):
    """``[node]``: this process."""

    name: str = ""
    """1..64 characters of ``[A-Za-z0-9._-]``; empty means ``<hostname>-<pid>``."""
    admin_address: str = DEFAULT_ADMIN_ADDRESS
    """Where the admin HTTP server listens (docs/admin-http.md): loopback by default;
    ``0.0.0.0:<port>`` or one interface's address to let a remote Prometheus scrape."""
    admin_token: SecretStr = SecretStr("")
    """``Authorization: Bearer`` token for ``POST /step-down``: at least
    ``MIN_ADMIN_TOKEN_CHARS`` random printable ASCII characters, or empty (step-down over
    HTTP disabled)."""
    admin_max_threads: Int = Field(default=8, ge=1, le=64)
    """Worker threads of the admin HTTP server (slow clients hold no thread)."""
    admin_timeout_s: Float = Field(default=5.0, gt=0, le=60)
    """Total time a request may take to arrive, and its answer to be taken."""
    on_session_loss: Literal["exit", "rejoin"] = "exit"
    log_format: Literal["text", "json"] = "text"
    shutdown_timeout_s: Float = Field(default=10.0, gt=0)
    state_dir: str = ""
    """An absolute path: the folder where the node keeps its state files (its ZooKeeper
    session, :mod:`allocator.session_file`); created mode 0700 if missing, and it must not
    be writable by others. systemd's ``StateDirectory=allocator/%i`` makes it
    ``/var/lib/allocator/<instance>``; ``allocator local`` gives each node one of its own.
    Empty (the default): the node keeps no state file."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if value and not _NODE_NAME.fullmatch(value):
            raise ValueError(f"must be 1..{MAX_NODE_NAME_CHARS} characters of A-Z a-z 0-9 . _ -")
        return value

    @field_validator("admin_address")
    @classmethod
    def _check_admin_address(cls, value: str) -> str:
        _check_host_port(value, min_port=0, port_required=True)
        return value

    @field_validator("admin_token")
    @classmethod
    def _check_admin_token(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if token and not _ADMIN_TOKEN_CHARS.fullmatch(token):
            raise ValueError(
                "must be printable ASCII without spaces or control characters "
                "(e.g. from `openssl rand -base64 32`)"
            )
        if token and len(token) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"must be at least {MIN_ADMIN_TOKEN_CHARS} random characters "
                "(e.g. from `openssl rand -base64 32`), or empty to disable step-down over HTTP"
            )
        if token and len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT:
            raise ValueError(
                f"must be at least {MIN_ADMIN_TOKEN_CHARS} random characters "
                f"(e.g. from `openssl rand -base64 32`); this one has fewer than "
                f"{MIN_ADMIN_TOKEN_DISTINCT} distinct characters, so it was not generated"
            )
        return value

    @field_validator("state_dir")
    @classmethod
    def _check_state_dir(cls, value: str) -> str:
        if value and (not value.startswith("/") or "\x00" in value):
            raise ValueError("must be an absolute path, e.g. /var/lib/allocator/node-1, or empty")
        return value

    def state_path(self) -> Path | None:
        """``state_dir`` as a path, or None when it is empty (no state file is kept)."""
        return Path(self.state_dir) if self.state_dir else None

    def resolved_name(self) -> str:
        """``name``, or ``<hostname>-<pid>`` when empty (reads the host name and pid now)."""
        if self.name:
            return self.name
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "node"
        suffix = f"-{os.getpid()}"
        return host[: MAX_NODE_NAME_CHARS - len(suffix)] + suffix


class PoolConfig(_Section):
    """``[pool]``: how many blocks the leader keeps cut ahead, and the jobs around them."""

    min_blocks: Int = Field(default=16_384, ge=1)
    """The floor the leader keeps whatever the claim rate: what a cold pool offers a burst
    before any rate is measured (16 connections at ~3k claims/s for ~3 s), and the level a
    node waits for before ``/readyz`` answers ready."""
    runway_s: Float = Field(default=60.0, ge=0)
    max_blocks: Int = Field(default=1_000_000, ge=1)
    """The cap. It covers a handover (the session timeout plus :attr:`handover_margin_s`,
    15 s by default) at claim rates up to ``max_blocks / 15 s``: ~66k blocks/s, above the
    32k blocks/s the default layout lets a leader cut. ``config check`` states the rate."""
    low_watermark_blocks: Int = Field(default=16, ge=0)
    handover_margin_s: Float = Field(default=5.0, ge=0)
    """What a handover may take beyond ``zookeeper.session_timeout_ms`` (detection, the
    takeover, the first refill). The pool must last that long at the current claim rate:
    the refill aims for it and ``AllocatorPoolRunwayShort`` pages below it."""
    refill_interval_s: Float = Field(default=1.0, gt=0)
    max_clock_behind_ms: Int = Field(default=1000, ge=0)
    max_clock_ahead_ms: Int = Field(default=1000, ge=1, le=600_000)
    """No block is cut past the database clock plus this (or plus the lead the mark already
    had), enforced by ``cut_blocks`` in the database."""
    max_clock_skew_ms: Int = Field(default=500, ge=1)
    """A node whose clock differs from the database server's by more refuses to cut."""
    retention_s: Float = Field(default=86_400.0, gt=0)
    sample_interval_s: Float = Field(default=5.0, gt=0)


class LeaderConfig(_Section):
    """``[leader]``: when a leader that cannot do its job hands over."""

    db_unreachable_s: Float = Field(default=15.0, gt=0)
    """A leader whose database writes have all failed for this long hands over to a
    contender that reaches the database (and keeps leading if none does)."""
    clock_skew_handover_s: Float = Field(default=10.0, gt=0)
    """A leader whose clock has disagreed with the database's for this long hands over to a
    contender whose clock agrees (and keeps leading, cutting nothing, if none does)."""
    probe_interval_s: Float = Field(default=1.0, gt=0, le=60)
    """How often every node checks that it reaches the database and that its clock agrees,
    and publishes both in its election znode."""


SECTIONS: dict[str, type[_Section]] = {
    "cluster": ClusterConfig,
    "layout": LayoutConfig,
    "zookeeper": ZookeeperConfig,
    "postgres": PostgresConfig,
    "node": NodeConfig,
    "pool": PoolConfig,
    "leader": LeaderConfig,
}
KEYS: tuple[str, ...] = tuple(
    f"{section}.{key}" for section, model in SECTIONS.items() for key in model.model_fields
)
_WIDTH_KEYS = tuple(f"layout.{name}" for name in LayoutConfig.model_fields if name.endswith("bits"))
_LAYOUT_FIELD_KEYS = {"epoch_ms": "layout.epoch"} | {k.split(".")[1]: k for k in _WIDTH_KEYS}

# A cross-field problem: dotted key, message, the key's effective value.
_Problem = tuple[str, str, object]


def _cross_check(
    sections: Mapping[str, BaseModel], set_keys: Iterable[str] = (), now_ms: int | None = None
) -> list[_Problem]:
    """Rules spanning keys; each runs when the sections it needs passed their own checks.

    ``set_keys`` are the keys given by some source (to blame for widths that do not add
    up); ``now_ms`` enables the check that the epoch is not in the future.
    """
    problems: list[_Problem] = []
    lay, cluster = sections.get("layout"), sections.get("cluster")
    if isinstance(lay, LayoutConfig):
        try:
            built = Config.layout_of(lay)
            if now_ms is not None:
                built.check_epoch(now_ms)
        except LayoutError as exc:
            if exc.field is None:  # the widths do not add up: blame the ones that were set
                given = set(set_keys)
                keys = [key for key in _WIDTH_KEYS if key in given] or list(_WIDTH_KEYS)
            else:
                keys = [_LAYOUT_FIELD_KEYS.get(exc.field, f"layout.{exc.field}")]
            message = str(exc).removeprefix(f"{exc.field}: ")
            problems += [(key, message, getattr(lay, key.split(".")[1])) for key in keys]
        block_size, positions = lay.block_size, 1 << lay.sequence_bits
        if block_size & (block_size - 1):
            problems.append(("layout.block_size", "must be a power of two", block_size))
        elif block_size > positions:
            message = f"must be <= 2^layout.sequence_bits = {positions}"
            problems.append(("layout.block_size", message, block_size))
        max_datacenter = (1 << lay.datacenter_bits) - 1
        if isinstance(cluster, ClusterConfig) and cluster.datacenter_id > max_datacenter:
            message = f"must be <= {max_datacenter} (2^layout.datacenter_bits - 1)"
            problems.append(("cluster.datacenter_id", message, cluster.datacenter_id))
    postgres, pool = sections.get("postgres"), sections.get("pool")
    if isinstance(postgres, PostgresConfig) and postgres.pool_max_size < postgres.pool_min_size:
        message = f"must be >= postgres.pool_min_size ({postgres.pool_min_size})"
        problems.append(("postgres.pool_max_size", message, postgres.pool_max_size))
    if isinstance(pool, PoolConfig):
        if pool.max_blocks < pool.min_blocks:
            message = f"must be >= pool.min_blocks ({pool.min_blocks})"
            problems.append(("pool.max_blocks", message, pool.max_blocks))
        if pool.max_clock_skew_ms >= pool.max_clock_ahead_ms:
            message = f"must be < pool.max_clock_ahead_ms ({pool.max_clock_ahead_ms})"
            problems.append(("pool.max_clock_skew_ms", message, pool.max_clock_skew_ms))
        if pool.low_watermark_blocks >= pool.min_blocks:
            message = f"must be < pool.min_blocks ({pool.min_blocks})"
            problems.append(("pool.low_watermark_blocks", message, pool.low_watermark_blocks))
    zookeeper = sections.get("zookeeper")
    if isinstance(zookeeper, ZookeeperConfig):
        has_auth = bool(zookeeper.auth.get_secret_value())
        if zookeeper.insecure and has_auth:
            message = "must be false when zookeeper.auth is set (the ACLs are used)"
            problems.append(("zookeeper.insecure", message, True))
        if zookeeper.world_readable and not has_auth:
            message = "needs zookeeper.auth (without it every znode is open to all anyway)"
            problems.append(("zookeeper.world_readable", message, True))
    leader = sections.get("leader")
    if isinstance(leader, LeaderConfig) and isinstance(pool, PoolConfig):
        # A contender's advert may be two probes old, and a leader judges its own writes
        # once per refill: a shorter window could hand over to a node that cannot write.
        least = 2 * leader.probe_interval_s + pool.refill_interval_s
        if leader.db_unreachable_s <= least:
            message = (
                f"must be > 2 x leader.probe_interval_s + pool.refill_interval_s ({least:g} s)"
            )
            problems.append(("leader.db_unreachable_s", message, leader.db_unreachable_s))
    return problems


class Config(BaseSettings):
    """The effective configuration. Build it with :func:`load_config`.

    ``Config()`` alone reads only the process environment (pydantic-settings); the sections
    are also reachable as attributes: ``config.pool.min_blocks``. The ``[layout]`` section is
    ``layout_section``, because :attr:`layout` is the validated :class:`~allocator.layout.Layout`.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_prefix_target="all",  # the prefix applies to the "layout" alias too
        env_nested_delimiter="_",
        env_nested_max_split=1,  # ALLOCATOR_POOL_MIN_BLOCKS -> pool / min_blocks
        extra="forbid",
        frozen=True,
    )

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    layout_section: LayoutConfig = Field(default_factory=LayoutConfig, alias="layout")
    zookeeper: ZookeeperConfig = Field(default_factory=ZookeeperConfig)
    postgres: PostgresConfig = Field(default_factory=PostgresConfig)
    node: NodeConfig = Field(default_factory=NodeConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    leader: LeaderConfig = Field(default_factory=LeaderConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        problems = _cross_check(self.sections())
        if problems:
            raise ValueError("; ".join(f"{key}: {message}" for key, message, _ in problems))
        return self

    @staticmethod
    def layout_of(section: LayoutConfig) -> layout_mod.Layout:
        return layout_mod.Layout(
            epoch_ms=section.epoch,
            timestamp_bits=section.timestamp_bits,
            datacenter_bits=section.datacenter_bits,
            lane_bits=section.lane_bits,
            sequence_bits=section.sequence_bits,
        )

    @property
    def layout(self) -> layout_mod.Layout:
        """The Snowflake layout of ``[layout]``."""
        return self.layout_of(self.layout_section)

    def sections(self) -> dict[str, _Section]:
        """Each section by its name in the file."""
        return {
            name: getattr(self, "layout_section" if name == "layout" else name) for name in SECTIONS
        }

    def masked_dict(self) -> dict[str, dict[str, object]]:
        """The effective config by section; secrets masked, the epoch as ISO-8601 UTC."""
        result: dict[str, dict[str, object]] = {}
        for name, section in self.sections().items():
            values: dict[str, object] = {}
            for key in type(section).model_fields:
                value: object = getattr(section, key)
                if isinstance(value, SecretStr):
                    secret = value.get_secret_value()
                    value = mask_url(secret) if name == "postgres" else (MASK if secret else "")
                elif (name, key) == ("layout", "epoch"):
                    value = layout_mod.format_utc_ms(self.layout_section.epoch)
                values[key] = value
            result[name] = values
        return result


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(Config)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


def process_environment() -> dict[str, str]:
    """A copy of this process's environment variables.

    The one way for code outside this module to see the environment (module rules): to
    hand it on to a child process, or to read a documented variable of the embedded
    cluster's tooling (``ALLOCATOR_PG_BIN_DIR``, ``ALLOCATOR_ZK_JAVA_DIR``)."""
    return dict(os.environ)


def env_name(key: str) -> str:
    """The variable of a dotted key: ``pool.min_blocks`` is ``ALLOCATOR_POOL_MIN_BLOCKS``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def secret_file_env(key: str) -> str:
    """The variable naming a file that holds secret ``key``: ``node.admin_token`` is
    ``ALLOCATOR_NODE_ADMIN_TOKEN_FILE``."""
    return env_name(key) + "_FILE"


def _secret_files(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` without the secrets' ``*_FILE`` variables, and what their files hold by
    dotted key (module rules). An empty ``*_FILE`` variable counts as unset."""
    file_keys = {secret_file_env(key): key for key in SECRET_KEYS}
    given = {name.upper() for name, value in env.items() if value}
    rest: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for name, value in env.items():
        key = file_keys.get(name.upper())
        if key is None:
            rest[name] = value
        elif value:
            if env_name(key) in given:
                raise ConfigError(f"set {env_name(key)} or {secret_file_env(key)}, not both")
            secrets[key] = _read_secret_file(secret_file_env(key), value)
    return rest, secrets


def _read_secret_file(name: str, path: str) -> str:
    shown = f"{name}={path if path.isprintable() else repr(path)}"  # one line, always
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: the file is not UTF-8 text") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "bad path"
        raise ConfigError(f"{shown}: cannot read the file ({reason})") from None
    if not text:
        raise ConfigError(f"{shown}: the file is empty")
    if "\n" in text or "\r" in text:
        raise ConfigError(f"{shown}: the file must hold the secret on one line")
    return text


def _read_file(path: Path) -> dict[str, Any]:
    shown = str(path) if str(path).isprintable() else repr(str(path))  # one line, always
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {shown}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {shown} is not valid TOML") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"config file {shown} is not valid UTF-8") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"cannot read config file {shown}") from exc


def _flatten(nested: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, body in nested.items():
        if isinstance(body, Mapping):
            flat.update({f"{section}.{key}": value for key, value in body.items()})
        else:
            flat[str(section)] = body
    return flat


_MESSAGES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "literal_error": "must be one of {expected}",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "extra_forbidden": "unknown key",
}


def _message(error: ErrorDetails) -> str:
    ctx = error.get("ctx", {})
    if error["type"] == "value_error":
        return str(ctx["error"])
    template = _MESSAGES.get(error["type"])
    return template.format(**ctx) if template else error["msg"]


def _show(key: str, value: object) -> str:
    """A bad value for an error line; secrets stay hidden."""
    if key in SECRET_KEYS:
        if key == "postgres.url" and isinstance(value, str):
            masked = mask_url(value)
            return masked if masked.isprintable() else repr(masked)  # one line, always
        return MASK
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not _NUMBER.fullmatch(value):
        return repr(value)
    return str(value)


def _unknown_key(key: str) -> str:
    if key in SECTIONS:
        return f"{key}: must be a table of keys, like [{key}]"
    close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.75)
    # A key that is empty, blank or holds odd characters (a newline) is shown quoted.
    shown = key if _PLAIN_KEY.fullmatch(key) else repr(key)
    return f"{shown}: unknown key" + (f"; did you mean {close[0]}?" if close else "")


def load_config(
    path: Path | None = None,
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    now_ms: int | None = None,
) -> Config:
    """Load, merge and validate: defaults < file < ``ALLOCATOR_*`` variables < ``overrides``.

    ``path`` defaults to ``$ALLOCATOR_CONFIG``; when neither is set no file is read.
    ``overrides`` maps dotted keys (``"zookeeper.hosts"``) to values, text or typed.
    ``env`` defaults to ``os.environ``; ``now_ms`` (for the epoch check) to the clock.
    Raises :class:`InvalidConfigError` listing every problem, or :class:`ConfigError` when
    the file (or a secret's ``*_FILE``) cannot be read.
    """
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_PATH_ENV):
        path = Path(env[CONFIG_PATH_ENV])
    layers: list[tuple[Mapping[str, Any], Callable[[str], str]]] = []
    if path is not None:
        layers.append((_flatten(_read_file(path)), lambda key: f"from {path}"))
    env, from_files = _secret_files(env)
    try:
        layers.append((_flatten(_EnvSource(env)()), lambda key: f"from {env_name(key)}"))
    except SettingsError as exc:
        raise ConfigError(f"cannot read the {ENV_PREFIX}* environment variables") from exc
    layers.append((from_files, lambda key: f"from {secret_file_env(key)}"))
    layers.append(
        ({str(k): v for k, v in (overrides or {}).items()}, lambda key: "from the command line")
    )

    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for flat, label in layers:
        for key, value in flat.items():
            values[key], origin[key] = value, label(key)
    _register_secrets(values)

    problems: list[str] = []
    for key in [key for key in values if key not in KEYS]:
        problems.append(f"{_unknown_key(key)} ({origin[key]})")
        del values[key]

    def line(key: str, message: str, value: object) -> str:
        shown = _show(key, values.get(key, value))
        return f"{key}: {message} (got {shown}, {origin.get(key, 'default')})"

    sections: dict[str, _Section] = {}
    for name, model in SECTIONS.items():
        prefix = f"{name}."
        body = {
            key[len(prefix) :]: value for key, value in values.items() if key.startswith(prefix)
        }
        try:
            sections[name] = model.model_validate(body)
        except ValidationError as exc:
            for error in exc.errors():
                key = ".".join([name, *(str(part) for part in error["loc"])])
                problems.append(line(key, _message(error), error["input"]))
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    for key, message, value in _cross_check(sections, set_keys=origin, now_ms=now_ms):
        problems.append(line(key, message, value))
    if problems:
        raise InvalidConfigError(problems)
    return Config.model_validate(sections)


def parse_set_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``--set section.key=value`` flags as overrides for :func:`load_config`; last one wins.

    A secret (``zookeeper.auth``, ``node.admin_token``, a ``postgres.url`` with a password)
    is refused: it would show in every process list. It comes from the environment or the
    config file."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        key = key.strip()
        if not equals or not re.fullmatch(r"[A-Za-z0-9_]+\.[A-Za-z0-9_]+", key):
            raise UsageError(
                f"--set {pair!r}: expected SECTION.KEY=VALUE, e.g. pool.min_blocks=128"
            )
        if key.lower() in SECRET_KEYS and (
            key.lower() != "postgres.url" or mask_url(value) != value
        ):
            # A flag shows in every process list (a URL without a password is no secret);
            # the value is not echoed here either.
            raise UsageError(
                f"--set {key.lower()}: a secret is never taken from the command line; "
                f"set {env_name(key.lower())} or put it in the config file"
            )
        overrides[key.lower()] = value
    return overrides


def load_from_options(
    config_path: Path | None,
    set_pairs: Iterable[str] = (),
    flags: Mapping[str, object] | None = None,
) -> Config:
    """:func:`load_config` from the shared options; ``flags`` (dedicated options) beat ``--set``."""
    return load_config(config_path, {**parse_set_pairs(set_pairs), **(flags or {})})
