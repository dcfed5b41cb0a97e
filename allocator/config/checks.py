"""Rules between keys: what each section's own checks cannot see (:func:`cross_check`).
Both :func:`allocator.config.load_config` and :class:`~allocator.config.Config` run them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel

from allocator.config.sections import (
    ClusterConfig,
    LayoutConfig,
    LeaderConfig,
    PoolConfig,
    PostgresConfig,
    ZookeeperConfig,
    build_layout,
)
from allocator.core.errors import LayoutError

_WIDTH_KEYS = tuple(f"layout.{name}" for name in LayoutConfig.model_fields if name.endswith("bits"))
_LAYOUT_FIELD_KEYS = {"epoch_ms": "layout.epoch"} | {k.split(".")[1]: k for k in _WIDTH_KEYS}

Problem = tuple[str, str, object]
"""A problem between keys: the dotted key to blame, the message, that key's effective value."""


def cross_check(
    sections: Mapping[str, BaseModel], set_keys: Iterable[str] = (), now_ms: int | None = None
) -> list[Problem]:
    """Rules spanning keys; each runs when the sections it needs passed their own checks.

    ``set_keys`` are the keys given by some source (to blame for widths that do not add
    up); ``now_ms`` enables the check that the epoch is not in the future.
    """
    problems: list[Problem] = []
    lay, cluster = sections.get("layout"), sections.get("cluster")
    if isinstance(lay, LayoutConfig):
        try:
            built = build_layout(lay)
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
        problems += _zookeeper_problems(zookeeper)
    if isinstance(pool, PoolConfig):
        problems += _block_age_problems(pool, zookeeper)
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


def _block_age_problems(pool: PoolConfig, zookeeper: BaseModel | None) -> list[Problem]:
    """``pool.max_block_age_s`` must exceed the runway a handover needs (a pool cut just before
    a leader died must not age out during the handover) and the void job's lead of at least
    two refill intervals (:mod:`allocator.config.block_age`)."""
    problems: list[Problem] = []
    bound = pool.max_block_age_s
    if isinstance(zookeeper, ZookeeperConfig):
        needed = zookeeper.session_timeout_ms / 1000 + pool.handover_margin_s
        if bound <= needed:
            message = (
                f"must be > the runway a handover needs, zookeeper.session_timeout_ms + "
                f"pool.handover_margin_s ({needed:g} s)"
            )
            problems.append(("pool.max_block_age_s", message, bound))
    least = 2 * pool.refill_interval_s
    if bound <= least:
        message = f"must be > 2 x pool.refill_interval_s ({least:g} s)"
        problems.append(("pool.max_block_age_s", message, bound))
    return problems


def _zookeeper_problems(zk: ZookeeperConfig) -> list[Problem]:
    """The identity keys (``auth`` and/or SASL) against ``insecure``, ``world_readable`` and
    ``readers``; SASL's username and password together; TLS's files with ``tls``
    (verification is always on, so TLS needs a CA)."""
    problems: list[Problem] = []
    has_auth = bool(zk.auth.get_secret_value())
    has_sasl = bool(zk.sasl_username)
    if has_sasl and not zk.sasl_password.get_secret_value():
        problems.append(("zookeeper.sasl_password", "must be set with zookeeper.sasl_username", ""))
    if zk.sasl_password.get_secret_value() and not has_sasl:
        message = "needs zookeeper.sasl_username (whose password it is)"
        problems.append(("zookeeper.sasl_password", message, zk.sasl_password))
    identity = "zookeeper.auth or zookeeper.sasl_username"
    if zk.insecure and (has_auth or has_sasl):
        given = "zookeeper.auth" if has_auth else "zookeeper.sasl_username"
        message = f"must be false when {given} is set (the ACLs are used)"
        problems.append(("zookeeper.insecure", message, True))
    if zk.world_readable and not (has_auth or has_sasl):
        message = f"needs {identity} (without it every znode is open to all anyway)"
        problems.append(("zookeeper.world_readable", message, True))
    if zk.readers.strip() and not (has_auth or has_sasl):
        message = f"needs {identity} (without it every znode is open to all anyway)"
        problems.append(("zookeeper.readers", message, zk.readers))
    if zk.tls and not zk.tls_ca_file:
        message = (
            "must be set when zookeeper.tls is true: the servers' certificates are always "
            "verified (a PEM file of the CA that signed them)"
        )
        problems.append(("zookeeper.tls_ca_file", message, ""))
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        value = getattr(zk, key)
        if value and not zk.tls:
            message = "needs zookeeper.tls = true (it would be ignored)"
            problems.append((f"zookeeper.{key}", message, value))
    if zk.tls and bool(zk.tls_cert_file) != bool(zk.tls_key_file):
        key, other = ("tls_key_file", "tls_cert_file")
        if zk.tls_key_file:
            key, other = other, key
        message = f"must be set with zookeeper.{other} (mutual TLS needs both)"
        problems.append((f"zookeeper.{key}", message, ""))
    if zk.tls_key_password.get_secret_value() and not zk.tls_key_file:
        message = "needs zookeeper.tls_key_file (whose password it is)"
        problems.append(("zookeeper.tls_key_password", message, zk.tls_key_password))
    return problems
