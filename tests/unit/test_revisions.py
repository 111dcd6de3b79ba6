"""What changed between two kept revisions, a page of the history, a boundary's view of it, a
rollback's refusals, the request's numbers, and `convergerd policy history`'s table: tables of
cases, no database."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given

from convergerd.api.mutations import BadRequest
from convergerd.api.revisions import page_of, revision_number
from convergerd.cli.revisions import render_history
from convergerd.core.revisions import (
    Change,
    Kind,
    Operation,
    Refused,
    Revision,
    Rollback,
    changes,
    history,
    in_boundary,
    refusal,
    what_changed,
)
from tests.strategies import JSON_VALUES

AT = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
REGS = {"type": "AllowedRegistries", "registries": ["r.example"]}
BASE = {"boundary_id": "team-a", "enabled": True, "enforcement": "Deny", "rule": REGS}


def rev(n: int, content: dict[str, Any] | None = BASE, op: Operation = Operation.UPDATE,
        **kw: Any) -> Revision:
    return Revision("p", n, op if content is not None else Operation.DELETE, content,
                    saved_by="someone", saved_at=AT, **kw)


@pytest.mark.parametrize(("after", "text"), [
    ({**BASE, "enabled": False}, "enabled: true → false"),
    ({**BASE, "rule": {**REGS, "registries": ["r.example", "m.example"]}}, "rule: registries"),
    ({**BASE, "rule": {"type": "ForbidLatestTag"}}, "rule: registries, type"),
    ({**BASE, "boundary_id": "team-b", "enforcement": "Warn"},
     'boundary_id: "team-a" → "team-b"; enforcement: "Deny" → "Warn"'),
    ({**BASE, "strategy": "careful"}, 'strategy: null → "careful"'),  # a column added later
    ({k: v for k, v in BASE.items() if k != "enforcement"}, 'enforcement: "Deny" → null'),
    ({**BASE, "rule": ["not", "a", "mapping"]},
     'rule: {"type":"AllowedRegistries","registries":["r.example"]} → ["not","a","mapping"]'),
])
def test_a_change_names_the_field_and_for_a_mapping_its_keys(after: dict[str, Any],
                                                             text: str) -> None:
    diff = what_changed(rev(1), rev(2, after))
    assert (diff.kind, diff.text()) == (Kind.CHANGED, text)


@pytest.mark.parametrize(("previous", "current", "kind", "text"), [
    (None, rev(1, op=Operation.INSERT), Kind.CREATED, "created"),
    (rev(1), rev(2, None), Kind.DELETED, "deleted"),
    (rev(2, None), rev(3), Kind.CREATED, "created"),  # created again after its deletion
    (None, rev(7, op=Operation.BASELINE), Kind.FIRST_KEPT, "the oldest revision kept"),
    (None, rev(7), Kind.FIRST_KEPT, "the oldest revision kept"),  # older ones pruned
    (rev(1), rev(2), Kind.UNCHANGED, "no field changed (a new revision of the same content)"),
    (Revision("p", 1, Operation.UPDATE, None, "x", AT, readable=False), rev(2),
     Kind.UNREADABLE, "its content or the one before cannot be read"),
])
def test_what_a_revision_did(previous: Revision | None, current: Revision, kind: Kind,
                             text: str) -> None:
    diff = what_changed(previous, current)
    assert (diff.kind, diff.text()) == (kind, text)


def test_changes_as_json_bound_what_they_show() -> None:
    long = "x" * 500
    [change] = changes({"note": "a"}, {"note": long})
    shown = change.as_json()
    assert shown["before"] == "a"
    assert len(shown["after"]) <= 60
    keys = changes({"rule": {}}, {"rule": {f"k{i:03}": i for i in range(50)}})[0]
    assert keys.keys is not None
    assert len(keys.keys) == 20
    assert Change("rule", keys=()).text() == "rule"


@given(JSON_VALUES, JSON_VALUES)
def test_any_two_contents_compare_without_error(before: Any, after: Any) -> None:
    found = changes({"rule": before, "x": before}, {"rule": after, "x": after})
    assert (found == ()) == (before == after)
    for change in found:
        assert "\n" not in change.text()


def test_a_page_compares_its_last_revision_with_the_one_past_it() -> None:
    kept = [rev(4, {**BASE, "enabled": False}), rev(3), rev(2, op=Operation.INSERT),
            rev(1, None)]
    page, more = history(kept[:3], 2)
    assert [(r.revision, d.kind) for r, d in page] == [(4, Kind.CHANGED), (3, Kind.UNCHANGED)]
    assert more
    page, more = history(kept, 10)
    assert [d.kind for _, d in page] == [Kind.CHANGED, Kind.UNCHANGED, Kind.CREATED,
                                         Kind.DELETED]
    assert not more


def test_a_boundarys_view_shows_nothing_of_another_boundary() -> None:
    elsewhere = {**BASE, "boundary_id": "team-b"}
    kept = [rev(5, {**BASE, "enabled": False}), rev(4), rev(3, elsewhere), rev(2, None),
            rev(1, elsewhere, op=Operation.INSERT)]
    page, _ = history(kept, 10, visible=in_boundary("team-a"))
    assert [d.kind for _, d in page] == [Kind.CHANGED, Kind.MOVED_IN, Kind.ELSEWHERE,
                                         Kind.MOVED_IN, Kind.ELSEWHERE]
    assert all("team-b" not in d.text() for _, d in page)


@pytest.mark.parametrize(("wanted", "deleting", "refused"), [
    (rev(3), False, None),
    (rev(3), True, Refused.DELETING),
    (rev(3, None), False, Refused.DELETION),
    (Revision("p", 3, Operation.UPDATE, None, "x", AT, readable=False), False,
     Refused.UNREADABLE),
])
def test_what_a_rollback_refuses(wanted: Revision, deleting: bool,
                                 refused: Refused | None) -> None:
    assert refusal(wanted, deleting=deleting) is refused


@pytest.mark.parametrize(("done", "message"), [
    (Rollback("p", 9, refused=Refused.UNKNOWN_REVISION, kept=(3, 8)),
     "to: policy 'p' has no revision 9 (revisions 3 to 8 are kept; "
     "CONVERGERD_REVISION_RETENTION keeps the last 100 of each policy)"),
    (Rollback("p", 9, refused=Refused.UNKNOWN_REVISION),
     "to: policy 'p' has no revision 9 (no revision is kept; CONVERGERD_REVISION_RETENTION "
     "keeps the last 100 of each policy)"),
    (Rollback("p", 9, refused=Refused.UNKNOWN_POLICY),
     "unknown policy 'p': no row and no revision kept"),
    (Rollback("p", 4, refused=Refused.DELETION),
     "to: revision 4 of policy 'p' is its deletion, which has no content: roll back to a "
     "revision before it"),
    (Rollback("p", 2, refused=Refused.INVALID, reason="boundary: 'gone' does not exist\n"),
     "to: revision 2 of policy 'p' is not a valid policy now: boundary: 'gone' does not "
     "exist; nothing written"),
])
def test_a_refusal_names_the_field_and_the_value(done: Rollback, message: str) -> None:
    assert done.refusal(keep_last=100) == message


@pytest.mark.parametrize(("value", "number"), [
    (1, 1), ("42", 42), (2**63 - 1, 2**63 - 1), ("9223372036854775807", 2**63 - 1)])
def test_a_revision_number(value: object, number: int) -> None:
    assert revision_number(value, "to") == number


@pytest.mark.parametrize("value", [
    0, -1, True, 1.0, "1.0", "", "+1", " 1", "\u0661", "99999999999999999999", 2**63, None, [1]])
def test_not_a_revision_number(value: object) -> None:
    with pytest.raises(BadRequest, match=r"^to: expected a revision number"):
        revision_number(value, "to")


@pytest.mark.parametrize(("query", "page"), [
    ({}, (20, None)), ({"limit": "100", "before": "7"}, (100, 7)), ({"limit": "1"}, (1, None))])
def test_a_page_of_the_history(query: dict[str, str], page: tuple[int, int | None]) -> None:
    assert page_of(query) == page


@pytest.mark.parametrize(("query", "names"), [
    ({"limit": "101"}, "limit: at most 100, got 101"), ({"limit": "0"}, "limit:"),
    ({"before": "x"}, "before:")])
def test_a_bad_page_names_its_parameter(query: dict[str, str], names: str) -> None:
    with pytest.raises(BadRequest, match=names):
        page_of(query)


def test_the_history_table_shows_each_revision_on_one_line() -> None:
    body = {"policy": "p", "boundary": "team-a", "retention": {"keep_last": 100},
            "listing": {"complete": False, "next": "/v1/policies/p/revisions?before=2"},
            "revisions": [
                {"revision": 3, "saved_at": "2026-12-01T00:00:00Z", "saved_by": "bob\x1b[2J",
                 "what_changed": {"summary": "rule: registries\nforged line"}},
                {"revision": 2, "saved_at": "2026-11-30T00:00:00Z", "saved_by": None,
                 "what_changed": {"summary": "created"}},
                "not a revision"]}
    lines = render_history(body).splitlines()
    assert lines[0] == ("policy p (boundary team-a): 2 revision(s) listed, the last 100 of "
                        "each policy kept")
    assert len(lines) == 7
    assert "\x1b" not in "".join(lines)
    assert lines[3].startswith("3 ")
    assert lines[4].split() == ["2", "2026-11-30T00:00:00Z", "-", "created"]
    assert lines[-1] == "older revisions: --before 2"
