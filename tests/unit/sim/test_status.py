"""Status bodies, byte for byte where kube-apiserver quotes them."""

from __future__ import annotations

import json

from convergerd.sim import status
from convergerd.sim.resources import LEASES, PODS, POLICIES


def body(err: status.ApiError) -> object:
    return json.loads(err.body())


def test_not_found_lease() -> None:
    assert body(status.not_found(LEASES, "lock")) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'leases.coordination.k8s.io "lock" not found',
        "reason": "NotFound",
        "details": {"name": "lock", "group": "coordination.k8s.io", "kind": "leases"},
        "code": 404,
    }


def test_not_found_core_has_no_group() -> None:
    err = status.not_found(PODS, "p")
    assert err.status["message"] == 'pods "p" not found'
    assert err.status["details"] == {"name": "p", "kind": "pods"}


def test_path_not_found_has_no_details() -> None:
    assert body(status.path_not_found()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the server could not find the requested resource",
        "reason": "NotFound",
        "code": 404,
    }


def test_conflict_optimistic_lock() -> None:
    err = status.conflict(POLICIES, "w1")
    assert err.status["message"] == (
        'Operation cannot be fulfilled on policies.platform.stackship.se "w1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    assert (err.code, err.reason) == (409, "Conflict")


def test_apply_conflict_single_matches_notes() -> None:
    err = status.apply_conflict([('"kubectl-create" using example.com/v1', ".spec.enabled")])
    assert body(err) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Apply failed with 1 conflict: conflict with "kubectl-create" using '
        "example.com/v1: .spec.enabled",
        "reason": "Conflict",
        "details": {
            "causes": [
                {
                    "reason": "FieldManagerConflict",
                    "message": 'conflict with "kubectl-create" using example.com/v1',
                    "field": ".spec.enabled",
                }
            ]
        },
        "code": 409,
    }


def test_apply_conflict_multiple_groups_by_manager() -> None:
    err = status.apply_conflict([('"a"', ".spec.x"), ('"a"', ".spec.y"), ('"b"', ".spec.z")])
    assert err.message == (
        'Apply failed with 3 conflicts: conflicts with "a":\n- .spec.x\n- .spec.y\n'
        'conflicts with "b":\n- .spec.z'
    )


def test_rv_required_quirk_uses_plural_and_0x0() -> None:
    assert body(status.rv_required_for_update(POLICIES, "w1")) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'policies.platform.stackship.se "w1" is invalid: metadata.resourceVersion: '
        "Invalid value: 0x0: must be specified for an update",
        "reason": "Invalid",
        "details": {
            "name": "w1",
            "group": "platform.stackship.se",
            "kind": "policies",
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": "Invalid value: 0x0: must be specified for an update",
                    "field": "metadata.resourceVersion",
                }
            ],
        },
        "code": 422,
    }


def test_field_manager_required_is_422_patch_options() -> None:
    assert body(status.field_manager_required()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
        "is required for apply patch",
        "reason": "Invalid",
        "details": {
            "group": "meta.k8s.io",
            "kind": "PatchOptions",
            "causes": [
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value: is required for apply patch",
                    "field": "fieldManager",
                }
            ],
        },
        "code": 422,
    }


def test_force_on_non_apply() -> None:
    assert status.force_on_non_apply().message == (
        'PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be specified for '
        "non-apply patch"
    )


def test_forbidden_namespaced_and_cluster_scope() -> None:
    err = status.forbidden(LEASES, "lock", "alice", "patch", "default")
    assert body(err) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'leases.coordination.k8s.io "lock" is forbidden: User "alice" cannot patch '
        'resource "leases" in API group "coordination.k8s.io" in the namespace "default"',
        "reason": "Forbidden",
        "details": {"name": "lock", "group": "coordination.k8s.io", "kind": "leases"},
        "code": 403,
    }
    listing = status.forbidden(PODS, "", "bob", "list", None)
    assert listing.message == (
        'pods is forbidden: User "bob" cannot list resource "pods" in API group "" at the '
        "cluster scope"
    )


def test_unauthorized() -> None:
    assert body(status.unauthorized()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


def test_max_in_flight_429_is_plain_text() -> None:
    err = status.too_many_requests(1)
    assert err.code == 429
    assert err.content_type == "text/plain; charset=utf-8"
    assert err.headers == {"Retry-After": "1"}
    assert err.body() == b"Too many requests, please try again later.\n"


def test_429_status_form() -> None:
    err = status.too_many_requests_status("slow down", 3)
    assert err.status["details"] == {"retryAfterSeconds": 3}
    assert err.status["reason"] == "TooManyRequests"


def test_unsupported_media_type_for_crs() -> None:
    assert body(status.unsupported_media_type()) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "the body of the request was in an unknown format - accepted media types "
        "include: application/json-patch+json, application/merge-patch+json, "
        "application/apply-patch+yaml",
        "reason": "UnsupportedMediaType",
        "code": 415,
    }


def test_fault_statuses() -> None:
    assert body(status.server_error(500, "boom")) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Internal error occurred: boom",
        "reason": "InternalError",
        "details": {"causes": [{"message": "boom"}]},
        "code": 500,
    }
    unavailable = status.server_error(503, "etcd is down")
    assert (unavailable.reason, unavailable.message) == ("ServiceUnavailable", "etcd is down")
    timeout = status.gateway_timeout("request did not complete", 2)
    assert timeout.status["message"] == "Timeout: request did not complete"
    assert timeout.status["details"] == {"retryAfterSeconds": 2}
    assert "reason" not in status.server_error(502).status


def test_expired_watch_shape() -> None:
    assert body(status.expired("too old resource version: 5 (120)")) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 5 (120)",
        "reason": "Expired",
        "code": 410,
    }
