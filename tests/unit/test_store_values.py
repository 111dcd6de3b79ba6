"""What the store writes is always something PostgreSQL can hold (`convergerd.store.values`),
and database errors are told apart by class and SQLSTATE (`convergerd.store.errors`)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.decode import MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS
from convergerd.core.model import UnreadableJson
from convergerd.store.errors import rejection_reason
from convergerd.store.values import (
    INT32_MAX,
    INT64_MAX,
    TEXT_MAX_CHARS,
    json_column,
    pg_count,
    pg_revision,
    pg_text,
)
from tests.strategies import JSON_VALUES

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


# --- json/jsonb columns: what the database hands back ------------------------------------------


@st.composite
def stored_json(draw: st.DrawFn) -> str:
    """Text a json/jsonb column can hold: a value at any nesting depth (jsonb accepts thousands
    of levels), or with an integer of any length (jsonb numerics are arbitrary precision)."""
    inner = json.dumps(draw(JSON_VALUES))
    depth = draw(st.integers(0, 6000))
    digits = draw(st.integers(1, 6000))
    number = draw(st.sampled_from(["", "-"])) + "9" * digits
    kind = draw(st.sampled_from(["list", "object", "number", "number in object"]))
    if kind == "list":
        return "[" * depth + inner + "]" * depth
    if kind == "object":
        return '{"a": ' * depth + inner + "}" * depth
    if kind == "number":
        return number
    return '{"type": "ForbidLatestTag", "n": [' + number + "]}"


@given(stored_json())
def test_a_stored_json_value_decodes_or_is_marked_unreadable(text: str) -> None:
    """asyncpg calls this for every json/jsonb value of a row: an exception would fail the whole
    query (every tenant's delivery), so it returns a value or a marker, nothing else."""
    value = json_column(text)
    if isinstance(value, UnreadableJson):
        assert value.reason  # says why, for the invalid policy's reason
        assert "9999" not in value.reason  # and quotes none of the value
    else:
        assert value == json.loads(text)


@given(JSON_VALUES)
def test_json_within_bounds_reads_as_stored(value: Any) -> None:
    assert json_column(json.dumps(value)) == value


@pytest.mark.parametrize(("text", "reason"), [
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
     f"nested deeper than {MAX_JSON_DEPTH} levels"),
    ("1" * 4301, f"an integer of 4301 digits (at most {MAX_JSON_INT_DIGITS})"),
])
def test_unreadable_values_say_why(text: str, reason: str) -> None:
    assert json_column(text) == UnreadableJson(reason)
