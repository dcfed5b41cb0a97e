"""CPU time by role during a run, from ``/proc/<pid>/stat``: the primary's claim backends,
its node backends, its WAL writer and walsender, the rest of it, the standby, the nodes and
ZooKeeper (pgbench's own is measured by :mod:`allocator.bench.claims.pgbench`).

Processes born during the run count from zero; one that exits between two samples loses
what it used since the last one (pgbench's backends: at most one sample interval)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from allocator.local.nodes import CONSUMER_LOGIN_ROLE, NODE_LOGIN_ROLE

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class Roots:
    """The pids each role descends from."""

    primary: int
    standby: int | None
    nodes: tuple[int, ...]
    zookeeper: tuple[int, ...]


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    cpu_s: float
    title: str


def read_procs() -> dict[int, Proc]:
    """Every process's parent, CPU time (user + system) and command line (a postgres
    process's title: ``postgres: allocator_app allocator 127.0.0.1(…) idle``)."""
    found: dict[int, Proc] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        found[int(entry.name)] = Proc(
            pid=int(entry.name),
            ppid=int(fields[1]),
            cpu_s=(int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
            title=title.strip(),
        )
    return found


def role_of(proc: Proc, procs: dict[int, Proc], roots: Roots) -> str | None:
    """The role a process plays, by the root it descends from (None: not the cluster's)."""
    pid, seen = proc.pid, 0
    while pid > 1 and seen < 64:
        if pid == roots.primary:
            return _primary_role(proc.title)
        if pid == roots.standby:
            return "standby"
        if pid in roots.nodes:
            return "nodes"
        if pid in roots.zookeeper:
            return "zookeeper"
        parent = procs.get(pid)
        if parent is None:
            return None
        pid, seen = parent.ppid, seen + 1
    return None


def _primary_role(title: str) -> str:
    if title.startswith(f"postgres: {CONSUMER_LOGIN_ROLE} "):
        return "primary: claim backends"
    if title.startswith(f"postgres: {NODE_LOGIN_ROLE} "):
        return "primary: node backends"
    if title.startswith("postgres: walsender"):
        return "primary: walsender"
    if title.startswith("postgres: walwriter"):
        return "primary: walwriter"
    return "primary: other"


class CpuMeter:
    """CPU seconds by role between :meth:`start` and the last :meth:`sample`."""

    def __init__(self, roots: Roots) -> None:
        self._roots = roots
        self._baseline: dict[int, float] = {}
        self._last: dict[int, tuple[str, float]] = {}

    def start(self) -> None:
        self._baseline = {pid: proc.cpu_s for pid, proc in read_procs().items()}
        self._last = {}
        self.sample()

    def sample(self) -> None:
        procs = read_procs()
        for proc in procs.values():
            if (role := role_of(proc, procs, self._roots)) is not None:
                self._last[proc.pid] = (role, proc.cpu_s)

    def by_role(self) -> dict[str, float]:
        """CPU seconds each role used since :meth:`start`."""
        used: dict[str, float] = {}
        for pid, (role, cpu_s) in self._last.items():
            used[role] = used.get(role, 0.0) + cpu_s - self._baseline.get(pid, 0.0)
        return {role: round(seconds, 2) for role, seconds in sorted(used.items())}


def shares(
    cpu_s: dict[str, float], seconds: float, extra: Iterable[tuple[str, float]]
) -> dict[str, float]:
    """Each role's CPU seconds as a share of the run's capacity (seconds x CPUs)."""
    capacity = seconds * (os.cpu_count() or 1)
    every = {**cpu_s, **dict(extra)}
    return {role: round(used / capacity, 3) for role, used in every.items()} if capacity else {}


def machine_busy_s() -> tuple[float, float]:
    """The whole machine's (busy, total) CPU seconds so far, from ``/proc/stat``: what every
    process on it used, the bench's cluster or not (the machine is shared)."""
    fields = [int(v) for v in (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # up to steal; guest time is already inside user
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS
