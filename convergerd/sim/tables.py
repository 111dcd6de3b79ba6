"""Server-side printing: `meta.k8s.io` Tables for clients that ask for them (pure).

`kubectl get` with a human-readable output sends
`Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;
g=meta.k8s.io,application/json` and prints whatever columns the server chooses. Sources
(kubernetes 1.32):
- custom resources: apiextensions-apiserver `registry/customresource/tableconvertor` - Name
  plus one column per additionalPrinterColumn of the served version, cells typed by
  `cellForJSONValue`;
- built-ins: `pkg/printers/internalversion/printers.go` (Lease, Namespace here); kinds without a
  printer get `registry/rest/table.go` defaultTableConvertor (Name, Created At);
- row objects: `endpoints/handlers/response.go` asTable (`includeObject`).

Only requests that ask for a Table reach this module; `requested_table_version` is a substring
test for everyone else.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convergerd.sim import status
from convergerd.sim.resources import LEASES, NAMESPACES, POLICIES, ResourceType

Obj = dict[str, Any]

_TABLE_VERSIONS = frozenset({"v1", "v1beta1"})
_NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
_CREATED_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was "
    "created. It is not guaranteed to be set in happens-before order across separate "
    "operations. Clients may not set this value. It is represented in RFC3339 form and is in "
    "UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
_HOLDER_DESCRIPTION = (
    "holderIdentity contains the identity of the holder of a current lease. If Coordinated "
    "Leader Election is used, the holder identity must be equal to the elected "
    "LeaseCandidate.metadata.name field."
)


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry of a CRD version."""

    name: str
    type: str
    json_path: str
    format: str = ""
    description: str = ""
    priority: int = 0

    def as_crd(self) -> dict[str, Any]:
        """The entry as the CRD spells it (defaults left out)."""
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.format:
            out["format"] = self.format
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


# A copy of deploy/member-cluster/crd-policies.yaml (v1alpha1); a unit test keeps them equal.
POLICY_PRINTER_COLUMNS: tuple[PrinterColumn, ...] = (
    PrinterColumn("Boundary", "string", ".spec.boundary"),
    PrinterColumn("Enabled", "boolean", ".spec.enabled"),
    PrinterColumn("Revision", "integer", ".spec.revision"),
    PrinterColumn("Phase", "string", ".status.phase"),
    PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
)


def requested_table_version(accept: str) -> str | None:
    """ "v1"/"v1beta1" when the Accept header's first servable clause is a meta.k8s.io Table,
    None for plain JSON (content negotiation walks the clauses in the client's order)."""
    if "as=Table" not in accept:
        return None
    for clause in accept.split(","):
        media, *raw_params = (p.strip() for p in clause.split(";"))
        params = dict(p.partition("=")[::2] for p in raw_params)
        as_kind = params.get("as")
        if as_kind is None:
            if media in ("application/json", "application/*", "*/*"):
                return None
            continue
        if (
            as_kind == "Table"
            and media == "application/json"
            and params.get("g") == "meta.k8s.io"
            and params.get("v") in _TABLE_VERSIONS
        ):
            return params["v"]
    return None


def check_include_object(include_object: str) -> None:
    """asTable's 400 for an includeObject it does not know."""
    if include_object not in ("", "Metadata", "Object", "None"):
        raise status.bad_request(f"unrecognized includeObject value: {json.dumps(include_object)}")


def to_table(
    rt: ResourceType,
    result: Mapping[str, Any],
    *,
    version: str,
    include_object: str,
    now: datetime.datetime,
) -> Obj:
    """The Table for a get (one object) or list (a List object) result."""
    check_include_object(include_object)
    is_list = "items" in result and rt.list_kind == result.get("kind", rt.list_kind)
    items: list[Mapping[str, Any]] = list(result["items"]) if is_list else [result]
    columns, cells_of = _convertor(rt, now)
    meta: Obj = {}
    src_meta = result.get("metadata") or {}
    for key in ("resourceVersion", "continue", "remainingItemCount"):
        if src_meta.get(key) not in (None, ""):
            meta[key] = src_meta[key]
    rows = [
        {"cells": cells_of(item), "object": _row_object(rt, item, version, include_object)}
        for item in items
    ]
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    }


def _row_object(
    rt: ResourceType, item: Mapping[str, Any], version: str, include_object: str
) -> Obj | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        # ConvertToVersion: the versioned object, kind and apiVersion set
        return {"apiVersion": rt.api_version, "kind": rt.kind} | dict(item)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": item.get("metadata") or {},
    }


def _column(name: str, type_: str, description: str, fmt: str = "", priority: int = 0) -> Obj:
    return {
        "name": name,
        "type": type_,
        "format": fmt,
        "description": description,
        "priority": priority,
    }


_NAME_COLUMN = _column("Name", "string", _NAME_DESCRIPTION, "name")
_AGE_COLUMN = _column("Age", "string", _CREATED_DESCRIPTION)

Cells = Callable[[Mapping[str, Any]], list[Any]]


def _convertor(rt: ResourceType, now: datetime.datetime) -> tuple[list[Obj], Cells]:
    def name(obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("name", ""))

    def age(obj: Mapping[str, Any]) -> str:
        created = (obj.get("metadata") or {}).get("creationTimestamp")
        return _age(created, now) if created else "<unknown>"

    if rt is POLICIES:
        cols = [_NAME_COLUMN] + [
            _column(
                c.name,
                c.type,
                c.description
                or f"Custom resource definition column (in JSONPath format): {c.json_path}",
                c.format,
                c.priority,
            )
            for c in POLICY_PRINTER_COLUMNS
        ]
        return cols, lambda o: [name(o)] + [_crd_cell(c, o, now) for c in POLICY_PRINTER_COLUMNS]
    if rt is LEASES:
        cols = [_NAME_COLUMN, _column("Holder", "string", _HOLDER_DESCRIPTION), _AGE_COLUMN]
        return cols, lambda o: [
            name(o),
            str((o.get("spec") or {}).get("holderIdentity") or ""),
            age(o),
        ]
    if rt is NAMESPACES:
        cols = [
            _NAME_COLUMN,
            _column("Status", "string", "The status of the namespace"),
            _AGE_COLUMN,
        ]
        return cols, lambda o: [name(o), str((o.get("status") or {}).get("phase", "")), age(o)]
    # defaultTableConvertor; the real server has printers for pods and the admission policy
    # kinds too (not reproduced here)
    cols = [_NAME_COLUMN, _column("Created At", "date", _CREATED_DESCRIPTION)]
    return cols, lambda o: [name(o), (o.get("metadata") or {}).get("creationTimestamp", "")]


_MISSING = object()


def _lookup(obj: Mapping[str, Any], json_path: str) -> Any:
    """A simple JSONPath (`.a.b`), as CRD printer columns use them; _MISSING when absent."""
    node: Any = obj
    for part in json_path.strip(".").split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# cellForJSONValue by column type: (accepts the JSON value?, cell for it)
_CELL_TYPES: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any]]] = {
    "integer": (_number, int),
    "number": (_number, float),
    "boolean": (lambda v: isinstance(v, bool), lambda v: v),
}


def _crd_cell(column: PrinterColumn, obj: Mapping[str, Any], now: datetime.datetime) -> Any:
    """tableconvertor.ConvertToTable + cellForJSONValue; None (null) when nothing fits."""
    value = _lookup(obj, column.json_path)
    cell: Any = None
    if value is _MISSING or value is None:
        pass
    elif column.type == "string":
        # client-go jsonpath prints any value; a string as itself
        cell = value if isinstance(value, str) else json.dumps(value)
    elif column.type == "date":
        cell = _age(value, now) if isinstance(value, str) else None
    elif column.type in _CELL_TYPES:
        accepts, convert = _CELL_TYPES[column.type]
        cell = convert(value) if accepts(value) else None
    return cell


def _age(timestamp: str, now: datetime.datetime) -> str:
    try:
        created = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    if created.tzinfo is None:
        return "<invalid>"
    return human_duration((now - created).total_seconds())


def human_duration(seconds: float) -> str:
    """apimachinery `duration.HumanDuration`: about two significant figures."""
    whole = int(seconds)  # Go truncates toward zero
    minutes, hours = whole // 60, whole // 3600
    days, years = hours // 24, hours // 24 // 365
    if whole < -1:
        text = "<invalid>"
    elif whole < 0:
        text = "0s"
    elif whole < 120:
        text = f"{whole}s"
    elif minutes < 10:
        text = _pair(minutes, "m", whole % 60, "s")
    elif minutes < 180:
        text = f"{minutes}m"
    elif hours < 8:
        text = _pair(hours, "h", minutes % 60, "m")
    elif hours < 48:
        text = f"{hours}h"
    elif hours < 24 * 8:
        text = _pair(days, "d", hours % 24, "h")
    elif hours < 24 * 365 * 2:
        text = f"{days}d"
    elif hours < 24 * 365 * 8:
        text = _pair(years, "y", days % 365, "d")
    else:
        text = f"{years}y"
    return text


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    """ "3h" or "3h7m": the smaller unit only when it is not zero."""
    return f"{big}{big_unit}" if small == 0 else f"{big}{big_unit}{small}{small_unit}"
