"""`WorkloadCache`: the objects the rules judge, in the namespaces of the boundaries that have
a Policy, kept current by list + watch (one `kube.watch.Informer` per kind).

- **Which namespaces**: the Namespaces labelled `platform.stackship.se/boundary` are watched
  (only that label is kept); the boundaries are the operator's (every Policy's, enabled or
  not: `set_boundaries`). An object is kept when its namespace's boundary has a Policy.
- **Which objects**: every kind of `workloads.WORKLOAD_KINDS` (the kinds admission judges),
  watched cluster-wide (one watch per kind, not per namespace), listed in pages of
  `kube.client.LIST_PAGE_SIZE` (limit/continue), each object slimmed (`workloads.slim`)
  as its page arrives: managedFields and all else no rule reads never reach the cache.
- **Kept current**: each watch resumes from its last resourceVersion (bookmarks on), re-lists
  on 410, backs off on errors (bounded), exactly as the Policy watch does. When the set of
  namespaces grows (a namespace labelled, a first Policy for a boundary), every kind is
  re-listed once (the objects of the new namespaces were left out before); when it shrinks,
  the objects of the namespaces that left are dropped. With no boundary to watch, no workload
  is watched at all.
- **Staleness is said**: `synced` is False until every kind is listed, and while any watch is
  failing or re-listing (`Informer.healthy`); the audit writes it as `cacheSynced`.

`on_objects(namespace)` is called for every change of a cached object, `on_state()` when the
namespaces of a boundary or `synced` may have changed; both from the cache's tasks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from convergerd.kube.api import KubeObject, Resource, WatchApi
from convergerd.kube.watch import Informer
from convergerd.operator.admission import BOUNDARY_LABEL
from convergerd.operator.workloads import WORKLOAD_KINDS, slim, slim_namespace

log = logging.getLogger(__name__)

NAMESPACES = Resource("", "v1", "namespaces")


class WorkloadCache:
    def __init__(
        self,
        api: WatchApi,
        *,
        request_timeout_s: float,
        cluster: str,
        on_objects: Callable[[str], None] = lambda namespace: None,
        on_state: Callable[[], None] = lambda: None,
        on_restart: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.cluster = cluster
        self._on_objects = on_objects
        self._on_state = on_state
        self._boundaries: frozenset[str] | None = None  # None: not told yet
        self._relevant: frozenset[str] = frozenset()  # namespaces whose objects are kept
        self._watched: frozenset[str] = frozenset()  # what the running informers keep
        self._changed = asyncio.Event()
        self._was_synced = False
        self.namespaces = Informer(api, NAMESPACES, request_timeout_s=request_timeout_s,
                                   label_selector=BOUNDARY_LABEL,
                                   transform=functools.partial(slim_namespace,
                                                               label=BOUNDARY_LABEL),
                                   on_change=self._namespace_changed, on_restart=on_restart,
                                   on_health=self._namespaces_health)
        self.kinds: dict[str, Informer] = {
            kind: Informer(api, resource, request_timeout_s=request_timeout_s,
                           transform=functools.partial(self._keep, kind),
                           on_change=self._object_changed, on_restart=on_restart,
                           on_health=self._health_changed)
            for resource, kind in WORKLOAD_KINDS}
        self._tasks: list[asyncio.Task[None]] = []

    # -- what is kept ----------------------------------------------------------------------

    def _keep(self, kind: str, obj: KubeObject) -> KubeObject | None:
        meta = obj.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        if namespace not in self._watched:
            return None
        return slim(kind, obj)

    def boundary_of(self, namespace: str) -> str | None:
        ns = self.namespaces.objects.get(namespace)
        labels = ns["metadata"].get("labels") if ns is not None else None
        return labels.get(BOUNDARY_LABEL) if isinstance(labels, Mapping) else None

    def namespaces_of(self, boundary: str) -> frozenset[str]:
        return frozenset(name for name in self.namespaces.objects
                         if self.boundary_of(name) == boundary)

    def objects_in(self, namespaces: Iterable[str]) -> Iterator[KubeObject]:
        """Every cached object in `namespaces`."""
        wanted = frozenset(namespaces)
        for informer in self.kinds.values():
            for key, obj in informer.objects.items():
                if key.partition("/")[0] in wanted:
                    yield obj

    def __len__(self) -> int:
        return sum(len(i.objects) for i in self.kinds.values())

    @property
    def synced(self) -> bool:
        """Everything the audit needs is listed and every watch is current."""
        if self._boundaries is None or not self.namespaces.healthy or self._changed.is_set():
            return False  # not told, or a change of namespaces or boundaries not applied yet
        if self._watched != self._relevant:
            return False  # a re-list for new namespaces is due
        return not self._relevant or all(i.healthy for i in self.kinds.values())

    # -- events ----------------------------------------------------------------------------

    def set_boundaries(self, boundaries: Iterable[str]) -> None:
        """The boundaries that have a Policy (enabled or not)."""
        new = frozenset(boundaries)
        if new != self._boundaries:
            self._boundaries = new
            self._changed.set()

    def _namespace_changed(self, name: str, obj: KubeObject | None) -> None:
        self._changed.set()

    def _object_changed(self, key: str, obj: KubeObject | None) -> None:
        self._on_objects(key.partition("/")[0])

    def _namespaces_health(self, healthy: bool) -> None:
        if healthy:
            self._changed.set()  # the namespace list is in (it may be empty: no change)
        self._state_changed()

    def _health_changed(self, healthy: bool) -> None:
        self._state_changed()

    def _state_changed(self) -> None:
        synced = self.synced
        if synced != self._was_synced:
            self._was_synced = synced
            self._on_state()

    # -- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.namespaces.run(), name="namespace watch")
                tg.create_task(self._follow(), name="workload watches")
        finally:
            await self._stop()

    async def _follow(self) -> None:
        """Keep the workload watches in line with the namespaces to keep; a watch task that
        ends (a bug: they run forever) ends the cache."""
        while True:
            changed = asyncio.create_task(self._changed.wait())
            try:
                await asyncio.wait([changed, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
            for task in self._tasks:
                if task.done():
                    task.result()  # raises what ended it
                    raise RuntimeError(f"{task.get_name()} ended")
            self._changed.clear()
            if self._boundaries is None or not self.namespaces.synced.is_set():
                continue  # the namespace list sets `_changed` again when it is in
            relevant = frozenset(
                name for name in self.namespaces.objects
                if self.boundary_of(name) in self._boundaries)
            self._relevant = relevant
            if not relevant <= self._watched or (not relevant and self._tasks):
                await self._restart(relevant)
            elif relevant != self._watched:
                self._watched = relevant
                for informer in self.kinds.values():
                    informer.forget(functools.partial(_in, relevant))
            self._was_synced = self.synced
            self._on_state()

    async def _restart(self, relevant: frozenset[str]) -> None:
        """Re-list every kind for `relevant` (or stop watching when it is empty)."""
        await self._stop()
        self._watched = relevant
        for informer in self.kinds.values():
            informer.invalidate()
            if not relevant:
                informer.forget(lambda key: False)
        if relevant:
            log.info("cluster %s: workload cache: watching %d namespace(s); listing %s",
                     self.cluster, len(relevant), ", ".join(self.kinds),
                     extra={"cluster": self.cluster})
            self._tasks = [asyncio.create_task(i.run(), name=f"watch {kind}")
                           for kind, i in self.kinds.items()]

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        results: list[Any] = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result


def _in(namespaces: frozenset[str], key: str) -> bool:
    return key.partition("/")[0] in namespaces
