"""Server-side apply: field sets (FieldsV1), managedFields bookkeeping, merge and conflicts.

A simplified structured-merge-diff without schemas: maps are granular (each key its own
field), lists and scalars are atomic. That is exactly what an apiserver does for a CRD whose
schema declares no list types, and it covers what convergerd and its operator write (Policy,
ValidatingAdmissionPolicy(Binding), Lease, Namespace labels). Keyed lists such as a pod's
`spec.containers` are treated as atomic here (a deliberate simplification).

Fields are handled as sets of paths; a path is a tuple of FieldsV1 keys ("f:spec", ...), and
a set holds the leaves a manager owns. The algorithm follows sigs.k8s.io/structured-merge-diff
`merge.Updater.{Apply,Update}` and apiserver's `managedFieldsUpdater`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from convergerd.sim import status

Path = tuple[str, ...]

# Never recorded in field sets (managedfields/internal/stripmeta.go).
_IGNORED_METADATA = frozenset(
    {
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    }
)
_IGNORED_TOP = frozenset({"apiVersion", "kind"})
APPLY = "Apply"
UPDATE = "Update"


# --- flattening objects into leaf paths -------------------------------------------------------


def flatten(obj: Mapping[str, Any]) -> dict[Path, Any]:
    """Leaf path -> value for every field SSA tracks in `obj`.

    A leaf is a scalar, a list (atomic) or an empty map. Ignored metadata is skipped.
    """
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        if key in _IGNORED_TOP:
            continue
        if key == "metadata" and isinstance(value, dict):
            meta = {k: v for k, v in value.items() if k not in _IGNORED_METADATA}
            if meta:
                _flatten_into(out, ("f:metadata",), meta)
            continue
        if isinstance(value, dict) and value:
            _flatten_into(out, ("f:" + key,), value)
        else:
            out[("f:" + key,)] = value
    return out


def _flatten_into(out: dict[Path, Any], prefix: Path, mapping: Mapping[str, Any]) -> None:
    # Objects here are decoded JSON: a map is always a dict (an ABC check costs several times
    # as much, and this runs for every field of every write).
    for key, value in mapping.items():
        path = (*prefix, "f:" + key)
        if isinstance(value, dict) and value:
            _flatten_into(out, path, value)
        else:
            out[path] = value


def json_equal(a: Any, b: Any) -> bool:
    """Equality on JSON data where true != 1 (Python says True == 1).

    Python's C-level == and repr do nearly all the work; the recursive walk only runs when
    equal values print differently (key order, or a bool against a number).
    """
    if a is b:
        return True
    if a != b:
        return False
    return repr(a) == repr(b) or _strict_equal(a, b)


def _strict_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_strict_equal(v, b[k]) for k, v in a.items())
        )
    if isinstance(a, list):
        return (
            isinstance(b, list)
            and len(a) == len(b)
            and all(_strict_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


@dataclass(frozen=True, slots=True)
class Comparison:
    added: frozenset[Path]
    removed: frozenset[Path]
    modified: frozenset[Path]

    @property
    def changed(self) -> frozenset[Path]:
        """Paths whose new value someone now owns: modified or added."""
        return self.added | self.modified


def compare(old: Mapping[Path, Any], new: Mapping[Path, Any]) -> Comparison:
    old_keys, new_keys = old.keys(), new.keys()
    modified = frozenset(p for p in old_keys & new_keys if not json_equal(old[p], new[p]))
    return Comparison(frozenset(new_keys - old_keys), frozenset(old_keys - new_keys), modified)


# --- FieldsV1 encoding --------------------------------------------------------------------------


def fields_to_set(tree: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """FieldsV1 -> paths. `{}` is a leaf; "." marks ownership of the enclosing node."""
    out: set[Path] = set()
    for key, child in tree.items():
        if key == ".":
            out.add(prefix)
        elif isinstance(child, dict) and child:
            out |= fields_to_set(child, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def set_to_fields(paths: Iterable[Path]) -> dict[str, Any]:
    """Paths -> FieldsV1, keys sorted with "." first like structured-merge-diff writes them.

    Built in one pass over the sorted paths: a node's own path sorts before its children's,
    and siblings in key order, so every map is filled in the order it is written."""
    root: dict[str, Any] = {}
    leaves: set[Path] = set(paths)
    for path in sorted(leaves):
        node = root
        for depth, element in enumerate(path):
            if not node and path[:depth] in leaves:
                node["."] = {}  # a leaf that also has children: ownership of the node itself
            child = node.get(element)
            if child is None:
                child = node[element] = {}
            node = child
    return root


def render_path(path: Path) -> str:
    """structured-merge-diff notation: .spec.x, [name="c"], [=v], [0]."""
    parts: list[str] = []
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            parts.append("." + rest)
        elif kind == "k":
            keys = json.loads(rest)
            parts.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]")
        elif kind == "v":
            parts.append(f"[={rest}]")
        elif kind == "i":
            parts.append(f"[{rest}]")
    return "".join(parts)


# --- managedFields entries ----------------------------------------------------------------------


@dataclass(slots=True)
class ManagedEntry:
    manager: str
    operation: str
    api_version: str
    time: str
    fields: frozenset[Path]
    subresource: str = ""
    raw_fields: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def identity(self) -> tuple[str, str, str, str]:
        # BuildManagerIdentifier: apiVersion is part of the identity only for Update
        version = self.api_version if self.operation == UPDATE else ""
        return (self.manager, self.operation, version, self.subresource)

    def identity_json(self) -> str:
        """The encoded identifier; conflict groups are sorted by it."""
        data: dict[str, Any] = {"manager": self.manager, "operation": self.operation}
        if self.operation == UPDATE:
            data["apiVersion"] = self.api_version
        if self.subresource:
            data["subresource"] = self.subresource
        return json.dumps(data, separators=(",", ":"))

    def render(self) -> str:
        """printManager in managedfields/internal/conflict.go (identities carry no time)."""
        text = json.dumps(self.manager)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == UPDATE:
            text += f" using {self.api_version}"
        return text

    def to_json(self) -> dict[str, Any]:
        fields_v1 = self.raw_fields if self.raw_fields is not None else set_to_fields(self.fields)
        entry: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1,
        }
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


def decode_managed(obj: Mapping[str, Any]) -> list[ManagedEntry]:
    entries: list[ManagedEntry] = []
    for raw in obj.get("metadata", {}).get("managedFields") or ():
        tree = raw.get("fieldsV1") or {}
        entries.append(
            ManagedEntry(
                manager=raw.get("manager", ""),
                operation=raw.get("operation", UPDATE),
                api_version=raw.get("apiVersion", ""),
                time=raw.get("time", ""),
                fields=frozenset(fields_to_set(tree)),
                subresource=raw.get("subresource", ""),
                raw_fields=tree,
            )
        )
    return entries


def encode_managed(entries: Iterable[ManagedEntry]) -> list[dict[str, Any]]:
    """Serialized and sorted like sortEncodedManagedFields: operation, time, manager, ..."""
    ordered = sorted(
        (e for e in entries if e.fields),
        key=lambda e: (e.operation, e.time, e.manager, e.api_version, e.subresource),
    )
    return [e.to_json() for e in ordered]


def _with_fields(entry: ManagedEntry, fields: frozenset[Path]) -> ManagedEntry:
    if fields == entry.fields:
        return entry
    return ManagedEntry(
        entry.manager, entry.operation, entry.api_version, entry.time, fields, entry.subresource
    )


# --- object surgery -------------------------------------------------------------------------


def merge_applied(live: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The applied configuration laid over the live object: maps merge, the rest replaces."""
    out = dict(live)
    for key, value in config.items():
        current = out.get(key)
        if isinstance(value, dict) and isinstance(current, dict) and value:
            out[key] = merge_applied(current, value)
        else:
            out[key] = value
    return out


def remove_paths(obj: dict[str, Any], paths: Iterable[Path]) -> dict[str, Any]:
    """A copy of `obj` without `paths`; maps emptied by the removal go too."""
    for path in paths:
        obj = _remove_path(obj, path)
    return obj


def _remove_path(node: dict[str, Any], path: Path) -> dict[str, Any]:
    key = path[0][2:]
    if not path[0].startswith("f:") or key not in node:
        return node  # keyed/set elements never occur: lists are atomic here
    out = dict(node)
    if len(path) == 1:
        del out[key]
        return out
    child = out[key]
    if not isinstance(child, dict):
        return node
    new_child = _remove_path(child, path[1:])
    if new_child:
        out[key] = new_child
    else:
        del out[key]
    return out


# --- the two operations ---------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """What an apply or update did: the new object (managedFields included) and whether the
    object content (not counting managedFields) changed."""

    obj: dict[str, Any]
    content_changed: bool


def _set_managed(obj: dict[str, Any], entries: Iterable[ManagedEntry]) -> dict[str, Any]:
    meta = dict(obj.get("metadata") or {})
    encoded = encode_managed(entries)
    if encoded:
        meta["managedFields"] = encoded
    else:
        meta.pop("managedFields", None)
    out = dict(obj)
    out["metadata"] = meta
    return out


def apply(
    live: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    manager: str,
    api_version: str,
    subresource: str,
    force: bool,
    now: str,
) -> Outcome:
    """Apply `config` for `manager` over `live` (use {} for create-on-apply).

    Raises the 409 apply conflict when a field another manager owns would change and `force`
    is not set. `config` must already be cut to the endpoint's scope (no status on the main
    endpoint of a type with a status subresource, only status on /status).
    """
    entries = decode_managed(live)
    me = next(
        (e for e in entries if e.identity == (manager, APPLY, "", subresource)),
        None,
    )
    last_set = me.fields if me else frozenset()
    new_set = frozenset(flatten(config))
    others = [e for e in entries if e is not me]

    merged = merge_applied(live, config)
    owned_by_others = frozenset().union(*(e.fields for e in others))
    merged = remove_paths(merged, (last_set - new_set) - owned_by_others)

    live_flat = flatten(live)
    diff = compare(live_flat, flatten(merged))
    others = _settle_others(others, diff, force=force)

    content_changed = bool(diff.added or diff.removed or diff.modified)
    time = now if content_changed or me is None else me.time
    mine = ManagedEntry(manager, APPLY, api_version, time, new_set, subresource)
    return Outcome(_set_managed(merged, [*others, mine]), content_changed)


def _settle_others(
    others: list[ManagedEntry], diff: Comparison, *, force: bool
) -> list[ManagedEntry]:
    """Conflicts with, and ownership taken from, every other manager (Updater.update)."""
    changed = diff.changed
    conflicts: list[tuple[ManagedEntry, Path]] = [
        (e, p) for e in others for p in (e.fields & changed)
    ]
    if conflicts and not force:
        conflicts.sort(key=lambda c: (c[0].identity_json(), render_path(c[1])))
        raise status.apply_conflict([(e.render(), render_path(p)) for e, p in conflicts])
    return [_with_fields(e, e.fields - changed - diff.removed) for e in others]


def update(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    *,
    manager: str,
    api_version: str,
    subresource: str,
    now: str,
) -> Outcome:
    """Record a non-apply write (POST, PUT, merge/JSON patch): never conflicts, takes ownership
    of every field it changed (managedFieldsUpdater.Update)."""
    old = old or {}
    entries = decode_managed(old)
    diff = compare(flatten(old), flatten(new))
    identity = (manager, UPDATE, api_version, subresource)
    me = next((e for e in entries if e.identity == identity), None)
    others = _settle_others([e for e in entries if e is not me], diff, force=True)
    taken = diff.changed
    kept = (me.fields - diff.removed) if me else frozenset()
    result = others
    if taken or kept:
        time = now if taken or me is None else me.time
        result = [
            *others,
            ManagedEntry(manager, UPDATE, api_version, time, kept | taken, subresource),
        ]
    content_changed = bool(diff.added or diff.removed or diff.modified)
    return Outcome(_set_managed(dict(new), result), content_changed)
