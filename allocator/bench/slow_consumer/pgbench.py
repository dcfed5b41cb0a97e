"""The claims of ``allocator bench slow-consumer``: pgbench at a fixed rate, and its logs."""

from __future__ import annotations

import math
import re
import subprocess
import tempfile
from pathlib import Path

from allocator.bench.claims.sql import script
from allocator.bench.server import BenchError, Server
from allocator.bench.slow_consumer.plan import Plan
from allocator.bench.slow_consumer.stats import Claim
from allocator.config import process_environment

PGBENCH_GRACE_S = 120.0


def claims(server: Server, database: str, plan: Plan, count: int) -> tuple[list[Claim], bool, str]:
    """``count`` claims by pgbench at the plan's rate; every claim's end time and execution
    time, by end time; whether a client aborted (AL003) and pgbench's stderr.

    The bundled ``claim_blocks.pgbench`` (one block per claim) as the consumer role,
    ``-n -M prepared -c C -j min(C, 2) -R rate -t count/C -l``. A claim's latency is its
    logged time minus its schedule lag: its own execution, whatever the rate limiter's
    queue did. A run past its time limit is killed; any failure but an abort raises
    :class:`BenchError`."""
    conninfo, env = server.claim_conninfo(database)
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as tmp:
        folder = Path(tmp)
        script_path = folder / "claim_blocks.pgbench"
        script_path.write_text(script("claim_blocks.pgbench"))
        argv = [
            str(server.pgbench),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(plan.clients),
            "-j",
            str(min(plan.clients, 2)),
            "-R",
            str(plan.rate),
            "-t",
            str(math.ceil(count / plan.clients)),
            "-f",
            str(script_path),
            "-D",
            "batch=1",
            "-l",
            f"--log-prefix={folder / 'tx'}",
            conninfo,
        ]
        limit = count / plan.rate * 3 + PGBENCH_GRACE_S
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
                env={**process_environment(), "PGAPPNAME": "bench-slow-consumer", **env},
            )
        except subprocess.TimeoutExpired as exc:  # run() has killed pgbench
            raise BenchError(f"pgbench ran over {limit:.0f} s") from exc
        aborted = done.returncode == 2 and "aborted" in done.stderr
        if done.returncode != 0 and not aborted:
            raise BenchError(
                f"pgbench failed (exit {done.returncode}): "
                + " | ".join(done.stderr.strip().splitlines()[-3:])
            )
        return _read_claims(folder), aborted, done.stderr


_LOG_LINE = re.compile(r"^\d+ \d+ (\d+) \d+ (\d+) (\d+) (\d+)")


def _read_claims(folder: Path) -> list[Claim]:
    """pgbench -R logs ``client tx time_us script epoch_s epoch_us lag_us`` per line."""
    claims: list[Claim] = []
    for path in folder.glob("tx.*"):
        with path.open() as lines:
            for line in lines:
                if match := _LOG_LINE.match(line):
                    total, seconds, micros, lag = (int(g) for g in match.groups())
                    claims.append(Claim(ended=seconds + micros / 1e6, exec_us=total - lag))
    claims.sort(key=lambda c: c.ended)
    return claims
