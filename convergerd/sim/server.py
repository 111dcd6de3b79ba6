"""The simulated API servers' front door: cluster lookup, faults, authentication,
authorization and request accounting, in the order kube-apiserver's filter chain applies them.

Many clusters share one https listener and are told apart by path prefix:
`https://127.0.0.1:<port>/clusters/<id>/api/v1/...`. A cluster record is a few fields; its
object store is created on the first request that needs it, so idle clusters cost next to
nothing and `--clusters 1000` starts in about the time it takes to write the kubeconfig.

Order of checks (kube-apiserver `DefaultBuildHandlerChain`): authentication (401) ->
max-in-flight / APF (our injected 429 and 5xx) -> authorization (403) -> routing (404) ->
the handler. Network faults (down, hang, latency) come first: they model the path to the host.
Fault `hostile` (convergerd.sim.hostile) comes last: it rewrites the answer the chain built.

Authorization: the cluster's token may do everything (a cluster-admin) but what faults take
away (`readOnly`: writes; `metrics: false`: `/metrics`, as RBAC without `nonResourceURLs:
["/metrics"]`); an anonymous request may only read `/version` and the health endpoints.
Every request carries its `RequestNotes` (convergerd.sim.notes): the Warning headers admission
added go on its answer, whatever the answer is, and its audit annotations to the request log.
`/metrics` is answered by the cluster's API servers in turn (convergerd.sim.apimetrics).
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from convergerd.sim import apimetrics, discovery, hostile, status
from convergerd.sim.accounting import NON_RESOURCE, Accounting
from convergerd.sim.apimetrics import ApiServers
from convergerd.sim.faults import Faults
from convergerd.sim.handlers import ResourceHandlers, resource_verb
from convergerd.sim.notes import RequestNotes
from convergerd.sim.routing import Endpoint, NonResourceRoute, ResourceRoute, Route, Router
from convergerd.sim.store import ClusterStore
from convergerd.sim.tls import CertAuthority

CLUSTER_PREFIX = "/clusters/"
# Who the kubeconfig token authenticates as (what a 403 message names).
AUTHENTICATED_USER = "system:serviceaccount:stackship-system:convergerd"
ANONYMOUS_USER = "system:anonymous"
# RBAC's system:public-info-viewer lets anyone (anonymous too) read these.
_PUBLIC_ENDPOINTS = frozenset({Endpoint.VERSION, Endpoint.HEALTH})
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_JSON = "application/json"
# SO_LINGER on, timeout 0: close() sends RST instead of FIN, so a "down" cluster's client sees
# "connection reset" rather than a clean end of stream.
_LINGER_RESET = struct.pack("ii", 1, 0)
_NO_ANSWER = 599  # the status of a dropped connection's placeholder response


@dataclass(eq=False, slots=True)
class Listener:
    """One https port with its own CA; several clusters share it."""

    name: str
    ca: CertAuthority
    host: str
    port: int = 0  # known once listening

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(eq=False, slots=True)
class Cluster:
    """A simulated cluster: identity, credentials, faults, and (once used) its objects."""

    id: str
    token: str
    listener: Listener
    faults: Faults = field(default_factory=Faults)
    store: ClusterStore | None = None
    apiservers: ApiServers = field(default_factory=ApiServers)

    @property
    def base_url(self) -> str:
        return f"https://{self.listener.address}{CLUSTER_PREFIX}{self.id}"


class ApiServer:
    """The aiohttp request handler shared by every cluster listener."""

    def __init__(
        self,
        clusters: Mapping[str, Cluster],
        accounting: Accounting,
        *,
        store_factory: Callable[[Cluster], ClusterStore],
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        bookmark_interval_s: float = 60.0,
    ) -> None:
        self._clusters = clusters
        self._accounting = accounting
        self._store_factory = store_factory
        self._rng = rng or random.Random()
        self._clock = clock
        self._router = Router()
        self._by_token = {c.token: c for c in clusters.values()}
        self._resources = ResourceHandlers(rng=self._rng, bookmark_interval_s=bookmark_interval_s)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        cluster_id, rel = _split_cluster(path)
        if cluster_id:
            cluster = self._clusters.get(cluster_id)
            prefix_len = len(CLUSTER_PREFIX) + len(cluster_id)
        else:
            cluster, rel, prefix_len = self._cluster_by_token(request), path, 0
        if cluster is None:
            return error_response(status.path_not_found())
        route = self._router.parse(rel)
        verb = (
            resource_verb(request.method, route, request.query)
            if isinstance(route, ResourceRoute)
            else NON_RESOURCE
        )
        arrived, started = self._clock(), time.monotonic()
        code = 0  # stays 0 when the request gets no answer (down, hang, client gone)
        notes = RequestNotes()
        try:
            response = await self._hostile_serve(request, cluster, route, rel,
                                                 request.path_qs[prefix_len:], notes=notes)
            code = response.status
            return response
        finally:
            self._accounting.record(
                time=arrived,
                cluster=cluster.id,
                verb=verb,
                method=request.method,
                path=request.path_qs[prefix_len:],
                status=code,
                user_agent=request.headers.get("User-Agent", ""),
                duration_ms=(time.monotonic() - started) * 1000,
                token_of=self._token_owner(request),
                annotations=notes.annotations,
            )

    async def _hostile_serve(
        self, request: web.BaseRequest, cluster: Cluster, route: Route | None, rel: str,
        rel_qs: str, *, notes: RequestNotes,
    ) -> web.StreamResponse:
        """`_serve`, with fault `hostile` (if set) answering instead or rewriting the answer."""
        fault = cluster.faults.hostile
        if fault is None:
            return await self._serve(request, cluster, route, rel, notes)
        named = isinstance(route, ResourceRoute) and route.name is not None
        instead = await hostile.intercept(fault, request, rel_qs, named)
        if instead is not None:
            return instead
        response = await self._serve(hostile.served_request(fault, request), cluster, route,
                                     rel, notes)
        if response.status == _NO_ANSWER:
            return response
        return await hostile.answer(fault, request, response)

    def _token_owner(self, request: web.BaseRequest) -> str | None:
        """Whose token the request carried: a cluster id, "" for a token of no cluster, None
        when it had no Authorization header (the request log shows where tokens went)."""
        header = request.headers.get("Authorization")
        if header is None:
            return None
        _, _, token = header.partition(" ")
        owner = self._by_token.get(token.strip())
        return owner.id if owner is not None else ""

    async def _serve(
        self, request: web.BaseRequest, cluster: Cluster, route: Route | None, rel: str,
        notes: RequestNotes,
    ) -> web.StreamResponse:
        response = await self._answer(request, cluster, route, rel, notes)
        if notes.headers and not response.prepared:
            for header in notes.headers:
                response.headers.add("Warning", header)
        return response

    async def _answer(
        self, request: web.BaseRequest, cluster: Cluster, route: Route | None, rel: str,
        notes: RequestNotes,
    ) -> web.StreamResponse:
        faults = cluster.faults
        if faults.down:
            return _reset_connection(request)
        if faults.hang:
            # Never answer; aiohttp cancels this handler when the client disconnects
            # (handler_cancellation=True), so nothing outlives the client's patience.
            await asyncio.Event().wait()
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        try:
            user = self._authenticate(request, cluster)
            self._maybe_inject_error(faults)
            self._authorize(request, route, rel, user, faults)
            if route is None:
                raise status.path_not_found()
            if isinstance(route, NonResourceRoute):
                return self._non_resource(route, cluster)
            if not discovery.is_served(route.rt, faults.minor, faults.crd):
                # A missing CRD or a type this version lacks: the apiserver has no route at all.
                raise status.path_not_found()
            return await self._resources.serve(request, self._store(cluster), route, notes)
        except status.ApiError as e:
            return error_response(e)

    def _cluster_by_token(self, request: web.BaseRequest) -> Cluster | None:
        """The cluster for a request without the /clusters/<id> prefix, by its bearer token.

        client-go's `RequestURI` (used by `kubectl get --raw`) replaces the whole path and so
        drops the server URL's path prefix; the token still says which cluster is meant.
        """
        _, _, token = request.headers.get("Authorization", "").partition(" ")
        cluster = self._by_token.get(token.strip())
        if cluster is None or request.transport is None:
            return None
        sockname = request.transport.get_extra_info("sockname")
        return cluster if sockname and sockname[1] == cluster.listener.port else None

    def _store(self, cluster: Cluster) -> ClusterStore:
        if cluster.store is None:
            cluster.store = self._store_factory(cluster)
        return cluster.store

    def _authenticate(self, request: web.BaseRequest, cluster: Cluster) -> str:
        header = request.headers.get("Authorization")
        if header is None:
            return ANONYMOUS_USER
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token.strip() == cluster.token:
            return AUTHENTICATED_USER
        raise status.unauthorized()

    def _maybe_inject_error(self, faults: Faults) -> None:
        if faults.error_rate <= 0 or self._rng.random() >= faults.error_rate:
            return
        if faults.error_status == 429:
            raise status.too_many_requests(faults.retry_after_seconds or 1)
        err = status.server_error(faults.error_status)
        if faults.retry_after_seconds is not None:
            err.headers["Retry-After"] = str(faults.retry_after_seconds)
        raise err

    def _authorize(
        self,
        request: web.BaseRequest,
        route: Route | None,
        rel: str,
        user: str,
        faults: Faults,
    ) -> None:
        if user == ANONYMOUS_USER:
            if isinstance(route, NonResourceRoute) and route.endpoint in _PUBLIC_ENDPOINTS:
                return
            raise _forbidden(request, route, rel, user)
        if faults.read_only and request.method in _WRITE_METHODS:
            raise _forbidden(request, route, rel, user)
        if (not faults.metrics and isinstance(route, NonResourceRoute)
                and route.endpoint is Endpoint.METRICS):
            raise _forbidden(request, route, rel, user)

    def _non_resource(self, route: NonResourceRoute, cluster: Cluster) -> web.Response:
        faults = cluster.faults
        minor, crd = faults.minor, faults.crd
        body: bytes | None
        match route.endpoint:
            case Endpoint.VERSION:
                body = discovery.version_body(faults.version)
            case Endpoint.API:
                body = discovery.api_versions_body(cluster.listener.address)
            case Endpoint.APIS:
                body = discovery.api_group_list_body(minor, crd)
            case Endpoint.API_GROUP:
                body = discovery.api_group_body(route.group, minor, crd)
            case Endpoint.GROUP_VERSION:
                body = discovery.group_version_body(route.group, route.version, minor, crd)
            case Endpoint.OPENAPI_V3:
                body = discovery.openapi_v3_body(faults.version, crd)
            case Endpoint.OPENAPI_V3_GV:
                body = discovery.openapi_v3_gv_body(route.group, route.version, faults.version, crd)
            case Endpoint.HEALTH:
                return web.Response(body=b"ok", content_type="text/plain")
            case Endpoint.METRICS:
                return web.Response(body=cluster.apiservers.scrape(),
                                    headers={"Content-Type": apimetrics.CONTENT_TYPE})
            case _:
                # /openapi/v2 is not served: kubectl only falls back to it when v3 fails.
                body = None
        if body is None:
            raise status.path_not_found()
        return json_response(body)


def _split_cluster(path: str) -> tuple[str, str]:
    """("c0001", "/api/v1/...") from "/clusters/c0001/api/v1/..."; ("", "") if no prefix."""
    if not path.startswith(CLUSTER_PREFIX):
        return "", ""
    cluster_id, _, rest = path[len(CLUSTER_PREFIX) :].partition("/")
    return cluster_id, "/" + rest


def _forbidden(
    request: web.BaseRequest, route: Route | None, rel: str, user: str
) -> status.ApiError:
    if isinstance(route, ResourceRoute):
        verb = resource_verb(request.method, route, request.query)
        return status.forbidden(
            route.rt, route.name or "", user, verb, route.namespace, route.subresource
        )
    verb = request.method.lower()
    message = f'forbidden: User "{user}" cannot {verb} path "{rel}"'
    return status.ApiError(status.status_object(403, "Forbidden", message, {}))


def _reset_connection(request: web.BaseRequest) -> web.Response:
    """Drop the connection with a TCP reset, answering nothing (fault `down`).

    All clusters on a listener share its port, so the TCP and TLS handshakes have already
    succeeded when we learn which cluster is addressed; "reset on the first request" is as close
    to "connection refused" as path-prefix routing gets.
    """
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if isinstance(sock, socket.socket) or hasattr(sock, "setsockopt"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        transport.abort()
    # aiohttp finds the transport gone and writes nothing.
    return web.Response(status=_NO_ANSWER)


def json_response(body: bytes, code: int = 200) -> web.Response:
    return web.Response(body=body, status=code, headers={"Content-Type": _JSON})


def error_response(err: status.ApiError) -> web.Response:
    headers = {"Content-Type": err.content_type, **err.headers}
    return web.Response(body=err.body(), status=err.code, headers=headers)
