"""`WorkloadCache` says when it may be behind: before its lists, and while a watch fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from convergerd.core.errors import ClusterUnreachable
from convergerd.kube.api import KubeObject, ObjectList, Resource, WatchEvent
from convergerd.operator.cache import WorkloadCache

BOUNDARY = "platform.stackship.se/boundary"


class FakeCluster:
    """Lists what it holds; a watch stays open, or fails while its resource is `failing`."""

    def __init__(self) -> None:
        self.items: dict[str, list[KubeObject]] = {
            "namespaces": [{"metadata": {"name": "web", "resourceVersion": "1",
                                         "labels": {BOUNDARY: "b1"}}}],
            "pods": [{"metadata": {"name": "p", "namespace": "web", "resourceVersion": "2"},
                      "spec": {"containers": [{"image": "nginx"}]}}],
        }
        self.failing: set[str] = set()
        self.fail_now = asyncio.Event()  # open watches of `failing` resources fail

    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList:
        items = self.items.get(resource.plural, [])
        if transform is not None:
            items = [t for t in map(transform, items) if t is not None]
        return ObjectList(items=items, resource_version="10", requests=1)

    async def watch(self, resource: Resource, *, resource_version: str,
                    label_selector: str | None, timeout_s: float) -> AsyncIterator[WatchEvent]:
        if resource.plural in self.failing:
            raise ClusterUnreachable("no answer", reason="timeout")
        yield WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "11"}}, None, "11")
        while resource.plural not in self.failing:
            await self.fail_now.wait()
            self.fail_now.clear()
        raise ClusterUnreachable("connection reset", reason="timeout")


async def until(check: Callable[[], Any]) -> None:
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


async def test_synced_only_when_listed_and_every_watch_is_current() -> None:
    cluster = FakeCluster()
    states: list[bool] = []
    cache: WorkloadCache
    cache = WorkloadCache(cluster, request_timeout_s=1, cluster="c1", max_bytes=2**20,
                          on_state=lambda: states.append(cache.synced))
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.sleep(0.05)
        assert not cache.synced  # no boundaries told yet: nothing is known
        cache.set_boundaries({"b1"})
        await until(lambda: cache.synced)
        assert [o["metadata"]["name"] for o in cache.objects_in({"web"})] == ["p"]
        assert cache.namespaces_of("b1") == {"web"}

        states.clear()
        cluster.failing.add("deployments")
        cluster.fail_now.set()  # the deployments watch breaks, and stays broken
        await until(lambda: not cache.synced)
        assert states == [False]
        assert [o["metadata"]["name"] for o in cache.objects_in({"web"})] == ["p"]  # kept

        cluster.failing.clear()  # the next attempt (after a backoff) resumes the watch
        await until(lambda: cache.synced)
        assert states == [False, True]
        assert cache.kinds["Deployment"].lists == 1  # resumed, not re-listed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class Scripted:
    """Lists what it holds; a watch plays what the test pushes (a 410 ends it)."""

    def __init__(self, items: dict[str, list[KubeObject]]) -> None:
        self.items = items
        self.events: dict[str, asyncio.Queue[WatchEvent]] = {}
        self.lists: dict[str, int] = {}

    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList:
        self.lists[resource.plural] = self.lists.get(resource.plural, 0) + 1
        items = [t for t in map(transform or (lambda o: o), self.items.get(resource.plural, []))
                 if t is not None]
        return ObjectList(items=items, resource_version="10", requests=1)

    async def watch(self, resource: Resource, *, resource_version: str,
                    label_selector: str | None, timeout_s: float) -> AsyncIterator[WatchEvent]:
        queue = self.events.setdefault(resource.plural, asyncio.Queue())
        yield WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "11"}}, None, "11")
        while True:
            event = await queue.get()
            yield event
            if event.type == "ERROR":
                return

    def push(self, plural: str, event: WatchEvent) -> None:
        self.events.setdefault(plural, asyncio.Queue()).put_nowait(event)


def wide_pod(name: str, namespace: str) -> KubeObject:
    """A pod of as many 500-character images as an object may keep whole (~15 KiB charged)."""
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "5"},
            "spec": {"containers": [{"image": f"r.example.com/{i:03d}/" + "y" * 480 + ":1"}
                                    for i in range(22)]}}


def deleted(obj: KubeObject, version: str) -> WatchEvent:
    return WatchEvent("DELETED", obj, obj["metadata"]["name"], version)


async def test_the_budget_is_accounted_exactly_through_relists_and_deletions() -> None:
    budget = 256 * 1024
    namespaces = [{"metadata": {"name": ns, "resourceVersion": "1", "labels": {BOUNDARY: b}}}
                  for ns, b in (("web", "b1"), ("big", "b2"))]
    pods = [wide_pod(f"w{i:02d}", "big") for i in range(24)]
    cluster = Scripted({"namespaces": namespaces,
                        "pods": [*pods, {"metadata": {"name": "p", "namespace": "web",
                                                      "resourceVersion": "2"}}]})
    cache = WorkloadCache(cluster, request_timeout_s=1, cluster="c1", max_bytes=budget)
    task = asyncio.create_task(cache.run())
    try:
        cache.set_boundaries({"b1", "b2"})
        await until(lambda: cache.synced)
        refused = cache.refused_objects
        assert 0 < refused < 24
        assert budget - 20_000 < cache.used_bytes <= budget * 1.125
        assert cache.used_bytes == cache.held_bytes()
        incomplete = cache.incomplete({"big"}, refused)
        assert incomplete is not None
        assert incomplete.biggest[0][0] == "big"
        assert cache.incomplete({"web"}, 0) is None  # b1's audit misses nothing

        # A 410: every pod listed again; each old copy given back as its new one comes, none
        # counted twice (the stubs not yet replaced still count: one more may be refused).
        cluster.push("pods", WatchEvent("ERROR", {"code": 410}, None, None, 410))
        await until(lambda: cluster.lists["pods"] == 2 and cache.synced)
        assert cache.used_bytes == cache.held_bytes() <= budget * 1.125
        assert refused <= cache.refused_objects <= refused + 1

        # The tenant deletes most of its pods: below half the budget with stubs held, the
        # cache lists again once, and holds everything.
        for i, pod in enumerate(pods[:20]):
            cluster.items["pods"].remove(pod)
            cluster.push("pods", deleted(pod, str(20 + i)))
        await until(lambda: cache.refused_objects == 0 and cache.synced)
        assert len(cache) == 5
        assert cache.used_bytes == cache.held_bytes() < budget / 2
        assert cluster.lists["pods"] == 3
        assert cache.incomplete({"big"}, 0) is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
