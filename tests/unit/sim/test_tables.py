"""Server-side Tables (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), pure parts.

Real behaviour pinned here (kubernetes 1.32 source):
- CRDs: apiextensions-apiserver `registry/customresource/tableconvertor` - Name, then one column
  per additionalPrinterColumn; `cellForJSONValue` types the cells, a missing value is null.
- Built-ins: `pkg/printers/internalversion/printers.go` (Lease: Name, Holder, Age;
  Namespace: Name, Status, Age); kinds without a printer get `rest.defaultTableConvertor`
  (Name, Created At as RFC3339).
- Ages: `apimachinery/pkg/util/duration.HumanDuration`.
- Row objects: `endpoints/handlers/response.go` asTable - includeObject Metadata (the default)
  gives PartialObjectMetadata, Object the full object, None nothing, anything else 400.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from convergerd.sim import status, tables
from convergerd.sim.resources import LEASES, NAMESPACES, PODS, POLICIES

NOW = datetime.datetime(2025, 1, 2, 3, 10, 5, tzinfo=datetime.UTC)
CRD_PATH = Path(__file__).resolve().parents[3] / "deploy" / "member-cluster" / "crd-policies.yaml"


def policy(name: str, *, phase: str | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "platform.stackship.se/v1alpha1",
        "kind": "Policy",
        "metadata": {
            "name": name,
            "uid": "u-" + name,
            "resourceVersion": "7",
            "generation": 1,
            "creationTimestamp": "2025-01-02T03:04:05Z",
            "labels": {"team": "a"},
            "managedFields": [{"manager": "m", "operation": "Apply"}],
        },
        "spec": {"policyId": name, "boundary": "team-a", "enabled": True, "revision": 3} | spec,
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def policy_list(*items: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "kind": "PolicyList",
        "apiVersion": "platform.stackship.se/v1alpha1",
        "metadata": {"resourceVersion": "42", **meta},
        "items": list(items),
    }


@pytest.mark.parametrize(
    ("accept", "version"),
    [
        # what kubectl get sends for human-readable output (kubectl/pkg/cmd/get/get.go)
        (
            "application/json;as=Table;v=v1;g=meta.k8s.io,"
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            "v1",
        ),
        ("application/json;as=Table;g=meta.k8s.io;v=v1", "v1"),
        ("application/json; as=Table; v=v1beta1; g=meta.k8s.io", "v1beta1"),
        # an unservable Table version is skipped, the next clause wins
        ("application/json;as=Table;v=v2;g=meta.k8s.io,application/json", None),
        ("application/json", None),
        ("", None),
        ("*/*", None),
        # plain JSON first: the client prefers it
        ("application/json,application/json;as=Table;v=v1;g=meta.k8s.io", None),
    ],
)
def test_table_version_from_accept(accept: str, version: str | None) -> None:
    assert tables.requested_table_version(accept) == version


def test_crd_printer_columns_match_the_deployed_crd() -> None:
    crd = yaml.safe_load(CRD_PATH.read_text())
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == POLICIES.version]
    assert crd["spec"]["group"] == POLICIES.group
    assert crd["spec"]["names"]["plural"] == POLICIES.plural
    expected = [
        {
            "name": c["name"],
            "type": c["type"],
            "jsonPath": c["jsonPath"],
            **({"format": c["format"]} if "format" in c else {}),
            **({"description": c["description"]} if "description" in c else {}),
            **({"priority": c["priority"]} if "priority" in c else {}),
        }
        for c in served["additionalPrinterColumns"]
    ]
    assert [c.as_crd() for c in tables.POLICY_PRINTER_COLUMNS] == expected


def test_policy_list_table_uses_the_crd_columns() -> None:
    listing = policy_list(
        policy("p1", phase="Enforcing"),
        policy("p2", enabled=False, revision=12),
    )
    listing["metadata"] |= {"continue": "tok", "remainingItemCount": 3}
    table = tables.to_table(POLICIES, listing, version="v1", include_object="", now=NOW)
    assert table["kind"] == "Table"
    assert table["apiVersion"] == "meta.k8s.io/v1"
    assert table["metadata"] == {
        "resourceVersion": "42",
        "continue": "tok",
        "remainingItemCount": 3,
    }
    columns = [
        (c["name"], c["type"], c["format"], c["priority"]) for c in table["columnDefinitions"]
    ]
    assert columns == [
        ("Name", "string", "name", 0),
        ("Boundary", "string", "", 0),
        ("Enabled", "boolean", "", 0),
        ("Revision", "integer", "", 0),
        ("Phase", "string", "", 0),
        ("Age", "date", "", 0),
    ]
    boundary = table["columnDefinitions"][1]
    assert boundary["description"] == (
        "Custom resource definition column (in JSONPath format): .spec.boundary"
    )
    assert [r["cells"] for r in table["rows"]] == [
        ["p1", "team-a", True, 3, "Enforcing", "6m"],
        # no status yet: a null cell (kubectl prints <none>)
        ["p2", "team-a", False, 12, None, "6m"],
    ]
    row = table["rows"][0]
    assert row["object"] == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": policy("p1")["metadata"],
    }


def test_single_object_table_and_include_object_modes() -> None:
    obj = policy("p1")
    table = tables.to_table(POLICIES, obj, version="v1beta1", include_object="Object", now=NOW)
    assert table["apiVersion"] == "meta.k8s.io/v1beta1"
    assert table["metadata"] == {"resourceVersion": "7"}
    [row] = table["rows"]
    assert row["object"] == obj
    none = tables.to_table(POLICIES, obj, version="v1", include_object="None", now=NOW)
    assert none["rows"][0]["object"] is None
    meta = tables.to_table(POLICIES, obj, version="v1beta1", include_object="Metadata", now=NOW)
    assert meta["rows"][0]["object"]["apiVersion"] == "meta.k8s.io/v1beta1"
    with pytest.raises(status.ApiError) as err:
        tables.to_table(POLICIES, obj, version="v1", include_object="Everything", now=NOW)
    assert err.value.code == 400
    assert err.value.message == 'unrecognized includeObject value: "Everything"'


@pytest.mark.parametrize(
    ("spec", "cells"),
    [
        # integer columns take JSON numbers, booleans only booleans; others are null
        ({"revision": 2.0}, ["p", "team-a", True, 2, None]),
        ({"revision": "two", "enabled": "yes"}, ["p", "team-a", None, None, None]),
        # a string column prints whatever is there (client-go jsonpath)
        ({"boundary": 5}, ["p", "5", True, 3, None]),
        ({"boundary": True}, ["p", "true", True, 3, None]),
    ],
)
def test_cells_are_typed_like_the_crd_table_convertor(
    spec: dict[str, Any], cells: list[Any]
) -> None:
    table = tables.to_table(POLICIES, policy("p", **spec), version="v1", include_object="", now=NOW)
    assert table["rows"][0]["cells"][:-1] == cells


def test_builtin_printers_and_default_columns() -> None:
    ns = {
        "metadata": {"name": "default", "creationTimestamp": "2024-12-30T03:10:05Z"},
        "status": {"phase": "Active"},
    }
    table = tables.to_table(
        NAMESPACES,
        {
            "kind": "NamespaceList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "9"},
            "items": [ns],
        },
        version="v1",
        include_object="",
        now=NOW,
    )
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Status", "Age"]
    assert table["rows"][0]["cells"] == ["default", "Active", "3d"]

    lease = {
        "metadata": {
            "name": "lock",
            "namespace": "ns",
            "creationTimestamp": "2025-01-02T03:09:05Z",
        },
        "spec": {"holderIdentity": "pod-a"},
    }
    table = tables.to_table(LEASES, lease, version="v1", include_object="", now=NOW)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Holder", "Age"]
    assert table["rows"][0]["cells"] == ["lock", "pod-a", "60s"]
    assert table["rows"][0]["object"]["metadata"]["namespace"] == "ns"
    unheld = tables.to_table(
        LEASES,
        {"metadata": lease["metadata"], "spec": {}},
        version="v1",
        include_object="",
        now=NOW,
    )
    assert unheld["rows"][0]["cells"][1] == ""

    pod = {
        "metadata": {"name": "p", "namespace": "ns", "creationTimestamp": "2025-01-02T03:04:05Z"}
    }
    table = tables.to_table(PODS, pod, version="v1", include_object="", now=NOW)
    assert [(c["name"], c["type"]) for c in table["columnDefinitions"]] == [
        ("Name", "string"),
        ("Created At", "date"),
    ]
    assert table["rows"][0]["cells"] == ["p", "2025-01-02T03:04:05Z"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (125, "2m5s"),
        (9 * 60 + 59, "9m59s"),
        (10 * 60 + 30, "10m"),
        (3 * 3600 - 1, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 60 * 7, "3h7m"),
        (8 * 3600 + 60 * 7, "8h"),
        (47 * 3600, "47h"),
        (2 * 86400, "2d"),
        (2 * 86400 + 5 * 3600, "2d5h"),
        (8 * 86400, "8d"),
        (3 * 365 * 86400, "3y"),
        (3 * 365 * 86400 + 4 * 86400, "3y4d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration(seconds: int, text: str) -> None:
    assert tables.human_duration(seconds) == text
