"""How messages quote untrusted values: `errors.shown` and `errors.shorten`."""

from __future__ import annotations

import pytest

from convergerd.core.errors import SHOWN_MAX_CHARS, shorten, shown


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
def test_huge_values_are_cut_to_the_limit(value: object) -> None:
    assert len(shown(value)) <= SHOWN_MAX_CHARS


def test_deep_nesting_does_not_recurse_without_end() -> None:
    deep: list[object] = []
    inner = deep
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    assert shown(deep) == "[[[[...]]]]"


def test_shorten_cuts_text_to_the_limit() -> None:
    assert shorten("abc", 3) == "abc"
    assert shorten("abcd", 3) == "ab…"
