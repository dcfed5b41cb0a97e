"""allocator: a leader-elected allocator of Snowflake ID blocks.

ZooKeeper elects one leader; only the leader cuts blocks of Snowflake IDs into PostgreSQL,
every write fenced by a ZooKeeper-derived token; applications claim blocks with one SQL call.
See DESIGN.md in the shared folder for the contract.
"""

__version__ = "0.1.0"
