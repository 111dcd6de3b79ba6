"""Status error objects exactly as kube-apiserver writes them (kube-apiserver).

Constructors follow `k8s.io/apimachinery/pkg/api/errors/errors.go`: empty fields are left out
(Go `omitempty`), `details.kind` holds the resource plural except for Invalid (the Kind).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from convergerd.sim.resources import ResourceType

_OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
_INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. "
    "You can start a new list without the continue parameter, or use the continue token in "
    "this response to retrieve the remainder of the results. Continuing with the provided "
    "token results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)
_UNSUPPORTED_PATCH = (
    "the body of the request was in an unknown format - accepted media types include: "
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
)
TOO_MANY_REQUESTS_TEXT = "Too many requests, please try again later.\n"


class ApiError(Exception):
    """A request failure carrying the exact body the apiserver would send."""

    def __init__(
        self,
        status: dict[str, Any],
        *,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
        text: str | None = None,
    ) -> None:
        super().__init__(status.get("message", text or ""))
        self.status = status
        self.code: int = int(status["code"])
        self.content_type = content_type
        self.headers: dict[str, str] = dict(headers or {})
        self.text = text

    @property
    def reason(self) -> str:
        return str(self.status.get("reason", ""))

    @property
    def message(self) -> str:
        return str(self.status.get("message", ""))

    def body(self) -> bytes:
        if self.text is not None:
            return self.text.encode()
        return json.dumps(self.status, separators=(",", ":")).encode()


def status_object(
    code: int,
    reason: str,
    message: str,
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Failure Status; empty strings and a None details are omitted like Go's omitempty."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
    }
    if message:
        status["message"] = message
    if reason:
        status["reason"] = reason
    if details is not None:
        status["details"] = {k: v for k, v in details.items() if v not in ("", None, [], 0)}
    status["code"] = code
    return status


def _gr_details(rt: ResourceType, name: str) -> dict[str, Any]:
    return {"name": name, "group": rt.group, "kind": rt.plural}


def _error(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> ApiError:
    return ApiError(status_object(code, reason, message, details))


def not_found(rt: ResourceType, name: str) -> ApiError:
    return _error(
        404, "NotFound", f"{rt.group_resource} {_q(name)} not found", _gr_details(rt, name)
    )


def namespace_not_found(namespace: str) -> ApiError:
    """NamespaceLifecycle admission: creating into a namespace that does not exist."""
    return _error(
        404,
        "NotFound",
        f"namespaces {_q(namespace)} not found",
        {"name": namespace, "kind": "namespaces"},
    )


def path_not_found(api_version: str = "v1") -> ApiError:
    status = status_object(404, "NotFound", "the server could not find the requested resource")
    status["apiVersion"] = api_version
    return ApiError(status)


def already_exists(rt: ResourceType, name: str) -> ApiError:
    msg = f"{rt.group_resource} {_q(name)} already exists"
    return _error(409, "AlreadyExists", msg, _gr_details(rt, name))


def conflict(rt: ResourceType, name: str, detail: str = _OPTIMISTIC_LOCK) -> ApiError:
    msg = f"Operation cannot be fulfilled on {rt.group_resource} {_q(name)}: {detail}"
    return _error(409, "Conflict", msg, _gr_details(rt, name))


def apply_conflict(conflicts: Sequence[tuple[str, str]]) -> ApiError:
    """SSA conflicts: (rendered manager, field path) pairs, already sorted by the caller."""
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {mgr}", "field": path}
        for mgr, path in conflicts
    ]
    if len(conflicts) == 1:
        mgr, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {mgr}: {path}"
    else:
        lines: list[str] = []
        last: str | None = None
        for mgr, path in conflicts:
            if mgr != last:
                lines.append(f"conflicts with {mgr}:")
                last = mgr
            lines.append(f"- {path}")
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return _error(409, "Conflict", message, {"causes": causes})


def field_error(
    field: str, kind: str, detail: str = "", value: str | None = None
) -> dict[str, str]:
    """One `field.Error` as a cause; kind is Invalid/Required/Forbidden/NotSupported/
    TooLong/Duplicate."""
    reasons = {
        "Invalid": ("FieldValueInvalid", "Invalid value"),
        "Required": ("FieldValueRequired", "Required value"),
        "Forbidden": ("FieldValueForbidden", "Forbidden"),
        "NotSupported": ("FieldValueNotSupported", "Unsupported value"),
        "TooLong": ("FieldValueTooLong", "Too long"),
        "Duplicate": ("FieldValueDuplicate", "Duplicate value"),
    }
    reason, prefix = reasons[kind]
    body = prefix if value is None else f"{prefix}: {value}"
    if detail:
        body = f"{body}: {detail}"
    return {"reason": reason, "message": body, "field": field}


def invalid(group: str, kind: str, name: str, causes: Sequence[Mapping[str, str]]) -> ApiError:
    """`NewInvalid(GroupKind, name, errs)`; for the PUT-without-RV quirk pass the plural as kind."""
    qualified = f"{kind}.{group}" if group else kind
    errs = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    agg = errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]"
    details = {"name": name, "group": group, "kind": kind, "causes": [dict(c) for c in causes]}
    return _error(422, "Invalid", f"{qualified} {_q(name)} is invalid: {agg}", details)


def invalid_object(rt: ResourceType, name: str, causes: Sequence[Mapping[str, str]]) -> ApiError:
    return invalid(rt.group, rt.kind, name, causes)


def rv_required_for_update(rt: ResourceType, name: str) -> ApiError:
    cause = field_error(
        "metadata.resourceVersion", "Invalid", "must be specified for an update", value="0x0"
    )
    return invalid(rt.group, rt.plural, name, [cause])


def field_manager_required() -> ApiError:
    cause = field_error("fieldManager", "Required", "is required for apply patch")
    return invalid("meta.k8s.io", "PatchOptions", "", [cause])


def field_manager_too_long(manager: str) -> ApiError:
    cause = field_error("fieldManager", "TooLong", "must have at most 128 bytes", value=None)
    cause["message"] = "Too long: may not be more than 128 bytes"
    return invalid("meta.k8s.io", "PatchOptions", "", [cause])


def force_on_non_apply() -> ApiError:
    cause = field_error("force", "Forbidden", "may not be specified for non-apply patch")
    return invalid("meta.k8s.io", "PatchOptions", "", [cause])


def patch_rejected() -> ApiError:
    """A JSON patch that fails to apply: patch.go answers `NewGenericServerResponse(422, ...)`
    with isUnexpectedResponse=false, so the patch library's own message is dropped and
    details is present but empty."""
    message = "the server rejected our request due to an error in our request"
    return ApiError(status_object(422, "Invalid", message, {}))


def bad_request(message: str) -> ApiError:
    return _error(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return _error(401, "Unauthorized", "Unauthorized")


def forbidden(  # noqa: PLR0917 - positional order is the contract the server codes against
    rt: ResourceType,
    name: str,
    user: str,
    verb: str,
    namespace: str | None,
    subresource: str | None = None,
) -> ApiError:
    resource = f"{rt.plural}/{subresource}" if subresource else rt.plural
    reason = f"User {_q(user)} cannot {verb} resource {_q(resource)} in API group {_q(rt.group)}"
    reason += f" in the namespace {_q(namespace)}" if namespace else " at the cluster scope"
    subject = f"{rt.group_resource} {_q(name)}" if name else rt.group_resource
    return _error(403, "Forbidden", f"{subject} is forbidden: {reason}", _gr_details(rt, name))


def expired(message: str, continue_token: str | None = None) -> ApiError:
    status = status_object(410, "Expired", message)
    if continue_token:
        status["metadata"] = {"continue": continue_token}
    return ApiError(status)


def inconsistent_continue(fresh_token: str) -> ApiError:
    return expired(_INCONSISTENT_CONTINUE, fresh_token)


def too_many_requests(retry_after: int = 1) -> ApiError:
    """Max-in-flight / APF rejection: plain text, not a Status (maxinflight.go)."""
    return ApiError(
        status_object(429, "TooManyRequests", TOO_MANY_REQUESTS_TEXT.strip()),
        content_type="text/plain; charset=utf-8",
        headers={"Retry-After": str(retry_after)},
        text=TOO_MANY_REQUESTS_TEXT,
    )


def too_many_requests_status(message: str, retry_after: int) -> ApiError:
    """`NewTooManyRequests` (JSON, as eviction sends it)."""
    status = status_object(429, "TooManyRequests", message, {"retryAfterSeconds": retry_after})
    return ApiError(status, headers={"Retry-After": str(retry_after)})


def unsupported_media_type(*, strategic_merge: bool = False) -> ApiError:
    """415 for a patch type the resource does not accept (CRs: no strategic merge patch)."""
    message = _UNSUPPORTED_PATCH
    if strategic_merge:
        message += ", application/strategic-merge-patch+json"
    return _error(415, "UnsupportedMediaType", message)


def method_not_allowed(rt: ResourceType, action: str) -> ApiError:
    """`NewMethodNotSupported`: e.g. action "deletecollection"."""
    msg = f"{action} is not supported on resources of kind {_q(rt.group_resource)}"
    return _error(405, "MethodNotAllowed", msg, {"group": rt.group, "kind": rt.plural})


def internal_error(message: str) -> ApiError:
    """`NewInternalError(err)`: 500 with the error as the only cause."""
    details = {"causes": [{"message": message}]}
    return _error(500, "InternalError", f"Internal error occurred: {message}", details)


def service_unavailable(message: str = "service unavailable") -> ApiError:
    """`NewServiceUnavailable(reason)`: 503, the reason is the whole message, no details."""
    return _error(503, "ServiceUnavailable", message)


def gateway_timeout(message: str, retry_after: int = 0) -> ApiError:
    """`NewTimeoutError(msg, n)`: 504 reason Timeout, message prefixed with "Timeout: "."""
    details = {"retryAfterSeconds": retry_after} if retry_after else None
    return _error(504, "Timeout", f"Timeout: {message}", details)


def bad_gateway(message: str = "bad gateway") -> ApiError:
    """kube-apiserver itself has no 502 constructor; a proxy in front answers with one.

    We keep the JSON envelope with an empty (omitted) reason: that is `StatusReasonUnknown`, what
    client-go makes of a 5xx it cannot classify.
    """
    return _error(502, "", message)


def server_error(code: int, message: str = "") -> ApiError:
    """Fault injection by status code: the constructor a real server would use for it."""
    if code == 503:
        return service_unavailable(message or "service unavailable")
    if code == 504:
        return gateway_timeout(message or "request did not complete within the allotted timeout")
    if code == 502:
        return bad_gateway(message or "bad gateway")
    return internal_error(message or "injected fault")


def success_status(rt: ResourceType, name: str, uid: str) -> dict[str, Any]:
    """DELETE answer for kinds without ReturnDeletedObject (registry `finalizeDelete`)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {k: v for k, v in (_gr_details(rt, name) | {"uid": uid}).items() if v},
    }


def _q(s: str) -> str:
    """Go's %q for the ASCII names Kubernetes allows (json.dumps escapes the same way)."""
    return json.dumps(s, ensure_ascii=False)
