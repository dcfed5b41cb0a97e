"""What an ``ALLOCATOR_*`` variable in a deployment kit (compose, systemd) may be: a
configuration key's, a secret key's ``*_FILE``, or ``ALLOCATOR_CONFIG`` (the file)."""

from __future__ import annotations

from allocator.config import CONFIG_PATH_ENV, KEYS, SECRET_KEYS, env_name, secret_file_env

NODE_VARIABLES = frozenset(
    {env_name(key) for key in KEYS}
    | {secret_file_env(key) for key in SECRET_KEYS}
    | {CONFIG_PATH_ENV}
)
