"""What the store writes is always something PostgreSQL can hold (`convergerd.store.values`),
and database errors are told apart by class and SQLSTATE (`convergerd.store.errors`)."""

from __future__ import annotations

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.store.errors import rejection_reason
from convergerd.store.values import (
    INT32_MAX,
    INT64_MAX,
    TEXT_MAX_CHARS,
    for_log,
    pg_count,
    pg_revision,
    pg_text,
)

# Every code point, lone surrogates and NUL included (what a JSON decoder can hand us).
ANY_TEXT = st.text(st.characters(codec=None, min_codepoint=0), max_size=300)


@given(ANY_TEXT, st.integers(min_value=2, max_value=200))
def test_cleaned_text_is_always_storable(value: str, limit: int) -> None:
    cleaned = pg_text(value, limit)
    assert cleaned is not None
    assert "\x00" not in cleaned
    cleaned.encode("utf-8")  # no lone surrogate left
    assert len(cleaned) <= limit


@given(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
               max_size=50))
def test_clean_text_is_returned_as_is(value: str) -> None:
    assert pg_text(value) is value


@pytest.mark.parametrize(
    ("value", "cleaned"),
    [
        ("ok\x00", "ok"),
        ("\x00\x00", ""),
        ("bad \ud800 byte", "bad \ufffd byte"),
        ("x" * (TEXT_MAX_CHARS + 1), "x" * (TEXT_MAX_CHARS - 1) + "…"),
        (None, None),
    ],
)
def test_text_cleaning(value: str | None, cleaned: str | None) -> None:
    assert pg_text(value) == cleaned


def test_counts_are_clamped_and_odd_revisions_dropped() -> None:
    assert pg_count(2**40) == INT32_MAX
    assert pg_count(-(2**40)) == -(2**31)
    assert pg_count(2**70, bits=64) == INT64_MAX
    assert pg_count(7) == 7
    assert pg_revision(2**63) is None
    assert pg_revision(2**63 - 1) == INT64_MAX
    assert pg_revision(True) is None  # a JSON `true` where a revision was due
    assert pg_revision(3) == 3


def test_values_for_logs_are_escaped_and_short() -> None:
    assert for_log("ok\x00") == "'ok\\x00'"
    assert len(for_log("y" * 1000)) == 100
    assert for_log("plain") == "plain"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (asyncpg.exceptions.CharacterNotInRepertoireError("NUL"), "data"),
        (asyncpg.exceptions.NumericValueOutOfRangeError("too big"), "data"),
        (asyncpg.exceptions.StringDataRightTruncationError("too long"), "data"),
        (asyncpg.exceptions.UniqueViolationError("dup"), "constraint"),
        (asyncpg.exceptions.CheckViolationError("check"), "constraint"),
        (asyncpg.exceptions.InsufficientPrivilegeError("revoked"), "access"),
        (asyncpg.exceptions.UndefinedTableError("renamed"), "access"),
        (asyncpg.exceptions.ProgramLimitExceededError("index row"), "limit"),
        (asyncpg.exceptions.RaiseError("trigger"), "raised"),
        (asyncpg.exceptions.CardinalityViolationError("twice"), "other"),
        (OverflowError("value out of int64 range"), "data"),  # COPY's own encoder
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"), "data"),
        # Not refusals: the database is away (wait and retry), or not the database at all.
        (asyncpg.exceptions.AdminShutdownError("bye"), None),
        (asyncpg.exceptions.SerializationError("retry"), None),
        (asyncpg.exceptions.TooManyConnectionsError("full"), None),
        (OSError("reset"), None),
        (ValueError("bug"), None),
    ],
)
def test_refusals_are_classified_by_sqlstate_class(
    error: BaseException, reason: str | None
) -> None:
    assert rejection_reason(error) == reason
