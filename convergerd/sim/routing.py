"""Kubernetes API paths -> what they address (pure).

Follows the apiserver's request-info rules (`k8s.io/apiserver/pkg/endpoints/request`):
`/api/v1/...` is the core group, `/apis/<group>/<version>/...` the others, and in
`/namespaces/<ns>/<x>` the segment `<x>` is a resource unless it is one of the Namespace
object's own subresources. Only string splits and dict lookups: this runs on every request.
Whether a cluster *serves* a type (its version, the CRD) is decided by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from convergerd.sim.resources import ALL_TYPES, ResourceType

# Subresources of the Namespace object itself (`/api/v1/namespaces/<name>/status`).
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


class Endpoint(Enum):
    """Non-resource endpoints a simulated cluster answers."""

    VERSION = "version"
    API = "api"  # /api
    APIS = "apis"  # /apis
    API_GROUP = "api_group"  # /apis/<group>
    GROUP_VERSION = "group_version"  # /api/v1, /apis/<group>/<version>
    OPENAPI_V2 = "openapi_v2"
    OPENAPI_V3 = "openapi_v3"
    OPENAPI_V3_GV = "openapi_v3_gv"  # /openapi/v3/api/v1, /openapi/v3/apis/<g>/<v>
    HEALTH = "health"  # /healthz, /livez, /readyz
    METRICS = "metrics"  # /metrics (Prometheus text)


@dataclass(frozen=True, slots=True)
class NonResourceRoute:
    endpoint: Endpoint
    group: str = ""
    version: str = ""


@dataclass(frozen=True, slots=True)
class ResourceRoute:
    """A request for a resource collection (`name is None`) or one object."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


Route = NonResourceRoute | ResourceRoute

_SIMPLE: dict[str, NonResourceRoute] = {
    "/version": NonResourceRoute(Endpoint.VERSION),
    "/api": NonResourceRoute(Endpoint.API),
    "/apis": NonResourceRoute(Endpoint.APIS),
    "/openapi/v2": NonResourceRoute(Endpoint.OPENAPI_V2),
    "/openapi/v3": NonResourceRoute(Endpoint.OPENAPI_V3),
    "/healthz": NonResourceRoute(Endpoint.HEALTH),
    "/livez": NonResourceRoute(Endpoint.HEALTH),
    "/readyz": NonResourceRoute(Endpoint.HEALTH),
    "/metrics": NonResourceRoute(Endpoint.METRICS),
}


class Router:
    """Resolves paths against a fixed set of resource types."""

    def __init__(self, types: Iterable[ResourceType] = ALL_TYPES) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._groups: set[str] = set()
        for rt in types:
            self._types[(rt.group, rt.version, rt.plural)] = rt
            self._groups.add(rt.group)

    def parse(self, path: str) -> Route | None:
        """The route for a cluster-relative path, or None when nothing lives there."""
        simple = _SIMPLE.get(path.rstrip("/") or "/")
        if simple is not None:
            return simple
        segs = [s for s in path.split("/") if s]
        head = segs[0] if segs else ""
        route: Route | None = None
        if head == "api" and len(segs) >= 2 and segs[1] == "v1":
            # The core group only has v1.
            route = self._group_version_path("", "v1", segs[2:])
        elif head == "apis" and len(segs) == 2:
            route = NonResourceRoute(Endpoint.API_GROUP, group=segs[1])
        elif head == "apis" and len(segs) > 2:
            route = self._group_version_path(segs[1], segs[2], segs[3:])
        elif head == "openapi" and len(segs) >= 3 and segs[1] == "v3":
            route = _openapi_v3_gv(segs[2:])
        return route

    def _group_version_path(self, group: str, version: str, rest: list[str]) -> Route | None:
        if not rest:
            return NonResourceRoute(Endpoint.GROUP_VERSION, group=group, version=version)
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            namespace, rest = rest[1], rest[2:]
        rt = self._types.get((group, version, rest[0])) if len(rest) <= 3 else None
        if rt is None:
            return None
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        valid = (
            # A cluster-scoped type has no namespace; a namespaced object needs one.
            (namespace is None or rt.namespaced)
            and (namespace is not None or name is None or not rt.namespaced)
            and (subresource is None or _has_subresource(rt, subresource))
        )
        if not valid:
            return None
        return ResourceRoute(rt=rt, namespace=namespace, name=name, subresource=subresource)


def _has_subresource(rt: ResourceType, subresource: str) -> bool:
    return subresource == "status" and rt.has_status


def _openapi_v3_gv(rest: list[str]) -> NonResourceRoute | None:
    if rest == ["api", "v1"]:
        return NonResourceRoute(Endpoint.OPENAPI_V3_GV, group="", version="v1")
    if len(rest) == 3 and rest[0] == "apis":
        return NonResourceRoute(Endpoint.OPENAPI_V3_GV, group=rest[1], version=rest[2])
    return None
