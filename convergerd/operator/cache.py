"""`WorkloadCache`: the objects the rules judge, in the namespaces of the boundaries that have
a Policy, kept current by list + watch (one `kube.watch.Informer` per kind).

- **Which namespaces**: the Namespaces labelled `platform.stackship.se/boundary` are watched
  (only that label is kept); the boundaries are the operator's (every Policy's, enabled or
  not: `set_boundaries`). An object is kept when its namespace's boundary has a Policy.
- **Which objects**: every kind of `workloads.WORKLOAD_KINDS` (the kinds admission judges),
  watched cluster-wide (one watch per kind, not per namespace), listed in pages of
  `kube.client.LIST_PAGE_SIZE` (limit/continue; smaller where an answer is over the cap),
  each object slimmed (`workloads.slim`) as its page arrives: managedFields and all else no
  rule reads never reach the cache; objects outside the boundaries are dropped there.
- **Kept current**: each watch resumes from its last resourceVersion (bookmarks on), re-lists
  on 410, backs off on errors (bounded), exactly as the Policy watch does. When the set of
  namespaces grows (a namespace labelled, a first Policy for a boundary), every kind is
  re-listed once (the objects of the new namespaces were left out before); when it shrinks,
  the objects of the namespaces that left are dropped. With no boundary to watch, no workload
  is watched at all.
- **Staleness is said**: `synced` is False until every kind is listed, and while any watch is
  failing or re-listing (`Informer.healthy`); the audit writes it as `cacheSynced`.
- **Bounded, and what it left out is said**: one page over the response cap is asked again
  smaller, and an object too large to read alone (in a list or a watch event) is stepped
  past and named (`ObjectClient.list_objects`, `Informer.skipped`, `step_past`), so no object
  anywhere in the cluster can keep a kind from being listed or watched. Each object is
  bounded (`workloads.slim`), and the cache charges each one's `workloads.cost` against
  `max_bytes`, by kind and namespace: an object that would pass the budget is kept as a
  `workloads.refused` stub instead (the audit counts it as not judged, and a deletion or a
  smaller version of it is still seen), and past the budget plus `REFUSED_SHARE` of it not
  even the stub is kept (`lost`, counted until the watches restart). Below `RELIST_BELOW`
  of the budget with stubs held, every kind is listed again once. `incomplete(namespaces,
  refused)` says what a boundary's audit misses; a log line is written when the cache fills
  and when it holds everything again, and when the objects too large to list change.
- **One list page at a time**: the kinds' lists take turns (`_OneListAtATime`), so what a
  list costs on its way in (the answer, up to the response cap, and its decoding, several
  times that for small objects) is paid once, not once per kind: the operator's memory limit
  follows from it (docs/operations.md).
- **Exact accounting**: charged when `_keep` builds an object (a list page, a watch event),
  given back when it leaves the informer (`on_remove`). An object being replaced is given
  back at once (`_credited`: a re-list holds both copies for a moment, the budget counts one).
  After a watch restart (a failed or cancelled list may have charged objects it never stored)
  that kind is counted again from what it holds.

`on_objects(namespace)` is called for every change of a cached object, `on_state()` when the
namespaces of a boundary or `synced` may have changed; both from the cache's tasks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any

from convergerd.admission.render import BOUNDARY_LABEL
from convergerd.core.shown import shown
from convergerd.kube.api import KubeObject, ObjectList, Resource, WatchApi, WatchEvent
from convergerd.kube.watch import Informer, object_key
from convergerd.operator.audit import Incomplete
from convergerd.operator.workloads import (
    WORKLOAD_KINDS,
    cost,
    refused,
    slim,
    slim_namespace,
)

log = logging.getLogger(__name__)

NAMESPACES = Resource("", "v1", "namespaces")
# Refused stubs may take the cache this far past its budget (a share of it); past that an
# object is not even counted (`lost`).
REFUSED_SHARE = 1 / 8
# Below this share of the budget, objects kept as stubs are listed again (one re-list: the
# list then fills the cache to its budget, so this cannot repeat while it stays full).
RELIST_BELOW = 1 / 2
# The operator's memory limit (`memory_limit_bytes`, deploy/operator, docs/operations.md):
# the process at rest (about 85 MB measured, issue 33), the cache's budget twice (a re-list
# holds the old and the new copy of a kind for a moment), and one list page in flight: the
# answer up to the response cap, and orjson's objects for it (7 times the bytes for a page of
# small objects: bench figure in docs/operations.md).
BASE_BYTES = 96 * 2**20
PAGE_FACTOR = 8
NAMED_MAX = 5  # objects named per audit and per log line
BIGGEST_MAX = 3  # namespaces named as holding the most of the cache


class WorkloadCache:
    def __init__(
        self,
        api: WatchApi,
        *,
        request_timeout_s: float,
        cluster: str,
        max_bytes: int,
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
        self.max_bytes = max_bytes
        self._used: dict[str, int] = dict.fromkeys(self._kind_names(), 0)  # by kind
        self._bytes: dict[str, dict[str, int]] = {k: {} for k in self._used}  # kind, namespace
        self._refused: dict[str, int] = dict.fromkeys(self._used, 0)  # stubs held, by kind
        self._credited: dict[str, set[int]] = {k: set() for k in self._used}
        self.lost = 0
        self._relist_refused = False
        self._full = False  # last logged: refused or lost objects
        self._too_large_logged: dict[str, frozenset[str]] = {}
        self._on_restart = on_restart
        self.namespaces = Informer(api, NAMESPACES, request_timeout_s=request_timeout_s,
                                   label_selector=BOUNDARY_LABEL,
                                   transform=functools.partial(slim_namespace,
                                                               label=BOUNDARY_LABEL),
                                   on_change=self._namespace_changed, on_restart=on_restart,
                                   on_health=self._namespaces_health)
        lists = _OneListAtATime(api)
        self.kinds: dict[str, Informer] = {
            kind: Informer(lists, resource, request_timeout_s=request_timeout_s,
                           transform=functools.partial(self._keep, kind),
                           on_change=self._object_changed,
                           on_restart=functools.partial(self._restarted, kind),
                           on_health=functools.partial(self._health_changed, kind),
                           on_remove=functools.partial(self._removed, kind),
                           step_past=True)
            for resource, kind in WORKLOAD_KINDS}
        self._tasks: list[asyncio.Task[None]] = []

    # -- what is kept ----------------------------------------------------------------------

    @staticmethod
    def _kind_names() -> list[str]:
        return [kind for _, kind in WORKLOAD_KINDS]

    def _keep(self, kind: str, obj: KubeObject) -> KubeObject | None:
        meta = obj.get("metadata")
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        if namespace not in self._watched:
            return None
        kept = slim(kind, obj)
        key = object_key(kept, namespaced=True) if kept is not None else None
        if kept is None or key is None:
            return None
        old = self.kinds[kind].objects.get(key)
        credited = self._credited[kind]
        if old is not None and id(old) not in credited:
            self._charge(kind, old, -1)  # replaced: given back now, not when it leaves
            credited.add(id(old))
        used = self.used_bytes
        if used + cost(kept) > self.max_bytes:
            kept = refused(kind, kept)
            if used + cost(kept) > self.max_bytes * (1 + REFUSED_SHARE):
                self.lost += 1
                self._fullness()
                return None
        self._charge(kind, kept, 1)
        self._fullness()
        return kept

    def _charge(self, kind: str, obj: Mapping[str, Any], sign: int) -> None:
        charge = sign * cost(obj)
        namespace = str(obj["metadata"].get("namespace"))
        by_namespace = self._bytes[kind]
        self._used[kind] += charge
        left = by_namespace[namespace] = by_namespace.get(namespace, 0) + charge
        if left <= 0:
            del by_namespace[namespace]
        if obj.get("refused"):
            self._refused[kind] += sign

    def _removed(self, kind: str, key: str, obj: KubeObject) -> None:
        credited = self._credited[kind]
        if id(obj) in credited:
            credited.discard(id(obj))
        else:
            self._charge(kind, obj, -1)
        self._fullness()
        if (self.refused_objects and self.used_bytes < self.max_bytes * RELIST_BELOW
                and self.synced):  # not while a list runs: it would be cut short
            self._relist_refused = True  # room again: the stubs' objects are listed anew
            self._changed.set()

    def _recount(self, kind: str) -> None:
        """Count `kind` again from what its informer holds (see the module doc)."""
        self._used[kind] = 0
        self._bytes[kind] = {}
        self._refused[kind] = 0
        self._credited[kind] = set()
        for obj in self.kinds[kind].objects.values():
            self._charge(kind, obj, 1)

    @property
    def used_bytes(self) -> int:
        """Bytes charged for the objects held (`workloads.cost`)."""
        return sum(self._used.values())

    def held_bytes(self) -> int:
        """`used_bytes` counted afresh from the objects held (O(objects): for checks)."""
        return sum(cost(obj) for informer in self.kinds.values()
                   for obj in informer.objects.values())

    @property
    def refused_objects(self) -> int:
        """Objects held as stubs, for want of room."""
        return sum(self._refused.values())

    @property
    def too_large_objects(self) -> int:
        """Objects stepped past, too large to read, by the lists and watches (anywhere in the
        cluster)."""
        return sum(len(i.skipped) for i in self.kinds.values())

    def biggest(self, count: int = BIGGEST_MAX) -> tuple[tuple[str, int], ...]:
        """The namespaces holding the most of the cache, with their bytes."""
        totals: dict[str, int] = {}
        for by_namespace in self._bytes.values():
            for namespace, size in by_namespace.items():
                totals[namespace] = totals.get(namespace, 0) + size
        return tuple(sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:count])

    def incomplete(self, namespaces: Iterable[str], refused_here: int) -> Incomplete | None:
        """What an audit of `namespaces` misses (it found `refused_here` stubs there); None
        when nothing."""
        wanted = frozenset(namespaces)
        too_large = sorted((kind, *_split(key)) for kind, informer in self.kinds.items()
                           for key in informer.skipped if _split(key)[0] in wanted)
        if not refused_here and not too_large and not self.lost:
            return None
        return Incomplete(refused_here, self.lost, tuple(too_large[:NAMED_MAX]), len(too_large),
                          self.biggest(), self.max_bytes)

    def _fullness(self) -> None:
        """One log line when the cache starts refusing objects, one when it holds all again."""
        full = bool(self.lost or self.refused_objects)
        if full == self._full:
            return
        self._full = full
        if full:
            log.warning("cluster %s: workload cache: at its budget of %d bytes "
                        "(CONVERGERD_OPERATOR_CACHE_MAX_BYTES): objects are no longer cached, "
                        "the audits of their boundaries say incomplete; holding the most: %s",
                        self.cluster, self.max_bytes, _biggest_text(self.biggest()),
                        extra={"cluster": self.cluster})
        else:
            log.info("cluster %s: workload cache: every object fits its budget again",
                     self.cluster, extra={"cluster": self.cluster})
        self._on_state()  # every audit may gain or lose `incomplete`

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

    def _health_changed(self, kind: str, healthy: bool) -> None:
        if healthy:
            self._log_too_large(kind)
        self._state_changed()

    def _restarted(self, kind: str, reason: str) -> None:
        self._recount(kind)
        self._fullness()
        self._on_restart(reason)

    def _log_too_large(self, kind: str) -> None:
        """One log line when the objects of `kind` too large to list change."""
        names = frozenset(self.kinds[kind].skipped)
        if names == self._too_large_logged.get(kind, frozenset()):
            return
        self._too_large_logged[kind] = names
        if names:
            log.warning("cluster %s: workload cache: %d %s object(s) larger than the response "
                        "cap (CONVERGERD_MAX_RESPONSE_BYTES) were stepped past, not read: %s",
                        self.cluster, len(names), kind,
                        ", ".join(shown(n, 120, style="text") for n in sorted(names)[:NAMED_MAX]),
                        extra={"cluster": self.cluster})

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
            if (not relevant <= self._watched or (not relevant and self._tasks)
                    or self._relist_refused):
                self._relist_refused = False
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
        self.lost = 0  # every kind is listed again: what is left out is counted anew
        for kind, informer in self.kinds.items():
            informer.invalidate()
            if not relevant:
                informer.forget(lambda key: False)
            self._recount(kind)  # a cancelled list may have charged what it never stored
        self._fullness()
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


def memory_limit_bytes(cache_max_bytes: int, max_response_bytes: int) -> int:
    """The operator's memory limit for these settings (see `BASE_BYTES`)."""
    return BASE_BYTES + 2 * cache_max_bytes + PAGE_FACTOR * max_response_bytes


class _OneListAtATime:
    """`api` with one list at a time through it (watches pass as they are)."""

    def __init__(self, api: WatchApi) -> None:
        self._api = api
        self._lock = asyncio.Lock()

    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList:
        async with self._lock:
            return await self._api.list_objects(resource, label_selector=label_selector,
                                                timeout_s=timeout_s, transform=transform,
                                                step_past=step_past)

    def watch(self, resource: Resource, *, resource_version: str, label_selector: str | None,
              timeout_s: float) -> AsyncIterator[WatchEvent]:
        return self._api.watch(resource, resource_version=resource_version,
                               label_selector=label_selector, timeout_s=timeout_s)


def _in(namespaces: frozenset[str], key: str) -> bool:
    return key.partition("/")[0] in namespaces


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def _biggest_text(biggest: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{shown(n, 80, style='text')} ({size / 2**20:.1f} MiB)"
                     for n, size in biggest) or "nothing"
