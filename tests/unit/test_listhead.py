"""`list_head` reads a list answer's continue token, resourceVersion and first item from its
first bytes, in kube-apiserver's field order, and never more than it can vouch for."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.kube.listhead import HEAD_BYTES, EventHead, ListHead, event_head, list_head
from tests.strategies import JSON_VALUES


def answer(items: list[dict[str, Any]], token: str | None = "tok-1") -> bytes:  # noqa: S107
    meta: dict[str, Any] = {"resourceVersion": "41"}
    if token is not None:
        meta["continue"] = token
    return orjson.dumps({"kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": meta,
                         "items": items})


BIG = {"metadata": {"name": "big", "namespace": "team-b", "uid": "u",
                    "annotations": {"blob": "x" * 300_000}}, "spec": {"replicas": 0}}


@pytest.mark.parametrize(("data", "want"), [
    (answer([BIG])[:HEAD_BYTES], ListHead(True, "tok-1", "41", "team-b", "big")),
    (answer([BIG], token=None)[:HEAD_BYTES], ListHead(True, None, "41", "team-b", "big")),
    # A token with escapes, keys in another order, values skipped of every kind.
    (b'{"kind":1.5e3,"x":[1,{"y":"]}"}],"metadata":{"continue":"a\\"b","n":null},'
     b'"items":[{"kind":true,"metadata":{"namespace":"n","name":"m\\u00e9"}}]}',
     ListHead(True, 'a"b', None, "n", "m\u00e9")),
    # The items before the list's metadata: where the list goes on is unknown.
    (b'{"items":[{"metadata":{"name":"x","namespace":"n"}}],"metadata":{"continue":"t"}}',
     ListHead(False, None, None, "n", "x")),
    # Cut inside the metadata, or nothing at all, or not JSON.
    (b'{"metadata":{"continue":"t', ListHead(False, None, None, None, None)),
    (b"", ListHead(False, None, None, None, None)),
    (b"<html>", ListHead(False, None, None, None, None)),
])
def test_the_head_of_a_list_answer(data: bytes, want: ListHead) -> None:
    assert list_head(data) == want


def test_a_name_is_cleaned_and_bounded() -> None:
    head = list_head(answer([{"metadata": {"name": "a\u001b[31mb", "namespace": "n" * 300}}]))
    assert head.name == "a\ufffd[31mb"
    assert head.namespace is None  # longer than any name: not vouched for
    assert head.listed


@given(st.lists(st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3), max_size=3),
       st.text(max_size=20) | st.none(), st.integers(min_value=0, max_value=400))
def test_any_cut_of_any_list_reads_what_is_there_or_nothing(
        items: list[dict[str, Any]], token: str | None, cut: int) -> None:
    named = [{"metadata": {"name": f"o{i}", "namespace": "ns"}, **item}
             for i, item in enumerate(items)]
    data = answer(named, token)
    head = list_head(data[:cut])
    if head.name is not None:  # found: it is the first item's
        assert head.name == "o0"
        assert head.listed
        assert head.continue_token == (token or None)
    whole = list_head(data)
    assert whole.listed
    assert whole.name == ("o0" if items else None)


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


@pytest.mark.parametrize(("data", "want"), [
    (event("MODIFIED", {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {
        "name": "big", "namespace": "team-b", "uid": "u", "resourceVersion": "77",
        "annotations": {"blob": "x" * 300_000}}})[:HEAD_BYTES],
     EventHead("MODIFIED", "team-b", "big", "77")),
    (event("DELETED", {"metadata": {"name": "n", "resourceVersion": "78"}}),
     EventHead("DELETED", None, "n", "78")),
    # Cut before the resourceVersion: where the watch goes on is unknown.
    (event("ADDED", {"metadata": {"name": "n", "namespace": "x", "resourceVersion": "79"}})[:66],
     EventHead("ADDED", "x", "n", None)),
    (event("BOOKMARK", {"metadata": {"resourceVersion": "80"}}), EventHead(None, None, None, "80")),
    (b"\x00not json", EventHead(None, None, None, None)),
])
def test_the_head_of_a_watch_event(data: bytes, want: EventHead) -> None:
    assert event_head(data) == want
