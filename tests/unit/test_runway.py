"""Pure parts of the jobs and the pool's sizing (:mod:`allocator.config.runway`)."""

from __future__ import annotations

import pytest

from allocator.config import Config, runway


def _config(**pool: float) -> Config:
    return Config.model_validate(
        {
            "pool": {"min_blocks": 64, "runway_s": 60.0, "max_blocks": 100_000, **pool},
            "zookeeper": {"session_timeout_ms": 10_000},
        }
    )


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (None, 64),  # no rate observed yet: the minimum
        (0.0, 64),
        (0.5, 64),  # 0.5 blocks/s x 60 s = 30 < min_blocks
        (10.0, 600),  # runway wins
        (10.01, 601),  # rounded up: never less runway than asked
        (1e9, 100_000),  # capped
    ],
)
def test_pool_target_is_min_blocks_or_runway_capped(rate: float | None, expected: int) -> None:
    assert runway.target_blocks(_config(), rate) == expected


def test_the_target_never_covers_less_than_a_handover() -> None:
    # runway_s 5 s is shorter than the 10 s session + 5 s margin a handover may take.
    config = _config(runway_s=5.0)
    assert runway.needed_runway_s(config) == 15.0
    assert runway.target_blocks(config, 100.0) == 1500


def test_the_covered_rate_is_the_cap_over_the_needed_runway() -> None:
    config = _config(handover_margin_s=10.0)
    assert runway.covered_rate_blocks_per_s(config) == 100_000 / 20
    assert runway.rate_warning(config, 5000.0) is None
    assert runway.rate_warning(config, None) is None
    warning = runway.rate_warning(config, 14_000.0)
    assert warning is not None
    assert "pool.max_blocks (100000)" in warning
    assert "5,000 blocks/s" in warning
    assert runway.coverage_line(config) == (
        "pool.max_blocks (100000) covers a handover of 20 s (zookeeper.session_timeout_ms + "
        "pool.handover_margin_s) at claim rates up to 5,000 blocks/s"
    )


def test_an_idle_transaction_bound_past_the_session_is_warned_about() -> None:
    assert runway.config_warnings(_config()) == []
    config = Config.model_validate(
        {
            "postgres": {"idle_in_transaction_timeout_ms": 10_000},
            "zookeeper": {"session_timeout_ms": 10_000},
        }
    )
    (warning,) = runway.config_warnings(config)
    assert warning.startswith("postgres.idle_in_transaction_timeout_ms (10000) is not below")


def test_status_states_the_needed_runway_and_warns_when_the_cap_cannot_cover_it() -> None:
    from allocator.commands.status import _add_coverage

    data: dict[str, dict[str, object]] = {"pool": {"claim_rate_blocks_per_s": 14_000.0}}
    warning = _add_coverage(data, _config())  # 100,000 blocks / 15 s covers 6,667 blocks/s
    assert warning is not None
    assert "consumers will see 'pool empty' (AL003) during a failover" in warning
    assert data["pool"] == {
        "claim_rate_blocks_per_s": 14_000.0,
        "runway_needed_s": 15.0,
        "covered_rate_blocks_per_s": 6666.7,
        "covers_handover": False,
    }
    calm: dict[str, dict[str, object]] = {"pool": {"claim_rate_blocks_per_s": None}}
    assert _add_coverage(calm, _config()) is None
    assert calm["pool"]["covers_handover"] is True
