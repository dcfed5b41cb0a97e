"""The mixed schedule: a random, seeded sequence of faults, sometimes two at once."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Final

PAIR_PROBABILITY: Final = 0.25
PAIRABLE_NODE_FAULTS: Final = frozenset(
    {"graceful", "step-down", "kill", "pause", "expire", "host-death"}
)
PAIRABLE_SERVER_FAULTS: Final = ("zk-server-kill", "pg-restart")
SURVIVABLE: Final = frozenset(
    {"step-down", "zk-partition-short", "zk-server-kill", "pg-restart", "pg-failover",
     "pg-partition"}
)  # fmt: skip
"""The faults every node process lives through (no restart): a soak draws from these, so
the same processes meet hours of faults and their growth can be judged (a node restarted
every minute has nothing to leak; the mixed schedule covers the faults that restart)."""


def mixed(seed: int, rounds: int, allowed: Iterable[str]) -> list[tuple[str, ...]]:
    """``rounds`` rounds, each the scenario names applied at once (one or two).

    Pure: the same seed, round count and allowed scenarios give the same schedule
    (``random.Random(seed)``, nothing else random), so ``--seed`` repeats a run. Each round
    draws one scenario uniformly; with probability :data:`PAIR_PROBABILITY` a round whose
    fault hits the leader's process or session also gets a server fault at the same moment
    (:data:`PAIRABLE_SERVER_FAULTS`): only pairs whose expected outcome stays clear (the
    handover must follow, the server comes back); clock and partition faults run alone."""
    names = sorted(set(allowed))
    if not names:
        raise ValueError("no scenario is allowed on this target")
    servers: Sequence[str] = [s for s in PAIRABLE_SERVER_FAULTS if s in names]
    rng = random.Random(seed)  # noqa: S311 (a repeatable schedule, not a secret)
    schedule: list[tuple[str, ...]] = []
    for _ in range(rounds):
        first = rng.choice(names)
        pair = rng.random() < PAIR_PROBABILITY
        if pair and first in PAIRABLE_NODE_FAULTS and servers:
            schedule.append((first, rng.choice(servers)))
        else:
            schedule.append((first,))
    return schedule


def soak(seed: int, rounds: int, allowed: Iterable[str]) -> list[tuple[str, ...]]:
    """A mixed schedule of the faults node processes survive (see :data:`SURVIVABLE`)."""
    survivable = [name for name in allowed if name in SURVIVABLE]
    return mixed(seed, rounds, survivable)
