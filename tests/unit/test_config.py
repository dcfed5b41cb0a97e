"""Configuration: defaults, sources and precedence, validation messages, masking (no servers)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from allocator import config as config_mod
from allocator.config import KEYS, Config, block_age, env_name, load_config, parse_set_pairs
from allocator.core.errors import ConfigError, InvalidConfigError, UsageError
from allocator.core.layout import DEFAULT_EPOCH_MS, Layout

NOW_MS = 1_800_000_000_000  # 2027-01-15, so "the epoch is not in the future" is deterministic

# A valid, non-default value for every key: (text as given in an environment variable, the
# value it becomes). The test below checks that this table covers every key.
GOOD: dict[str, tuple[str, object]] = {
    "cluster.datacenter_id": ("7", 7),
    "layout.epoch": ("2021-06-01T12:00:00+02:00", 1_622_541_600_000),
    "layout.timestamp_bits": ("42", 42),
    "layout.datacenter_bits": ("4", 4),
    "layout.lane_bits": ("5", 5),
    "layout.sequence_bits": ("12", 12),
    "layout.block_size": ("256", 256),
    "zookeeper.hosts": (
        "zk1:2181,zk2,[::1]:2182/allocator/eu1",
        "zk1:2181,zk2,[::1]:2182/allocator/eu1",
    ),
    "zookeeper.election_path": ("/alloc/election", "/alloc/election"),
    "zookeeper.session_timeout_ms": ("400", 400),
    "zookeeper.connect_timeout_s": ("2.5", 2.5),
    "zookeeper.max_reconnect_delay_s": ("60", 60.0),
    "zookeeper.auth": ("user:pw", "user:pw"),
    "zookeeper.world_readable": ("true", True),
    "zookeeper.insecure": ("false", False),  # true is an error next to auth (own test)
    "zookeeper.readers": (
        "digest:ops:NvFL8lKqTgMn1/4zGHWbWrrmGFQ=, sasl:auditor",
        "digest:ops:NvFL8lKqTgMn1/4zGHWbWrrmGFQ=, sasl:auditor",
    ),
    "zookeeper.tls": ("true", True),
    "zookeeper.tls_ca_file": ("/etc/zk/ca.pem", "/etc/zk/ca.pem"),
    "zookeeper.tls_cert_file": ("/etc/zk/node.pem", "/etc/zk/node.pem"),
    "zookeeper.tls_key_file": ("/etc/zk/node.key", "/etc/zk/node.key"),
    "zookeeper.tls_key_password": ("key-pw", "key-pw"),
    "zookeeper.sasl_mechanism": ("digest-md5", "DIGEST-MD5"),
    "zookeeper.sasl_username": ("nodes", "nodes"),
    "zookeeper.sasl_password": ("sasl-pw", "sasl-pw"),
    "postgres.url": ("postgres://u:pw@db.example:6432/ids", "postgres://u:pw@db.example:6432/ids"),
    "postgres.allow_async_replication": ("true", True),
    "postgres.pool_min_size": ("0", 0),
    "postgres.pool_max_size": ("9", 9),
    "postgres.statement_timeout_ms": ("100", 100),
    "postgres.idle_in_transaction_timeout_ms": ("200", 200),
    "postgres.connect_timeout_s": ("0.5", 0.5),
    "postgres.tcp_user_timeout_ms": ("0", 0),
    "postgres.keepalives_idle_s": ("7", 7),
    "postgres.keepalives_interval_s": ("3", 3),
    "postgres.keepalives_count": ("4", 4),
    "node.name": ("node-1.eu_1", "node-1.eu_1"),
    "node.admin_address": ("0.0.0.0:0", "0.0.0.0:0"),
    "node.admin_token": ("tok-0123456789abcdefXYZ_-+/=", "tok-0123456789abcdefXYZ_-+/="),
    "node.admin_max_threads": ("2", 2),
    "node.admin_timeout_s": ("0.5", 0.5),
    "node.on_session_loss": ("exit", "exit"),
    "node.log_format": ("json", "json"),
    "node.shutdown_timeout_s": ("3", 3.0),
    "node.state_dir": ("/var/lib/allocator/node-1", "/var/lib/allocator/node-1"),
    "pool.min_blocks": ("10", 10),
    "pool.runway_s": ("0", 0.0),
    "pool.max_blocks": ("10", 10),
    "pool.low_watermark_blocks": ("9", 9),
    "pool.low_watermark_check_s": ("0.05", 0.05),
    "pool.refill_interval_s": ("0.25", 0.25),
    "pool.max_clock_behind_ms": ("0", 0),
    "pool.retention_s": ("3600", 3600.0),
    "pool.sample_interval_s": ("1", 1.0),
    "pool.max_clock_ahead_ms": ("2000", 2000),
    "pool.max_clock_skew_ms": ("250", 250),
    "pool.handover_margin_s": ("2.5", 2.5),
    "pool.max_block_age_s": ("60", 60.0),
    "pool.serve_aged_blocks_without_leader": ("false", False),
    "leader.db_unreachable_s": ("30", 30.0),
    "leader.clock_skew_handover_s": ("5.5", 5.5),
    "leader.probe_interval_s": ("2", 2.0),
}

# Bad values, each alone against the defaults; the error must name the key.
BAD: list[tuple[str, str]] = [
    ("cluster.datacenter_id", "-1"),
    ("cluster.datacenter_id", "32"),
    ("cluster.datacenter_id", "x"),
    ("layout.epoch", "yesterday"),
    ("layout.epoch", "2020-01-01T00:00:00"),
    ("layout.epoch", "2999-01-01T00:00:00Z"),
    ("layout.epoch", "-1"),
    ("layout.timestamp_bits", "40"),
    ("layout.timestamp_bits", "0"),
    ("layout.datacenter_bits", "-1"),
    ("layout.datacenter_bits", "6"),
    ("layout.lane_bits", "4"),
    ("layout.sequence_bits", "0"),
    ("layout.sequence_bits", "13"),
    ("layout.block_size", "0"),
    ("layout.block_size", "3"),
    ("layout.block_size", "8192"),
    ("zookeeper.hosts", ""),
    ("zookeeper.hosts", "zk1:99999"),
    ("zookeeper.hosts", "zk1:2181,"),
    ("zookeeper.hosts", "zk 1:2181"),
    ("zookeeper.hosts", "zk1:2181/"),
    ("zookeeper.hosts", "zk1:2181/a//b"),
    ("zookeeper.hosts", "zk1:2181/zookeeper"),
    ("zookeeper.election_path", "election"),
    ("zookeeper.election_path", "/election/"),
    ("zookeeper.election_path", "/"),
    ("zookeeper.election_path", "/a/../b"),
    ("zookeeper.session_timeout_ms", "399"),
    ("zookeeper.session_timeout_ms", "1.5"),
    ("zookeeper.connect_timeout_s", "0"),
    ("zookeeper.connect_timeout_s", "nan"),
    ("zookeeper.max_reconnect_delay_s", "0"),
    ("zookeeper.max_reconnect_delay_s", "61"),
    ("zookeeper.auth", "nocolon"),
    ("zookeeper.auth", ":pw"),
    ("zookeeper.auth", "user:"),
    ("postgres.url", "mysql://u@h/db"),
    ("postgres.url", "not a url"),
    ("postgres.url", "postgresql://u:pw@h:99999/db"),
    ("postgres.url", "postgresql://u@h1:5432,h2:x/db?target_session_attrs=read-write"),
    ("postgres.allow_async_replication", "maybe"),
    ("zookeeper.world_readable", "maybe"),
    ("zookeeper.insecure", "maybe"),
    ("zookeeper.readers", "ops:password"),  # a reader is named by its hash, never a password
    ("zookeeper.readers", "digest:ops:not-a-sha1"),
    ("zookeeper.readers", "world:anyone"),
    ("zookeeper.readers", "sasl:ops"),  # needs the cluster's identity
    ("zookeeper.tls", "maybe"),
    ("zookeeper.tls", "true"),  # without a CA: blamed on tls_ca_file
    ("zookeeper.tls_ca_file", "/etc/zk/ca.pem"),  # without tls = true
    ("zookeeper.tls_cert_file", "/etc/zk/node.pem"),
    ("zookeeper.tls_key_file", "/etc/zk/node.key"),
    ("zookeeper.tls_key_password", "key-pw"),  # without a key file
    ("zookeeper.sasl_mechanism", "GSSAPI"),  # Kerberos: unsupported
    ("zookeeper.sasl_mechanism", "PLAIN"),
    ("zookeeper.sasl_username", "has space"),
    ("zookeeper.sasl_username", "a:b"),
    ("zookeeper.sasl_password", "sasl-pw"),  # without a username
    ("postgres.pool_min_size", "-1"),
    ("postgres.pool_min_size", "5"),  # above the default max; blamed on max, see below
    ("postgres.pool_max_size", "0"),
    ("postgres.statement_timeout_ms", "0"),
    ("postgres.idle_in_transaction_timeout_ms", "0"),
    ("postgres.connect_timeout_s", "0"),
    ("postgres.tcp_user_timeout_ms", "-1"),
    ("postgres.keepalives_idle_s", "0"),
    ("postgres.keepalives_interval_s", "0"),
    ("postgres.keepalives_count", "0"),
    ("pool.max_clock_ahead_ms", "0"),
    ("pool.max_clock_ahead_ms", "600001"),
    ("pool.max_clock_skew_ms", "0"),
    ("pool.max_clock_skew_ms", "1000"),  # must stay below max_clock_ahead_ms (1000)
    ("leader.db_unreachable_s", "0"),
    ("leader.db_unreachable_s", "3"),  # <= 2 x probe_interval_s (1) + refill_interval_s (1)
    ("leader.clock_skew_handover_s", "-1"),
    ("leader.probe_interval_s", "0"),
    ("leader.probe_interval_s", "61"),
    ("node.name", "has space"),
    ("node.name", "x" * 65),
    ("node.name", "nöde"),
    ("node.admin_address", "localhost"),
    ("node.admin_address", ":8470"),
    ("node.admin_address", "127.0.0.1:70000"),
    ("node.admin_token", "s3cret"),
    ("node.admin_token", "x" * 23),
    ("node.admin_token", "x" * 32),  # long enough, but typed, not generated
    ("node.admin_token", "abcabcabcabcabcabcabcabcabc"),
    ("node.admin_token", "a-long-enough-token but-with-a-space"),
    ("node.admin_token", "a-long-enough-token-but-with-a-newline\n"),
    ("node.admin_token", "a-long-enough-token-that-is-not-ascii-é"),
    ("node.admin_max_threads", "0"),
    ("node.admin_max_threads", "65"),
    ("node.admin_timeout_s", "0"),
    ("node.admin_timeout_s", "61"),
    ("node.on_session_loss", "restart"),
    ("node.log_format", "xml"),
    ("node.shutdown_timeout_s", "0"),
    ("node.state_dir", "var/lib/allocator"),
    ("node.state_dir", "~/state"),
    ("pool.min_blocks", "0"),
    ("pool.runway_s", "-1"),
    ("pool.max_blocks", "10"),
    ("pool.low_watermark_blocks", "-1"),
    ("pool.low_watermark_blocks", "6144"),  # not below the default min_blocks
    ("pool.low_watermark_check_s", "0"),
    ("pool.low_watermark_check_s", "61"),
    ("pool.refill_interval_s", "0"),
    ("pool.max_clock_behind_ms", "-1"),
    ("pool.retention_s", "0"),
    ("pool.handover_margin_s", "-1"),
    ("pool.sample_interval_s", "inf"),
    ("pool.max_block_age_s", "0"),
    ("pool.max_block_age_s", "15"),  # not above the runway a handover needs (10 s + 5 s)
    ("pool.handover_margin_s", "300"),  # the bound (300 s) would not cover a handover
    ("pool.serve_aged_blocks_without_leader", "maybe"),
]
# Where a bad value breaks a rule between two keys, the error names the dependent key.
BLAMED = {
    ("postgres.pool_min_size", "5"): "postgres.pool_max_size",
    ("pool.handover_margin_s", "300"): "pool.max_block_age_s",
    ("layout.datacenter_bits", "-1"): "layout.datacenter_bits",
    ("zookeeper.tls", "true"): "zookeeper.tls_ca_file",
}
SECRETS_WITHOUT_RULES: set[str] = set()


def load(**kwargs: object) -> Config:
    kwargs.setdefault("env", {})
    kwargs.setdefault("now_ms", NOW_MS)
    return load_config(**kwargs)  # type: ignore[arg-type]


def problems(**kwargs: object) -> tuple[str, ...]:
    with pytest.raises(InvalidConfigError) as caught:
        load(**kwargs)
    return caught.value.problems


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "allocator.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load()
    assert config.layout == Layout()
    assert config.layout_section.block_size == 4096
    assert config.cluster.datacenter_id == 0
    assert config.zookeeper.hosts == "127.0.0.1:2181"
    assert config.zookeeper.election_path == "/election"
    assert config.zookeeper.session_timeout_ms == 10_000
    assert config.zookeeper.max_reconnect_delay_s == 5.0
    assert config.postgres.url.get_secret_value() == config_mod.DEFAULT_POSTGRES_URL
    assert (config.postgres.pool_min_size, config.postgres.pool_max_size) == (1, 4)
    assert config.node.admin_address == "127.0.0.1:8470"
    assert (config.node.on_session_loss, config.node.log_format) == ("rejoin", "text")
    assert (config.pool.min_blocks, config.pool.max_blocks, config.pool.low_watermark_blocks) == (
        6_144,
        1_000_000,
        4_096,
    )
    assert config.pool.low_watermark_check_s == 0.1
    assert config.pool.retention_s == 86_400
    assert config.masked_dict()["layout"]["epoch"] == "2020-01-01T00:00:00.000Z"


def test_good_table_covers_every_key() -> None:
    assert set(GOOD) == set(KEYS)
    assert {key for key, _ in BAD} | SECRETS_WITHOUT_RULES == set(KEYS)


def effective(config: Config, key: str) -> object:
    section, name = key.split(".")
    value = getattr(config.sections()[section], name)
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


def test_every_key_has_an_allocator_environment_variable() -> None:
    env = {env_name(key): text for key, (text, _) in GOOD.items()}
    assert env["ALLOCATOR_ZOOKEEPER_SESSION_TIMEOUT_MS"] == "400"
    assert env["ALLOCATOR_POSTGRES_URL"].startswith("postgres://")
    assert env["ALLOCATOR_POOL_LOW_WATERMARK_BLOCKS"] == "9"
    config = load(env=env)
    for key, (_, value) in GOOD.items():
        assert effective(config, key) == value, key


def test_every_key_can_be_overridden() -> None:
    config = load(overrides={key: text for key, (text, _) in GOOD.items()})
    for key, (_, value) in GOOD.items():
        assert effective(config, key) == value, key


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[pool]\nmin_blocks = 100\nmax_blocks = 1000\n[zookeeper]\nhosts = "zk-file:2181"\n',
    )
    env = {"ALLOCATOR_POOL_MIN_BLOCKS": "200", "ALLOCATOR_ZOOKEEPER_HOSTS": "zk-env:2181"}
    overrides = {"pool.min_blocks": 300}

    config = load(path=path, env=env, overrides=overrides)
    assert (config.pool.min_blocks, config.pool.max_blocks) == (300, 1000)
    assert config.zookeeper.hosts == "zk-env:2181"

    config = load(path=path, env=env)
    assert (config.pool.min_blocks, config.zookeeper.hosts) == (200, "zk-env:2181")

    config = load(path=path)
    assert (config.pool.min_blocks, config.zookeeper.hosts) == (100, "zk-file:2181")


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[cluster]\ndatacenter_id = 3\n")
    assert load(env={"ALLOCATOR_CONFIG": str(path)}).cluster.datacenter_id == 3


def test_foreign_allocator_variables_are_ignored() -> None:
    env = {"ALLOCATOR_SOAK": "1", "ALLOCATOR_DECODE_JSON": "1", "ALLOCATOR_LOCAL_UP_NODES": "3"}
    assert load(env=env) == load()


def test_a_multi_host_url_names_a_primary_and_its_standbys() -> None:
    url = "postgresql://node@10.0.0.1:5432,10.0.0.2:5433/ids?target_session_attrs=read-write"
    config = load(env={env_name("postgres.url"): url})
    assert config.postgres.url.get_secret_value() == url


@pytest.mark.parametrize(("key", "value"), BAD)
def test_bad_value_from_environment_names_key_and_source(key: str, value: str) -> None:
    blamed = BLAMED.get((key, value), key)
    lines = problems(env={env_name(key): value})
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{blamed}: ")
    source = f"from {env_name(key)}" if blamed == key else "default"
    assert lines[0].endswith(f", {source})")


@pytest.mark.parametrize(("key", "value"), BAD)
def test_bad_value_from_overrides_names_key_and_source(key: str, value: str) -> None:
    blamed = BLAMED.get((key, value), key)
    (line,) = problems(overrides={key: value})
    assert line.startswith(f"{blamed}: ")
    assert line.endswith(", from the command line)" if blamed == key else ", default)")


def test_error_line_format() -> None:
    (line,) = problems(env={"ALLOCATOR_POOL_MIN_BLOCKS": "0"})
    assert line == "pool.min_blocks: must be >= 1 (got 0, from ALLOCATOR_POOL_MIN_BLOCKS)"
    (line,) = problems(overrides={"node.log_format": "xml"})
    assert line == (
        "node.log_format: must be one of 'text' or 'json' (got 'xml', from the command line)"
    )


def test_every_problem_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "[pool]\nmin_blocks = 0\n[layout]\nblock_size = 3\n")
    lines = problems(
        path=path,
        env={"ALLOCATOR_NODE_LOG_FORMAT": "xml", "ALLOCATOR_CLUSTER_DATACENTER_ID": "99"},
        overrides={"zookeeper.session_timeout_ms": "1"},
    )
    assert [line.split(":")[0] for line in lines] == [
        "zookeeper.session_timeout_ms",
        "node.log_format",
        "pool.min_blocks",
        "layout.block_size",
        "cluster.datacenter_id",
    ]
    assert f"(got 0, from {path})" in lines[2]
    with pytest.raises(InvalidConfigError) as caught:
        load(path=path)
    assert str(caught.value) == (
        f"invalid configuration (2 problems): pool.min_blocks: must be >= 1 (got 0, from {path}); "
        f"layout.block_size: must be a power of two (got 3, from {path})"
    )


def test_file_values_are_typed(tmp_path: Path) -> None:
    path = write(tmp_path, "[pool]\nmin_blocks = true\n[zookeeper]\nhosts = 5\n")
    assert problems(path=path) == (
        f"zookeeper.hosts: must be a string (got 5, from {path})",
        f"pool.min_blocks: must be a number, not true/false (got true, from {path})",
    )


def test_layout_widths_that_do_not_add_up_blame_the_keys_set() -> None:
    lines = problems(overrides={"layout.lane_bits": 4, "layout.sequence_bits": 10})
    assert [line.split(":")[0] for line in lines] == [
        "layout.lane_bits",
        "layout.sequence_bits",
        "layout.block_size",  # the default 4096 no longer fits 10 sequence bits
    ]
    assert "sum to 63" in lines[0]
    assert "sum to 63" in lines[1]
    assert lines[2].endswith("must be <= 2^layout.sequence_bits = 1024 (got 4096, default)")


@pytest.mark.parametrize(
    "epoch",
    ["2021-06-01T10:00:00Z", "2021-06-01T12:00:00+02:00", "1622541600000", 1_622_541_600_000],
)
def test_epoch_forms(epoch: object) -> None:
    assert load(overrides={"layout.epoch": epoch}).layout.epoch_ms == 1_622_541_600_000


def test_epoch_as_toml_datetime(tmp_path: Path) -> None:
    path = write(tmp_path, "[layout]\nepoch = 2021-06-01T10:00:00Z\n")
    config = load(path=path)
    assert config.layout.epoch_ms == 1_622_541_600_000
    assert config.masked_dict()["layout"]["epoch"] == "2021-06-01T10:00:00.000Z"


def test_epoch_in_the_future_is_relative_to_now() -> None:
    overrides = {"layout.epoch": NOW_MS}
    assert load(overrides=overrides, now_ms=NOW_MS).layout.epoch_ms == NOW_MS
    (line,) = problems(overrides=overrides, now_ms=NOW_MS - 1)
    assert line.startswith("layout.epoch: ")
    assert "in the future" in line


def test_layout_property_uses_configured_values() -> None:
    overrides = {"layout.lane_bits": 6, "layout.sequence_bits": 11, "layout.block_size": 2048}
    config = load(overrides=overrides)
    assert config.layout == Layout(DEFAULT_EPOCH_MS, 41, 5, 6, 11)


def test_unknown_keys_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\npool = 3\n[pol]\nmin_blocks = 1\n[node]\nnmae = "a"\n')
    assert problems(path=path) == (
        f"name: unknown key (from {path})",
        f"pool: must be a table of keys, like [pool] (from {path})",
        f"pol.min_blocks: unknown key; did you mean pool.min_blocks? (from {path})",
        f"node.nmae: unknown key; did you mean node.name? (from {path})",
    )


def test_unknown_override_and_environment_keys() -> None:
    lines = problems(overrides={"pool.bogus": "1", "nodot": 1}, env={"ALLOCATOR_NODE_COLOUR": "x"})
    assert lines == (
        "node.colour: unknown key (from ALLOCATOR_NODE_COLOUR)",
        "pool.bogus: unknown key (from the command line)",
        "nodot: unknown key (from the command line)",
    )


def test_unknown_secret_like_keys_do_not_echo_values() -> None:
    (line,) = problems(env={"ALLOCATOR_POSTGRES_PASSWORD": "hunter2"})
    assert "hunter2" not in line


def test_missing_named_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found: .*nope\.toml"):
        load(path=tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="config file not found"):
        load(env={"ALLOCATOR_CONFIG": str(tmp_path / "nope.toml")})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not valid TOML") as caught:
        load(path=write(tmp_path, "[pool\n"))
    assert caught.value.__cause__ is not None
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(path=tmp_path)


def test_masking() -> None:
    config = load(
        overrides={
            "postgres.url": "postgresql://node:pa:ss@db:5432/ids?sslmode=require&password=qs",
            "node.admin_token": "tok-XYZ-0123456789abcdefgh",
            "zookeeper.auth": "user:zkpw",
        }
    )
    masked = config.masked_dict()
    assert masked["postgres"]["url"] == (
        "postgresql://node:***@db:5432/ids?sslmode=require&password=***"
    )
    assert masked["node"]["admin_token"] == "***"
    assert masked["zookeeper"]["auth"] == "***"
    assert "pa:ss" not in repr(config)
    assert "tok-XYZ" not in repr(config)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("tok-XYZ", "must be at least 24 random characters"),
        ("XYZ" * 10, "must be at least 24 random characters"),
        ("tok-XYZ tok-XYZ tok-XYZ tok-XYZ", "must be printable ASCII without spaces"),
        ("tok-XYZ\ttok-XYZ-tok-XYZ-tok-XYZ", "must be printable ASCII without spaces"),
    ],
)
def test_a_weak_admin_token_is_refused_without_echoing_it(token: str, message: str) -> None:
    (line,) = problems(env={"ALLOCATOR_NODE_ADMIN_TOKEN": token})
    assert line.startswith(f"node.admin_token: {message}")
    assert line.endswith("(got ***, from ALLOCATOR_NODE_ADMIN_TOKEN)")
    assert "tok-XYZ" not in line


def test_masking_leaves_empty_secrets_and_password_less_urls() -> None:
    masked = load().masked_dict()
    assert masked["postgres"]["url"] == config_mod.DEFAULT_POSTGRES_URL
    assert (masked["node"]["admin_token"], masked["zookeeper"]["auth"]) == ("", "")


@pytest.mark.parametrize(
    ("key", "value", "secret"),
    [
        ("postgres.url", "mysql://u:hunter2@h/db", "hunter2"),
        ("zookeeper.auth", "hunter2", "hunter2"),
        ("postgres.url", "postgresql://u:hun/ter2@h/db", "ter2"),  # unescaped "/": port "hun"
    ],
)
def test_errors_never_echo_secrets(key: str, value: str, secret: str) -> None:
    (line,) = problems(overrides={key: value})
    assert line.startswith(f"{key}: ")
    assert secret not in line


def test_config_is_frozen() -> None:
    config = load()
    with pytest.raises(ValidationError):
        config.pool = config.pool  # type: ignore[misc]
    with pytest.raises(ValidationError):
        config.pool.min_blocks = 1  # type: ignore[misc]


def test_direct_validation_still_checks_rules_between_keys() -> None:
    with pytest.raises(ValidationError, match=re.escape("pool.low_watermark_blocks: must be <")):
        Config.model_validate({"pool": {"min_blocks": 4, "low_watermark_blocks": 4}})


@pytest.mark.parametrize(("floor", "watermark"), [("6144", 4096), ("1000", 666), ("1", 0)])
def test_an_unset_low_watermark_is_two_thirds_of_the_floor(floor: str, watermark: int) -> None:
    config = load(env={env_name("pool.min_blocks"): floor})
    assert config.pool.low_watermark_blocks == watermark
    assert load(overrides={"pool.min_blocks": floor}).pool.low_watermark_blocks == watermark


def test_a_low_watermark_that_is_set_wins_over_the_floors_share() -> None:
    config = load(overrides={"pool.min_blocks": "1000", "pool.low_watermark_blocks": "10"})
    assert config.pool.low_watermark_blocks == 10


def test_node_state_dir_is_optional_and_absolute() -> None:
    assert load().node.state_path() is None
    config = load(env={"ALLOCATOR_NODE_STATE_DIR": "/var/lib/allocator/node-1"})
    assert config.node.state_path() == Path("/var/lib/allocator/node-1")
    with pytest.raises(InvalidConfigError, match=re.escape("node.state_dir: must be an absolute")):
        load(overrides={"node.state_dir": "state"})


def test_node_name_resolves_at_use_time() -> None:
    assert load(overrides={"node.name": "n1"}).node.resolved_name() == "n1"
    resolved = load().node.resolved_name()
    assert resolved.endswith(f"-{os.getpid()}")
    assert resolved.startswith(re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:20])
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", resolved)


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([], {}),
        (["pool.min_blocks=5"], {"pool.min_blocks": "5"}),
        (["postgres.url=postgresql://u@h/db?a=b"], {"postgres.url": "postgresql://u@h/db?a=b"}),
        (["node.name=a", "node.name=b"], {"node.name": "b"}),
    ],
)
def test_parse_set_pairs(pairs: list[str], expected: dict[str, str]) -> None:
    assert parse_set_pairs(pairs) == expected


@pytest.mark.parametrize("pair", ["pool.min_blocks", "=5", "min_blocks=5", "a.b.c=1", " .x=1"])
def test_parse_set_pairs_rejects_bad_syntax(pair: str) -> None:
    with pytest.raises(UsageError, match=re.escape("expected SECTION.KEY=VALUE")):
        parse_set_pairs([pair])


@pytest.mark.parametrize(
    "pair",
    [
        "zookeeper.auth=user:hunter2-secret",
        "ZOOKEEPER.AUTH=user:hunter2-secret",
        "node.admin_token=hunter2-secret",
        "postgres.url=postgresql://u:hunter2-secret@h/db",
    ],
)
def test_set_refuses_secrets_without_echoing_them(pair: str) -> None:
    key = pair.partition("=")[0].lower()
    with pytest.raises(UsageError, match=re.escape(env_name(key))) as caught:
        parse_set_pairs([pair])
    assert "hunter2" not in str(caught.value)
    assert "never taken from the command line" in str(caught.value)


def test_zookeeper_auth_comes_from_the_environment_or_the_file(tmp_path: Path) -> None:
    assert load(env={"ALLOCATOR_ZOOKEEPER_AUTH": "u:env"}).zookeeper.auth.get_secret_value() == (
        "u:env"
    )
    path = write(tmp_path, '[zookeeper]\nauth = "u:file"\nworld_readable = true\n')
    config = load(path=path)
    assert config.zookeeper.auth.get_secret_value() == "u:file"
    assert config.zookeeper.world_readable is True
    assert config.zookeeper.insecure is False


def test_insecure_with_auth_and_world_read_without_auth_are_errors() -> None:
    with pytest.raises(InvalidConfigError) as caught:
        load(overrides={"zookeeper.auth": "u:pw", "zookeeper.insecure": True})
    assert caught.value.problems == (
        "zookeeper.insecure: must be false when zookeeper.auth is set (the ACLs are used) "
        "(got true, from the command line)",
    )
    with pytest.raises(InvalidConfigError, match=r"zookeeper\.world_readable: needs"):
        load(overrides={"zookeeper.world_readable": True})
    assert load(overrides={"zookeeper.insecure": True}).zookeeper.insecure is True


def test_the_age_bound_must_exceed_two_refill_intervals_and_derives_the_jobs_settings() -> None:
    tight = {
        "zookeeper.session_timeout_ms": "400",
        "pool.handover_margin_s": "0",
        "pool.refill_interval_s": "0.25",
    }
    (line,) = problems(overrides={**tight, "pool.max_block_age_s": "0.45"})
    assert "pool.max_block_age_s" in line
    assert "2 x pool.refill_interval_s (0.5 s)" in line
    config = load(overrides={**tight, "pool.max_block_age_s": "4"})
    assert block_age.max_block_age_ms(config) == 4000
    assert block_age.leader_stale_ms(config) == 750  # 3 refill intervals + the margin (0)
    assert block_age.void_ahead_ms(config) == 500  # 2 refill intervals > 10 % of the bound
    defaults = load()
    assert defaults.pool.max_block_age_s == 300
    assert defaults.pool.serve_aged_blocks_without_leader is True
    assert block_age.leader_stale_ms(defaults) == 8000  # 3 x 1 s + 5 s
    assert block_age.void_ahead_ms(defaults) == 30_000  # 10 % of 300 s


def test_kerberos_is_refused_as_unsupported_and_named() -> None:
    (line,) = problems(env={env_name("zookeeper.sasl_mechanism"): "GSSAPI"})
    assert line.startswith("zookeeper.sasl_mechanism: Kerberos (GSSAPI) is unsupported")


def test_the_sasl_identity_is_a_node_identity_and_its_password_a_secret() -> None:
    config = load(
        env={
            env_name("zookeeper.sasl_username"): "nodes",
            env_name("zookeeper.sasl_password"): "sasl-secret-pw",
            env_name("zookeeper.readers"): "sasl:ops",
        }
    )
    assert config.zookeeper.reader_ids() == [("sasl", "ops")]
    assert "sasl-secret-pw" not in str(config.masked_dict())
    with pytest.raises(InvalidConfigError, match=r"zookeeper\.insecure: must be false when "):
        load(
            overrides={
                "zookeeper.sasl_username": "n",
                "zookeeper.sasl_password": "p",
                "zookeeper.insecure": True,
            }
        )
    with pytest.raises(UsageError, match="a secret is never taken from the command line"):
        parse_set_pairs(["zookeeper.sasl_password=p"])


def test_readers_from_a_toml_array(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[zookeeper]\nauth = "u:pw"\nreaders = ["sasl:ops", "sasl:audit", "sasl:ops"]\n',
    )
    assert load(path=path).zookeeper.reader_ids() == [("sasl", "ops"), ("sasl", "audit")]


def test_mutual_tls_needs_the_certificate_and_its_key() -> None:
    base = {"zookeeper.tls": True, "zookeeper.tls_ca_file": "/ca.pem"}
    (line,) = problems(overrides={**base, "zookeeper.tls_cert_file": "/c.pem"})
    assert line.startswith("zookeeper.tls_key_file: must be set with zookeeper.tls_cert_file")
