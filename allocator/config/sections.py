"""The settings model: one frozen pydantic model per section of the file, each key with its
own rules (bounds, shapes; the TCP keepalive settings in Linux's bounds, the layout's bit
widths in the ID's 63 bits), and :data:`KEYS`. Rules between keys are
:mod:`allocator.config.checks`.
"""

from __future__ import annotations

import os
import re
import socket
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from allocator.config.values import (
    NUMBER,
    PG_INT_MAX,
    Float,
    Int,
    check_host_port,
    check_znode_path,
)
from allocator.core import layout as layout_mod
from allocator.core.zookeeper_hosts import servers_of

DEFAULT_ZK_HOSTS = "127.0.0.1:2181"
DEFAULT_POSTGRES_URL = "postgresql://allocator_node@127.0.0.1:5432/allocator"
DEFAULT_ADMIN_ADDRESS = "127.0.0.1:8470"
MAX_NODE_NAME_CHARS = 64
MIN_ADMIN_TOKEN_CHARS = 24
MIN_ADMIN_TOKEN_DISTINCT = 8
"""A random token of 24 characters has far more distinct ones (base64: ~20, hex: ~13); a
token with fewer was typed, not generated."""

SASL_DIGEST_MD5 = "DIGEST-MD5"
KERBEROS_MECHANISMS = frozenset({"GSSAPI", "KERBEROS", "GSS-SPNEGO"})
_SASL_ID = re.compile(r"[\x21-\x2b\x2d-\x39\x3b-\x7e]+")  # printable, no space , :
_DIGEST_ID = re.compile(r"[\x21-\x2b\x2d-\x39\x3b-\x7e]+:[A-Za-z0-9+/]{27}=")
_NODE_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_NODE_NAME_CHARS}}}")
_ADMIN_TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")
_ID_BITS = layout_mod.ID_BITS


class Section(BaseModel):
    """A section of the file: frozen; an unknown key, ``inf`` or ``nan`` is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ClusterConfig(Section):
    """``[cluster]``: which cluster this is."""

    datacenter_id: Int = Field(default=0, ge=0)
    """The datacenter field of every ID; names the cluster. At most ``layout.max_datacenter``."""


class LayoutConfig(Section):
    """``[layout]``: the Snowflake layout (see :mod:`allocator.core.layout`) and the block size."""

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
        if isinstance(value, str) and not NUMBER.fullmatch(value.strip()):
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


class ZookeeperConfig(Section):
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
    (:mod:`allocator.zookeeper.client`). From the environment (``ALLOCATOR_ZOOKEEPER_AUTH``) or the
    config file, never a flag. Empty: no ACLs, and ``allocator run`` refuses to start
    unless ``insecure`` is set."""
    world_readable: bool = False
    """Also let anyone (unauthenticated) read, never write, the cluster's znodes."""
    insecure: bool = False
    """Run a node without ``auth``: its znodes are open to anyone who reaches ZooKeeper, who
    can stall the election. Warned about at every start; an error together with ``auth``."""
    readers: str = ""
    """Identities that may read, never write, the cluster's znodes (an operator's
    ``status``/``watch``): comma-separated ``digest:<user>:<base64 sha1 of user:password>``
    or ``sasl:<user>``. Every node adds them to each znode's ACL with READ only."""
    tls: bool = False
    """Connect to the ensemble over TLS (its ``secureClientPort``), verifying the servers'
    certificates against ``tls_ca_file`` (always: there is no switch to turn it off)."""
    tls_ca_file: str = ""
    """PEM file of the CA(s) that signed the servers' certificates; needed with ``tls``."""
    tls_cert_file: str = ""
    """PEM client certificate for mutual TLS (with ``tls_key_file``); empty: none."""
    tls_key_file: str = ""
    """PEM private key of ``tls_cert_file``."""
    tls_key_password: SecretStr = SecretStr("")
    """Password of an encrypted ``tls_key_file``; a secret (environment or file only)."""
    sasl_mechanism: str = SASL_DIGEST_MD5
    """SASL mechanism when ``sasl_username`` is set: only ``DIGEST-MD5``; Kerberos
    (``GSSAPI``) is unsupported."""
    sasl_username: str = ""
    """SASL identity (the server's JAAS ``user_<name>``); its ACL id is ``sasl:<name>``.
    Empty: no SASL."""
    sasl_password: SecretStr = SecretStr("")
    """Password of ``sasl_username``; a secret (``ALLOCATOR_ZOOKEEPER_SASL_PASSWORD_FILE``)."""

    @field_validator("hosts")
    @classmethod
    def _check_hosts(cls, value: str) -> str:
        servers = servers_of(value)
        if not servers.strip():
            raise ValueError("must name at least one server, e.g. zk1:2181,zk2:2181/allocator")
        for server in servers.split(","):
            check_host_port(server.strip(), min_port=1, port_required=False)
        chroot = value[len(servers) :]  # as written: a trailing slash is refused
        if chroot:
            check_znode_path(chroot, "the chroot")
        return value

    @field_validator("election_path")
    @classmethod
    def _check_election_path(cls, value: str) -> str:
        check_znode_path(value, "the path")
        return value

    @field_validator("readers", mode="before")
    @classmethod
    def _join_readers(cls, value: object) -> object:
        # A TOML array reads as the comma-separated text the environment holds.
        if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
            return ",".join(value)
        return value

    @field_validator("readers")
    @classmethod
    def _check_readers(cls, value: str) -> str:
        for reader in filter(None, (item.strip() for item in value.split(","))):
            scheme, _, ident = reader.partition(":")
            if scheme == "digest" and _DIGEST_ID.fullmatch(ident):
                continue
            if scheme == "sasl" and _SASL_ID.fullmatch(ident):
                continue
            raise ValueError(
                f"{reader!r} is not digest:<user>:<base64 sha1 of user:password> or "
                "sasl:<user> (never a password: see docs/zookeeper-acls.md)"
            )
        return value

    @field_validator("sasl_mechanism")
    @classmethod
    def _check_sasl_mechanism(cls, value: str) -> str:
        if value.upper() in KERBEROS_MECHANISMS:
            raise ValueError(
                "Kerberos (GSSAPI) is unsupported: use DIGEST-MD5 with sasl_username and "
                "sasl_password, or digest auth (docs/zookeeper-acls.md)"
            )
        if value.upper() != SASL_DIGEST_MD5:
            raise ValueError(f"must be {SASL_DIGEST_MD5} (the only SASL mechanism supported)")
        return SASL_DIGEST_MD5

    @field_validator("sasl_username")
    @classmethod
    def _check_sasl_username(cls, value: str) -> str:
        if value and not _SASL_ID.fullmatch(value):
            raise ValueError("must be printable ASCII without spaces, ':' or ','")
        return value

    def reader_ids(self) -> list[tuple[str, str]]:
        """``readers`` as (scheme, id) pairs, in order, without duplicates."""
        pairs = [item.strip().partition(":") for item in self.readers.split(",")]
        return list(dict.fromkeys((scheme, ident) for scheme, _, ident in pairs if scheme))

    @field_validator("auth")
    @classmethod
    def _check_auth(cls, value: SecretStr) -> SecretStr:
        user, colon, password = value.get_secret_value().partition(":")
        if (user or colon) and not (user and password):
            raise ValueError("must be user:password (digest) or empty")
        return value


class PostgresConfig(Section):
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


class NodeConfig(Section):
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
    on_session_loss: Literal["exit", "rejoin"] = "rejoin"
    """What a node does once its ZooKeeper session is lost (its term, if any, ended): rejoin
    (keep the old session if ZooKeeper confirms it with the node's znode, else a new one, the
    old one closed first: docs/design.md §4), or exit 3 for a supervisor to restart it."""
    log_format: Literal["text", "json"] = "text"
    shutdown_timeout_s: Float = Field(default=10.0, gt=0)
    state_dir: str = ""
    """An absolute path: the folder where the node keeps its state files (its ZooKeeper
    session, :mod:`allocator.session.file`); created mode 0700 if missing, and it must not
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
        check_host_port(value, min_port=0, port_required=True)
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


class PoolConfig(Section):
    """``[pool]``: how many blocks the leader keeps cut ahead, and the jobs around them."""

    min_blocks: Int = Field(default=6_144, ge=1)
    """The floor the leader keeps whatever the claim rate, and the level a node waits for
    before ``/readyz`` answers ready. It is sized for a step from idle to the fastest claim
    rate: a pool below :attr:`low_watermark_blocks` wakes the refill, whose first cut lands
    within ~0.3 s (the check interval plus the refill's reads and first write, measured on
    a 2-core machine under that load); 4,096 blocks cover 0.3 s at ~12.8k claims/s (the
    fastest ``allocator bench claims`` reached here), and the 2,048 above that keep small
    swings from waking the refill. Every block held idles towards ``pool.max_block_age_s``,
    so a quiet cluster voids about ``min_blocks / (bound - ahead) - rate`` blocks a second
    (78,031 an hour measured at 1 claim/s with the defaults):
    lower both settings when the peak claim rate is known to be lower (docs/operations.md,
    "Pool sizing")."""
    runway_s: Float = Field(default=60.0, ge=0)
    max_blocks: Int = Field(default=1_000_000, ge=1)
    """The cap. It covers a handover (the session timeout plus :attr:`handover_margin_s`,
    15 s by default) at claim rates up to ``max_blocks / 15 s``: ~66k blocks/s, above the
    32k blocks/s the default layout lets a leader cut. ``config check`` states the rate."""
    low_watermark_blocks: Int = Field(default=4_096, ge=0)
    """Below this the refill is woken at once (:attr:`low_watermark_check_s`): it must cover
    the fastest claim rate for the time the woken refill's first cut takes to land. Unset,
    it is two thirds of :attr:`min_blocks` (4,096 of the default 6,144), so a file that
    sets only the floor stays valid."""
    low_watermark_check_s: Float = Field(default=0.1, gt=0, le=60)
    """How often the leader reads the pool level while the pool is small (below four times
    :attr:`min_blocks`; above that, once per :attr:`refill_interval_s`), and wakes the
    refill at once when it is below :attr:`low_watermark_blocks` (:mod:`jobs.low_water`)."""
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
    max_block_age_s: Float = Field(default=300.0, gt=0)
    """The bound on an ID's age: no block whose first ID lies further than this behind the
    database clock is handed out while a leader serves (``claim_blocks`` voids and skips it;
    the leader voids such blocks in bulk ahead of the bound, :mod:`allocator.config.block_age`).
    5 minutes by default: an ID read as "created around" is off by minutes at most, while the
    bound stays far above what a handover needs (15 s by default), so a pool cut just before
    a leader died still serves through the handover. It must exceed that runway
    (``zookeeper.session_timeout_ms`` + :attr:`handover_margin_s`) and two refill intervals;
    a config where it does not is refused."""
    serve_aged_blocks_without_leader: bool = True
    """While no leader serves (its heartbeat older than
    :func:`allocator.config.block_age.leader_stale_ms`): true (the default) keeps
    ``claim_blocks`` handing out blocks older than the bound, so claims keep working through a
    leaderless stretch, the pool's purpose, at the price of older IDs; false keeps the bound,
    so claims get ``AL003`` once the pool's blocks have all aged."""

    @model_validator(mode="before")
    @classmethod
    def _low_watermark_follows_the_floor(cls, data: Any) -> Any:
        """An unset ``low_watermark_blocks`` is two thirds of a ``min_blocks`` that is set."""
        if not isinstance(data, dict) or "low_watermark_blocks" in data:
            return data
        floor = data.get("min_blocks")
        if isinstance(floor, bool):
            return data
        try:
            blocks = int(floor)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return data  # unset (the defaults agree) or invalid (reported as such)
        return {**data, "low_watermark_blocks": max(0, blocks * 2 // 3)}


class LeaderConfig(Section):
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


SECTIONS: dict[str, type[Section]] = {
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


def build_layout(section: LayoutConfig) -> layout_mod.Layout:
    """The :class:`~allocator.core.layout.Layout` of a ``[layout]`` section (raises
    :class:`~allocator.core.errors.LayoutError` when its widths do not fit together)."""
    return layout_mod.Layout(
        epoch_ms=section.epoch,
        timestamp_bits=section.timestamp_bits,
        datacenter_bits=section.datacenter_bits,
        lane_bits=section.lane_bits,
        sequence_bits=section.sequence_bits,
    )
