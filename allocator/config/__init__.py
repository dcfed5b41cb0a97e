"""Configuration: one validated, frozen :class:`Config` from a TOML file, the environment and flags.

This package is the public face; import from it (``from allocator.config import Config,
load_config``). Each module has one job:

- :mod:`~allocator.config.values`: what one value may be (bounded numbers, addresses);
- :mod:`~allocator.config.sections`: the pydantic model of each section, and the keys;
- :mod:`~allocator.config.checks`: the rules between keys;
- :mod:`~allocator.config.model`: :class:`Config`, the sections together;
- :mod:`~allocator.config.environment`: the ``ALLOCATOR_*`` variables, and the one reader
  of the process environment;
- :mod:`~allocator.config.secrets`: the secret keys, their masking and ``*_FILE`` files;
- :mod:`~allocator.config.problems`: how a problem reads (one line per problem);
- :mod:`~allocator.config.loading`: :func:`load_config`, the sources and their order;
- :mod:`~allocator.config.runway`: what the settings cover (the runway a handover needs).

The command-line options that load it (``--config``, ``--set``) are the CLI's:
:func:`allocator.commands.options.config_options`.
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
