""":func:`allocator.cluster_status.gather` against real servers: the ``fence`` object, the token's
generation in ``leader`` and ``handovers``, contenders' adverts, and odd ZooKeeper data.

The election is built by hand (ephemeral sequential znodes with a contender's data, the
fence taken with the first one's czxid), so each case sets exactly the state it reads.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from kazoo.client import KazooClient

from allocator import fence
from allocator.cluster_status import gather, gather_fence
from allocator.config import Config, load_config
from allocator.postgres import operator as db
from allocator.zookeeper.election import NODE_PREFIX, Identity
from tests.fixtures.pg import take_fence

pytestmark = pytest.mark.integration

ELECTION = "/election"
GENERATION = fence.generation_path(ELECTION)
STABLE_KEYS = {
    "leader": {"name", "host", "pid", "epoch", "since"},
    "contender": {"name", "host", "pid", "znode"},
    "handover": {"epoch", "holder", "elected_at", "ended_at", "end_reason"},
}


@pytest.fixture
def config(zk_hosts: str, db_url: str) -> Config:
    return load_config(overrides={"zookeeper.hosts": zk_hosts, "postgres.url": db_url}, env={})


@pytest.fixture
def zk(zk_hosts: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zk_hosts)
    client.start(timeout=15)
    client.ensure_path(ELECTION)
    yield client
    client.stop()
    client.close()


def contend(zk: KazooClient, data: bytes, tag: str) -> int:
    """A contender's znode (ephemeral, sequential, our name format: ``tag`` as the 32 hex
    digits); returns its czxid."""
    hex_tag = tag.encode().hex().ljust(32, "0")[:32]
    path = zk.create(f"{ELECTION}/{NODE_PREFIX}{hex_tag}-", data, ephemeral=True, sequence=True)
    return int(zk.exists(path).czxid)


def identity(name: str, *, db_ok: bool | None, clock_ok: bool | None) -> bytes:
    return Identity(name, "host-a", 4242, "http://127.0.0.1:1", db_ok, clock_ok).to_bytes()


def test_status_shows_the_token_fence_and_adverts(
    config: Config, zk: KazooClient, db_url: str
) -> None:
    czxid = contend(zk, identity("node-1", db_ok=True, clock_ok=False), "a")
    contend(zk, b"\xff\x00 not json", "b")  # unreadable data: shown as "?", never raises
    contend(zk, identity("node-3", db_ok=None, clock_ok=None), "c")
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, czxid, holder="node-1")

    data = gather(config).to_json()

    assert data["leader"].keys() >= STABLE_KEYS["leader"] | {"generation"}
    assert (data["leader"]["name"], data["leader"]["epoch"]) == ("node-1", czxid)
    assert data["leader"]["generation"] == 0
    assert data["leader"]["since"] is not None
    adverts = [(c["name"], c["db_ok"], c["clock_ok"]) for c in data["contenders"]]
    assert adverts == [("node-1", True, False), ("?", None, None), ("node-3", None, None)]
    assert [c["problem"] for c in data["contenders"]] == [None, "not UTF-8", None]
    assert data["election"] == {
        "unparsable": [{"znode": data["contenders"][1]["znode"], "problem": "not UTF-8"}],
        "ignored": [],
    }
    assert all(c.keys() >= STABLE_KEYS["contender"] for c in data["contenders"])
    [handover] = data["handovers"]
    assert handover.keys() >= STABLE_KEYS["handover"]
    assert (handover["generation"], handover["epoch"]) == (0, czxid)
    assert data["fence"] == {
        "generation": 0,
        "epoch": czxid,
        "holder": "node-1",
        "zookeeper_generation": 0,
        "zookeeper_newest_zxid": data["fence"]["zookeeper_newest_zxid"],
        "generation_znode": "/" + config.zookeeper.hosts.split("/", 1)[1] + GENERATION,
        "ahead_of_zookeeper": False,
        "problem": None,
        "rebases": [],
        "high_water_id": -1,
        "watermark": None,
        "watermark_problem": None,
        "database_behind_zookeeper": None,
    }
    assert data["fence"]["zookeeper_newest_zxid"] >= czxid


def test_a_database_below_the_watermark_is_behind_and_says_why(
    config: Config, zk: KazooClient, db_url: str
) -> None:
    czxid = contend(zk, identity("node-1", db_ok=True, clock_ok=True), "a")
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, czxid, holder="node-1")
    mark = fence.Watermark(fence.Token(0, czxid), 10**12)  # cuts the database lacks
    zk.create(fence.watermark_path(ELECTION), mark.to_bytes())

    report = gather(config).to_json()["fence"]

    assert report["watermark"] == mark.to_json()
    assert (
        "high-water mark -1 is below the watermark's 1000000000000"
        in (report["database_behind_zookeeper"])
    )
    zk.set(fence.watermark_path(ELECTION), b"{not a watermark")
    report = gather(config).to_json()["fence"]
    assert report["watermark"] is None
    assert report["database_behind_zookeeper"] is None
    assert "not JSON" in report["watermark_problem"]


def test_an_epoch_beyond_zookeeper_is_ahead(config: Config, zk: KazooClient, db_url: str) -> None:
    czxid = contend(zk, identity("node-1", db_ok=True, clock_ok=True), "a")
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, czxid, holder="node-1")
        # What an ensemble restored from an older snapshot looks like from the database.
        admin.execute("UPDATE allocator.fence SET epoch = epoch + (1::bigint << 40)")

    report = gather_fence(config)

    assert report.ahead_of_zookeeper is True
    assert report.epoch == czxid + (1 << 40)
    assert gather(config).to_json()["fence"]["ahead_of_zookeeper"] is True


def test_a_rebase_clears_it_and_a_lost_generation_znode_brings_it_back(
    config: Config, zk: KazooClient, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, (9 << 32) + 1, holder="node-1")
    assert gather_fence(config).ahead_of_zookeeper is True

    rebased = db.rebase_fence(db_url, "ensemble rebuilt")  # what `fence rebase` does, by hand
    zk.create(GENERATION, str(rebased.new_generation).encode())
    report = gather_fence(config)
    assert (report.generation, report.epoch, report.zookeeper.generation) == (1, 0, 1)
    assert report.ahead_of_zookeeper is False
    assert [r.reason for r in report.rebases or []] == ["ensemble rebuilt"]

    zk.delete(GENERATION)  # wiped again: ZooKeeper says generation 0
    assert gather_fence(config).ahead_of_zookeeper is True


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"banana", "not a number"),
        (b"", "not a number"),
        (b"-1", "not a number"),
        (b"1" * 20, "past the largest generation"),
    ],
)
def test_an_unreadable_generation_is_reported_not_raised(
    config: Config, zk: KazooClient, data: bytes, problem: str
) -> None:
    zk.create(GENERATION, data)

    out = gather(config).to_json()["fence"]

    assert out["zookeeper_generation"] is None
    assert out["ahead_of_zookeeper"] is None
    assert problem in out["problem"]


def test_a_missing_chroot_is_an_empty_election(zk_hosts: str, db_url: str) -> None:
    config = load_config(
        overrides={"zookeeper.hosts": zk_hosts + "/gone", "postgres.url": db_url}, env={}
    )
    data = gather(config).to_json()
    assert (data["leader"], data["contenders"]) == (None, [])
    assert data["fence"]["zookeeper_generation"] == 0
    assert data["fence"]["ahead_of_zookeeper"] is False  # (0, 0) in the fresh database
