"""The benches against a PostgreSQL server that does not answer: one error line and exit
75, as for every command, never a driver's traceback (run in-process, no server)."""

from __future__ import annotations

import pytest

from tests.fuzz.clikit import CLOSED_PORT, clean_environment, invoke

EX_UNAVAILABLE = 75


@pytest.mark.parametrize("bench", ["claims", "slow-consumer"])
def test_an_unreachable_server_is_one_line_and_exit_75(
    monkeypatch: pytest.MonkeyPatch, bench: str
) -> None:
    clean_environment(monkeypatch)
    url = f"postgresql://bench@127.0.0.1:{CLOSED_PORT}/postgres"
    result = invoke(["bench", bench, "--database-url", url])
    assert result.exit_code == EX_UNAVAILABLE, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: connect to the bench's PostgreSQL server: ")
    assert "Traceback" not in result.output
