"""The web page's pure parts, as tables: where a sign-in may send the browser (never off this
server), a cell's words and signs, where each wave of a rollout is, the bounds of the rollouts'
lists, every value escaped."""

from __future__ import annotations

from typing import Any

import pytest

from convergerd.api.pages import (
    PROGRESS_WORDS,
    ROLLOUTS_LISTED,
    Cell,
    Viewer,
    cell_of,
    h,
    lag_text,
    login_page,
    rollout_page,
    rollouts_table,
    url,
)
from convergerd.api.rollouts import wave_progress
from convergerd.api.ui import next_page_of
from convergerd.core.model import PolicyId
from convergerd.core.rollout import Rollout, State, parse_strategy

XSS = '<script>alert(1)</script>"\'><b>x</b>'


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


STRATEGY = parse_strategy({"id": "careful", "waves": [
    {"name": "canary", "selector": {"ring": "canary"}}, {"name": "half", "fraction": 0.5},
    {"name": "rest", "fraction": 1.0}]})


@pytest.mark.parametrize(("state", "wave", "progress"), [
    (State.PROGRESSING, 1, ["done", "current", "waiting"]),
    (State.WAITING_APPROVAL, 2, ["done", "done", "current"]),
    (State.PAUSED, 0, ["current", "waiting", "waiting"]),
    (State.HALTED, 1, ["done", "current", "waiting"]),
    (State.REVERTED, 1, ["done", "sent_back", "not_reached"]),
    (State.ABORTED, 1, ["sent_back", "sent_back", "not_reached"]),
])
def test_where_each_wave_of_a_rollout_in_force_is(state: State, wave: int,
                                                   progress: list[str]) -> None:
    rollout = Rollout(1, PolicyId("p"), 2, 1, STRATEGY, state, wave=wave)
    assert [wave_progress(rollout, i) for i in range(3)] == progress
    assert set(progress) <= set(PROGRESS_WORDS)


def _live(i: int) -> dict[str, Any]:
    return {"policy": f"p{i:03d}", "from_revision": None, "to_revision": 1,
            "state": "progressing", "wave": {"index": 0, "name": "canary", "of": 3},
            "clusters": {"new": 0, "old": 0}, "gate": "delivering", "reason": XSS}


def test_the_live_rollouts_listed_are_bounded_and_escaped() -> None:
    text = rollouts_table([_live(i) for i in range(ROLLOUTS_LISTED + 50)])
    assert f"Live rollouts ({ROLLOUTS_LISTED} of {ROLLOUTS_LISTED + 50})" in text
    assert text.count("<tr>") == 1 + ROLLOUTS_LISTED
    assert "none → 1" in text
    assert XSS not in text
    assert h(XSS) in text


def test_a_rollouts_page_names_a_few_clusters_per_revision_and_counts_the_rest() -> None:
    named = [f"c{i:05d}" for i in range(20)]
    doc = {"policy": "p", "from_revision": 1, "to_revision": 2, "strategy": "careful",
           "state": "progressing", "in_force": True, "gate": "bake", "reason": XSS,
           "wave": {"index": 0, "name": "canary", "of": 1, "warn_step": False},
           "updated_at": "2026-12-06T00:00:00Z", "updated_by": XSS, "bake_seconds": 600,
           "on_halt": "revert", "clusters": {"new": 10_000, "old": 0, "none": 0},
           "waves": [{"index": 0, "name": "canary", "selector": None, "fraction": 1.0,
                      "warn_first": True, "approval": False, "progress": "current",
                      "clusters": 10_000,
                      "revisions": [{"revision": 2, "clusters": 10_000, "named": named}]}],
           "events": [{"at": "2026-12-06T00:00:00Z", "by": XSS, "what": "started", "wave": 0,
                       "detail": XSS}]}
    text = rollout_page(Viewer("admin token", "/ui/"), doc, read_at=None)
    assert "revision 2 (new)</b>: 10000" in text
    assert f"{', '.join(named)} and 9980 more" in text
    assert "10 min in Warn, then 10 min" in text
    assert "current: progressing" in text
    assert XSS not in text
    assert text.count(h(XSS)) == 4  # the reason, who changed it last, an event's by and detail
