"""The effective configuration: :class:`Config`, the sections together, valid as a whole
however it is built, and shown with its secrets masked.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from allocator.config.checks import cross_check
from allocator.config.environment import ENV_PREFIX
from allocator.config.secrets import MASK, mask_url
from allocator.config.sections import (
    SECTIONS,
    ClusterConfig,
    LayoutConfig,
    LeaderConfig,
    NodeConfig,
    PoolConfig,
    PostgresConfig,
    Section,
    ZookeeperConfig,
    build_layout,
)
from allocator.core import layout as layout_mod


class Config(BaseSettings):
    """The effective configuration. Build it with :func:`~allocator.config.load_config`.

    ``Config()`` alone reads only the process environment (pydantic-settings); the sections
    are also reachable as attributes: ``config.pool.min_blocks``. The ``[layout]`` section is
    ``layout_section``, because :attr:`layout` is the validated
    :class:`~allocator.core.layout.Layout`.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_prefix_target="all",  # the prefix applies to the "layout" alias too
        env_nested_delimiter="_",
        env_nested_max_split=1,  # ALLOCATOR_POOL_MIN_BLOCKS -> pool / min_blocks
        extra="forbid",
        frozen=True,
    )

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    layout_section: LayoutConfig = Field(default_factory=LayoutConfig, alias="layout")
    zookeeper: ZookeeperConfig = Field(default_factory=ZookeeperConfig)
    postgres: PostgresConfig = Field(default_factory=PostgresConfig)
    node: NodeConfig = Field(default_factory=NodeConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    leader: LeaderConfig = Field(default_factory=LeaderConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        problems = cross_check(self.sections())
        if problems:
            raise ValueError("; ".join(f"{key}: {message}" for key, message, _ in problems))
        return self

    @staticmethod
    def layout_of(section: LayoutConfig) -> layout_mod.Layout:
        """The Snowflake layout of a ``[layout]`` section."""
        return build_layout(section)

    @property
    def layout(self) -> layout_mod.Layout:
        """The Snowflake layout of ``[layout]``."""
        return self.layout_of(self.layout_section)

    def sections(self) -> dict[str, Section]:
        """Each section by its name in the file."""
        return {
            name: getattr(self, "layout_section" if name == "layout" else name) for name in SECTIONS
        }

    def masked_dict(self) -> dict[str, dict[str, object]]:
        """The effective config by section; secrets masked, the epoch as ISO-8601 UTC."""
        result: dict[str, dict[str, object]] = {}
        for name, section in self.sections().items():
            values: dict[str, object] = {}
            for key in type(section).model_fields:
                value: object = getattr(section, key)
                if isinstance(value, SecretStr):
                    secret = value.get_secret_value()
                    value = mask_url(secret) if name == "postgres" else (MASK if secret else "")
                elif (name, key) == ("layout", "epoch"):
                    value = layout_mod.format_utc_ms(self.layout_section.epoch)
                values[key] = value
            result[name] = values
        return result
