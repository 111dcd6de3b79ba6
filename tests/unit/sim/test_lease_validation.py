"""The simulator decodes and validates a Lease's spec as kube-apiserver does: typed fields (a
wrong JSON type, an int32 out of range: 400), MicroTimes (400 when unparseable, also when an
offset carries the time past the calendar Python holds, never a 500), `ValidateLeaseSpec`
(422), on create, update and apply alike."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from convergerd.sim.resources import LEASES
from convergerd.sim.status import ApiError
from convergerd.sim.store import APPLY_PATCH, ClusterStore

T0 = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
NS = "default"


@pytest.fixture
def store() -> ClusterStore:
    return ClusterStore(now=lambda: T0)


def lease(name: str = "lock", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name}, "spec": {"holderIdentity": "a", **spec}}


def write(store: ClusterStore, how: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create, or update an existing Lease, or server-side apply: the three ways a spec comes in."""
    if how == "create":
        return store.create(LEASES, NS, body, manager="m")
    if how == "update":
        current = store.create(LEASES, NS, lease(body["metadata"]["name"]), manager="m")
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        obj, _ = store.update(LEASES, NS, body["metadata"]["name"], body, manager="m")
        return obj
    obj, _ = store.patch(LEASES, NS, body["metadata"]["name"], json.dumps(body).encode(),
                         content_type=APPLY_PATCH, manager="m", force=True)
    return obj


HOW = ["create", "update", "apply"]
BEYOND_THE_CALENDAR = ["0001-01-01T00:30:00.000000+01:00", "9999-12-31T23:30:00.000000-01:00"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("field", ["renewTime", "acquireTime"])
@pytest.mark.parametrize("text", BEYOND_THE_CALENDAR)
def test_a_time_whose_offset_crosses_year_0_or_9999_is_a_400_not_a_500(
    store: ClusterStore, how: str, field: str, text: str
) -> None:
    with pytest.raises(ApiError) as refused:
        write(store, how, lease(**{field: text}))
    assert refused.value.code == 400
    assert refused.value.message == (
        f'Lease in version "v1" cannot be handled as a Lease: parsing time "{text}": '
        "year outside of range [0,9999]")


def test_times_at_the_ends_of_the_calendar_are_stored_in_utc(store: ClusterStore) -> None:
    obj = store.create(LEASES, NS, lease(renewTime="9999-12-31T23:59:59.999999Z",
                                         acquireTime="0999-01-01T01:00:00.000000+01:00"),
                       manager="m")
    assert obj["spec"]["renewTime"] == "9999-12-31T23:59:59.999999Z"
    assert obj["spec"]["acquireTime"] == "0999-01-01T00:00:00.000000Z"  # four-digit year


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("leaseDurationSeconds", 2**31, "number 2147483648"),
        ("leaseDurationSeconds", 10**30, f"number {10**30}"),
        ("leaseTransitions", -(2**31) - 1, "number -2147483649"),
        ("leaseDurationSeconds", 15.5, "number 15.5"),
        ("leaseDurationSeconds", "15", "string"),
        ("leaseTransitions", True, "bool"),
        ("holderIdentity", 7, "number"),
        ("holderIdentity", {"a": 1}, "object"),
    ],
)
def test_a_typed_field_out_of_its_go_type_is_a_400_decode_error(
    store: ClusterStore, how: str, field: str, value: Any, shown: str
) -> None:
    go_type = "string" if field == "holderIdentity" else "int32"
    with pytest.raises(ApiError) as refused:
        write(store, how, lease(**{field: value}))
    assert refused.value.code == 400
    assert refused.value.message == (
        f'Lease in version "v1" cannot be handled as a Lease: json: cannot unmarshal {shown} '
        f"into Go struct field LeaseSpec.spec.{field} of type {go_type}")


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"leaseDurationSeconds": 0},
         "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"),
        ({"leaseTransitions": -1},
         "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0"),
    ],
)
def test_validate_lease_spec_is_a_422(
    store: ClusterStore, how: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiError) as refused:
        write(store, how, lease(**spec))
    assert refused.value.code == 422
    assert refused.value.reason == "Invalid"
    assert refused.value.message == f'Lease.coordination.k8s.io "lock" is invalid: {message}'


def test_int32_limits_are_accepted(store: ClusterStore) -> None:
    obj = store.create(LEASES, NS, lease(leaseDurationSeconds=2**31 - 1,
                                         leaseTransitions=2**31 - 1), manager="m")
    assert obj["spec"]["leaseDurationSeconds"] == obj["spec"]["leaseTransitions"] == 2**31 - 1
