"""ClusterStore list pagination and watch semantics (kube-apiserver)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from convergerd.sim.resources import LEASES, NAMESPACES, POLICIES
from convergerd.sim.status import ApiError
from convergerd.sim.store import ClusterStore

CR_API = "platform.stackship.se/v1alpha1"


def policy(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": CR_API, "kind": "Policy", "metadata": meta, "spec": spec}


def names(listing: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in listing["items"]]


@pytest.fixture
def store() -> ClusterStore:
    s = ClusterStore()
    for n in ("c", "a", "e", "b", "d"):
        s.create(POLICIES, None, policy(n, {"team": "x" if n in "abc" else "y"}), manager="m")
    return s


# --- list -------------------------------------------------------------------------------------


def test_list_shape_sorted_with_kind_for_crs(store: ClusterStore) -> None:
    listing = store.list(POLICIES, None)
    assert listing["kind"] == "PolicyList"
    assert listing["apiVersion"] == CR_API
    assert listing["metadata"] == {"resourceVersion": str(store.resource_version)}
    assert names(listing) == ["a", "b", "c", "d", "e"]
    assert listing["items"][0]["kind"] == "Policy"  # CR list items carry kind/apiVersion


def test_builtin_list_items_omit_kind_and_filter_by_namespace(store: ClusterStore) -> None:
    store.create(NAMESPACES, None, {"metadata": {"name": "other"}}, manager="m")
    store.create(LEASES, "default", {"metadata": {"name": "l1"}}, manager="m")
    store.create(LEASES, "other", {"metadata": {"name": "l0"}}, manager="m")
    listing = store.list(LEASES, "default")
    assert listing["kind"] == "LeaseList"
    assert names(listing) == ["l1"]
    assert "kind" not in listing["items"][0]
    assert "apiVersion" not in listing["items"][0]
    all_ns = store.list(LEASES, None)
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in all_ns["items"]] == [
        ("default", "l1"),
        ("other", "l0"),
    ]


def test_empty_list_has_items(store: ClusterStore) -> None:
    assert store.list(LEASES, "default")["items"] == []


def test_list_selectors(store: ClusterStore) -> None:
    assert names(store.list(POLICIES, None, label_selector="team=x")) == ["a", "b", "c"]
    assert names(store.list(POLICIES, None, label_selector="team notin (x)")) == ["d", "e"]
    assert names(store.list(POLICIES, None, field_selector="metadata.name=d")) == ["d"]
    with pytest.raises(ApiError) as info:
        store.list(POLICIES, None, field_selector="spec.x=1")
    assert info.value.code == 400


def test_pagination_keeps_one_resource_version(store: ClusterStore) -> None:
    first = store.list(POLICIES, None, limit=2)
    list_rv = first["metadata"]["resourceVersion"]
    assert names(first) == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 3
    # writes between pages are invisible to the rest of this list
    store.delete(POLICIES, None, "c")
    store.create(POLICIES, None, policy("bb"), manager="m")
    store.patch(
        POLICIES,
        None,
        "d",
        b'{"spec":{"v":2}}',
        content_type="application/merge-patch+json",
        manager="m",
        force=None,
    )
    second = store.list(POLICIES, None, limit=2, continue_token=first["metadata"]["continue"])
    assert second["metadata"]["resourceVersion"] == list_rv
    assert names(second) == ["c", "d"]
    assert second["items"][1]["spec"] == {}
    third = store.list(POLICIES, None, limit=2, continue_token=second["metadata"]["continue"])
    assert names(third) == ["e"]
    assert "continue" not in third["metadata"]
    assert "remainingItemCount" not in third["metadata"]


def test_pagination_with_selector_has_no_remaining_count(store: ClusterStore) -> None:
    page = store.list(POLICIES, None, label_selector="team=x", limit=1)
    assert names(page) == ["a"]
    assert "continue" in page["metadata"]
    assert "remainingItemCount" not in page["metadata"]
    rest = store.list(
        POLICIES,
        None,
        label_selector="team=x",
        limit=5,
        continue_token=page["metadata"]["continue"],
    )
    assert names(rest) == ["b", "c"]


def test_stale_continue_is_410_with_fresh_token() -> None:
    store = ClusterStore(history_limit=3)
    for n in "abcd":
        store.create(POLICIES, None, policy(n), manager="m")
    token = store.list(POLICIES, None, limit=2)["metadata"]["continue"]
    for n in "efgh":
        store.create(POLICIES, None, policy(n), manager="m")  # pushes the list RV out of history
    with pytest.raises(ApiError) as info:
        store.list(POLICIES, None, limit=2, continue_token=token)
    err = info.value
    assert (err.code, err.reason) == (410, "Expired")
    assert err.message.startswith("The provided continue parameter is too old")
    fresh = err.status["metadata"]["continue"]
    rest = store.list(POLICIES, None, limit=10, continue_token=fresh)
    assert names(rest) == ["c", "d", "e", "f", "g", "h"]  # inconsistent continuation from now


def test_continue_expires_after_ttl(store: ClusterStore) -> None:
    expiring = ClusterStore(page_token_ttl_s=-1)
    for n in "ab":
        expiring.create(POLICIES, None, policy(n), manager="m")
    token = expiring.list(POLICIES, None, limit=1)["metadata"]["continue"]
    with pytest.raises(ApiError) as info:
        expiring.list(POLICIES, None, limit=1, continue_token=token)
    assert info.value.code == 410


def test_garbage_continue_is_400(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.list(POLICIES, None, continue_token="not-a-token")
    assert info.value.code == 400


# --- watch ------------------------------------------------------------------------------------


async def drain(watcher: Any, timeout: float = 0.01) -> list[tuple[str, str]]:
    events = []
    while (event := await watcher.next(timeout)) is not None:
        events.append((event["type"], event["object"]["metadata"].get("name", "")))
    return events


async def test_watch_from_zero_sends_synthetic_added_then_changes(store: ClusterStore) -> None:
    watcher = store.watch(POLICIES, None, resource_version="0")
    assert await drain(watcher) == [("ADDED", n) for n in "abcde"]
    store.create(POLICIES, None, policy("f"), manager="m")
    store.patch(
        POLICIES,
        None,
        "a",
        b'{"spec":{"x":1}}',
        content_type="application/merge-patch+json",
        manager="m",
        force=None,
    )
    store.delete(POLICIES, None, "b")
    store.create(LEASES, "default", {"metadata": {"name": "other-type"}}, manager="m")
    assert await drain(watcher) == [("ADDED", "f"), ("MODIFIED", "a"), ("DELETED", "b")]
    watcher.close()
    assert store.watcher_count() == 0


async def test_watch_events_carry_full_objects_and_new_rvs(store: ClusterStore) -> None:
    start = store.resource_version
    watcher = store.watch(POLICIES, None, resource_version=str(start))
    store.delete(POLICIES, None, "a")
    event = await watcher.next(0.1)
    assert event is not None
    assert event["type"] == "DELETED"
    assert event["object"]["kind"] == "Policy"
    assert event["object"]["metadata"]["resourceVersion"] == str(start + 1)


async def test_watch_from_rv_replays_only_later_changes(store: ClusterStore) -> None:
    mark = store.resource_version
    store.create(POLICIES, None, policy("z"), manager="m")
    watcher = store.watch(POLICIES, None, resource_version=str(mark))
    assert await drain(watcher) == [("ADDED", "z")]


async def test_watch_too_old_rv_is_410() -> None:
    store = ClusterStore(history_limit=2)
    for n in "abcd":
        store.create(POLICIES, None, policy(n), manager="m")
    with pytest.raises(ApiError) as info:
        store.watch(POLICIES, None, resource_version="1")
    # 4 bootstrap namespaces + 4 policies = RV 8; history keeps 7..8, so the floor is 6
    assert json.loads(info.value.body()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 1 (6)",
        "reason": "Expired",
        "code": 410,
    }


async def test_object_leaving_the_selector_is_deleted(store: ClusterStore) -> None:
    watcher = store.watch(
        POLICIES, None, resource_version=str(store.resource_version), label_selector="team=x"
    )
    store.patch(
        POLICIES,
        None,
        "a",
        b'{"metadata":{"labels":{"team":"y"}}}',
        content_type="application/merge-patch+json",
        manager="m",
        force=None,
    )
    event = await watcher.next(0.1)
    assert event is not None
    assert event["type"] == "DELETED"
    assert event["object"]["metadata"]["labels"] == {"team": "x"}  # the last matching state
    assert event["object"]["metadata"]["resourceVersion"] == str(store.resource_version)
    store.patch(
        POLICIES,
        None,
        "d",
        b'{"metadata":{"labels":{"team":"x"}}}',
        content_type="application/merge-patch+json",
        manager="m",
        force=None,
    )
    assert await drain(watcher) == [("ADDED", "d")]


async def test_bookmark_shape_and_timeout(store: ClusterStore) -> None:
    watcher = store.watch(POLICIES, None, resource_version=str(store.resource_version))
    assert await watcher.next(0.01) is None
    assert watcher.bookmark() == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Policy",
            "apiVersion": CR_API,
            "metadata": {"resourceVersion": str(store.resource_version)},
        },
    }


async def test_next_wakes_up_on_a_write(store: ClusterStore) -> None:
    watcher = store.watch(POLICIES, None, resource_version=str(store.resource_version))
    waiting = asyncio.ensure_future(watcher.next(5))
    await asyncio.sleep(0)
    store.create(POLICIES, None, policy("late"), manager="m")
    event = await asyncio.wait_for(waiting, 1)
    assert event is not None
    assert event["type"] == "ADDED"


async def test_slow_watcher_is_dropped_with_410() -> None:
    store = ClusterStore(watch_buffer_limit=3)
    watcher = store.watch(POLICIES, None, resource_version=None)
    for n in "abcde":
        store.create(POLICIES, None, policy(n), manager="m")
    event = await watcher.next(0.01)
    assert event is not None
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert watcher.done
    assert store.watcher_count() == 0


async def test_watch_objects_are_copies(store: ClusterStore) -> None:
    watcher = store.watch(POLICIES, None, resource_version="0")
    event = await watcher.next(0.1)
    assert event is not None
    event["object"]["spec"]["poison"] = True
    assert "poison" not in store.get(POLICIES, None, "a")["spec"]


async def test_history_older_than_the_window_is_compacted() -> None:
    now = [0.0]
    store = ClusterStore(history_window_s=300.0, monotonic=lambda: now[0])
    store.create(POLICIES, None, policy("a"), manager="m")
    mark = store.resource_version
    now[0] = 200.0
    store.create(POLICIES, None, policy("b"), manager="m")
    assert await drain(store.watch(POLICIES, None, resource_version=str(mark))) == [
        ("ADDED", "b")]
    now[0] = 400.0  # "a" and the bootstrap namespaces are now older than 5 minutes
    store.create(POLICIES, None, policy("c"), manager="m")
    assert await drain(store.watch(POLICIES, None, resource_version=str(mark))) == [
        ("ADDED", "b"), ("ADDED", "c")]
    now[0] = 550.0  # and "b" too
    store.create(POLICIES, None, policy("d"), manager="m")
    with pytest.raises(ApiError) as info:
        store.watch(POLICIES, None, resource_version=str(mark))
    assert info.value.code == 410
