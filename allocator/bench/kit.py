"""What every ``allocator bench`` command shares: the embedded cluster it brings up and stops
(or the given database), progress lines on stderr, the machine's description and the JSON.
"""

from __future__ import annotations

import os
import platform
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from allocator.bench.server import Server
from allocator.local.cluster import LocalCluster
from allocator.local.info import ClusterInfo

NOT_EMBEDDED: dict[str, Any] = {"state_dir": None, "started": False, "stopped": False}
"""The ``cluster`` object of a run against a given database URL."""


def progress(message: str) -> None:
    """One line of a bench's progress, on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def timestamp() -> str:
    """Now in UTC, as the JSON file's name carries it (``20261203T142501Z``)."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


@contextmanager
def embedded_cluster(
    state_dir: Path,
    keep: bool,
    *,
    nodes: int = 0,
    node_env: Mapping[str, str] | None = None,
    pg_standby: bool = False,
) -> Iterator[tuple[ClusterInfo, dict[str, Any]]]:
    """One ZooKeeper server, PostgreSQL (migrated; with ``pg_standby`` its synchronous
    standby too) and ``nodes`` nodes in ``state_dir``; yields the cluster's info and the JSON
    describing it (completed as it stops).

    Started here and stopped here (by pid, through :meth:`LocalCluster.down`) unless
    ``keep``; a second SIGTERM during that cleanup is ignored. The JSON says whether the
    cluster was started and stopped, and lists the pids it ran."""
    cluster = LocalCluster(
        state_dir, zk_servers=1, nodes=nodes, node_env=node_env, pg_standby=pg_standby
    )
    info_json: dict[str, Any] = {"state_dir": str(cluster.state_dir), "started": False}
    came_up = False
    try:
        what = f"{nodes} node" + ("" if nodes == 1 else "s") if nodes else "no node"
        standby = ", a synchronous standby" if pg_standby else ""
        progress(
            f"starting the embedded cluster in {cluster.state_dir} (1 ZooKeeper{standby}, {what})"
        )
        info = cluster.up(migrate=True, nodes=nodes)
        came_up = True
        info_json["started"] = True
        info_json["pids"] = sorted(
            {
                pid
                for pid in [
                    info.postgres.pid,
                    *(s.pid for s in info.pg_servers),
                    info.supervisor_pid,
                    *(s.pid for s in info.zk_servers),
                    *(n.pid for n in info.nodes),
                ]
                if pid
            }
        )
        yield info, info_json
    finally:
        info_json["stopped"] = False
        if came_up and not keep:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut cleanup
            progress("stopping the embedded cluster")
            cluster.down()
            info_json["stopped"] = True
        elif came_up:
            progress(f"left running: allocator local down --state-dir {cluster.state_dir}")


@contextmanager
def bench_server(
    url: str | None, state_dir: Path, keep: bool
) -> Iterator[tuple[Server, dict[str, Any]]]:
    """The server to bench on: ``url`` (a superuser URL: the bench makes databases of its
    own there), or the embedded cluster with no node (the bench is the only leader: nobody
    cuts or requeues behind its back)."""
    if url:
        yield Server(superuser_url=url), dict(NOT_EMBEDDED)
        return
    with embedded_cluster(state_dir, keep) as (info, info_json):
        yield (
            Server(superuser_url=info.database_url, consumer_url=info.consumer_database_url),
            info_json,
        )


def machine(
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    **extra: Any,
) -> dict[str, Any]:
    """The JSON's ``machine`` object: CPUs, load averages around the run, Python."""
    return {
        "cpus": os.cpu_count(),
        "loadavg_before": list(load_before),
        "loadavg_after": list(load_after),
        "python": platform.python_version(),
        **extra,
    }


def hardware() -> dict[str, Any]:
    """The CPU model and the memory, from ``/proc`` (empty where it cannot be read): the
    hardware a figure was measured on, for a page that quotes it."""
    found: dict[str, Any] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                found["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                found["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    found["kernel"] = platform.release()
    return found
