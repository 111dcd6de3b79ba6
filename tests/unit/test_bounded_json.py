"""`decode.bounded_json`, the one JSON decoder of every edge: whatever the input, a value
within the bounds or `NotJSON` — never RecursionError, ValueError or anything else."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.decode import (
    MAX_JSON_DEPTH,
    MAX_JSON_INT_DIGITS,
    _Outline,
    _StringsOverLimit,
    bounded_json,
    parse_json,
)
from convergerd.core.errors import BadResponse, NotJSON
from tests.strategies import JSON_VALUES


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0



@given(st.binary(max_size=512))
def test_arbitrary_bytes_give_a_value_or_not_json(data: bytes) -> None:
    try:
        value = bounded_json(data)
    except NotJSON:
        return
    assert _depth(value) <= MAX_JSON_DEPTH


@given(JSON_VALUES)
def test_json_within_bounds_reads_as_the_standard_library_reads_it(value: Any) -> None:
    text = json.dumps(value)
    assert bounded_json(text) == json.loads(text)
    assert bounded_json(text.encode()) == json.loads(text)


@given(JSON_VALUES, st.integers(1, len(json.dumps([1]))))
def test_truncated_json_is_refused(value: Any, cut: int) -> None:
    text = json.dumps([value, "end"])
    with pytest.raises(NotJSON):
        bounded_json(text[: len(text) - cut])


@given(st.integers(MAX_JSON_DEPTH + 1, 20_000), st.booleans(), st.booleans(), st.booleans())
def test_deep_nesting_is_refused_without_recursion(depth: int, objects: bool,
                                                   lone_surrogate: bool, as_bytes: bool) -> None:
    """Deep nesting is refused on both paths: orjson's (valid UTF-8) and the fallback's (a
    lone surrogate escape, which orjson refuses), however deep."""
    inner = '"\\ud800"' if lone_surrogate else "1"
    opener, closer = ('{"k":', "}") if objects else ("[", "]")
    text = opener * depth + inner + closer * depth
    with pytest.raises(NotJSON, match="nested deeper"):
        bounded_json(text.encode() if as_bytes else text)


@pytest.mark.parametrize("depth", [1, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH])
@pytest.mark.parametrize("lone_surrogate", [False, True])
def test_nesting_up_to_the_bound_reads(depth: int, lone_surrogate: bool) -> None:
    inner = '"\\ud800"' if lone_surrogate else "1"
    assert _depth(bounded_json("[" * depth + inner + "]" * depth)) == depth


@given(st.integers(MAX_JSON_INT_DIGITS + 1, 50_000), st.booleans())
def test_huge_integers_are_refused(digits: int, negative: bool) -> None:
    text = ("-" if negative else "") + "7" * digits
    with pytest.raises(NotJSON):
        bounded_json(f'["\\ud800", {text}]')  # the fallback: json with int()
    with pytest.raises(NotJSON):
        bounded_json(f"[{text}e400]")


@given(st.integers(2**63 - 10, 10**MAX_JSON_INT_DIGITS - 1), st.booleans(), st.booleans())
def test_integers_past_64_bits_read_exactly(magnitude: int, negative: bool,
                                             as_bytes: bool) -> None:
    number = -magnitude if negative else magnitude
    text = json.dumps({"n": [number]})
    assert bounded_json(text.encode() if as_bytes else text) == {"n": [number]}


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = json.dumps(["[" * 5000, {"a": "{" * 5000}, "\ud800"])
    assert bounded_json(text)[0] == "[" * 5000


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "-Infinity", "1e400", "", "  ", "[1,]"])
def test_what_json_does_not_allow_is_refused(text: str) -> None:
    with pytest.raises(NotJSON):
        bounded_json(text)


@given(st.integers(MAX_JSON_DEPTH + 1, 20_000), st.sampled_from(["[", "{", "]", "}"]))
def test_unbalanced_brackets_are_refused_before_the_parser_recurses(count: int,
                                                                     bracket: str) -> None:
    """The fallback's parser would recurse into every unclosed bracket: refused before it."""
    with pytest.raises(NotJSON):
        bounded_json('["\\ud800", ' + bracket * count)


@given(st.lists(st.one_of(st.binary(max_size=30), st.sampled_from([b"1" * 18, b"9" * 19,
                                                                     b"0" * 25, b"\xd9\xa0" * 20])),
                max_size=8).map(b"".join))
def test_the_long_digit_check_on_bytes_finds_what_the_regex_finds(data: bytes) -> None:
    """The outline's substring search that replaced `rb"\\d{19}"` (16 us a search) sends the
    same answers to the exact decoder: a run of 19 ASCII digits, never another script's
    digits. Escaped backslashes and quotes (only ever inside strings) are dropped first, which
    may join two runs in a string: never fewer found, at worst the slower decoder."""
    found = re.search(rb"\d{19}", data) is not None
    if b"\\" in data:
        assert _Outline(data).long_digits >= found
    else:
        assert _Outline(data).long_digits == found


def _containers(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_containers(v) for v in value)
    return 0


def _strings_with_brackets(value: Any) -> int:
    if isinstance(value, dict):
        return sum(_strings_with_brackets(k) + _strings_with_brackets(v)
                   for k, v in value.items())
    if isinstance(value, list):
        return sum(_strings_with_brackets(v) for v in value)
    return int(isinstance(value, str) and any(b in value for b in "[]{}"))


def _counted(data: bytes, limit: int) -> int | tuple[str, int]:
    """What the outline counts against `limit`: its containers, or ("strings", n) if the
    strings holding brackets alone are over it (n: at least that many; strings next to each
    other count as one)."""
    try:
        return _Outline(data).containers(limit)
    except _StringsOverLimit as over:
        return "strings", over.count


# Strings made of what could fool a scan of the text: brackets, quotes, backslashes, escapes.
_TRICKY_TEXT = st.text(st.sampled_from('[]{}"\\/\n\u2028a1\ud800'), max_size=12)
_TRICKY_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.integers(-99, 99) | _TRICKY_TEXT,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(_TRICKY_TEXT, children, max_size=4),
    max_leaves=40,
)


@given(_TRICKY_VALUES, st.integers(1, 12), st.booleans(), st.booleans())
def test_the_outline_measures_nesting_and_containers_exactly(value: Any, limit: int,
                                                             ascii_only: bool,
                                                             long: bool) -> None:
    """The checks made on the text's outline, never on the decoded value, see exactly its
    nesting and its containers, whatever its strings hold; a short text (brackets counted
    first) and a long one (trailing blanks: a list page's path) alike."""
    text = json.dumps(value, ensure_ascii=ascii_only) + (" " * 20_000 if long else "")
    data = text.encode("utf-8", "surrogatepass")
    assert _Outline(data).nesting_within(limit) is (_depth(value) <= limit)
    real, strings = _containers(value), _strings_with_brackets(value)
    for limit_, exact in ((real - 1, True), (real, False)):
        counted = _counted(data, limit_)
        if isinstance(counted, tuple):
            assert strings >= counted[1] > limit_
        else:
            assert counted == real if exact else counted >= real


def test_an_answer_of_strings_holding_brackets_is_refused_before_they_are_told_apart() -> None:
    """Each item a list holding a string of one bracket: under the size cap, millions of
    them once made the outline's regex hold the loop and the memory (one piece per string);
    they are counted first, and more of them than the containers may number is a refusal."""
    page = b"[" + b",".join([b'["["]'] * 5_000) + b"]"
    with pytest.raises(BadResponse, match=r"holds at least 5,000 strings with brackets in "
                       r"them, more than the 1,000 JSON objects and arrays it may cost"):
        parse_json(page, "the list", max_containers=1_000)
    fewer = b"[" + b",".join([b'["["]'] * 999) + b"]"
    with pytest.raises(BadResponse, match="holds 1,000 JSON objects and arrays"):
        parse_json(fewer, "the list", max_containers=999)  # each item a list, and the page
    assert len(parse_json(fewer, "the list", max_containers=1_000)) == 999
