"""Fuzz: ``allocator.claim_blocks`` arguments over SQL, as a consumer calls it (issue 10,
must-show 8).

Generated bad arguments, as the ``allocator_consumer`` role sends them: a consumer that is
NULL, empty, blank, over-long (up to 200 000 characters), holds control characters or NUL,
or is not valid UTF-8 (raw bytes through ``convert_from`` and through a text parameter
sent as raw bytes); a count that is NULL, ``<= 0``, over 1000, beyond ``integer`` (then
sent as ``bigint`` or ``numeric``), a float, a boolean or text that is no integer; named
and explicitly cast arguments; too few and too many arguments. Each answer is one of the
SQLSTATEs docs/sql.md lists for a call (``DOCUMENTED``) with a one-line primary message,
or psycopg's client-side refusal of a NUL in text (nothing is sent); and nothing changes:
the unclaimed blocks, the fence, the high-water mark and the claim ticket sequence are
the same after the call as before.

Inputs (``ci`` profile): 300 calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format

from allocator.client.base import ClaimArgumentError, check_consumer
from tests.fixtures.pg import cut, layout_blocks, take_fence, url_for_user
from tests.fuzz.profiles import examples

pytestmark = pytest.mark.integration

EPOCH = 100
BLOCKS = 8
DOCUMENTED = {
    "AL001": "consumer NULL, empty, blank, over 128 characters or with control characters",
    "AL002": "n NULL, below 1 or above 1000",
    "22021": "bytes that are not valid UTF-8 (or a NUL byte)",
    "22P02": "an argument given as text that is not an integer",
    "22003": "an argument given as text beyond integer",
    "42883": "no claim_blocks takes these arguments (types, count)",
}
"""SQLSTATEs docs/sql.md documents for a bad call of claim_blocks."""
QUOTING = {"22P02", "22003"}
"""PostgreSQL quotes the bad input in these messages (a line break in it shows)."""


class RawText(bytes):
    """Bytes sent as a ``text`` parameter as they are: the server checks their encoding."""


class RawTextDumper(Dumper):
    format = Format.BINARY
    oid = psycopg.adapters.types["text"].oid

    def dump(self, obj: bytes) -> bytes:
        return bytes(obj)


@dataclass(frozen=True)
class Call:
    statement: str
    params: tuple[object, ...]

    def quotes_a_line_break(self) -> bool:
        return any(isinstance(p, str) and ("\n" in p or "\r" in p) for p in self.params)


SNAPSHOT = """
SELECT (SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NULL),
       (SELECT count(*) FROM allocator.blocks),
       (SELECT row_to_json(f)::text FROM allocator.fence f),
       (SELECT row_to_json(h)::text FROM allocator.high_water h),
       (SELECT last_value FROM allocator.claim_ticket),
       (SELECT is_called FROM allocator.claim_ticket)
"""
"""Pool, fence, mark and ticket position: a failed claim must leave all of them alone."""


# -- arguments -------------------------------------------------------------------------------

good_names = st.sampled_from(["orders-api", "app", "名前", "a b", "x" * 128])
controls = st.sampled_from([chr(c) for c in (*range(1, 32), *range(0x7F, 0xA0))])
"""Control characters (Unicode Cc): C0, DEL and C1."""


@st.composite
def bad_names(draw: st.DrawFn) -> str | None:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(st.sampled_from([None, "", " ", "    "]))
    if kind == 1:  # too long: 129 characters and up, multi-byte ones too
        char = draw(st.sampled_from(["x", "é", "名", "😀"]))
        return char * draw(st.sampled_from([129, 130, 1000, 200_000]))
    if kind == 2:  # a control character somewhere
        text = draw(st.text(max_size=20).filter(lambda t: "\x00" not in t))
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(controls) + text[at:]
    if kind == 3:  # a NUL: psycopg refuses it before sending
        return draw(st.text(max_size=10)) + "\x00" + draw(st.text(max_size=10))
    return draw(controls) * draw(st.integers(1, 3))


bad_counts = st.one_of(
    st.sampled_from([None, 0, -1, 1001, 2**31 - 1, -(2**31)]),
    st.integers(max_value=0),
    st.integers(1001, 2**31 - 1),
    st.integers(min_value=2**31),  # bigint / numeric: no function takes them
    st.integers(max_value=-(2**31) - 1),
    st.floats(),
    st.sampled_from([True, False, Decimal("1.5"), Decimal("NaN")]),
    st.sampled_from(["abc", "1.5", "", " ", "1e3", "0x10", "1_0", "١٢٣", "12\nx", "99999999999"]),
    st.sampled_from(["0", "-1", "1001", " 0 ", "+0"]),  # text that casts to a bad count
)
good_counts = st.sampled_from([1, 2, 1000])


def _valid_text(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")  # strict: no surrogates, no overlong forms, like PostgreSQL
    except UnicodeDecodeError:
        return False
    return b"\x00" not in raw


invalid_utf8 = (
    st.tuples(
        st.binary(max_size=8),
        st.sampled_from(
            [
                b"\xff",
                b"\xc3\x28",
                b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80",
                b"\xc0\xaf",
                b"\x80",
                b"\x00",
            ]
        ),
        st.binary(max_size=8),
    )
    .map(b"".join)
    .filter(lambda raw: not _valid_text(raw))
)
"""Bytes that are not valid UTF-8 (or hold a NUL, which text cannot)."""


@st.composite
def calls(draw: st.DrawFn) -> Call:
    kind = draw(st.integers(0, 7))
    if kind <= 2:  # positional; at least one argument bad
        if draw(st.booleans()):
            consumer, n = draw(bad_names()), draw(st.one_of(good_counts, bad_counts))
        else:
            consumer, n = draw(st.one_of(good_names, bad_names())), draw(bad_counts)
        return Call("SELECT * FROM allocator.claim_blocks(%s, %s)", (consumer, n))
    if kind == 3:  # n left to its default
        return Call("SELECT * FROM allocator.claim_blocks(%s)", (draw(bad_names()),))
    if kind == 4:  # named and cast
        consumer = draw(st.one_of(good_names, bad_names()))
        n = draw(st.sampled_from([0, -5, 1001, None]))
        form, n_first = draw(
            st.sampled_from(
                [
                    ("SELECT * FROM allocator.claim_blocks(consumer => %s, n => %s)", False),
                    ("SELECT * FROM allocator.claim_blocks(%s::text, %s::integer)", False),
                    ("SELECT * FROM allocator.claim_blocks(n => %s::int, consumer => %s)", True),
                ]
            )
        )
        return Call(form, (n, consumer) if n_first else (consumer, n))
    if kind == 5:  # text cast to integer: not an integer, or beyond it
        consumer = draw(st.one_of(good_names, bad_names()))
        text = draw(
            st.one_of(
                st.sampled_from(["abc", "1.5", "", "1e3", "١٢٣", "12\nx", "9" * 12, "-9" * 6]),
                st.text(min_size=1, max_size=12).map(lambda t: f"{t}é"),  # never an integer
            )
        )
        return Call("SELECT * FROM allocator.claim_blocks(%s, %s::text::integer)", (consumer, text))
    if kind == 6:  # bytes that are not UTF-8: through convert_from, and as a raw text parameter
        raw = draw(invalid_utf8)
        if draw(st.booleans()):
            statement = "SELECT * FROM allocator.claim_blocks(convert_from(%s::bytea, 'UTF8'), %s)"
            return Call(statement, (raw, draw(st.one_of(good_counts, bad_counts))))
        return Call("SELECT * FROM allocator.claim_blocks(%b, 1)", (RawText(raw),))
    form = draw(  # the wrong number or types of arguments
        st.sampled_from(
            [
                ("SELECT * FROM allocator.claim_blocks()", 0),
                ("SELECT * FROM allocator.claim_blocks(%s, %s, %s)", 3),
                ("SELECT * FROM allocator.claim_blocks(%s::bytea, 1)", 1),
                ("SELECT * FROM allocator.claim_blocks(%s::integer, 1)", 1),
                ("SELECT * FROM allocator.claim_blocks(%s::json, 1)", 1),
                ("SELECT * FROM allocator.claim_blocks('orders', %s::bigint)", 1),
                ("SELECT * FROM allocator.claim_blocks('orders', %s::numeric)", 1),
                ("SELECT * FROM allocator.claim_blocks(%s, 1::bigint)", 1),
            ]
        )
    )
    statement, count = form
    values = st.sampled_from(["7", "{}", "x", None]) if "::" in statement else good_names
    return Call(statement, tuple(draw(values) for _ in range(count)))


# -- the database ------------------------------------------------------------------------------


@pytest.fixture
def stocked(db_url: str) -> Iterator[tuple[psycopg.Connection, psycopg.Connection]]:
    """(superuser, consumer) connections to a database with BLOCKS unclaimed blocks."""
    role = f"t_fuzz_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, EPOCH)
        cut(admin, EPOCH, layout_blocks(BLOCKS))
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_consumer").format(sql.Identifier(role))
        )
        try:
            with psycopg.connect(url_for_user(db_url, role), autocommit=True) as consumer:
                consumer.adapters.register_dumper(RawText, RawTextDumper)
                yield admin, consumer
        finally:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def snapshot(admin: psycopg.Connection) -> tuple[object, ...]:
    row = admin.execute(SNAPSHOT).fetchone()
    assert row is not None
    return tuple(row)


def test_claim_blocks_refuses_bad_arguments(
    stocked: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    admin, consumer = stocked
    before = snapshot(admin)
    assert before[0] == BLOCKS
    seen: dict[str, int] = {}

    @settings(max_examples=examples(300))
    @given(call=calls())
    def run(call: Call) -> None:
        try:
            rows = consumer.execute(call.statement, call.params).fetchall()
        except psycopg.Error as exc:
            answer = check_error(call, exc)
        else:
            raise AssertionError(f"claim_blocks accepted {call}: {rows}")
        assert snapshot(admin) == before, call
        seen[answer] = seen.get(answer, 0) + 1

    run()
    # The generator reaches every documented answer (the counts are in the test output).
    assert set(seen) >= {"AL001", "AL002", "22021", "22P02", "42883", "client"}, seen


def check_error(call: Call, exc: psycopg.Error) -> str:
    """Asserts ``exc`` is a documented answer to ``call``; returns its SQLSTATE ("client":
    psycopg refused a NUL in text and sent nothing)."""
    if exc.sqlstate is None and isinstance(exc, psycopg.DataError):
        assert "NUL" in str(exc), f"{call}: {exc}"
        return "client"
    assert exc.sqlstate in DOCUMENTED, f"{call}: undocumented {exc.sqlstate}: {exc}"
    primary = exc.diag.message_primary or ""
    assert primary, call
    if not (exc.sqlstate in QUOTING and call.quotes_a_line_break()):
        assert "\n" not in primary, f"{call}: {primary!r}"
        assert "\r" not in primary, f"{call}: {primary!r}"
    assert len(primary) < 300, f"{call}: {primary[:100]!r}..."
    return exc.sqlstate


INVISIBLE_NAMES = ["\u00a0", "\u3000", "\u2028", "a\u2028b", "\u200b", "\ufeff", "\u2003\u2003"]
"""Names that are blank or break a line without an ASCII control character."""


def test_claim_blocks_refuses_invisible_and_line_breaking_names(
    stocked: tuple[psycopg.Connection, psycopg.Connection],
) -> None:
    admin, consumer = stocked
    before = snapshot(admin)
    answers: dict[str, str | None] = {}
    for name in INVISIBLE_NAMES:
        try:
            consumer.execute("SELECT * FROM allocator.claim_blocks(%s)", (name,)).fetchall()
        except psycopg.Error as exc:
            answers[name] = exc.sqlstate
        else:
            answers[name] = None  # claimed a block
    assert answers == dict.fromkeys(INVISIBLE_NAMES, "AL001")
    assert snapshot(admin) == before
    for name in INVISIBLE_NAMES:  # the Python client says so before any I/O
        with pytest.raises(ClaimArgumentError) as caught:
            check_consumer(name)
        assert caught.value.sqlstate == "AL001"
    for name in ["orders-api", "a b", "\u00e9t\u00e9", "x\u200bx"]:
        assert check_consumer(name) == name
