"""What the workload cache keeps of each object the rules judge (pure).

`WORKLOAD_KINDS` is derived from `admission.RESOURCE_RULES` (subresources left out: an
ephemeral container is part of the Pod it was added to), so the cache and admission judge the
same kinds.

`slim` keeps what a rule reads and nothing else: the kind, name, namespace and resourceVersion
(to tell changes apart), `metadata.labels` (RequiredLabels) and the images of the pod spec
(AllowedRegistries, ForbidLatestTag), read from the same place as the rendered CEL reads them
(the Pod's `spec`, a CronJob's `spec.jobTemplate.spec.template.spec`, any other kind's
`spec.template.spec`; containers, initContainers, ephemeralContainers; entries without an
image skipped). Everything else (managedFields, annotations, status, the rest of the spec) is
dropped before the object is stored. Repeated strings (namespaces, label keys and values,
images) are interned: ten thousand pods of one Deployment share them.

A part that the CEL could not evaluate (a Real apiserver never stores one: labels that are not
a map, a container list that is not a list, an image that is not a string) is kept as the
error the audit reports, in `invalid` (`labels` or `images`), so the audit never guesses.
The budget `SLIM_BYTES_BUDGET` holds for a pod of a few labels and containers (a test holds
it for 10,000 pods).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from convergerd.kube.api import KubeObject, Resource
from convergerd.operator.admission import RESOURCE_RULES

# Bytes per cached object (the slim dict, its key and its share of the cache's table), for a
# pod with up to 4 labels and 2 containers, with room over what it measured (bench/RESULTS.md,
# "Figures once quoted in the code"): tests/unit/test_operator_workloads.py holds it for 10,000
# pods.
SLIM_BYTES_BUDGET = 1024

_KINDS = {
    "pods": "Pod", "deployments": "Deployment", "replicasets": "ReplicaSet",
    "statefulsets": "StatefulSet", "daemonsets": "DaemonSet", "jobs": "Job",
    "cronjobs": "CronJob",
}


def _kinds() -> tuple[tuple[Resource, str], ...]:
    out = []
    for group, version, plurals in RESOURCE_RULES:
        for plural in plurals:
            if "/" in plural:
                continue  # a subresource: judged as part of its object
            out.append((Resource(group, version, plural, namespaced=True), _KINDS[plural]))
    return tuple(out)


# (resource, kind) of every kind admission judges.
WORKLOAD_KINDS: tuple[tuple[Resource, str], ...] = _kinds()
_CONTAINER_FIELDS = ("containers", "initContainers", "ephemeralContainers")


class _Unreadable(Exception):
    pass


def _intern(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def _field(obj: Any, key: str, what: str) -> Any:
    """`obj.key` as CEL's has()/select see it: None when absent; an error when `obj` is not a
    map."""
    if not isinstance(obj, Mapping):
        raise _Unreadable(f"{what} is not an object")
    return obj.get(key) if key in obj else None


def _pod_spec(kind: str, obj: Mapping[str, Any]) -> Any:
    """The pod spec as the rendered CEL's `podSpec` variable picks it ({} when absent)."""
    if kind == "Pod":
        path: tuple[str, ...] = ("spec",)
    elif kind == "CronJob":
        path = ("spec", "jobTemplate", "spec", "template", "spec")
    else:
        path = ("spec", "template", "spec")
    current: Any = obj
    where = "object"
    for key in path:
        if not isinstance(current, Mapping) or key not in current:
            if not isinstance(current, Mapping):
                raise _Unreadable(f"{where} is not an object")
            return {}
        current = current[key]
        where += "." + key
    return current


def _container_images(containers: Any, field: str) -> list[str]:
    if not isinstance(containers, list):
        raise _Unreadable(f"the pod spec's {field} is not a list")
    found = []
    for container in containers:
        if not isinstance(container, Mapping):
            raise _Unreadable(f"an entry of the pod spec's {field} is not an object")
        if "image" not in container:
            continue
        image = container["image"]
        if not isinstance(image, str):
            raise _Unreadable(f"an image in the pod spec's {field} is not a string")
        found.append(sys.intern(image))
    return found


def images(kind: str, obj: Mapping[str, Any]) -> tuple[str, ...]:
    """Every image of the object's pod spec, in the rendered CEL's order (containers,
    initContainers, ephemeralContainers). `ValueError` where the CEL would fail."""
    try:
        spec = _pod_spec(kind, obj)
        found: list[str] = []
        for field in _CONTAINER_FIELDS:
            containers = _field(spec, field, "the pod spec")
            if containers is not None:
                found.extend(_container_images(containers, field))
        return tuple(found)
    except _Unreadable as exc:
        raise ValueError(str(exc)) from None


def slim(kind: str, obj: KubeObject) -> KubeObject | None:
    """What the cache keeps of `obj` (see the module doc); None without a name."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    kept_meta: dict[str, Any] = {
        "name": meta["name"],
        "namespace": _intern(meta.get("namespace")),
        "resourceVersion": meta.get("resourceVersion"),
    }
    out: KubeObject = {"kind": sys.intern(kind), "metadata": kept_meta}
    invalid: dict[str, str] = {}
    labels = meta.get("labels")
    if isinstance(labels, Mapping):
        kept_meta["labels"] = {sys.intern(str(k)): _intern(v) for k, v in labels.items()}
    elif "labels" in meta:
        invalid["labels"] = "metadata.labels is not a map"
    try:
        out["images"] = images(kind, obj)
    except ValueError as exc:
        invalid["images"] = str(exc)
    if invalid:
        out["invalid"] = invalid
    return out


def slim_namespace(obj: KubeObject, label: str) -> KubeObject | None:
    """What the cache keeps of a Namespace: its name, resourceVersion and the one label."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    labels = meta.get("labels")
    value = labels.get(label) if isinstance(labels, Mapping) else None
    kept: dict[str, Any] = {"name": sys.intern(meta["name"]),
                            "resourceVersion": meta.get("resourceVersion")}
    if isinstance(value, str):
        kept["labels"] = {label: sys.intern(value)}
    return {"metadata": kept}
