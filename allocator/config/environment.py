"""The environment: the ``ALLOCATOR_*`` variables' names, and the one reader of them."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic_settings import BaseSettings, EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

ENV_PREFIX = "ALLOCATOR_"
CONFIG_PATH_ENV = "ALLOCATOR_CONFIG"


def process_environment() -> dict[str, str]:
    """A copy of this process's environment variables.

    This module is the only one of the product that reads ``os.environ`` (an AST test holds
    it: ``tests/unit/test_boundaries.py``); this copy is the one way for any other to see it: to
    hand it on to a child process, or to read a documented variable of the embedded
    cluster's tooling (``ALLOCATOR_PG_BIN_DIR``, ``ALLOCATOR_ZK_JAVA_DIR``)."""
    return dict(os.environ)


def env_name(key: str) -> str:
    """The variable of a dotted key: ``ALLOCATOR_`` followed by the section and the key,
    upper-cased and joined by ``_``: ``pool.min_blocks`` is ``ALLOCATOR_POOL_MIN_BLOCKS``.
    An ``ALLOCATOR_<SECTION>_*`` variable that names no key is an error, like an unknown
    key in the file or in the overrides."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def secret_file_env(key: str) -> str:
    """The variable naming a file that holds secret ``key``: ``node.admin_token`` is
    ``ALLOCATOR_NODE_ADMIN_TOKEN_FILE``."""
    return env_name(key) + "_FILE"


class EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source of ``settings_cls`` over a given mapping
    instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._env, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )
