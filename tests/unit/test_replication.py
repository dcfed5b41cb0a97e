"""The verdict on how a database replicates (``allocator.core.records.Replication``)."""

from __future__ import annotations

import pytest

from allocator.core.records import Replication


def replication(standbys: int, synchronous: int, commit: str = "on") -> Replication:
    names = "standby1" if synchronous else ""
    return Replication(standbys, synchronous, names, commit, in_recovery=False)


@pytest.mark.parametrize(
    ("standbys", "synchronous", "commit", "asynchronous"),
    [
        (0, 0, "on", False),  # no standby: nothing to lose in a failover
        (0, 0, "off", False),  # (a crash is I4's business: claim_blocks forces "on")
        (1, 1, "on", False),
        (1, 1, "remote_apply", False),
        (2, 1, "on", False),  # a commit waits for one of them
        (1, 0, "on", True),  # synchronous_standby_names empty, or the standby not in sync
        (1, 1, "off", True),  # this node's commits do not wait
        (1, 1, "local", True),
        (1, 1, "remote_write", True),  # received, not flushed: lost with the standby's OS
    ],
)
def test_asynchronous_when_a_standby_exists_that_commits_do_not_wait_for(
    standbys: int, synchronous: int, commit: str, asynchronous: bool
) -> None:
    state = replication(standbys, synchronous, commit)
    assert state.asynchronous is asynchronous
    assert f"standbys={standbys}" in state.describe()
