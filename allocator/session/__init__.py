"""A node's ZooKeeper session on disk: the session file, and reaping a dead node's session."""
