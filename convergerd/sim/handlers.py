"""Resource verbs over HTTP: decode the request, call the cluster's store, encode the answer.

The store (convergerd.sim.store) owns the semantics; this module owns the wire: query
parameters, status codes (201 on create), field-manager defaulting, and watch streaming.
"""

from __future__ import annotations

import asyncio
import datetime
import random
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from aiohttp import web

from convergerd.sim import status, tables, wire
from convergerd.sim.notes import RequestNotes
from convergerd.sim.routing import ResourceRoute
from convergerd.sim.store import ClusterStore, Watcher

_JSON = "application/json"
_TRUE = frozenset({"true", "1"})
# kube-apiserver picks a random watch timeout in [min-request-timeout, 2x] when none is given.
_MIN_REQUEST_TIMEOUT_S = 1800
# The watch cache sends a last bookmark this long before a watch's deadline (cache_watcher.go).
_FINAL_BOOKMARK_LEAD_S = 2.0
_MAX_MANAGER_BYTES = 128


def resource_verb(method: str, route: ResourceRoute, query: Mapping[str, str]) -> str:
    """The Kubernetes verb of a request, as the apiserver's RequestInfo names it."""
    if method == "GET":
        if query.get("watch", "") in _TRUE:
            return "watch"
        return "list" if route.name is None else "get"
    return {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if route.name is not None else "deletecollection",
    }.get(method, method.lower())


def manager_from_user_agent(user_agent: str) -> str:
    """The default field manager of a non-apply write: the User-Agent up to its first "/"
    with non-printable characters dropped, at most 128 bytes (handlers/create.go)."""
    prefix = user_agent.split("/", 1)[0]
    printable = "".join(c for c in prefix if c.isprintable())
    return printable.encode()[:_MAX_MANAGER_BYTES].decode(errors="ignore")


def _encode(obj: Any) -> bytes:
    return wire.dumps(obj)


def _respond(obj: Any, code: int = 200) -> web.Response:
    return web.Response(body=_encode(obj), status=code, headers={"Content-Type": _JSON})


_BODY_TYPES = frozenset({_JSON, "application/yaml"})
_UNSUPPORTED_BODY = (
    "the body of the request was in an unknown format - accepted media types include: "
    "application/json, application/yaml"
)


def _decode_object(body: bytes, content_type: str) -> dict[str, Any]:
    """A create/update body (JSON, or YAML when the client says so) as a JSON object.

    Protobuf (what client-go sends for built-in kinds, e.g. `kubectl create namespace`) is
    not decoded: it needs the generated Kubernetes schemas. The answer is the apiserver's 415
    for a media type it does not accept.
    """
    if content_type not in _BODY_TYPES:
        raise status.ApiError(status.status_object(415, "UnsupportedMediaType", _UNSUPPORTED_BODY))
    try:
        doc = (
            wire.loads_yaml_request(body, yaml.SafeLoader)
            if "yaml" in content_type
            else wire.loads_request(body or b"null")
        )
    except (ValueError, yaml.YAMLError) as e:
        raise status.bad_request(f"error decoding request body: {e}") from e
    if not isinstance(doc, dict):
        raise status.bad_request("Object 'Kind' is missing in request body")
    return doc


def _media_type(request: web.BaseRequest) -> str:
    return request.headers.get("Content-Type", _JSON).split(";", 1)[0].strip().lower()


class ResourceHandlers:
    """get, list, watch, create, update, patch and delete for one request at a time."""

    def __init__(self, *, rng: random.Random, bookmark_interval_s: float) -> None:
        self._rng = rng
        self._bookmark_interval_s = bookmark_interval_s

    async def serve(
        self, request: web.BaseRequest, store: ClusterStore, route: ResourceRoute,
        notes: RequestNotes | None = None,
    ) -> web.StreamResponse:
        """`notes`: where admission puts this request's warnings and audit annotations."""
        query = request.query
        verb = resource_verb(request.method, route, query)
        name = route.name
        if verb == "get" and name is not None:
            return _read_response(request, route, store.get(route.rt, route.namespace, name))
        if verb == "list":
            return _read_response(
                request,
                route,
                store.list(
                    route.rt,
                    route.namespace,
                    label_selector=query.get("labelSelector"),
                    field_selector=query.get("fieldSelector"),
                    limit=_int_param(query, "limit"),
                    continue_token=query.get("continue"),
                ),
            )
        if verb == "watch":
            return await self._watch(request, store, route)
        return await self._write(request, store, route, verb, notes)

    async def _write(
        self, request: web.BaseRequest, store: ClusterStore, route: ResourceRoute, verb: str,
        notes: RequestNotes | None,
    ) -> web.Response:
        rt, ns, name = route.rt, route.namespace, route.name
        dry_run = request.query.get("dryRun") == "All"
        if verb == "create" and route.subresource is None:
            obj = _decode_object(await request.read(), _media_type(request))
            created = store.create(rt, ns, obj, manager=self._manager(request), dry_run=dry_run,
                                   notes=notes)
            return _respond(created, 201)
        if verb == "update" and name is not None:
            obj = _decode_object(await request.read(), _media_type(request))
            updated, was_created = store.update(
                rt,
                ns,
                name,
                obj,
                manager=self._manager(request),
                subresource=route.subresource,
                dry_run=dry_run,
                notes=notes,
            )
            return _respond(updated, 201 if was_created else 200)
        if verb == "patch" and name is not None:
            return await self._patch(request, store, route, dry_run, notes)
        if verb == "delete" and name is not None and route.subresource is None:
            return _respond(store.delete(rt, ns, name, dry_run=dry_run, notes=notes))
        raise status.method_not_allowed(rt, verb)

    async def _patch(
        self,
        request: web.BaseRequest,
        store: ClusterStore,
        route: ResourceRoute,
        dry_run: bool,
        notes: RequestNotes | None,
    ) -> web.Response:
        query = request.query
        media = _media_type(request)
        force_param = query.get("force")
        assert route.name is not None
        obj, created = store.patch(
            route.rt,
            route.namespace,
            route.name,
            await request.read(),
            content_type=media,
            # Apply has no User-Agent default: a missing fieldManager is the store's 422.
            manager=query.get("fieldManager")
            if media == "application/apply-patch+yaml"
            else self._manager(request),
            force=None if force_param is None else force_param in _TRUE,
            subresource=route.subresource,
            dry_run=dry_run,
            notes=notes,
        )
        return _respond(obj, 201 if created else 200)

    @staticmethod
    def _manager(request: web.BaseRequest) -> str:
        explicit = request.query.get("fieldManager")
        if explicit:
            return explicit
        return manager_from_user_agent(request.headers.get("User-Agent", ""))

    async def _watch(
        self, request: web.BaseRequest, store: ClusterStore, route: ResourceRoute
    ) -> web.StreamResponse:
        query = request.query
        field_selector = query.get("fieldSelector")
        if route.name is not None:
            # GET .../<name>?watch=true is a watch on that one object.
            by_name = f"metadata.name={route.name}"
            field_selector = f"{field_selector},{by_name}" if field_selector else by_name
        timeout_s = _int_param(query, "timeoutSeconds")
        if not timeout_s:
            timeout_s = self._rng.randint(_MIN_REQUEST_TIMEOUT_S, 2 * _MIN_REQUEST_TIMEOUT_S)
        bookmarks = query.get("allowWatchBookmarks", "") in _TRUE
        as_table = _watch_table_encoder(request, route)
        response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
        response.enable_chunked_encoding()
        try:
            watcher = store.watch(
                route.rt,
                route.namespace,
                resource_version=query.get("resourceVersion"),
                label_selector=query.get("labelSelector"),
                field_selector=field_selector,
            )
        except status.ApiError as e:
            if e.code != 410:
                raise
            # Too old a resourceVersion: the apiserver answers 200 and sends the 410 Status as a
            # single ERROR event, then ends the stream (cacher.go).
            await response.prepare(request)
            await response.write(_encode({"type": "ERROR", "object": e.status}) + b"\n")
            await response.write_eof()
            return response
        try:
            await response.prepare(request)
            await self._stream(response, watcher, timeout_s, bookmarks, as_table)
        finally:
            watcher.close()
        await response.write_eof()
        return response

    async def _stream(
        self,
        response: web.StreamResponse,
        watcher: Watcher,
        timeout_s: int,
        bookmarks: bool,
        as_table: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """Events until the deadline; bookmarks periodically and just before the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        final_bookmark_at = deadline - _FINAL_BOOKMARK_LEAD_S if bookmarks else None
        next_bookmark = loop.time() + self._bookmark_interval_s if bookmarks else None
        while not watcher.done:
            now = loop.time()
            if now >= deadline:
                return
            if final_bookmark_at is not None and now >= final_bookmark_at:
                await response.write(_encode(watcher.bookmark()) + b"\n")
                final_bookmark_at = None
                continue
            if next_bookmark is not None and now >= next_bookmark:
                await response.write(_encode(watcher.bookmark()) + b"\n")
                next_bookmark = now + self._bookmark_interval_s
                continue
            wake = min(t for t in (deadline, final_bookmark_at, next_bookmark) if t is not None)
            event = await watcher.next(timeout=wake - now)
            if event is not None:
                if as_table is not None:
                    event = as_table(event)
                await response.write(_encode(event) + b"\n")


def _read_response(
    request: web.BaseRequest, route: ResourceRoute, result: dict[str, Any]
) -> web.Response:
    """A get/list answer: plain JSON, or a meta.k8s.io Table when the Accept header asks."""
    version = tables.requested_table_version(request.headers.get("Accept", ""))
    if version is None:
        return _respond(result)
    table = tables.to_table(
        route.rt,
        result,
        version=version,
        include_object=request.query.get("includeObject", ""),
        now=datetime.datetime.now(datetime.UTC),
    )
    return _respond(table)


def _watch_table_encoder(
    request: web.BaseRequest, route: ResourceRoute
) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """For a watch that asks for Tables: each event's object as a Table, column definitions
    only on the first one (handlers/watch.go watchEmbeddedEncoder sets NoHeaders after it).
    BOOKMARK and ERROR events keep their objects."""
    version = tables.requested_table_version(request.headers.get("Accept", ""))
    if version is None:
        return None
    include_object = request.query.get("includeObject", "")
    tables.check_include_object(include_object)
    headers_sent = False

    def encode(event: dict[str, Any]) -> dict[str, Any]:
        nonlocal headers_sent
        if event["type"] in ("BOOKMARK", "ERROR"):
            return event
        table = tables.to_table(
            route.rt,
            event["object"],
            version=version,
            include_object=include_object,
            now=datetime.datetime.now(datetime.UTC),
        )
        if headers_sent:
            table["columnDefinitions"] = None
        headers_sent = True
        return {"type": event["type"], "object": table}

    return encode


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError as e:
        raise status.bad_request(f'invalid value for {name}: "{raw}": must be an integer') from e
    if value < 0:
        raise status.bad_request(f"{name}: must be non-negative, got {value}")
    return value
