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

**Bounded per object.** An image longer than `IMAGE_MAX_CHARS` (longer than any valid image
reference) is not kept, nor are the labels and images past `OBJECT_MAX_BYTES` per object
(each charged `LABEL_BYTES` or `IMAGE_BYTES` plus its characters; 1,400 containers of
600-character images are 840,000 characters): what was left out is said in `cut` (`labels`
or `images`), and the audit never lets a cut part pass unseen: an object whose kept parts
already break the rule is a violation with admission's message, any other object with a cut
part is a violation `cannot be judged: ...` (the part left out may break it). A label value
that is not a string is kept as None (no rule reads label values). Only what is kept is
interned (the intern table grows with every string interned and never shrinks).

`cost(obj)` is what the cache charges for a slim object against its total budget: an upper
bound of the bytes Python holds for it (`OBJECT_BYTES` for its dicts, tuple and key;
`LABEL_BYTES`, `IMAGE_BYTES` and the characters of each label and image kept, as if no string
were shared with another object; `PART_BYTES` and the characters of each `cut` or `invalid`
message), tested against tracemalloc on ordinary pods and on objects of unique labels and
images (where interning saves nothing). Ordinary pods share their label and image strings,
so they are charged about twice what they hold. `refused(kind, obj)`
is the stub kept for an object the cache had no room for (`REFUSED_BYTES` each), so the
audit counts it as not judged and a deletion or a smaller version is still seen.

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

from convergerd.admission.render import RESOURCE_RULES
from convergerd.core.shown import shown
from convergerd.kube.api import KubeObject, Resource

# Bytes per cached object (the slim dict, its key and its share of the cache's table), for a
# pod with up to 4 labels and 2 containers, with room over what it measured (bench/RESULTS.md,
# "Figures once quoted in the code"): tests/unit/test_operator_workloads.py holds it for 10,000
# pods.
SLIM_BYTES_BUDGET = 1024
# No valid image reference is longer (a repository name of at most 255, a tag of at most 128
# and a digest); a longer one is not kept (see the module doc).
IMAGE_MAX_CHARS = 512
# Labels and images kept per object, each charged as `cost` charges it: dozens of labels and
# images (an ordinary pod has a few of each).
OBJECT_MAX_BYTES = 16 * 1024
# The accounting's estimate (`cost`): an upper bound, tested against tracemalloc.
# Measured on Python 3.11 (tests/unit/test_operator_workloads.py holds them): a slim object
# with no label or image holds ~640 bytes; a unique label up to ~300 plus its characters (two
# strings, their share of the intern table just after it doubled, a dict entry), a unique
# image up to ~140 plus its characters.
OBJECT_BYTES = 768
LABEL_BYTES = 320
IMAGE_BYTES = 160
PART_BYTES = 384  # a `cut` or `invalid` map; each message in it IMAGE_BYTES + characters
REFUSED_BYTES = 640  # a stub: two small dicts and its name

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
        found.append(image)
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


def _kept_labels(labels: Mapping[Any, Any], room: int) -> tuple[dict[str, Any], int]:
    """The labels that fit in `room` characters, and the room left."""
    kept: dict[str, Any] = {}
    for key, value in labels.items():
        name = str(key)
        size = LABEL_BYTES + len(name) + (len(value) if isinstance(value, str) else 0)
        if size > room:
            break
        room -= size
        kept[sys.intern(name)] = sys.intern(value) if isinstance(value, str) else None
    return kept, room


def _kept_images(found: tuple[str, ...], room: int) -> tuple[tuple[str, ...], str | None]:
    """The images that fit (each within IMAGE_MAX_CHARS, all within `room` characters), and
    what was left out, said."""
    kept: list[str] = []
    too_long = beyond = 0
    first: str | None = None
    for image in found:
        if len(image) > IMAGE_MAX_CHARS:
            too_long += 1
        elif IMAGE_BYTES + len(image) > room:
            beyond += 1
        else:
            room -= IMAGE_BYTES + len(image)
            kept.append(sys.intern(image))  # only what is kept: the intern table never shrinks
            continue
        first = first or image
    if first is None:
        return tuple(kept), None
    parts = []
    if too_long:
        parts.append(f"{too_long} image(s) longer than {IMAGE_MAX_CHARS} characters (no valid "
                     "image reference is)")
    if beyond:
        parts.append(f"{beyond} image(s) past the {OBJECT_MAX_BYTES} bytes of labels and images "
                     "kept per object")
    return tuple(kept), (f"{' and '.join(parts)} not kept, the first {shown(first, 80)}; "
                         f"{len(kept)} of {len(found)} kept")


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
    cut: dict[str, str] = {}
    room = OBJECT_MAX_BYTES
    labels = meta.get("labels")
    if isinstance(labels, Mapping):
        kept_meta["labels"], room = _kept_labels(labels, room)
        if len(kept_meta["labels"]) < len(labels):
            cut["labels"] = (f"{len(kept_meta['labels'])} of {len(labels)} labels kept (the "
                             f"cache keeps {OBJECT_MAX_BYTES} bytes of labels and images per "
                             "object)")
    elif "labels" in meta:
        invalid["labels"] = "metadata.labels is not a map"
    try:
        out["images"], left_out = _kept_images(images(kind, obj), room)
    except ValueError as exc:
        invalid["images"] = str(exc)
    else:
        if left_out is not None:
            cut["images"] = left_out
    if invalid:
        out["invalid"] = invalid
    if cut:
        out["cut"] = cut
    return out


def _chars(value: Any) -> int:
    return len(value) if isinstance(value, str) else 0


def cost(obj: Mapping[str, Any]) -> int:
    """Bytes charged for a slim (or refused) object: see the module doc."""
    if obj.get("refused"):
        return REFUSED_BYTES + sum(map(_chars, obj["metadata"].values()))
    meta = obj["metadata"]
    total = OBJECT_BYTES + _chars(meta["name"]) + _chars(meta.get("namespace")) + _chars(
        meta.get("resourceVersion"))
    for key, value in (meta.get("labels") or {}).items():
        total += LABEL_BYTES + _chars(key) + _chars(value)
    for image in obj.get("images") or ():
        total += IMAGE_BYTES + _chars(image)
    for part in ("invalid", "cut"):
        messages = obj.get(part) or {}
        total += PART_BYTES if messages else 0
        for message in messages.values():
            total += IMAGE_BYTES + _chars(message)
    return total


def refused(kind: str, obj: Mapping[str, Any]) -> KubeObject:
    """The stub kept for the slim `obj` when the cache has no room for it."""
    meta = obj["metadata"]
    return {"kind": sys.intern(kind), "refused": True,
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")}}


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
