"""The web page's pure parts, as tables: where a sign-in may send the browser (never off this
server), a cell's words and signs, every value escaped."""

from __future__ import annotations

from typing import Any

import pytest

from convergerd.api.pages import Cell, cell_of, h, lag_text, login_page, url
from convergerd.api.ui import next_page_of


@pytest.mark.parametrize(("asked", "goes"), [
    ("/ui/policies/p-regs", "/ui/policies/p-regs"),
    ("/ui/boundaries/team-a?page=2", "/ui/boundaries/team-a?page=2"),
    (None, "/ui/"),
    ("", "/ui/"),
    ("https://evil.example/ui/", "/ui/"),
    ("//evil.example/ui/", "/ui/"),
    ("/ui//evil.example", "/ui/"),
    ("/ui/\\evil.example", "/ui/"),
    ("/status", "/ui/"),
    ("/ui/é", "/ui/"),
    ("/ui/" + "a" * 3000, "/ui/"),
])
def test_a_sign_in_goes_only_to_a_page_of_this_server(asked: str | None, goes: str) -> None:
    assert next_page_of(asked) == goes


def _view(phase: str | None, *, stale: bool = False, verification: str | None = None,
          violations: int | None = None) -> dict[str, Any]:
    return {"phase": phase, "stale": stale,
            "verified": {"verification": verification} if verification else None,
            "audit": {"violations": violations} if violations is not None else None}


@pytest.mark.parametrize(("view", "cell"), [
    (None, Cell(None, "unknown", None, held=False)),
    (_view("Enforcing", verification="verified", violations=3),
     Cell("Enforcing", "verified", 3, held=True)),
    (_view("Enforcing", stale=True, verification="stale"), Cell("Stale", "stale", None, held=True)),
    (_view(None), Cell(None, "unknown", None, held=True)),
    (_view("Error", verification="admitted", violations=0),
     Cell("Error", "admitted", 0, held=True)),
])
def test_a_cell_is_the_record_views_phase_verdict_and_violations(
    view: dict[str, Any] | None, cell: Cell,
) -> None:
    assert cell_of(view) == cell


@pytest.mark.parametrize(("seconds", "text"), [(None, "never"), (3.2, "3 s"), (300, "5 min"),
                                               (9000, "2.5 h")])
def test_lag_in_words(seconds: float | None, text: str) -> None:
    assert lag_text(seconds) == text


def test_values_are_escaped_in_text_attributes_and_addresses() -> None:
    assert h('<a href="x">&\'') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;"
    assert h(None) == ""
    assert url("/ui/", page=2, policies=None, x='"><') == "/ui/?page=2&amp;x=%22%3E%3C"
    form = login_page('<b>"no"</b>', next_page='/ui/policies/x"><script>')
    assert "<b>" not in form
    assert "<script>" not in form
    assert 'value="/ui/policies/x&quot;&gt;&lt;script&gt;"' in form
