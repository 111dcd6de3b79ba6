"""ClusterStore: the registry/storage behaviour a real kube-apiserver shows (kube-apiserver)."""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import pytest

from convergerd.sim.resources import (
    LEASES,
    NAMESPACES,
    PODS,
    POLICIES,
    VALIDATING_ADMISSION_POLICIES,
)
from convergerd.sim.status import ApiError
from convergerd.sim.store import AdmissionRequest, ClusterStore

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
JSONPATCH = "application/json-patch+json"
SMP = "application/strategic-merge-patch+json"
T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
CR_API = "platform.stackship.se/v1alpha1"


@pytest.fixture
def store() -> ClusterStore:
    return ClusterStore(now=lambda: T0)


def policy(name: str = "p1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": CR_API, "kind": "Policy", "metadata": {"name": name}, "spec": spec}


def apply_body(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def apply(
    store: ClusterStore, obj: dict[str, Any], manager: str = "convergerd", **kw: Any
) -> tuple[dict[str, Any], bool]:
    name = obj["metadata"]["name"]
    ns = obj["metadata"].get("namespace")
    rt = kw.pop("rt", POLICIES)
    return store.patch(
        rt,
        ns,
        name,
        apply_body(obj),
        content_type=APPLY,
        manager=manager,
        force=kw.pop("force", None),
        **kw,
    )


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


# --- create & metadata ---------------------------------------------------------------------


def test_create_fills_system_metadata(store: ClusterStore) -> None:
    before = store.resource_version
    obj = store.create(POLICIES, None, policy(enabled=True), manager="kubectl-create")
    meta = obj["metadata"]
    assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}", meta["uid"]
    )
    assert meta["creationTimestamp"] == "2025-01-02T03:04:05Z"
    assert meta["resourceVersion"] == str(before + 1)
    assert meta["generation"] == 1
    assert meta["managedFields"] == [
        {
            "manager": "kubectl-create",
            "operation": "Update",
            "apiVersion": CR_API,
            "time": "2025-01-02T03:04:05Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:enabled": {}}},
        }
    ]
    assert store.get(POLICIES, None, "p1") == obj


def test_lease_has_no_generation(store: ClusterStore) -> None:
    lease = store.create(LEASES, "default", {"metadata": {"name": "lock"}, "spec": {}}, manager="m")
    assert "generation" not in lease["metadata"]
    assert lease["metadata"]["namespace"] == "default"
    assert (lease["apiVersion"], lease["kind"]) == ("coordination.k8s.io/v1", "Lease")


def test_body_system_fields_are_ignored_on_create(store: ClusterStore) -> None:
    body = policy()
    body["metadata"] |= {"uid": "x", "resourceVersion": "999", "generation": 7}
    body["status"] = {"ready": True}
    obj = store.create(POLICIES, None, body, manager="m")
    assert obj["metadata"]["uid"] != "x"
    assert obj["metadata"]["generation"] == 1
    assert "status" not in obj  # status subresource: reset on create


def test_create_twice_is_already_exists(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(), manager="m")
    with pytest.raises(ApiError) as info:
        store.create(POLICIES, None, policy(), manager="m")
    assert info.value.code == 409
    assert info.value.status["message"] == 'policies.platform.stackship.se "p1" already exists'
    assert info.value.status["details"] == {
        "name": "p1",
        "group": "platform.stackship.se",
        "kind": "policies",
    }


def test_invalid_name_is_422(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.create(LEASES, "default", {"metadata": {"name": "Bad_Name"}}, manager="m")
    err = info.value
    assert err.code == 422
    assert err.message.startswith(
        'Lease.coordination.k8s.io "Bad_Name" is invalid: metadata.name: Invalid value: '
        '"Bad_Name": a lowercase RFC 1123 subdomain must consist of'
    )
    assert err.status["details"]["kind"] == "Lease"
    assert err.status["details"]["causes"][0]["field"] == "metadata.name"


def test_generate_name(store: ClusterStore) -> None:
    obj = store.create(PODS, "default", {"metadata": {"generateName": "web-"}}, manager="m")
    assert re.fullmatch(r"web-[a-z0-9]{5}", obj["metadata"]["name"])


def test_create_in_missing_namespace_is_404_namespace(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.create(PODS, "nope", {"metadata": {"name": "p"}}, manager="m")
    assert info.value.code == 404
    assert info.value.status["message"] == 'namespaces "nope" not found'
    assert info.value.status["details"] == {"name": "nope", "kind": "namespaces"}


def test_default_namespaces_exist_with_name_label(store: ClusterStore) -> None:
    names = [i["metadata"]["name"] for i in store.list(NAMESPACES, None)["items"]]
    assert names == ["default", "kube-node-lease", "kube-public", "kube-system"]
    ns = store.create(NAMESPACES, None, {"metadata": {"name": "team-a"}}, manager="m")
    assert ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team-a"}
    assert ns["status"] == {"phase": "Active"}


def test_get_returns_a_copy(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(x=1), manager="m")
    got = store.get(POLICIES, None, "p1")
    got["spec"]["x"] = 2
    got["metadata"]["labels"] = {"evil": "yes"}
    assert store.get(POLICIES, None, "p1")["spec"] == {"x": 1}


def test_get_missing_is_not_found(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.get(LEASES, "default", "lock")
    assert info.value.message == 'leases.coordination.k8s.io "lock" not found'


def test_vap_not_served_before_1_30() -> None:
    old = ClusterStore(served_minor=lambda: 29)
    with pytest.raises(ApiError) as info:
        old.list(VALIDATING_ADMISSION_POLICIES, None)
    assert info.value.code == 404
    assert info.value.message == "the server could not find the requested resource"


# --- PUT -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rt", "ns", "prefix"),
    [
        (POLICIES, None, 'policies.platform.stackship.se "x" is invalid'),
        (LEASES, "default", 'leases.coordination.k8s.io "x" is invalid'),
    ],
)
def test_put_without_rv_is_422_0x0(
    store: ClusterStore, rt: Any, ns: str | None, prefix: str
) -> None:
    store.create(rt, ns, {"metadata": {"name": "x"}, "spec": {}}, manager="m")
    with pytest.raises(ApiError) as info:
        store.update(rt, ns, "x", {"metadata": {"name": "x"}, "spec": {}}, manager="m")
    assert info.value.code == 422
    assert info.value.message == (
        f"{prefix}: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    )
    assert info.value.status["details"]["kind"] == rt.plural


def test_put_without_rv_is_unconditional_for_namespaces(store: ClusterStore) -> None:
    store.create(NAMESPACES, None, {"metadata": {"name": "a"}}, manager="m")
    obj, created = store.update(
        NAMESPACES, None, "a", {"metadata": {"name": "a", "labels": {"x": "y"}}}, manager="m"
    )
    assert not created
    assert obj["metadata"]["labels"] == {"x": "y", "kubernetes.io/metadata.name": "a"}


def test_put_with_stale_rv_is_409(store: ClusterStore) -> None:
    first = store.create(POLICIES, None, policy(x=1), manager="m")
    body = policy(x=2)
    body["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    store.update(POLICIES, None, "p1", body, manager="m")
    with pytest.raises(ApiError) as info:
        store.update(POLICIES, None, "p1", body, manager="m")
    assert info.value.code == 409
    assert info.value.message == (
        'Operation cannot be fulfilled on policies.platform.stackship.se "p1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )


def test_put_on_missing_lease_creates_it(store: ClusterStore) -> None:
    obj, created = store.update(
        LEASES,
        "default",
        "lock",
        {"metadata": {"name": "lock"}, "spec": {"holderIdentity": "a"}},
        manager="m",
    )
    assert created
    assert obj["spec"] == {"holderIdentity": "a"}


def test_put_on_missing_cr_is_404(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.update(POLICIES, None, "p1", policy(), manager="m")
    assert info.value.code == 404


def test_identical_put_is_not_a_write(store: ClusterStore) -> None:
    obj = store.create(POLICIES, None, policy(x=1), manager="m")
    before = store.resource_version
    again, _ = store.update(POLICIES, None, "p1", obj, manager="m")
    assert store.resource_version == before
    assert again == obj


# --- generation and the status subresource ---------------------------------------------------


def test_generation_rules(store: ClusterStore) -> None:
    obj = store.create(POLICIES, None, policy(x=1), manager="m")
    obj["metadata"]["labels"] = {"a": "b"}
    obj, _ = store.update(POLICIES, None, "p1", obj, manager="m")
    assert obj["metadata"]["generation"] == 1  # metadata-only change
    obj["spec"]["x"] = 2
    obj, _ = store.update(POLICIES, None, "p1", obj, manager="m")
    assert obj["metadata"]["generation"] == 2
    obj["status"] = {"observedGeneration": 2}
    obj, _ = store.update(POLICIES, None, "p1", obj, manager="op", subresource="status")
    assert obj["metadata"]["generation"] == 2  # status writes never bump generation
    assert obj["status"] == {"observedGeneration": 2}


def test_main_endpoint_ignores_status_and_status_ignores_the_rest(store: ClusterStore) -> None:
    obj = store.create(POLICIES, None, policy(x=1), manager="m")
    obj["status"] = {"ready": True}
    obj["metadata"]["labels"] = {"from": "status"}
    obj["spec"]["x"] = 99
    written, _ = store.update(POLICIES, None, "p1", obj, manager="op", subresource="status")
    assert written["status"] == {"ready": True}
    assert written["spec"] == {"x": 1}
    assert "labels" not in written["metadata"]
    entry = next(e for e in written["metadata"]["managedFields"] if e["manager"] == "op")
    assert entry["subresource"] == "status"
    assert entry["fieldsV1"] == {"f:status": {"f:ready": {}}}
    written["status"] = {"ready": False}
    main, _ = store.update(POLICIES, None, "p1", written, manager="m")
    assert main["status"] == {"ready": True}


def test_status_subresource_only_where_declared(store: ClusterStore) -> None:
    store.create(LEASES, "default", {"metadata": {"name": "l"}}, manager="m")
    with pytest.raises(ApiError) as info:
        store.update(
            LEASES, "default", "l", {"metadata": {"name": "l"}}, manager="m", subresource="status"
        )
    assert info.value.code == 404


# --- server-side apply ----------------------------------------------------------------------


def test_apply_creates_when_absent(store: ClusterStore) -> None:
    obj, created = apply(store, policy(enabled=True))
    assert created
    assert obj["metadata"]["generation"] == 1
    assert obj["metadata"]["managedFields"] == [
        {
            "manager": "convergerd",
            "operation": "Apply",
            "apiVersion": CR_API,
            "time": "2025-01-02T03:04:05Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:enabled": {}}},
        }
    ]
    _again, created = apply(store, policy(enabled=True))
    assert not created


def test_identical_reapply_is_not_a_write(store: ClusterStore) -> None:
    first, _ = apply(store, policy(enabled=True, size=3))
    before = store.resource_version
    second, _ = apply(store, policy(enabled=True, size=3))
    assert store.resource_version == before
    assert second == first


def test_apply_conflict_with_update_manager(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(enabled=True), manager="kubectl-create")
    with pytest.raises(ApiError) as info:
        apply(store, policy(enabled=False))
    assert json.loads(info.value.body()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Apply failed with 1 conflict: conflict with "kubectl-create" using '
        f"{CR_API}: .spec.enabled",
        "reason": "Conflict",
        "details": {
            "causes": [
                {
                    "reason": "FieldManagerConflict",
                    "message": f'conflict with "kubectl-create" using {CR_API}',
                    "field": ".spec.enabled",
                }
            ]
        },
        "code": 409,
    }


def test_apply_conflicts_between_appliers_grouped(store: ClusterStore) -> None:
    apply(store, policy(a=1, b=2), manager="one")
    apply(store, policy(c=3), manager="two")
    with pytest.raises(ApiError) as info:
        apply(store, policy(a=9, b=9, c=9), manager="three")
    assert info.value.message == (
        'Apply failed with 3 conflicts: conflicts with "one":\n- .spec.a\n- .spec.b\n'
        'conflicts with "two":\n- .spec.c'
    )


def test_same_value_is_shared_not_conflict(store: ClusterStore) -> None:
    apply(store, policy(a=1), manager="one")
    obj, _ = apply(store, policy(a=1), manager="two")
    owners = {e["manager"]: e["fieldsV1"] for e in obj["metadata"]["managedFields"]}
    assert owners == {"one": {"f:spec": {"f:a": {}}}, "two": {"f:spec": {"f:a": {}}}}


def test_force_takes_ownership(store: ClusterStore) -> None:
    apply(store, policy(a=1, b=1), manager="one")
    obj, _ = apply(store, policy(a=2), manager="two", force=True)
    assert obj["spec"] == {"a": 2, "b": 1}
    owners = {e["manager"]: e["fieldsV1"] for e in obj["metadata"]["managedFields"]}
    assert owners == {"one": {"f:spec": {"f:b": {}}}, "two": {"f:spec": {"f:a": {}}}}
    assert obj["metadata"]["generation"] == 2


def test_fields_no_longer_applied_are_removed_unless_owned(store: ClusterStore) -> None:
    apply(store, policy(a=1, b=1, c=1), manager="one")
    apply(store, policy(c=1), manager="two")  # shares c
    obj, _ = apply(store, policy(a=1), manager="one")
    assert obj["spec"] == {"a": 1, "c": 1}  # b removed, c kept for "two"


def test_update_takes_ownership_without_conflict(store: ClusterStore) -> None:
    apply(store, policy(a=1), manager="one")
    obj, _ = store.patch(
        POLICIES, None, "p1", b'{"spec":{"a":2}}', content_type=MERGE, manager="editor", force=None
    )
    owners = {e["manager"]: e for e in obj["metadata"]["managedFields"]}
    assert "one" not in owners  # its only field moved to the updater
    assert owners["editor"]["operation"] == "Update"
    assert owners["editor"]["fieldsV1"] == {"f:spec": {"f:a": {}}}


def test_field_manager_required_before_lookup(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.patch(POLICIES, None, "missing", b"{}", content_type=APPLY, manager=None, force=None)
    assert info.value.code == 422
    assert info.value.status["details"]["kind"] == "PatchOptions"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {
                "apiVersion": CR_API,
                "kind": "Policy",
                "metadata": {"name": "p1", "managedFields": []},
            },
            "metadata.managedFields must be nil",
        ),
        (
            {
                "apiVersion": "platform.stackship.se/v1",
                "kind": "Policy",
                "metadata": {"name": "p1"},
            },
            "invalid object type: platform.stackship.se/v1, Kind=Policy",
        ),
    ],
)
def test_apply_body_rules(store: ClusterStore, body: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as info:
        apply(store, body)
    assert (info.value.code, info.value.message) == (400, message)


def test_apply_yaml_body(store: ClusterStore) -> None:
    body = (
        b"apiVersion: platform.stackship.se/v1alpha1\nkind: Policy\n"
        b"metadata:\n  name: y\nspec:\n  enabled: true\n  on: 1\n"
    )
    obj, created = store.patch(
        POLICIES, None, "y", body, content_type=APPLY, manager="k", force=False
    )
    assert created
    assert obj["spec"] == {"enabled": True, "true": 1}


@pytest.mark.parametrize(
    ("body", "media"),
    [
        (b"apiVersion: platform.stackship.se/v1alpha1\nkind: Policy\n"
         b"metadata:\n  name: n\nspec:\n  x: .inf\n", APPLY),
        (b'{"spec":{"x":-Infinity}}', MERGE),
        (b'{"spec":{"x":NaN}}', MERGE),
        (b'{"spec":{"x":1e400}}', MERGE),
    ],
)
def test_a_body_with_nan_or_infinity_is_refused(
    store: ClusterStore, body: bytes, media: str
) -> None:
    """Go's JSON has no NaN or infinity: kube-apiserver answers 400 and stores nothing."""
    apply(store, policy("n", x=1))
    with pytest.raises(ApiError) as err:
        store.patch(POLICIES, None, "n", body, content_type=media, manager="k", force=None)
    assert err.value.code == 400
    assert store.get(POLICIES, None, "n")["spec"] == {"x": 1}


def test_an_apply_body_is_yaml_where_json_has_no_number(store: ClusterStore) -> None:
    """kube-apiserver reads an apply body as YAML: a bare NaN is the string "NaN" there."""
    body = b'{"apiVersion":"platform.stackship.se/v1alpha1","kind":"Policy",' \
        b'"metadata":{"name":"n"},"spec":{"x":NaN}}'
    obj, _ = store.patch(POLICIES, None, "n", body, content_type=APPLY, manager="k", force=None)
    assert obj["spec"] == {"x": "NaN"}


def test_integers_beyond_64_bits_are_stored_and_answered_exactly(store: ClusterStore) -> None:
    big = 2**70 + 1
    obj, _ = apply(store, policy("big", n=big, m=-(2**64)))
    assert obj["spec"] == {"n": big, "m": -(2**64)}
    assert store.get(POLICIES, None, "big")["spec"] == {"n": big, "m": -(2**64)}
    assert store.list(POLICIES, None)["items"][0]["spec"]["n"] == big


def test_apply_to_status_is_its_own_manager_entry(store: ClusterStore) -> None:
    apply(store, policy(a=1))
    body = policy()
    body["status"] = {"ok": True}
    obj, _ = apply(store, body, manager="op", subresource="status")
    assert obj["status"] == {"ok": True}
    assert obj["spec"] == {"a": 1}  # the empty spec sent to /status changes nothing
    entry = next(e for e in obj["metadata"]["managedFields"] if e["manager"] == "op")
    assert entry["subresource"] == "status"
    assert obj["metadata"]["generation"] == 1


def test_apply_to_main_ignores_status(store: ClusterStore) -> None:
    body = policy(a=1)
    body["status"] = {"ok": True}
    obj, _ = apply(store, body)
    assert "status" not in obj


# --- other patch types -------------------------------------------------------------------------


def test_merge_and_json_patch(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(a=1, b=2), manager="m")
    obj, created = store.patch(
        POLICIES,
        None,
        "p1",
        b'{"spec":{"b":null,"c":3}}',
        content_type=MERGE,
        manager="m",
        force=None,
    )
    assert obj["spec"] == {"a": 1, "c": 3}
    assert not created
    ops = b'[{"op":"replace","path":"/spec/a","value":5},{"op":"remove","path":"/spec/c"}]'
    obj, _ = store.patch(POLICIES, None, "p1", ops, content_type=JSONPATCH, manager="m", force=None)
    assert obj["spec"] == {"a": 5}


def test_failed_json_patch_is_422(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(a=1), manager="m")
    ops = b'[{"op":"test","path":"/spec/a","value":2}]'
    with pytest.raises(ApiError) as info:
        store.patch(POLICIES, None, "p1", ops, content_type=JSONPATCH, manager="m", force=None)
    assert info.value.status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid",
        "details": {},
        "code": 422,
    }


def test_strategic_merge_patch_only_for_builtins(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(a=1), manager="m")
    with pytest.raises(ApiError) as info:
        store.patch(POLICIES, None, "p1", b"{}", content_type=SMP, manager="m", force=None)
    assert info.value.code == 415
    store.create(LEASES, "default", {"metadata": {"name": "l"}}, manager="m")
    obj, _ = store.patch(
        LEASES,
        "default",
        "l",
        b'{"spec":{"holderIdentity":"b"}}',
        content_type=SMP,
        manager="m",
        force=None,
    )
    assert obj["spec"] == {"holderIdentity": "b"}


def test_force_on_non_apply_patch(store: ClusterStore) -> None:
    with pytest.raises(ApiError) as info:
        store.patch(POLICIES, None, "p1", b"{}", content_type=MERGE, manager="m", force=False)
    assert info.value.code == 422


def test_patch_with_stale_rv_is_409(store: ClusterStore) -> None:
    store.create(POLICIES, None, policy(a=1), manager="m")
    with pytest.raises(ApiError) as info:
        store.patch(
            POLICIES,
            None,
            "p1",
            b'{"metadata":{"resourceVersion":"1"}}',
            content_type=MERGE,
            manager="m",
            force=None,
        )
    assert info.value.code == 409


# --- dry run ----------------------------------------------------------------------------------


def test_dry_run_stores_nothing(store: ClusterStore) -> None:
    before = store.resource_version
    created = store.create(POLICIES, None, policy(a=1), manager="m", dry_run=True)
    assert created["spec"] == {"a": 1}
    assert "resourceVersion" not in created["metadata"]
    _, was_created = apply(store, policy(a=2), dry_run=True)
    assert was_created
    assert store.resource_version == before
    assert store.list(POLICIES, None)["items"] == []
    store.create(POLICIES, None, policy(a=1), manager="m")
    after = store.resource_version
    store.patch(
        POLICIES,
        None,
        "p1",
        b'{"spec":{"a":3}}',
        content_type=MERGE,
        manager="m",
        force=None,
        dry_run=True,
    )
    store.delete(POLICIES, None, "p1", dry_run=True)
    assert store.resource_version == after
    assert store.get(POLICIES, None, "p1")["spec"] == {"a": 1}


# --- admission ----------------------------------------------------------------------------------


def test_admission_hook_sees_requests_and_can_deny(store: ClusterStore) -> None:
    seen: list[AdmissionRequest] = []

    def hook(request: AdmissionRequest) -> None:
        seen.append(request)
        if request.object and request.object.get("spec", {}).get("enabled") is False:
            from convergerd.sim.status import invalid_object

            raise invalid_object(request.rt, request.name, [])

    store.admission = hook
    apply(store, policy(enabled=True))
    with pytest.raises(ApiError):
        apply(store, policy(enabled=False))
    store.delete(POLICIES, None, "p1")
    assert [r.operation for r in seen] == ["CREATE", "UPDATE", "DELETE"]
    assert seen[1].old_object is not None
    assert seen[1].old_object["spec"] == {"enabled": True}


# --- delete -----------------------------------------------------------------------------------


def test_delete_bodies(store: ClusterStore) -> None:
    lease = store.create(LEASES, "default", {"metadata": {"name": "l"}}, manager="m")
    assert store.delete(LEASES, "default", "l") == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": "l",
            "group": "coordination.k8s.io",
            "kind": "leases",
            "uid": lease["metadata"]["uid"],
        },
    }
    store.create(PODS, "default", {"metadata": {"name": "p"}}, manager="m")
    deleted = store.delete(PODS, "default", "p")
    assert deleted["metadata"]["name"] == "p"
    assert deleted["metadata"]["resourceVersion"] == str(store.resource_version)
    with pytest.raises(ApiError):
        store.delete(PODS, "default", "p")


def test_deleting_a_namespace_takes_its_objects(store: ClusterStore) -> None:
    store.create(NAMESPACES, None, {"metadata": {"name": "t"}}, manager="m")
    store.create(LEASES, "t", {"metadata": {"name": "l"}}, manager="m")
    store.delete(NAMESPACES, None, "t")
    assert store.list(LEASES, None)["items"] == []


# --- lease MicroTime --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("2025-01-02T03:04:05.123456Z", "2025-01-02T03:04:05.123456Z"),
        ("2025-01-02T05:04:05.000000+02:00", "2025-01-02T03:04:05.000000Z"),
    ],
)
def test_micro_time_accepted(store: ClusterStore, given: str, stored: str) -> None:
    obj = store.create(
        LEASES, "default", {"metadata": {"name": "l"}, "spec": {"renewTime": given}}, manager="m"
    )
    assert obj["spec"]["renewTime"] == stored


@pytest.mark.parametrize(
    ("given", "detail"),
    [
        ("2025-01-02T03:04:05Z", 'cannot parse "Z" as ".000000"'),
        ("2025-01-02T03:04:05.123Z", 'cannot parse ".123Z" as ".000000"'),
        ("yesterday", 'cannot parse "yesterday" as "2006"'),
    ],
)
def test_micro_time_rejected(store: ClusterStore, given: str, detail: str) -> None:
    with pytest.raises(ApiError) as info:
        store.create(
            LEASES,
            "default",
            {"metadata": {"name": "l"}, "spec": {"acquireTime": given}},
            manager="m",
        )
    assert info.value.code == 400
    assert info.value.message == (
        'Lease in version "v1" cannot be handled as a Lease: parsing time '
        f'"{given}" as "2006-01-02T15:04:05.000000Z07:00": {detail}'
    )
