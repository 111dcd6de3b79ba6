"""`ObjectClient`: any resource type of one cluster (get, list, watch, apply, status apply,
delete, dry-run create, discovery) over `ClusterClient.call` / `ClusterClient.stream`, so every
request shares the client's pool, bounds, rate limit and error classes.

Answers are untrusted: list pages pass `decode.list_page`, watch lines `decode.watch_line`,
each line read with the response size cap. A 404 about a resource *type* (not served) is
raised as `ClusterLevelError` with status 404, reason `not_served`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from convergerd.core.decode import (
    MAX_TOKEN_CHARS,
    ListBudget,
    clean_text,
    list_page,
    same_object,
    watch_line,
)
from convergerd.core.errors import BadResponse, ClusterLevelError, TooLarge
from convergerd.kube.api import Admitted, KubeObject, ObjectList, Resource, WatchEvent
from convergerd.kube.client import (
    APPLY_CONTENT_TYPE,
    LIST_PAGE_SIZE,
    ClusterClient,
    KeptLines,
)
from convergerd.kube.listhead import list_head

# How much longer than the watch's own timeoutSeconds the client waits for the stream to end.
WATCH_SLACK_S = 30.0
# One whole list of any kind, over all its pages (each page is bounded by the `limit` sent and
# the client's `Cost`): a big cluster's Pods, not a server that never stops paging.
OBJECT_LIST = ListBudget(max_items=500_000, max_pages=5_000)


def _not_served(exc: ClusterLevelError, resource: Resource) -> ClusterLevelError:
    if exc.status != 404:
        return exc
    return ClusterLevelError(f"{resource} is not served by this cluster", status=404,
                             k8s_reason=exc.k8s_reason, reason="not_served")


class ObjectClient:
    """Generic object verbs on one cluster's `ClusterClient` (which stays owned by its
    registry or creator)."""

    def __init__(self, client: ClusterClient, *, page_size: int = LIST_PAGE_SIZE) -> None:
        self._client = client
        self._page_size = page_size

    @property
    def cluster(self) -> str:
        return self._client.cluster

    async def get(self, resource: Resource, name: str, *, timeout_s: float,
                  namespace: str | None = None) -> KubeObject | None:
        """The object, or None when it does not exist."""
        try:
            reply = await self._client.call("GET", resource.path(name, namespace=namespace),
                                            verb="get", timeout_s=timeout_s, not_found=name)
        except ClusterLevelError as exc:
            raise _not_served(exc, resource) from exc
        if reply is None:
            return None
        same_object(reply.object, {"apiVersion": resource.api_version,
                                   "metadata": {"name": name, "namespace": namespace}},
                    "get answer")
        return reply.object

    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float, namespace: str | None = None,
                           limit: int | None = None,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList:
        """Every object (or the first `limit`), following `continue` until the end. With
        `transform`, each item is replaced as its page arrives (None: left out), so only one
        page of full objects is held at a time.

        A page over the response cap (`TooLarge`) is asked again with half the limit, down to
        one object; the limit doubles back after each page that fits. With `step_past`, one
        object too large alone is stepped past with the `continue` token read from its
        answer's first bytes (`kube.listhead`) and named in `skipped` (for a cache that says
        what it misses; without it, or when those bytes cannot say where the list goes on,
        the `TooLarge` is raised: a list that leaves an object out must not pass for whole)."""
        items: list[KubeObject] = []
        skipped: list[KubeObject] = []
        token: str | None = None
        requests = 0
        full = limit or self._page_size
        size = full
        version = ""  # every page of one list is at the first page's resourceVersion
        while True:
            query = {"limit": str(size)}
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            requests += 1
            try:
                reply = await self._client.call("GET", resource.path(namespace=namespace),
                                                verb="list", timeout_s=timeout_s, query=query)
            except ClusterLevelError as exc:
                raise _not_served(exc, resource) from exc
            except TooLarge as exc:
                if size > 1:
                    size //= 2
                    continue
                head = list_head(exc.head) if step_past else None
                if (head is None or not head.listed or head.name is None
                        or (resource.namespaced and head.namespace is None)
                        or head.continue_token == token):
                    raise  # what it skipped could not be named, or it would not move on
                skipped.append({"metadata": {"namespace": head.namespace, "name": head.name}})
                version = version or clean_text(head.resource_version or "", MAX_TOKEN_CHARS)
                if head.continue_token is None:
                    return ObjectList(items=items, resource_version=version,
                                      requests=requests, skipped=skipped)
                token = head.continue_token
                OBJECT_LIST.check(pages=requests, items=len(items) + len(skipped))
                continue
            assert reply is not None
            page = list_page(reply.object, api_version=resource.api_version, limit=size)
            version = version or page.resource_version
            if transform is None:
                items.extend(page.items)
            else:
                items.extend(t for t in map(transform, page.items) if t is not None)
            if page.continue_token is not None and page.continue_token == token:
                raise BadResponse("list answer: metadata.continue: the same token again")
            token = page.continue_token
            if token is None or (limit is not None and len(items) >= limit):
                return ObjectList(items=items, resource_version=page.resource_version or version,
                                  requests=requests, skipped=skipped)
            OBJECT_LIST.check(pages=requests, items=len(items))
            size = min(full, size * 2)

    async def watch(self, resource: Resource, *, resource_version: str,
                    label_selector: str | None, timeout_s: float) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version` with bookmarks, until the server ends the watch
        (`timeoutSeconds` = `timeout_s`)."""
        query = {"watch": "true", "allowWatchBookmarks": "true",
                 "resourceVersion": resource_version, "timeoutSeconds": str(int(timeout_s))}
        if label_selector:
            query["labelSelector"] = label_selector
        try:
            async for line in self._client.stream(resource.path(), query=query,
                                                  timeout_s=timeout_s + WATCH_SLACK_S):
                event = watch_line(line)
                yield WatchEvent(event.type, event.object, event.name, event.resource_version,
                                 event.code)
        except ClusterLevelError as exc:
            raise _not_served(exc, resource) from exc

    async def apply(self, resource: Resource, body: KubeObject, *, field_manager: str,
                    timeout_s: float, subresource: str | None = None) -> KubeObject:
        """Server-side apply with force, as `field_manager`."""
        name = body["metadata"]["name"]
        try:
            reply = await self._client.call(
                "PATCH", resource.path(name, subresource=subresource), verb="apply",
                timeout_s=timeout_s, body=body, content_type=APPLY_CONTENT_TYPE,
                query={"fieldManager": field_manager, "force": "true"})
        except ClusterLevelError as exc:
            raise _not_served(exc, resource) from exc
        assert reply is not None
        same_object(reply.object, body, "apply answer")
        return reply.object

    async def delete(self, resource: Resource, name: str, *, timeout_s: float) -> bool:
        """False when it was already gone."""
        try:
            reply = await self._client.call("DELETE", resource.path(name), verb="delete",
                                            timeout_s=timeout_s, not_found=name)
        except ClusterLevelError as exc:
            raise _not_served(exc, resource) from exc
        return reply is not None

    async def dry_run_create(self, resource: Resource, body: KubeObject, *, timeout_s: float,
                             namespace: str | None = None) -> Admitted:
        """A create with `dryRun=All`: admission runs, nothing is stored. A denial raises
        `ObjectRejected` (usually 422, or 403) carrying the server's message; an admitted
        object comes with the answer's warnings (a Warn binding's failures)."""
        reply = await self._client.call(
            "POST", resource.path(namespace=namespace), verb="create", timeout_s=timeout_s,
            body=body, query={"dryRun": "All"})
        assert reply is not None
        return Admitted(reply.object, reply.warnings)

    async def metrics(self, *, names: tuple[str, ...], timeout_s: float) -> bytes:
        """The lines of the API server's `/metrics` (Prometheus text) that start with one of
        `names`: a kube-apiserver's whole answer is often many MB, far over the response cap,
        so it is streamed and only those lines kept (`client.KeptLines`). Reading it needs
        RBAC `nonResourceURLs: ["/metrics"], verbs: ["get"]` (403 without)."""
        keep = KeptLines(tuple(name.encode() for name in names))
        return await self._client.text("/metrics", verb="metrics", timeout_s=timeout_s,
                                       keep=keep)

    async def served_resources(self, group: str, version: str, *,
                               timeout_s: float) -> frozenset[str] | None:
        """The resource names discovery lists for `group/version`; None when the cluster does
        not serve that group version at all (404)."""
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        try:
            reply = await self._client.call("GET", path, verb="discovery", timeout_s=timeout_s)
        except ClusterLevelError as exc:
            if exc.status == 404:
                return None
            raise
        assert reply is not None
        return _resource_names(reply.object)


def _resource_names(doc: Mapping[str, Any]) -> frozenset[str]:
    resources = doc.get("resources")
    if not isinstance(resources, list):
        raise BadResponse("discovery answer: resources: expected a list")
    return frozenset(r["name"] for r in resources
                     if isinstance(r, dict) and isinstance(r.get("name"), str))

