"""One pgbench run of a bundled script, and what it measured."""

from __future__ import annotations

import re
import resource
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from allocator.bench.claims.sql import script
from allocator.bench.server import BenchError, Server
from allocator.config import process_environment

PGBENCH_GRACE_S = 120.0


@dataclass(frozen=True)
class Pgbench:
    """What one pgbench run measured."""

    transactions: int
    tps: float
    latencies_us: list[int]
    aborted: bool
    stderr: str
    cpu_s: float
    """CPU time (user + system) pgbench itself used: the load generator's own cost."""


def run_pgbench(
    server: Server,
    conninfo: str,
    script_name: str,
    clients: int,
    *,
    seconds: float | None = None,
    transactions: int | None = None,
    defines: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    latency_log: bool = True,
) -> Pgbench:
    """One pgbench run of a bundled script; the per-transaction latencies when logged.

    ``pgbench -n -M prepared -c C -j min(C, 2)`` (``-T seconds`` or ``-t transactions``,
    ``-l`` for per-transaction latencies), the script written to a temporary folder from
    :mod:`allocator.bench.claims.sql`. A run past its time limit is killed; a client that
    aborted is reported (``aborted``); any other failure raises :class:`BenchError`."""
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as tmp:
        folder = Path(tmp)
        script_path = folder / script_name
        script_path.write_text(script(script_name))
        argv = [
            str(server.pgbench),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-f",
            str(script_path),
        ]
        if seconds is not None:
            argv += ["-T", str(max(1, round(seconds)))]
        if transactions is not None:
            argv += ["-t", str(transactions)]
        for name, value in (defines or {}).items():
            argv += ["-D", f"{name}={value}"]
        if latency_log:
            argv += ["-l", f"--log-prefix={folder / 'tx'}"]
        argv.append(conninfo)
        limit = (seconds or 0) + PGBENCH_GRACE_S + (transactions or 0) * clients / 1000
        cpu_before = _children_cpu_s()
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
                env={
                    **process_environment(),
                    "PGAPPNAME": f"bench-{script_name}",
                    **(env or {}),
                },
            )
        except subprocess.TimeoutExpired as exc:  # run() has killed pgbench
            raise BenchError(f"pgbench {script_name} ran over {limit:.0f} s") from exc
        aborted = done.returncode == 2 and "aborted" in done.stderr
        if done.returncode != 0 and not aborted:
            raise BenchError(
                f"pgbench {script_name} failed (exit {done.returncode}): "
                + " | ".join(done.stderr.strip().splitlines()[-3:])
            )
        processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
        latencies = _read_logs(folder) if latency_log else []
    return Pgbench(
        cpu_s=round(_children_cpu_s() - cpu_before, 3),
        transactions=int(processed.group(1)) if processed else 0,
        tps=float(tps.group(1)) if tps else 0.0,
        latencies_us=latencies,
        aborted=aborted,
        stderr=done.stderr,
    )


def _children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far (pgbench runs
    one at a time, so the difference around a run is that run's)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _read_logs(folder: Path) -> list[int]:
    """Per-transaction logs: ``client tx latency_us script epoch_s epoch_us`` per line."""
    latencies: list[int] = []
    for path in folder.glob("tx.*"):
        with path.open() as lines:
            latencies.extend(int(line.split(maxsplit=3)[2]) for line in lines)
    latencies.sort()
    return latencies
