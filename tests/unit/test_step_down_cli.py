"""``allocator step-down`` against a real admin server (the election read is stubbed): what
it prints when the leader hands over, and one readable error line when it refuses."""

from __future__ import annotations

import pytest

from allocator import cluster_status as status_mod
from allocator.core.exits import Exit
from allocator.zookeeper.election import Contender, Identity
from tests.admin_server import TOKEN, Stubs, served
from tests.fuzz.clikit import clean_environment, invoke


def _lead_from(monkeypatch: pytest.MonkeyPatch, admin_url: str, token: str) -> None:
    clean_environment(monkeypatch)
    monkeypatch.setenv("ALLOCATOR_ZOOKEEPER_AUTH", "ops:zk-Secret-0123")
    monkeypatch.setenv("ALLOCATOR_NODE_ADMIN_TOKEN", token)
    leader = Identity("node-1", "host-a", 4242, admin_url, True, True)
    contenders = [Contender("/election/n-0", 0, leader)]
    monkeypatch.setattr(status_mod, "read_contenders_once", lambda config: contenders)


def test_a_leader_that_hands_over_is_named_with_its_admin_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with served() as server:
        url = server.server.url
        _lead_from(monkeypatch, url, TOKEN)
        result = invoke(["step-down"])
        assert server.stubs.step_downs == 1
    assert result.exit_code == 0, result.output
    assert (
        result.stdout == f"node-1 is stepping down ({url}); the next node in the queue takes over\n"
    )


@pytest.mark.parametrize(
    ("leading", "token", "code", "line"),
    [
        (
            False,
            TOKEN,
            Exit.TEMPFAIL,  # the election moved on: ask again
            "error: node-1 no longer leads (HTTP 409): the election moved on; see ",
        ),
        (
            True,
            "another-token-0123456789-abcdefgh",
            Exit.CONFIG,  # the token is not the nodes': asking again cannot help
            "error: leader node-1 refused node.admin_token: HTTP 403 ",
        ),
    ],
)
def test_a_refusal_is_one_readable_line(
    monkeypatch: pytest.MonkeyPatch, leading: bool, token: str, code: Exit, line: str
) -> None:
    with served(stubs=Stubs(leading=leading)) as server:
        _lead_from(monkeypatch, server.server.url, token)
        result = invoke(["step-down"])
    assert result.exit_code == code, result.output
    (error,) = result.stderr.splitlines()
    assert error.startswith(line)
    assert "b'" not in error  # the answer's text, not a bytes repr
    if not leading:
        assert error.endswith("`allocator status`")
    else:
        assert "(wrong admin token)" in error
