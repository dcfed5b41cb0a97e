"""The election queue by znode name and stat alone, on the in-memory ZooKeeper (issue 10, 2).

A znode we did not write cannot stop the election: a persistent lookalike that sorts first,
a foreign name or garbage data changes nobody's place; what is ignored or does not parse is
reported, and reading the queue never raises for it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss, NoAuthError
from kazoo.security import make_digest_acl

from allocator import fence
from allocator.zookeeper.election import Election, Identity, ordered, read_queue, sequence_of
from tests.fakes import FakeEnsemble, FakeKazooClient
from tests.fakes.zookeeper import FakeResult

ELECTION = "/election"
AUTH = "allocator-test:not-a-real-secret"
ACL = [make_digest_acl("allocator-test", "not-a-real-secret", all=True)]
OTHER_ACL = [make_digest_acl("someone-else", "theirs", all=True)]


def our_name(sequence: int) -> str:
    return f"n-{uuid.uuid4().hex}-{sequence:010d}"


@pytest.fixture
def ensemble() -> FakeEnsemble:
    ensemble = FakeEnsemble()
    ensemble.set_data(ELECTION, b"")  # persistent, open: strangers may write under it
    return ensemble


@pytest.fixture
def clients(ensemble: FakeEnsemble) -> Iterator[list[FakeKazooClient]]:
    made: list[FakeKazooClient] = []
    yield made
    for client in made:
        client.stop()
        client.close()


def started(ensemble: FakeEnsemble, clients: list[FakeKazooClient], auth: str = "") -> Any:
    client = ensemble.client(auth=auth)
    client.start()
    clients.append(client)
    return client


def join(ensemble: FakeEnsemble, clients: list[FakeKazooClient], name: str) -> Election:
    election = Election(started(ensemble, clients, AUTH), ELECTION, Identity(name, "h", 1, ""))
    election.join()
    return election


def first(election: Election) -> bool:
    """True if ``election`` leads now. On the fake every call answers at once, so a first
    contender returns True on its first look; one that is not waits until the timer stops
    it (no timing is asserted: the timer only ends the wait)."""
    stop = threading.Event()
    timer = threading.Timer(0.2, stop.set)
    timer.start()
    try:
        return election.wait_until_first(stop, recheck_s=0.01)
    finally:
        timer.cancel()


def test_only_names_exactly_in_our_format_have_a_sequence() -> None:
    tag = uuid.uuid4().hex
    assert sequence_of(f"n-{tag}-0000000042") == 42
    for stranger in [
        "x",
        "n-x-0000000000",
        f"n-{tag.upper()}-0000000001",
        f"n-{tag}-000000001",  # 9 digits
        f"n-{tag}-00000000001",  # 11 digits
        f"n-{tag}--000000001",  # ZooKeeper's print of a sequence past 2^31 - 1
        f"n-{tag}-0000000001x",
        f"m-{tag}-0000000001",
        f"{tag}__lock__0000000001",
    ]:
        assert sequence_of(stranger) == -1, stranger
    names = [our_name(7), "junk", our_name(3), our_name(5)]
    assert [sequence_of(n) for n in ordered(names)] == [3, 5, 7]


def test_a_persistent_lookalike_that_sorts_first_does_not_lead(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    stranger = started(ensemble, clients)
    lookalike = stranger.create_async(f"{ELECTION}/{our_name(0)}", b"{}").get()
    a = join(ensemble, clients, "a")
    b = join(ensemble, clients, "b")
    assert sequence_of(lookalike.rsplit("/", 1)[1]) < sequence_of(a.znode.rsplit("/", 1)[1])
    assert first(a)
    assert not first(b)  # a leads; b waits on a, not on the lookalike
    queue = read_queue(started(ensemble, clients, AUTH), ELECTION)
    assert [c.identity.name for c in queue.contenders] == ["a", "b"]
    assert [(i.znode, i.reason) for i in queue.ignored] == [(lookalike, "not ephemeral")]
    a.leave()
    assert first(b)


def test_foreign_names_are_ignored_and_reported(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    stranger = started(ensemble, clients)
    for name in ["a", "n-0-0000000000", f"n-{uuid.uuid4().hex.upper()}-0000000000"]:
        stranger.create_async(f"{ELECTION}/{name}", b"", ephemeral=True).get()
    a = join(ensemble, clients, "a")
    assert first(a)
    queue = read_queue(started(ensemble, clients), ELECTION)
    assert [c.znode for c in queue.contenders] == [a.znode]
    assert len(queue.ignored) == 3
    assert {i.reason for i in queue.ignored} == {"name not n-<32 hex>-<10 digits>"}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"null",
        b"1e400",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe",
        b"[" * 100_000,
        b'{"name": "x", "host": "h", "pid": "12", "admin": "http://x:1"}',
        b'{"name": "x\\n", "host": "h", "pid": 1, "admin": ""}',
        b'{"name": "x", "host": "h", "pid": 1e400, "admin": ""}',
    ],
)
def test_garbage_data_keeps_its_place_and_is_reported(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient], data: bytes
) -> None:
    squatter = started(ensemble, clients)
    junk = squatter.create_async(
        f"{ELECTION}/n-{uuid.uuid4().hex}-", data, ephemeral=True, sequence=True
    ).get()
    a = join(ensemble, clients, "a")
    assert not first(a)  # the squatter is ephemeral and in our format: it keeps its place
    queue = read_queue(started(ensemble, clients), ELECTION)
    assert [c.znode for c in queue.contenders] == [junk, a.znode]
    assert [c.znode for c in queue.unparsable] == [junk]
    assert queue.contenders[0].identity.name == "?" or data.startswith(b'{"name": "x"')
    assert queue.contenders[0].problem
    assert queue.contenders[1].problem is None
    squatter.stop()
    assert first(a)


def test_data_whose_acl_refuses_us_is_reported_not_raised(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    other = started(ensemble, clients, "someone-else:theirs")
    theirs = other.create_async(
        f"{ELECTION}/n-{uuid.uuid4().hex}-", b"{}", OTHER_ACL, ephemeral=True, sequence=True
    ).get()
    queue = read_queue(started(ensemble, clients, AUTH), ELECTION)
    assert [(c.znode, c.problem) for c in queue.contenders] == [
        (theirs, "data not readable (its ACL refuses us)")
    ]


def test_what_the_election_creates_carries_its_acl(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    client = started(ensemble, clients, AUTH)
    election = Election(client, "/secured/election", Identity("a", "h", 1, ""), acl=ACL)
    znode = election.join()
    election.fence.raise_watermark(fence.Watermark(fence.Token(0, 1), 10))
    for path in ["/secured/election", znode, fence.watermark_path("/secured/election")]:
        acl, _stat = client.get_acls_async(path).get()
        assert acl == ACL, path
    stranger = started(ensemble, clients)
    with pytest.raises(NoAuthError):
        stranger.create_async("/secured/election/n-x-", b"", ephemeral=True, sequence=True).get()
    with pytest.raises(NoAuthError):
        stranger.set_async(znode, b"{}").get()
    with pytest.raises(NoAuthError):
        stranger.delete_async(znode).get()
    with pytest.raises(NoAuthError):
        stranger.get_async(znode).get()


def test_waiting_behind_a_long_lived_predecessor_keeps_one_pending_watch(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    """Re-checking every ``recheck_s`` must not add a watch callback per round: kazoo keeps
    them until the watch fires, so a predecessor that lives for days would pile them up."""
    leader = join(ensemble, clients, "leader")
    follower = join(ensemble, clients, "follower")
    assert not first(follower)  # ~20 re-checks of the same predecessor
    assert leader.znode is not None
    assert len(ensemble.pending_watches(leader.znode)) == 1


def test_a_leave_that_lost_its_connection_leaves_no_second_znode_after_rejoining(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    """A step-down while a ZooKeeper server died: the delete of our znode failed with
    ConnectionLoss, the session lived on. Joining again must not queue us twice (the old
    znode would stand first forever, and we would wait for ourselves)."""
    client = started(ensemble, clients)
    election = Election(client, ELECTION, Identity("a", "host", 1, "http://127.0.0.1:1"))
    first = election.join()
    real_delete = client.delete_async

    def lost(path: str, version: int = -1) -> FakeResult[bool]:
        def fail() -> bool:
            raise ConnectionLoss()

        return FakeResult(fail)

    client.delete_async = lost  # type: ignore[method-assign]
    with pytest.raises(ConnectionLoss):
        election.leave()
    client.delete_async = real_delete  # type: ignore[method-assign]
    assert ensemble.children(ELECTION) == [first.rsplit("/", 1)[1]]  # still there

    second = election.join()
    assert second != first
    assert ensemble.children(ELECTION) == [second.rsplit("/", 1)[1]]
    assert election.wait_until_first(threading.Event(), recheck_s=0.01)


class SlowCreate:
    """A client whose create waits for ``release``: a join in flight, on another thread."""

    def __init__(self, client: FakeKazooClient) -> None:
        self._client = client
        self.creating = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def create_async(self, *args: Any, **kwargs: Any) -> Any:
        self.creating.set()
        assert self.release.wait(5.0)
        return self._client.create_async(*args, **kwargs)


def test_an_advert_published_while_the_znode_is_created_is_not_lost(
    ensemble: FakeEnsemble, clients: list[FakeKazooClient]
) -> None:
    """The node's probe publishes its first advert right at start, while the run loop may be
    creating the znode with the advert it had: the znode must end up with the new one (two
    CI runs saw a good node advertised as unfit for good: a skewed leader never handed over
    to it)."""
    client = SlowCreate(started(ensemble, clients))
    election = Election(client, ELECTION, Identity("n", "host", 1, ""))  # type: ignore[arg-type]
    joining = threading.Thread(target=election.join)
    joining.start()
    assert client.creating.wait(5.0)
    fit = Identity("n", "host", 1, "", db_ok=True, clock_ok=True)
    publishing = threading.Thread(target=election.publish, args=(fit,))
    publishing.start()
    publishing.join(0.2)  # it must wait for the create, or come first; give it the chance
    client.release.set()
    joining.join(5.0)
    publishing.join(5.0)
    znode = election.znode
    assert znode is not None
    assert Identity.from_bytes(ensemble.data(znode)).fit
