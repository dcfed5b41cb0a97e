"""``allocator decode`` and ``allocator config check`` run as a user runs them: a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.core.exits import Exit
from allocator.core.layout import MAX_ID, Layout
from tests.fixtures.zk import ZK_AUTH

SAMPLE_ID = 1_234_567_890_123_456_789
EX_USAGE, EX_CONFIG = Exit.USAGE, Exit.CONFIG


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI with a clean environment: no ALLOCATOR_* variable leaks in from the caller."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("ALLOCATOR_")}
    return subprocess.run(
        [sys.executable, "-m", "allocator.cli", *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_decode_human() -> None:
    result = run("decode", str(SAMPLE_ID))
    assert result.returncode == 0, result.stderr
    expected = Layout().decode(SAMPLE_ID)
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert lines["id"] == str(SAMPLE_ID)
    assert lines["timestamp"].startswith("2029-04-29T18:12:02.167Z")
    assert (lines["datacenter"], lines["lane"], lines["sequence"]) == (
        str(expected.datacenter),
        str(expected.lane),
        str(expected.sequence),
    )


def test_decode_json() -> None:
    result = run("decode", "--json", str(MAX_ID))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "id": MAX_ID,
        "timestamp_ms": 3_776_860_055_551,
        "time": "2089-09-06T15:47:35.551Z",
        "datacenter": 31,
        "lane": 31,
        "sequence": 4095,
    }


def test_decode_uses_configured_layout(tmp_path: Path) -> None:
    path = tmp_path / "allocator.toml"
    path.write_text("[layout]\ndatacenter_bits = 0\nlane_bits = 10\n")
    result = run("decode", "--json", str(SAMPLE_ID), env={"ALLOCATOR_CONFIG": str(path)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["lane"] == (SAMPLE_ID >> 12) & 1023
    result = run(
        "decode",
        "--json",
        str(SAMPLE_ID),
        "--config",
        str(path),
        "--set",
        "layout.lane_bits=9",
        "--set",
        "layout.datacenter_bits=1",
    )
    assert json.loads(result.stdout)["lane"] == (SAMPLE_ID >> 12) & 511


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["abc"], "error: not an integer: 'abc'"),
        (["-5"], "error: negative: -5; Snowflake IDs are non-negative"),
        (["--", "-5"], "error: negative: -5; Snowflake IDs are non-negative"),
        (["--json", "-5"], "error: negative: -5; Snowflake IDs are non-negative"),
        (
            [str(MAX_ID + 1)],
            f"error: too large: {MAX_ID + 1} exceeds 2^63-1 ({MAX_ID})",
        ),
    ],
)
def test_decode_bad_ids(args: list[str], message: str) -> None:
    result = run("decode", *args)
    assert result.returncode == EX_USAGE
    assert result.stderr == message + "\n"
    assert result.stdout == ""


def test_config_check_valid() -> None:
    result = run("config", "check")
    assert result.returncode == 0, result.stderr
    assert "[pool]\nmin_blocks = 6144\n" in result.stdout
    assert "time bits run out on 2089-09-06T15:47:35.551Z" in result.stdout
    # 1,000,000 blocks over a 10 s session + 5 s margin
    assert "covers a handover of 15 s" in result.stdout
    assert "at claim rates up to 66,667 blocks/s" in result.stdout


def test_config_check_json(tmp_path: Path) -> None:
    path = tmp_path / "allocator.toml"
    path.write_text('[zookeeper]\nhosts = "zk1:2181,zk2:2181/allocator/eu1"\n')
    result = run("config", "check", "--json", "--config", str(path), "--set", "pool.min_blocks=128")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["layout_ends_at"] == "2089-09-06T15:47:35.551Z"
    assert document["config"]["zookeeper"]["hosts"] == "zk1:2181,zk2:2181/allocator/eu1"
    assert document["config"]["pool"]["min_blocks"] == 128


def test_config_check_masks_secrets() -> None:
    env = {
        "ALLOCATOR_POSTGRES_URL": "postgresql://node:hunter2@db:5432/ids",
        "ALLOCATOR_NODE_ADMIN_TOKEN": "token-42-0123456789abcdefgh",
        "ALLOCATOR_ZOOKEEPER_AUTH": "zk:zkpass",
    }
    for args in (["config", "check"], ["config", "check", "--json"]):
        result = run(*args, env=env)
        assert result.returncode == 0, result.stderr
        for secret in ("hunter2", "token-42", "zkpass"):
            assert secret not in result.stdout
        assert "postgresql://node:***@db:5432/ids" in result.stdout
    document = json.loads(result.stdout)["config"]
    assert document["node"]["admin_token"] == document["zookeeper"]["auth"] == "***"


def test_config_check_invalid_names_every_key(tmp_path: Path) -> None:
    path = tmp_path / "allocator.toml"
    path.write_text("[layout]\nblock_size = 3\n[pool]\nbogus = 1\n")
    result = run(
        "config",
        "check",
        "--config",
        str(path),
        "--set",
        "node.on_session_loss=restart",
        env={"ALLOCATOR_POOL_MIN_BLOCKS": "0", "ALLOCATOR_POSTGRES_URL": "mysql://u:hunter2@h/db"},
    )
    assert result.returncode == EX_CONFIG
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "error: invalid configuration (5 problems):"
    assert len(lines) == 6
    for expected in (
        f"pool.bogus: unknown key (from {path})",
        f"layout.block_size: must be a power of two (got 3, from {path})",
        "pool.min_blocks: must be >= 1 (got 0, from ALLOCATOR_POOL_MIN_BLOCKS)",
        "node.on_session_loss: must be one of 'exit' or 'rejoin' (got 'restart', from the command",
        "postgres.url: must be a postgresql:// or postgres:// URL",
    ):
        assert expected in result.stderr
    assert "hunter2" not in result.stderr
    assert "Traceback" not in result.stderr


def test_config_check_invalid_json() -> None:
    result = run("config", "check", "--json", env={"ALLOCATOR_POOL_MIN_BLOCKS": "0"})
    assert result.returncode == EX_CONFIG
    problem = "pool.min_blocks: must be >= 1 (got 0, from ALLOCATOR_POOL_MIN_BLOCKS)"
    assert json.loads(result.stdout) == {"valid": False, "errors": [problem]}
    assert result.stderr == f"error: invalid configuration (1 problem):\n  {problem}\n"


def test_other_commands_show_config_problems_on_one_line() -> None:
    env = {"ALLOCATOR_POOL_MIN_BLOCKS": "0", "ALLOCATOR_NODE_LOG_FORMAT": "xml"}
    result = run("decode", "1", env=env)
    assert result.returncode == EX_CONFIG
    assert result.stderr.startswith("error: invalid configuration (2 problems): node.log_format")
    assert result.stderr.count("\n") == 1


def test_config_check_missing_file(tmp_path: Path) -> None:
    result = run("config", "check", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == EX_CONFIG
    assert result.stderr == f"error: config file not found: {tmp_path / 'nope.toml'}\n"


def test_bad_set_syntax_is_a_usage_error() -> None:
    result = run("config", "check", "--set", "pool.min_blocks")
    assert result.returncode == EX_USAGE
    assert "expected SECTION.KEY=VALUE" in result.stderr


def test_migrate_to_base_is_never_confirmed_by_the_environment() -> None:
    """Destructive choices are typed each time (STYLE.md): ALLOCATOR_MIGRATE_YES and
    ALLOCATOR_MIGRATE_TO are not read. Refused before any connection is attempted."""
    env = {"ALLOCATOR_MIGRATE_YES": "1"}
    result = run(
        "migrate", "--to", "base", "--database-url", "postgresql://x@127.0.0.1:1/x", env=env
    )
    assert result.returncode == EX_USAGE
    assert "add --yes" in result.stderr
    env = {"ALLOCATOR_MIGRATE_TO": "base", "ALLOCATOR_MIGRATE_YES": "1"}
    result = run("migrate", "--check", "--database-url", "postgresql://x@127.0.0.1:1/x", env=env)
    assert "base" not in result.stderr
    assert "add --yes" not in result.stderr


@pytest.mark.integration
def test_config_check_database_refuses_asynchronous_replication(
    db_url: str, async_standby_slot: str
) -> None:
    env = {"ALLOCATOR_POSTGRES_URL": db_url}
    result = run("config", "check", "--database", env=env)
    assert result.returncode == EX_CONFIG, result.stderr
    assert "error: the database replicates asynchronously (standbys=1" in result.stderr
    assert "postgres.allow_async_replication" in result.stderr
    allowed = run(
        "config",
        "check",
        "--database",
        "--json",
        env={**env, "ALLOCATOR_POSTGRES_ALLOW_ASYNC_REPLICATION": "true"},
    )
    assert allowed.returncode == 0, allowed.stderr
    document = json.loads(allowed.stdout)
    assert document["valid"] is True
    assert document["replication"]["asynchronous"] is True
    assert any("allow_async_replication is set" in w for w in document["warnings"])


@pytest.mark.integration
def test_config_check_database_without_standbys_is_valid(db_url: str) -> None:
    env = {"ALLOCATOR_POSTGRES_URL": db_url, "ALLOCATOR_ZOOKEEPER_AUTH": "zk:zkpass"}
    result = run("config", "check", "--database", "--json", env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["replication"]["standbys"] == 0
    assert document["warnings"] == []


def test_config_check_database_unreachable_is_a_problem(unused_tcp_port: int) -> None:
    """A problem listed like the others, exiting 75 as an unreachable server does for
    every command (retry later), not 78 (the configuration may be right)."""
    url = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/x"
    result = run("config", "check", "--database", env={"ALLOCATOR_POSTGRES_URL": url})
    assert result.returncode == Exit.TEMPFAIL
    assert "error: postgres.url: cannot check replication" in result.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``allocator config check | head -1``: the reader is gone before the command writes;
    click's quiet exit, never a traceback ("a bug")."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("ALLOCATOR_")}
    with subprocess.Popen(
        [sys.executable, "-m", "allocator.cli", "config", "check"],
        env=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None
        process.stdout.close()  # long before the interpreter has started and writes
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert b"Traceback" not in stderr
    assert b"BrokenPipeError" not in stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    ("asked_ms", "granted_ms"), [(10_000, 10_000), (30_000, 20_000)], ids=["granted", "clamped"]
)
def test_config_check_zookeeper_shows_the_granted_session_timeout(
    zk_hosts: str, asked_ms: int, granted_ms: int
) -> None:
    """The embedded servers grant 400 ms..20 s: 30 s asked is 20 s granted, and said."""
    env = {
        "ALLOCATOR_ZOOKEEPER_HOSTS": zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": ZK_AUTH,
        "ALLOCATOR_ZOOKEEPER_SESSION_TIMEOUT_MS": str(asked_ms),
        "ALLOCATOR_POOL_MAX_BLOCK_AGE_S": "600",  # above the runway a 30 s session needs
    }
    result = run("config", "check", "--zookeeper", "--json", env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["zookeeper"] == {
        "session_timeout_ms": asked_ms,
        "granted_session_timeout_ms": granted_ms,
    }
    clamped = [w for w in document["warnings"] if "the ZooKeeper server grants" in w]
    assert len(clamped) == (asked_ms != granted_ms)


def test_config_check_zookeeper_without_a_server_exits_75(unused_tcp_port: int) -> None:
    env = {
        "ALLOCATOR_ZOOKEEPER_HOSTS": f"127.0.0.1:{unused_tcp_port}",
        "ALLOCATOR_ZOOKEEPER_AUTH": ZK_AUTH,
        "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": "1",
    }
    result = run("config", "check", "--zookeeper", env=env)
    assert result.returncode == Exit.TEMPFAIL, result.stderr
    assert "zookeeper.hosts: cannot open a session" in result.stderr
