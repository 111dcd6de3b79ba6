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
