"""Prometheus metrics of one node, in a registry of its own (no global state): the list of
every metric (docs/design.md §7).

Names are ``allocator_*`` with units in the name; counters end in ``_total``. Every metric
an alert rule or the dashboard uses (deploy/prometheus, deploy/grafana) is defined here and
nowhere else. A node creates one :class:`NodeMetrics`; tests create as many as they like.
"""

from __future__ import annotations

import math
import platform

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client import Enum as EnumMetric

from allocator import __version__
from allocator.core.records import BlockAgeStatus

SESSION_STATES = ["connecting", "connected", "suspended", "lost"]
BLOCKED_REASONS = (
    "database_unreachable",
    "fence_generation_unreadable",
    "fence_ahead_of_zookeeper",
    "database_behind_zookeeper",
)
"""Why a node first in the election cannot take the fence (``allocator_blocked``)."""


CLAIMED_AGE_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
"""Buckets of ``allocator_claimed_block_age_seconds``: they bracket the default bound (300 s)
and bounds down to a few seconds (tests) and up to an hour."""


class NodeMetrics:
    """The metrics a node exports on ``/metrics``.

    - Pool figures (``allocator_pool_*``) do not depend on which node leads: every node
      reads ``pool_status`` itself (:mod:`allocator.node.pool_watch`), so any scraped node
      tells the pool's state and a follower never exports a made-up 0. Until a node's first
      reading they are NaN, never 0.
    - The age of an ID (``allocator_pool_oldest_block_age_seconds``,
      ``allocator_pool_max_block_age_seconds``, ``allocator_claimed_block_age_seconds``,
      ``allocator_blocks_voided_aged_total``) comes from the leader's jobs only, so only the
      leader exports the gauges: NaN elsewhere, and NaN again once it stops leading. The
      oldest block's age is NaN while the pool is empty, the bound NaN before a leader of
      migration 0011 wrote one.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build = Info("allocator_build", "The allocator version this node runs", registry=r)
        self.build.info({"version": __version__, "python": platform.python_version()})
        self.is_leader = Gauge("allocator_is_leader", "1 while this node may write", registry=r)
        self.ready = Gauge(
            "allocator_ready",
            "1 while /readyz answers ready (ZooKeeper connected, database reachable, the pool "
            "at pool.min_blocks or above since it last ran empty)",
            registry=r,
        )
        self.fence_epoch = Gauge(
            "allocator_fence_epoch",
            "Epoch (czxid) of this node's current term, 0 if none",
            registry=r,
        )
        self.session = EnumMetric(
            "allocator_zookeeper_session",
            "ZooKeeper session state",
            states=SESSION_STATES,
            registry=r,
        )
        self.session_timeout = Gauge(
            "allocator_zookeeper_session_timeout_seconds",
            "The session timeout the ZooKeeper server granted (the self-stop waits the smaller "
            "of it and zookeeper.session_timeout_ms); NaN before the first session",
            registry=r,
        )
        self.session_timeout.set(math.nan)
        self.terms = Counter("allocator_terms", "Leadership terms begun by this node", registry=r)
        self.blocks_cut = Counter("allocator_blocks_cut", "Blocks cut and committed", registry=r)
        self.ids_cut = Counter("allocator_ids_cut", "IDs in blocks cut and committed", registry=r)
        self.fenced_writes_rejected = Counter(
            "allocator_fenced_writes_rejected",
            "Writes PostgreSQL rejected because this node's epoch no longer holds the fence",
            registry=r,
        )
        self.writes_abandoned = Counter(
            "allocator_writes_abandoned",
            "Writes rolled back because leadership came into doubt before commit",
            registry=r,
        )
        self.clock_behind = Gauge(
            "allocator_clock_behind_alert",
            "1 while cutting is refused because the clock is behind the high-water mark",
            registry=r,
        )
        self.time_range_exhausted = Gauge(
            "allocator_time_range_exhausted",
            "1 when the layout's time bits have run out: no block can be cut",
            registry=r,
        )
        self.pool_available_blocks = Gauge(
            "allocator_pool_available_blocks", "Unclaimed blocks in the pool", registry=r
        )
        self.pool_runway_seconds = Gauge(
            "allocator_pool_runway_seconds",
            "Pool runway at the observed claim rate (+Inf while nothing is claimed)",
            registry=r,
        )
        self.pool_claim_rate = Gauge(
            "allocator_pool_claim_rate_blocks_per_second",
            "Blocks claimed per second, from the leader's pool samples (0 while unknown)",
            registry=r,
        )
        self.claims_paused = Gauge(
            "allocator_claims_paused",
            "1 while an operator has paused claims (allocator pool pause, or a database the "
            "restore procedure reset): claim_blocks answers AL004",
            registry=r,
        )
        self.claims_paused.set(math.nan)
        self.pool_runway_needed_seconds = Gauge(
            "allocator_pool_runway_needed_seconds",
            "The runway a handover needs: zookeeper.session_timeout_ms + pool.handover_margin_s",
            registry=r,
        )
        for gauge in (self.pool_available_blocks, self.pool_runway_seconds, self.pool_claim_rate):
            gauge.set(math.nan)
        self.pool_oldest_block_age_seconds = Gauge(
            "allocator_pool_oldest_block_age_seconds",
            "How far the oldest unclaimed block's first ID lies behind the database clock "
            "(allocator.block_age_status; NaN while the pool is empty or on a follower)",
            registry=r,
        )
        self.pool_max_block_age_seconds = Gauge(
            "allocator_pool_max_block_age_seconds",
            "The bound on an ID's age in force (pool.max_block_age_s, as the leader's heartbeat "
            "wrote it; NaN on a follower)",
            registry=r,
        )
        for gauge in (self.pool_oldest_block_age_seconds, self.pool_max_block_age_seconds):
            gauge.set(math.nan)
        self.claimed_block_age_seconds = Histogram(
            "allocator_claimed_block_age_seconds",
            "Age of the blocks handed out (claimed_at minus the first ID's time), sampled by the "
            "leader from the claims since its previous sampling run (voided blocks left out)",
            buckets=CLAIMED_AGE_BUCKETS_S,
            registry=r,
        )
        self.blocks_voided_aged = Counter(
            "allocator_blocks_voided_aged",
            "Unclaimed blocks the leader voided because they were about to pass the bound on "
            "an ID's age (claimed_by allocator:voided-aged)",
            registry=r,
        )
        self.refill_seconds = Histogram(
            "allocator_refill_duration_seconds", "Time of one refill run", registry=r
        )
        self.fence_generation = Gauge(
            "allocator_fence_generation",
            "Generation of this node's current term's token, 0 if none (fence rebase advances it)",
            registry=r,
        )
        self.fence_ahead_of_zookeeper = Gauge(
            "allocator_fence_ahead_of_zookeeper",
            "1 while the database's fence holds a token this ZooKeeper ensemble cannot have "
            "issued (ensemble wiped or restored): run `allocator fence rebase`",
            registry=r,
        )
        self.clock_offset_seconds = Gauge(
            "allocator_clock_offset_seconds",
            "Database server clock minus this node's clock at the last probe",
            registry=r,
        )
        self.clock_skew = Gauge(
            "allocator_clock_skew_alert",
            "1 while this node's clock disagrees with the database's beyond pool.max_clock_skew_ms "
            "(it does not cut)",
            registry=r,
        )
        self.database_behind_zookeeper = Gauge(
            "allocator_database_behind_zookeeper",
            "1 while the database's fence or high-water mark lies below ZooKeeper's watermark "
            "(restored from a backup, or failed over to a standby that missed commits): no "
            "takeover, no cutting until an operator resets the pool",
            registry=r,
        )
        self.async_replication = Gauge(
            "allocator_async_replication",
            "1 while the database has standbys that no commit waits for (a failover may lose "
            "acknowledged claims); the leader then cuts nothing unless "
            "postgres.allow_async_replication",
            registry=r,
        )
        self.async_replication_allowed = Gauge(
            "allocator_async_replication_allowed",
            "1 if postgres.allow_async_replication is set: this node cuts on asynchronous standbys",
            registry=r,
        )
        self.database_reachable = Gauge(
            "allocator_database_reachable",
            "1 if the last probe of the database succeeded",
            registry=r,
        )
        self.mark_ahead_seconds = Gauge(
            "allocator_mark_ahead_seconds",
            "How far the high-water mark lies ahead of the database clock (0 when not ahead); "
            "the leader cuts densely after it until real time catches up",
            registry=r,
        )
        self.handover_withheld = Gauge(
            "allocator_handover_withheld",
            "1 while this leader should hand over (clock or database) but no contender "
            "advertises that it can do better",
            registry=r,
        )
        self.layout_mismatch = Gauge(
            "allocator_layout_mismatch",
            "1 when the database recorded another layout or datacenter than this node's",
            registry=r,
        )
        self.zookeeper_insecure = Gauge(
            "allocator_zookeeper_insecure",
            "1 if this node runs without ZooKeeper ACLs (zookeeper.insecure, no zookeeper.auth)",
            registry=r,
        )
        self.election_unparsable_znodes = Gauge(
            "allocator_election_unparsable_znodes",
            "Election znodes whose data does not parse at the last scan (they keep their place "
            "in the queue; someone other than our nodes wrote them)",
            registry=r,
        )
        self.election_queue_length = Gauge(
            "allocator_election_queue_length",
            "Contenders in the election queue at the last scan (the leader included)",
            registry=r,
        )
        self.layout_time_left_seconds = Gauge(
            "allocator_layout_time_left_seconds",
            "Seconds until the layout's time bits run out (then no block can be cut)",
            registry=r,
        )
        self.election_ignored_znodes = Gauge(
            "allocator_election_ignored_znodes",
            "Children of the election path that take no place in the queue at the last scan "
            "(not ephemeral, or not named n-<32 hex>-<10 digits>)",
            registry=r,
        )
        self.blocked = Gauge(
            "allocator_blocked",
            "1 for the reason this node, first in the election, cannot take the fence "
            "(one series per reason; all 0 while it leads or follows)",
            ["reason"],
            registry=r,
        )
        for reason in BLOCKED_REASONS:
            self.blocked.labels(reason=reason).set(0)
        self.job_errors = Counter(
            "allocator_job_errors",
            "Scheduled job runs that failed (label task: not job, which Prometheus owns)",
            ["task"],
            registry=r,
        )

    def pool_observed(
        self,
        available_blocks: int,
        runway_s: float | None,
        claim_rate: float | None,
        *,
        claims_paused: bool = False,
    ) -> None:
        """One reading of ``pool_status`` (runway None: nothing claimed, so unbounded)."""
        self.claims_paused.set(int(claims_paused))
        self.pool_available_blocks.set(available_blocks)
        self.pool_runway_seconds.set(math.inf if runway_s is None else runway_s)
        self.pool_claim_rate.set(claim_rate or 0.0)

    def block_age_observed(self, status: BlockAgeStatus) -> None:
        """One reading of ``block_age_status`` by the leader (NaN for what it has not)."""
        oldest, bound = status.oldest_unclaimed_age_ms, status.max_block_age_ms
        self.pool_oldest_block_age_seconds.set(math.nan if oldest is None else oldest / 1000)
        self.pool_max_block_age_seconds.set(math.nan if bound is None else bound / 1000)

    def blocked_by(self, reason: str | None) -> None:
        """``allocator_blocked``: 1 for ``reason`` (one of :data:`BLOCKED_REASONS`), 0 for
        the others; None: not blocked."""
        for known in BLOCKED_REASONS:
            self.blocked.labels(reason=known).set(int(known == reason))

    def leadership_ended(self) -> None:
        """Reset what only a leader exports (its term, its cutting alerts, the age gauges),
        so an ex-leader never keeps exporting a stale alert.
        """
        for gauge in (
            self.is_leader,
            self.fence_epoch,
            self.fence_generation,
            self.handover_withheld,
            self.clock_behind,
            self.time_range_exhausted,
            self.mark_ahead_seconds,
            self.async_replication,
        ):
            gauge.set(0)
        for gauge in (self.pool_oldest_block_age_seconds, self.pool_max_block_age_seconds):
            gauge.set(math.nan)
