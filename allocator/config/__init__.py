"""Configuration: one validated, frozen :class:`Config` from a TOML file, the environment and flags.

Import from this package (``from allocator.config import Config, load_config``); each module
has one job: values, sections, checks (between keys), model, environment, secrets, problems,
loading, runway and block_age. The ``--config``/``--set`` options are
:func:`allocator.commands.options.config_options` (docs/design.md §7).
"""

from __future__ import annotations

from allocator.config.environment import (
    CONFIG_PATH_ENV,
    ENV_PREFIX,
    env_name,
    process_environment,
    secret_file_env,
)
from allocator.config.loading import load_config, load_from_options, parse_set_pairs
from allocator.config.model import Config
from allocator.config.secrets import MASK, SECRET_KEYS, mask_url
from allocator.config.sections import (
    DEFAULT_ADMIN_ADDRESS,
    DEFAULT_POSTGRES_URL,
    DEFAULT_ZK_HOSTS,
    KEYS,
    SECTIONS,
    ClusterConfig,
    LayoutConfig,
    LeaderConfig,
    NodeConfig,
    PoolConfig,
    PostgresConfig,
    ZookeeperConfig,
)

__all__ = [
    "CONFIG_PATH_ENV",
    "DEFAULT_ADMIN_ADDRESS",
    "DEFAULT_POSTGRES_URL",
    "DEFAULT_ZK_HOSTS",
    "ENV_PREFIX",
    "KEYS",
    "MASK",
    "SECRET_KEYS",
    "SECTIONS",
    "ClusterConfig",
    "Config",
    "LayoutConfig",
    "LeaderConfig",
    "NodeConfig",
    "PoolConfig",
    "PostgresConfig",
    "ZookeeperConfig",
    "env_name",
    "load_config",
    "load_from_options",
    "mask_url",
    "parse_set_pairs",
    "process_environment",
    "secret_file_env",
]
