"""CLI commands, one module each; ``COMMANDS`` is what ``allocator.cli`` registers."""

from __future__ import annotations

import click

from allocator.commands import (  # the bench_* modules register on `bench`
    alerts,
    bench,
    bench_claims,  # noqa: F401
    bench_client,  # noqa: F401
    bench_slow_consumer,  # noqa: F401
    bench_sustained,  # noqa: F401
    claim,
    config_cmd,
    decode,
    demo,
    drill,
    fence_cmd,
    local,
    migrate_cmd,
    pool_cmd,
    reap,
    run,
    status,
)

COMMANDS: list[click.Command] = [
    alerts.alerts,
    bench.bench,
    claim.claim,
    config_cmd.config,
    decode.decode,
    demo.demo,
    drill.drill,
    fence_cmd.fence_group,
    local.local,
    migrate_cmd.migrate_command,
    pool_cmd.pool_group,
    reap.reap_session,
    run.run,
    status.status,
    status.step_down,
    status.watch,
]
