"""ZooKeeper's watermark: its format, that it never goes down, and the verdict it gives."""

from __future__ import annotations

import pytest

from allocator.fence import Token, Watermark, database_behind, watermark_path

MARK = Watermark(Token(1, 0x1_0000_0005), 12_345)


def test_the_watermark_lives_beside_the_election_path() -> None:
    assert watermark_path("/election") == "/db-watermark"
    assert watermark_path("/a/b/election") == "/a/b/db-watermark"


def test_round_trip_and_merge_keeps_the_larger_of_each_part() -> None:
    assert Watermark.from_bytes(MARK.to_bytes()) == MARK
    older_token_higher_mark = Watermark(Token(1, 0x1_0000_0001), 20_000)
    assert MARK.merge(older_token_higher_mark) == Watermark(Token(1, 0x1_0000_0005), 20_000)
    assert older_token_higher_mark.merge(MARK) == MARK.merge(older_token_higher_mark)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[1, 2, 3]",
        b"null",
        b'{"generation": 0, "epoch": 5}',
        b'{"generation": 0, "epoch": 5, "high_water_id": "7"}',
        b'{"generation": true, "epoch": 5, "high_water_id": 7}',
        b'{"generation": 0, "epoch": 5, "high_water_id": 1e400}',
        b'{"generation": -1, "epoch": 5, "high_water_id": 7}',
        b'{"generation": 0, "epoch": 5, "high_water_id": -2}',
        b'{"generation": 0, "epoch": 5, "high_water_id": 1180591620717411303424}',  # 2^70
        b'{"generation": 9223372036854775808, "epoch": 5, "high_water_id": 7}',  # 2^63
        b'{"generation": 0, "epoch": 18446744073709551616, "high_water_id": 7}',  # 2^64
        b'{"generation": 0, "epoch": 5, "high_water_id": ' + b"9" * 5000 + b"}",
        b"\xff\xfe",
    ],
)
def test_anything_else_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="watermark znode holds"):
        Watermark.from_bytes(data)


def test_a_database_at_or_past_the_watermark_is_not_behind() -> None:
    assert database_behind(MARK.token, MARK.high_water_id, MARK) is None
    assert database_behind(Token(2, 1), MARK.high_water_id + 1, MARK) is None
    assert database_behind(Token(0, 1), -1, None) is None  # no watermark yet


def test_an_older_fence_or_a_lower_mark_is_behind_and_says_which() -> None:
    older = database_behind(Token(1, 0x1_0000_0004), MARK.high_water_id, MARK)
    assert older is not None
    assert "fence 1:0x100000004 is older" in older
    lower = database_behind(MARK.token, MARK.high_water_id - 1, MARK)
    assert lower is not None
    assert "high-water mark 12344 is below the watermark's 12345" in lower
    both = database_behind(Token(0, 9), 0, MARK)
    assert both is not None
    assert "fence" in both
    assert "high-water mark" in both
