"""How long the pool must last: the runway a handover needs, and what the settings cover.

Pure functions of a :class:`~allocator.config.Config` (and a measured rate): no I/O.
"""

from __future__ import annotations

import math

from allocator.config.model import Config


def needed_runway_s(config: Config) -> float:
    """Seconds the pool must last: the session timeout plus the handover margin.

    The pool exists to serve through a failover: a crashed or partitioned leader's session
    must lapse first, then detection, the takeover and the successor's first refill
    (``pool.handover_margin_s``). Nodes export it (``allocator_pool_runway_needed_seconds``)
    and the alert ``AllocatorPoolRunwayShort`` pages when the runway is shorter.
    """
    return config.zookeeper.session_timeout_ms / 1000 + config.pool.handover_margin_s


def aimed_runway_s(config: Config) -> float:
    """Seconds of claims the refill keeps cut ahead: ``pool.runway_s``, never less than a
    handover needs."""
    return max(config.pool.runway_s, needed_runway_s(config))


def covered_rate_blocks_per_s(config: Config) -> float:
    """The highest claim rate (blocks/s) at which ``pool.max_blocks`` covers a handover.

    The refill's target is capped by ``pool.max_blocks`` (:func:`target_blocks`), so the cap
    decides this rate; ``config check`` and ``status`` warn above it (:func:`rate_warning`)."""
    return config.pool.max_blocks / needed_runway_s(config)


def target_blocks(config: Config, claim_rate_blocks_per_s: float | None) -> int:
    """How many available blocks the leader aims for at the given claim rate."""
    pool = config.pool
    by_rate = math.ceil((claim_rate_blocks_per_s or 0.0) * aimed_runway_s(config))
    return min(max(pool.min_blocks, by_rate), pool.max_blocks)


def config_warnings(config: Config) -> list[str]:
    """What ``config check`` says about these settings (none of it stops a node): today,
    that a frozen leader's open transaction would outlast its session."""
    warnings: list[str] = []
    session_ms = config.zookeeper.session_timeout_ms
    idle_ms = config.postgres.idle_in_transaction_timeout_ms
    if idle_ms >= session_ms:
        warnings.append(
            f"postgres.idle_in_transaction_timeout_ms ({idle_ms}) is not below "
            f"zookeeper.session_timeout_ms ({session_ms}): a frozen leader's open transaction "
            "holds the fence row past its session, and delays the handover"
        )
    return warnings


def coverage(config: Config) -> dict[str, float]:
    """What the settings cover, for ``config check`` and ``status``."""
    return {
        "needed_runway_s": needed_runway_s(config),
        "aimed_runway_s": aimed_runway_s(config),
        "covered_rate_blocks_per_s": round(covered_rate_blocks_per_s(config), 1),
    }


def coverage_line(config: Config) -> str:
    """One sentence: the claim rate up to which ``pool.max_blocks`` covers a handover."""
    return (
        f"pool.max_blocks ({config.pool.max_blocks}) covers a handover of "
        f"{needed_runway_s(config):g} s (zookeeper.session_timeout_ms + "
        f"pool.handover_margin_s) at claim rates up to "
        f"{covered_rate_blocks_per_s(config):,.0f} blocks/s"
    )


def rate_warning(config: Config, claim_rate_blocks_per_s: float | None) -> str | None:
    """Why the pool cannot cover a handover at the measured claim rate, or None."""
    if not claim_rate_blocks_per_s:
        return None
    covered = covered_rate_blocks_per_s(config)
    if claim_rate_blocks_per_s <= covered:
        return None
    return (
        f"the claim rate ({claim_rate_blocks_per_s:,.0f} blocks/s) is above what "
        f"pool.max_blocks ({config.pool.max_blocks}) covers through a handover of "
        f"{needed_runway_s(config):g} s ({covered:,.0f} blocks/s): consumers will see "
        "'pool empty' (AL003) during a failover; raise pool.max_blocks"
    )
