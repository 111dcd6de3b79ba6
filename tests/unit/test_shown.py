"""How messages and log lines show untrusted values and exceptions: `shown` and `describe`."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.shown import DESCRIBED_MAX_CHARS, SHOWN_MAX_CHARS, Style, describe, shown

STYLES: tuple[Style, ...] = ("repr", "text", "prose", "json")


@pytest.mark.parametrize(
    "value", [None, 7, "", "team-a", ["a", "b"], {"type": "ForbidLatestTag"}, "a\nb", 1.5]
)
def test_short_values_are_quoted_as_repr(value: object) -> None:
    assert shown(value) == repr(value)


def test_a_long_string_keeps_its_start_and_is_marked_cut() -> None:
    text = shown("registry.example.com/" + "x" * 10_000)
    assert len(text) == SHOWN_MAX_CHARS
    assert text.startswith("'registry.example.com/xxx")
    assert text.endswith("…")


def test_control_characters_stay_escaped_so_a_message_is_one_line() -> None:
    assert "\n" not in shown("a\n" * 500)
    assert "\x00" not in shown(b"\x00" * 500)


@pytest.mark.parametrize(
    "value",
    [
        ["x" * 1000] * 100_000,              # a big list: only its start is looked at
        {f"k{i}": "v" * 1000 for i in range(10_000)},
        1 << 100_000,                         # repr() refuses integers this long
        b"\xff" * 1_000_000,
    ],
    ids=["list", "dict", "int", "bytes"],
)
@pytest.mark.parametrize("style", STYLES)
def test_huge_values_are_cut_to_the_limit(value: object, style: Style) -> None:
    assert len(shown(value, style=style)) <= SHOWN_MAX_CHARS


def test_deep_nesting_does_not_recurse_without_end() -> None:
    deep: list[object] = []
    inner = deep
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    assert shown(deep) == "[[[[...]]]]"
    assert shown(deep, 10_000, style="json") == "[" * 100 + "[...]" + "]" * 100


def test_a_dict_keeps_its_order_as_repr_does() -> None:
    assert shown({"b": 1, "a": 2}) == repr({"b": 1, "a": 2})


def test_text_is_shown_as_itself_with_every_unprintable_character_escaped() -> None:
    assert shown("p1", style="text") == "p1"
    assert shown("a\nb\r\x1b[31m\x00\udcff\u202e", style="text") == (
        "a\\nb\\r\\x1b[31m\\x00\\udcff\\u202e")
    assert shown("x" * 500, style="text") == "x" * 99 + "…"
    assert shown(3, style="text") == "3"  # not a string: as repr


def test_prose_is_one_line_of_words() -> None:
    assert shown("  cannot\n\tconnect  \x1b[31m ", style="prose") == "cannot connect \\x1b[31m"
    assert shown("abc def", 3, style="prose") == "ab…"
    assert shown("word " * 100_000, 20, style="prose") == "word word word word…"


def test_json_is_what_a_decoded_value_looks_like() -> None:
    assert shown({"a": [1, "x\n"], "b": None}, style="json") == '{"a":[1,"x\\n"],"b":null}'
    assert shown(1 << 64, style="json") == "<large integer>"
    assert shown({"k": 1} | {str(i): i for i in range(100)}, 20, style="json").endswith("…")


def test_describe_names_the_type_and_the_message() -> None:
    assert describe(ValueError("bad value")) == "ValueError: bad value"
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(OSError("line one\nline two")) == "OSError: line one line two"
    assert len(describe(RuntimeError("x" * 10_000))) == DESCRIBED_MAX_CHARS


def test_describe_gives_a_database_error_its_sqlstate() -> None:
    class UniqueViolation(Exception):
        sqlstate = "23505"

    assert describe(UniqueViolation("duplicate key")) == (
        "UniqueViolation (SQLSTATE 23505): duplicate key")


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


# What an edge may hand over: any text (control characters, lone surrogates, bidi controls),
# integers past what repr() converts, bytes, and containers of those, nested far deeper than
# the interpreter's recursion limit.
_LEAVES = (st.text(st.characters(codec=None, min_codepoint=0), max_size=2_000)
           | st.integers()
           | st.integers(min_value=1, max_value=60_000).map(lambda bits: -(1 << bits))
           | st.binary(max_size=500) | st.floats() | st.booleans() | st.none())
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=10) | st.integers(), inner, max_size=5)
    | st.tuples(inner, inner),
    max_leaves=20,
)
_DEEP = st.builds(_nested, st.integers(min_value=0, max_value=3 * sys.getrecursionlimit()),
                  _LEAVES)


@given(value=_VALUES | _DEEP, limit=st.integers(min_value=1, max_value=5_000),
       style=st.sampled_from(STYLES))
def test_any_value_is_one_bounded_line(value: object, limit: int, style: Style) -> None:
    text = shown(value, limit, style=style)
    assert len(text) <= limit
    assert text.isprintable()  # no line break, control, bidi control or lone surrogate


@given(message=st.text(st.characters(codec=None, min_codepoint=0), max_size=2_000),
       limit=st.integers(min_value=1, max_value=1_000))
def test_any_exception_is_described_in_one_bounded_line(message: str, limit: int) -> None:
    text = describe(ValueError(message), limit)
    assert len(text) <= limit
    assert text.isprintable()



def test_an_integer_past_the_interpreters_digit_limit_is_described_not_raised() -> None:
    # 14,286 bits is ~4,300 digits: repr() raises past sys.get_int_max_str_digits().
    assert shown(-(1 << 14285), 5_000) == "<14286-bit integer>"
