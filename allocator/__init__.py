"""allocator: a leader-elected allocator of Snowflake ID blocks.

ZooKeeper elects one leader; only the leader cuts blocks of Snowflake IDs into PostgreSQL,
every write fenced by a ZooKeeper-derived token; applications claim blocks with one SQL
call. The contract is docs/design.md.

The import package and the command are ``allocator``; the distribution (what ``pip install``
names) is :data:`DISTRIBUTION`, because the package index's ``allocator`` is another
project. ``__version__`` is the one place the version is written: pyproject.toml reads it
from here.
"""

DISTRIBUTION = "snowflake-block-allocator"
__version__ = "0.2.0"
VERSION_MESSAGE = "%(prog)s, version %(version)s (distribution %(package)s)"
"""What ``allocator --version`` prints (click's ``version_option`` fields), with or without
the node's dependencies (:mod:`allocator.console`)."""
