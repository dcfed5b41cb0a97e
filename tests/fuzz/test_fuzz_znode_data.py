"""Fuzz: election znode data (issue 10, must-shows 2 and 8).

Whatever bytes an election znode holds (arbitrary bytes, any JSON value, near-miss
identities, and the values the issue names: a non-numeric pid, ``1e400``, ``null``, a
list), :meth:`Identity.parse` answers with an identity and a one-line problem, never an
exception; data that parses survives a round trip. Put in an ephemeral znode in our name
format ahead of a real contender (on the in-memory ZooKeeper), it keeps its place in the
queue and is reported as unparsable, and ``allocator status`` (text and ``--json``),
``watch`` and ``step-down`` give a documented answer (exit code, one error line, no
traceback). Step-down never sends the token to what unparsable data names; this test sends
nothing anywhere (``urlopen`` is replaced).

Inputs (``ci`` profile): ``Identity.parse`` 300, the queue and the commands 150.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import cluster_status as status_mod
from allocator.commands import status as status_cmd
from allocator.core.records import PoolStatus
from allocator.zookeeper.election import Identity, read_queue
from tests.fakes import FakeEnsemble
from tests.fuzz.clikit import check_answer, clean_environment, invoke
from tests.fuzz.profiles import examples

ELECTION = "/election"
AUTH = "fuzz-cluster:fuzz-password-not-secret"
TOKEN = "tok-fuzz-0123456789abcdefghijklmnop"
CHILD_NAME_KEYS = ["name", "host", "pid", "admin", "db_ok", "clock_ok"]

SPECIALS = [
    b"",
    b"null",
    b"1e400",
    b"-1e400",
    b"NaN",
    b"[]",
    b"[1, 2, 3]",
    b'"a string"',
    b"true",
    b"{",
    b"\xff\xfe\x00",
    b"[" * 50_000,
    b'{"a":' * 50_000,
    b"9" * 5_000,  # past Python's int-from-text digit limit
    b'{"name": "n", "host": "h", "pid": "12", "admin": ""}',
    b'{"name": "n", "host": "h", "pid": 1e400, "admin": ""}',
    b'{"name": "n", "host": "h", "pid": null, "admin": ""}',
    b'{"name": "n", "host": "h", "pid": [1], "admin": ""}',
    b'{"name": "n", "host": "h", "pid": -1, "admin": ""}',
    b'{"name": "n", "host": "h", "pid": true, "admin": ""}',
    b'{"name": "\\ud800", "host": "h", "pid": 1, "admin": ""}',
    b'{"name": "n\\u001b[2J", "host": "h", "pid": 1, "admin": ""}',
    b'{"name": "n", "host": "h", "pid": 1, "admin": "http://10.0.0.1:80"}',
    b'{"name": "n", "host": "h", "pid": 1, "admin": "http://x", "db_ok": "yes"}',
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FFF), max_size=20),
)
keys = st.one_of(st.sampled_from(CHILD_NAME_KEYS), st.text(max_size=8))
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=6)
    ),
    max_leaves=16,
)
near_identities = st.fixed_dictionaries(
    {"name": scalars, "host": scalars, "pid": scalars, "admin": scalars},
    optional={"db_ok": scalars, "clock_ok": scalars, "extra": json_values},
)


def _dumps(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


znode_data = st.one_of(
    st.sampled_from(SPECIALS),
    st.binary(max_size=256),
    json_values.map(_dumps),
    near_identities.map(_dumps),
)


@settings(max_examples=examples(300))
@given(data=znode_data)
def test_identity_parse_is_total(data: bytes) -> None:
    identity, problem = Identity.parse(data)
    assert Identity.from_bytes(data) == identity
    assert isinstance(identity.name, str)
    assert isinstance(identity.pid, int)
    if problem is None:
        assert identity.name.isprintable()
        assert identity.host.isprintable()
        assert Identity.parse(identity.to_bytes()) == (identity, None)
    else:
        assert problem.isprintable()  # one line, made of our words, nothing of the data


class _World:
    """The fakes one example runs against: an ensemble, and what step-down tried to call."""

    def __init__(self) -> None:
        self.ensemble = FakeEnsemble()
        self.requests: list[str] = []


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> _World:
    """``allocator status|watch|step-down`` on the in-memory ZooKeeper and a fixed pool:
    no server, no network (step-down's ``urlopen`` records and refuses)."""
    clean_environment(monkeypatch)
    monkeypatch.setenv("ALLOCATOR_ZOOKEEPER_AUTH", AUTH)
    monkeypatch.setenv("ALLOCATOR_NODE_ADMIN_TOKEN", TOKEN)
    holder = _World()
    pool = PoolStatus(
        available_blocks=3,
        available_ids=12_288,
        claim_rate_blocks_per_s=None,
        runway_s=None,
        high_water_id=1,
        cut_position=0,
        claim_position=0,
        epoch=0,
        holder=None,
    )

    def no_http(request: Any, timeout: float | None = None) -> Any:
        holder.requests.append(request.full_url)
        raise OSError("no network in this test")

    real_sleep = time.sleep

    def stop_watching(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") != status_cmd.__name__:
            real_sleep(seconds)
            return
        raise KeyboardInterrupt  # watch ends as on Ctrl-C, after one round

    monkeypatch.setattr(status_mod, "read_status", lambda *a, **k: (pool, []))
    monkeypatch.setattr(status_mod, "read_rebases", lambda *a, **k: [])
    monkeypatch.setattr(status_mod, "read_block_age", lambda *a, **k: None)
    monkeypatch.setattr(
        status_mod, "zookeeper_client", lambda config, **k: holder.ensemble.client(auth=AUTH)
    )
    monkeypatch.setattr(status_cmd.urllib.request, "urlopen", no_http)
    monkeypatch.setattr(time, "sleep", stop_watching)
    return holder


def test_a_squatter_with_any_data_keeps_its_place_and_every_view_answers(world: _World) -> None:
    @settings(max_examples=examples(150))
    @given(data=znode_data)
    def run(data: bytes) -> None:
        world.ensemble = ensemble = FakeEnsemble()
        world.requests.clear()
        squatter = ensemble.client(auth=AUTH)
        node = ensemble.client(auth=AUTH)
        squatter.start()
        node.start()
        try:
            squatter.ensure_path_async(ELECTION).get()
            junk = squatter.create_async(
                f"{ELECTION}/n-{uuid.uuid4().hex}-", data, ephemeral=True, sequence=True
            ).get()
            good = Identity("node-1", "host-1", 42, "http://127.0.0.1:1", True, True)
            real = node.create_async(
                f"{ELECTION}/n-{uuid.uuid4().hex}-",
                good.to_bytes(),
                ephemeral=True,
                sequence=True,
            ).get()
            _identity, problem = Identity.parse(data)

            queue = read_queue(node, ELECTION)
            assert [c.znode for c in queue.contenders] == [junk, real]  # data reorders nothing
            assert [c.znode for c in queue.unparsable] == ([junk] if problem else [])
            assert queue.contenders[1].identity == good

            for args in (["status"], ["status", "--json"], ["watch"], ["step-down"]):
                result = invoke(args)
                check_answer(result, args)
                if args == ["status", "--json"]:
                    assert result.exit_code == 0, result.output
                    shown = json.loads(result.stdout)
                    assert [c["znode"] for c in shown["contenders"]] == [junk, real]
                    unparsable = [e["znode"] for e in shown["election"]["unparsable"]]
                    assert unparsable == ([junk] if problem else [])
            if problem:
                assert world.requests == []  # no token sent where garbage points
        finally:
            squatter.stop()
            squatter.close()
            node.stop()
            node.close()

    run()
