"""The ZooKeeper adapter: clients with the cluster's ACL, the election on kazoo."""
