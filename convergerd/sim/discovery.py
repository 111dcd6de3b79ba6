"""Discovery and OpenAPI documents of one simulated cluster (pure).

What a cluster serves depends on its version (ValidatingAdmissionPolicy needs 1.30) and on
whether the Policy CRD is installed, so every document is a function of (version, crd). There
are only a handful of such combinations in a fleet, so the encoded bodies are memoised: a
discovery request costs a dict lookup, however many clusters ask.

Only the legacy (unaggregated) discovery format is served: client-go picks the format from the
response Content-Type, and plain `application/json` makes it fall back to per-group-version
GETs (kube-apiserver).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from convergerd.sim.faults import Version
from convergerd.sim.resources import ALL_TYPES, ResourceType, served

# The verbs this simulator implements (no deletecollection: clients then delete one by one).
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
_SUBRESOURCE_VERBS = ["get", "patch", "update"]
# Plausible build metadata for /version; clients only parse major/minor/gitVersion.
_BUILD = {
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T17:59:15Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_PATCH_PARAMS = [
    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    # kubectl's --validate=strict looks for exactly this parameter on the PATCH operation to
    # decide that the server validates (query_param_verifier_v3.go).
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": True}},
]
_PATCH_TYPES = [
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
]


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def is_served(rt: ResourceType, minor: int, crd: bool) -> bool:
    """Whether a cluster at `minor` (with or without the Policy CRD) serves `rt`."""
    return served(rt, minor) and (rt.builtin or crd)


@functools.lru_cache(maxsize=64)
def served_types(minor: int, crd: bool) -> tuple[ResourceType, ...]:
    return tuple(rt for rt in ALL_TYPES if is_served(rt, minor, crd))


@functools.lru_cache(maxsize=64)
def served_group_versions(minor: int, crd: bool) -> tuple[tuple[str, str], ...]:
    """Served (group, version) pairs in a stable order, core first.

    A group version with no served type is left out. (A real 1.29 still serves
    admissionregistration.k8s.io/v1 for webhook configurations, which the simulator does not
    implement; an empty resource list there makes client-go fail discovery with "received empty
    response", so leaving the group out is the closer match for clients.)
    """
    seen: dict[tuple[str, str], None] = {}
    for rt in ALL_TYPES:
        gv = (rt.group, rt.version)
        if is_served(rt, minor, crd):
            seen[gv] = None
    return tuple(sorted(seen, key=lambda gv: (gv[0] != "", gv[0] == "platform.stackship.se")))


@functools.lru_cache(maxsize=64)
def version_body(git_version: str) -> bytes:
    v = Version.parse(git_version)
    return _dump(
        {"major": str(v.major), "minor": str(v.minor), "gitVersion": git_version, **_BUILD}
    )


@functools.lru_cache(maxsize=64)
def api_versions_body(server_address: str) -> bytes:
    return _dump(
        {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }
    )


def _gv_ref(group: str, version: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{version}", "version": version}


def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
    refs = [_gv_ref(group, v) for v in versions]
    return {"name": group, "versions": refs, "preferredVersion": refs[0]}


@functools.lru_cache(maxsize=64)
def api_group_list_body(minor: int, crd: bool) -> bytes:
    groups: dict[str, list[str]] = {}
    for group, version in served_group_versions(minor, crd):
        if group:
            groups.setdefault(group, []).append(version)
    return _dump(
        {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [_api_group(g, vs) for g, vs in groups.items()],
        }
    )


@functools.lru_cache(maxsize=256)
def api_group_body(group: str, minor: int, crd: bool) -> bytes | None:
    versions = [v for g, v in served_group_versions(minor, crd) if g == group and g]
    if not versions:
        return None
    return _dump({"kind": "APIGroup", "apiVersion": "v1", **_api_group(group, versions)})


def _resource_entries(rt: ResourceType) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": _VERBS,
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    entries = [entry]
    if rt.has_status:
        entries.append(
            {
                "name": f"{rt.plural}/status",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": _SUBRESOURCE_VERBS,
            }
        )
    return entries


@functools.lru_cache(maxsize=256)
def group_version_body(group: str, version: str, minor: int, crd: bool) -> bytes | None:
    """The APIResourceList for /api/v1 or /apis/<group>/<version>, or None (404)."""
    if (group, version) not in served_group_versions(minor, crd):
        return None
    resources: list[dict[str, Any]] = []
    for rt in served_types(minor, crd):
        if (rt.group, rt.version) == (group, version):
            resources.extend(_resource_entries(rt))
    return _dump(
        {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": rt_group_version(group, version),
            "resources": resources,
        }
    )


def rt_group_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _operation_id(verb: str, rt: ResourceType) -> str:
    group = "".join(p.capitalize() for p in rt.group.replace(".", "-").split("-")) or "Core"
    return f"{verb}{group}{rt.version.capitalize()}{rt.kind}"


def _openapi_paths(rt: ResourceType) -> dict[str, Any]:
    """Enough of a resource's paths for kubectl's fieldValidation check (and a reader)."""
    base = "/" + _gv_path(rt.group, rt.version)
    collection = (
        f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else (f"{base}/{rt.plural}")
    )
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    ok = {"200": {"description": "OK"}}
    params = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    if rt.namespaced:
        params.append(
            {"name": "namespace", "in": "path", "required": True, "schema": {"type": "string"}}
        )
    item = {
        "parameters": params,
        "get": {
            "operationId": _operation_id("read", rt),
            "x-kubernetes-action": "get",
            "x-kubernetes-group-version-kind": gvk,
            "responses": ok,
        },
        "patch": {
            "operationId": _operation_id("patch", rt),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
            "parameters": _PATCH_PARAMS,
            "requestBody": {"content": {t: {"schema": {"type": "object"}} for t in _PATCH_TYPES}},
            "responses": ok,
        },
    }
    return {f"{collection}/{{name}}": item}


@functools.lru_cache(maxsize=256)
def openapi_v3_gv_body(group: str, version: str, git_version: str, crd: bool) -> bytes | None:
    minor = Version.parse(git_version).minor
    if (group, version) not in served_group_versions(minor, crd):
        return None
    paths: dict[str, Any] = {}
    for rt in served_types(minor, crd):
        if (rt.group, rt.version) == (group, version):
            paths.update(_openapi_paths(rt))
    return _dump(
        {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": git_version},
            "paths": paths,
            "components": {"schemas": {}},
        }
    )


@functools.lru_cache(maxsize=64)
def openapi_v3_body(git_version: str, crd: bool) -> bytes:
    """The OpenAPI v3 discovery root; each URL carries a content hash, as the real one does.

    The hash matters: clients cache per-GV documents by URL, and a cluster whose version or
    CRD changes must not be answered from a stale cache.
    """
    minor = Version.parse(git_version).minor
    paths: dict[str, Any] = {}
    for group, version in served_group_versions(minor, crd):
        body = openapi_v3_gv_body(group, version, git_version, crd)
        assert body is not None
        digest = hashlib.sha512(body).hexdigest().upper()
        rel = _gv_path(group, version)
        # Rooted at /openapi/v3 so client-go keeps the /clusters/<id> prefix (kubernetes#117463).
        paths[rel] = {"serverRelativeURL": f"/openapi/v3/{rel}?hash={digest}"}
    return _dump({"paths": paths})
