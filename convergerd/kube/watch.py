"""`Informer`: a cache of one resource type in one cluster, kept current by list + watch.

- **List once, then watch** from the list's resourceVersion with bookmarks
  (`allowWatchBookmarks`); every event and bookmark moves the cache's resourceVersion, so a
  watch the server ends (its timeout), a dropped connection or an error resumes from there: no
  re-list per event or per reconnect.
- **410 Gone** (the version is older than the server's history, sent as an ERROR event): one
  re-list, and only the differences from the cache are reported (`on_change`), so a re-list
  after an outage costs the consumer nothing for what did not change.
- **Untrusted answers**: list pages and watch lines are checked where they are decoded
  (`convergerd.core.decode`); each line is read with the response size cap. An unusable answer fails
  that watch (restarted with backoff), never the process.
- Generic: any `Resource`, an optional label selector, any `WatchApi` (the cluster client, or a
  fake in tests). The operator keeps its Policies here, and its workload cache
  (`convergerd.operator.cache`) one informer per workload kind; the daemon's per-cluster
  Policy caches can use the same class.
- Namespaced resources are keyed `namespace/name` (cluster-scoped: `name`).
- `transform` (optional) replaces each listed or watched object before it is stored (the
  workload cache keeps only what the rules read); None leaves the object out (a stored one is
  then reported deleted). List pages are transformed one page at a time, so a full list is
  never held at once.
- **Objects too large to read** (alone over the response cap), with `step_past` (a consumer
  that says what it misses; never the Policies, whose absence would delete their admission
  objects): a list steps past them (`ObjectList.skipped`), and a watch resumes after such an
  event from the resourceVersion read from its first bytes (`kube.listhead.event_head`,
  restart reason `too_large`, no backoff). They are kept apart as stubs in `skipped` until
  the next list or a readable event about them; the object's earlier version is dropped
  (reported deleted), as what it is now is unknown. Without `step_past` such an answer
  fails the list or the watch, as any unusable one.
- `healthy` is False until the first list, and from a watch failure or a 410 until the
  re-list or the first event of the resumed watch: a cache that may be behind says so.

`on_change(name, object or None)` is called for every change (None: deleted), in order, from
the informer's task; `on_restart(reason)` for every watch restart (`closed`: the server ended
it, `expired`: 410, else the error's reason slug); `on_health(healthy)` when `healthy` flips;
`on_remove(name, object)` for every stored object that leaves the cache (replaced, deleted,
forgotten), after it left: what a consumer that accounts for what the cache holds needs.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from convergerd.core.decode import clean_text
from convergerd.core.errors import ClusterError, TooLarge, classify_status
from convergerd.core.shown import shown
from convergerd.kube.api import KubeObject, Resource, WatchApi, WatchEvent
from convergerd.kube.listhead import event_head
from convergerd.logthrottle import LogThrottle
from convergerd.retry import backoff_s

log = logging.getLogger(__name__)

# kube-apiserver ends a watch after a random 30-60 min by default; asking for 5 minutes keeps
# a silent half-dead connection from hiding changes for long.
WATCH_TIMEOUT_S = 300.0
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0

ChangeHook = Callable[[str, KubeObject | None], None]
RestartHook = Callable[[str], None]
Transform = Callable[[KubeObject], KubeObject | None]


class Expired(Exception):
    """The watch's resourceVersion is too old (410): the cache must be re-listed."""


def _name_and_version(obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None, None
    name, version = meta.get("name"), meta.get("resourceVersion")
    return (name if isinstance(name, str) and name else None,
            version if isinstance(version, str) else None)


def object_key(obj: Mapping[str, Any], namespaced: bool) -> str | None:
    """The cache key of `obj`: `namespace/name` for a namespaced resource, else `name`; None
    without a name (or, namespaced, without a namespace)."""
    name, _ = _name_and_version(obj)
    if name is None or not namespaced:
        return name
    namespace = obj["metadata"].get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else None


def diff(old: Mapping[str, KubeObject],
         new: Mapping[str, KubeObject]) -> list[tuple[str, KubeObject | None]]:
    """The changes from `old` to `new` as (name, object or None), by resourceVersion: what a
    re-list reports. Pure."""
    changes: list[tuple[str, KubeObject | None]] = [
        (name, None) for name in sorted(old) if name not in new]
    for name in sorted(new):
        before = old.get(name)
        if before is None or _name_and_version(before)[1] != _name_and_version(new[name])[1]:
            changes.append((name, new[name]))
    return changes


class Informer:
    def __init__(
        self,
        api: WatchApi,
        resource: Resource,
        *,
        request_timeout_s: float,
        label_selector: str | None = None,
        watch_timeout_s: float = WATCH_TIMEOUT_S,
        on_change: ChangeHook | None = None,
        on_restart: RestartHook | None = None,
        transform: Transform | None = None,
        on_health: Callable[[bool], None] | None = None,
        on_remove: ChangeHook | None = None,
        step_past: bool = False,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api
        self.resource = resource
        self._selector = label_selector
        self._request_timeout_s = request_timeout_s
        self._watch_timeout_s = watch_timeout_s
        self._on_change = on_change
        self._on_restart = on_restart
        self._transform = transform
        self._on_health = on_health
        self._on_remove = on_remove
        self._step_past = step_past
        self._sleep = sleep
        self._rng = rng or random.Random()
        # A cluster can send any number of objects without a name: a few lines a minute.
        self._throttle = LogThrottle(log)
        self._objects: dict[str, KubeObject] = {}
        self._skipped: dict[str, KubeObject] = {}
        self.resource_version: str | None = None
        self.synced = asyncio.Event()  # set once the first list is in
        self.lists = 0  # how many times the cache was (re-)listed
        self._healthy = False  # listed, and the watch not failed since (see the module doc)

    @property
    def healthy(self) -> bool:
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        if value != self._healthy:
            self._healthy = value
            if self._on_health is not None:
                self._on_health(value)

    @property
    def objects(self) -> Mapping[str, KubeObject]:
        """The cache, by name (read only)."""
        return self._objects

    @property
    def skipped(self) -> Mapping[str, KubeObject]:
        """Objects stepped past, too large to read (stubs), by name: by the last list, or by
        the watch since (`step_past`)."""
        return self._skipped

    async def run(self) -> None:
        """Forever: list, then watch and resume; re-list only on 410."""
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    await self.relist()
                ended = await self._watch()
                failures = 0
                self._restarted(ended)
            except Expired:
                self.resource_version = None
                self.healthy = False
                self._restarted("expired")
            except ClusterError as exc:
                failures += 1
                self.healthy = False
                self._restarted(exc.reason)
                wait = backoff_s(failures, base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S, rng=self._rng)
                log.warning("watch of %s failed (%s): %s; again in %.1f s", self.resource,
                            exc.reason, exc, wait, extra={"resource": str(self.resource)})
                await self._sleep(wait)

    async def relist(self) -> None:
        """Replace the cache with a fresh list; report only the differences."""
        options: dict[str, Any] = {}  # only what is asked for: fakes need not take the rest
        if self._transform is not None:
            options["transform"] = self._transform
        if self._step_past:
            options["step_past"] = True
        listed = await self._api.list_objects(self.resource, label_selector=self._selector,
                                              timeout_s=self._request_timeout_s, **options)
        fresh: dict[str, KubeObject] = {}
        for item in listed.items:
            key = object_key(item, self.resource.namespaced)
            if key is None:
                self._throttle.log("no_name", logging.WARNING, "a listed %s has no name; left "
                                   "out", self.resource)
                continue
            fresh[key] = item
        skipped: dict[str, KubeObject] = {}
        for stub in listed.skipped:
            key = object_key(stub, self.resource.namespaced)
            if key is not None:
                skipped[key] = stub
        old, self._objects, self._skipped = self._objects, fresh, skipped
        self._removed(old.items())
        self.resource_version = listed.resource_version or None
        self.lists += 1
        self.healthy = True
        for key, obj in diff(old, fresh):
            self._changed(key, obj)
        self.synced.set()

    def invalidate(self) -> None:
        """The next `run` starts with a re-list (e.g. the transform now keeps more)."""
        self.resource_version = None
        self.healthy = False

    def forget(self, keep: Callable[[str], bool]) -> None:
        """Drop the cached objects whose key `keep` rejects, without reporting them (they left
        the consumer's interest, not the cluster)."""
        dropped = [(k, v) for k, v in self._objects.items() if not keep(k)]
        self._objects = {k: v for k, v in self._objects.items() if keep(k)}
        self._skipped = {k: v for k, v in self._skipped.items() if keep(k)}
        self._removed(dropped)

    async def _watch(self) -> str:
        """Until the watch ends: `closed`, or `too_large` when an event too large to read
        was stepped past (with `step_past`; the caller resumes after it)."""
        assert self.resource_version is not None
        try:
            async for event in self._api.watch(self.resource,
                                               resource_version=self.resource_version,
                                               label_selector=self._selector,
                                               timeout_s=self._watch_timeout_s):
                self._event(event)
        except TooLarge as exc:
            if not self._step_past:
                raise
            self._step_past_event(exc)
            return "too_large"
        return "closed"

    def _event(self, event: WatchEvent) -> None:
        if event.type == "ERROR":
            if event.code == 410:
                raise Expired
            cls, reason = classify_status(event.code or 500)
            message = event.object.get("message")
            text = clean_text(message, 200) if isinstance(message, str) else ""
            raise cls(f"watch ERROR event {event.code}: {text}", status=event.code or 500,
                      reason=reason)
        if event.resource_version is not None:
            self.resource_version = event.resource_version
        if not self._healthy:
            self.healthy = True
        if event.type == "BOOKMARK" or event.name is None:
            return
        key = object_key(event.object, self.resource.namespaced)
        if key is None:
            self._throttle.log("no_namespace", logging.WARNING, "a watched %s has no "
                               "namespace; left out", self.resource)
            return
        obj: KubeObject | None = event.object
        if obj is not None and event.type != "DELETED" and self._transform is not None:
            obj = self._transform(obj)
        self._skipped.pop(key, None)
        old = self._objects.get(key)
        if event.type == "DELETED" or obj is None:
            if self._objects.pop(key, None) is not None:
                self._changed(key, None)
        else:
            self._objects[key] = obj
            self._changed(key, obj)
        if old is not None:
            self._removed(((key, old),))

    def _step_past_event(self, exc: TooLarge) -> None:
        """An event too large to read: resume after it (its resourceVersion, read from its
        first bytes), the object dropped and kept as a skipped stub (or gone, if deleted).
        When those bytes do not say, the watch fails as any unusable answer does."""
        head = event_head(exc.head)
        key = None
        if head.type is not None and head.name is not None and head.resource_version:
            key = (f"{head.namespace}/{head.name}" if head.namespace else None
                   ) if self.resource.namespaced else head.name
        if key is None:
            raise exc
        self.resource_version = head.resource_version
        old = self._objects.pop(key, None)
        known = key in self._skipped
        new = head.type != "DELETED" and not known
        if head.type == "DELETED":
            self._skipped.pop(key, None)
        else:
            self._skipped[key] = {"metadata": {"namespace": head.namespace, "name": head.name}}
        if old is not None or new or (known and head.type == "DELETED"):
            self._changed(key, None)  # the consumer looks again (gone, or now skipped)
        if old is not None:
            self._removed(((key, old),))
        if new:
            log.warning("watch of %s: an event about %s is larger than the response cap "
                        "(CONVERGERD_MAX_RESPONSE_BYTES): stepped past, not read",
                        self.resource, shown(key, 120, style="text"),
                        extra={"resource": str(self.resource)})

    def _changed(self, name: str, obj: KubeObject | None) -> None:
        if self._on_change is not None:
            self._on_change(name, obj)

    def _removed(self, gone: Iterable[tuple[str, KubeObject]]) -> None:
        if self._on_remove is not None:
            for key, obj in gone:
                self._on_remove(key, obj)

    def _restarted(self, reason: str) -> None:
        if self._on_restart is not None:
            self._on_restart(reason)
