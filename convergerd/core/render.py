"""A policy as the Policy custom resource convergerd applies to a cluster (docs/design.md,
"What lands in a cluster"). Pure."""

from __future__ import annotations

import json
from typing import Any

from convergerd.core.exceptions import as_spec, stored_exceptions
from convergerd.core.model import (
    DEFAULT_ENFORCEMENT,
    BoundaryId,
    InvalidPolicy,
    Policy,
    PolicyId,
    PolicyRow,
    RuleError,
    check_boundary_id,
    check_policy_id,
    parse_enforcement,
    parse_rule,
)

GROUP = "platform.stackship.se"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Policy"
PLURAL = "policies"
CRD_NAME = f"{PLURAL}.{GROUP}"
FIELD_MANAGER = "stackship-platform"
BOUNDARY_LABEL = "platform.stackship.se/boundary"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "convergerd"
# What a round lists per cluster: only objects convergerd manages.
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# The largest Policy object convergerd applies, as JSON: far under etcd's 1.5 MB request limit,
# so one tenant's row cannot make a cluster's API server refuse it (or slow every list).
MAX_OBJECT_BYTES = 256 * 1024


def object_name(policy_id: str) -> str:
    return f"policy-{policy_id}"


def policy_id_from_name(name: str) -> str | None:
    return name.removeprefix("policy-") if name.startswith("policy-") else None


def render_policy(policy: Policy) -> dict[str, Any]:
    """The apply body: exactly the fields convergerd owns (never status).

    `spec.enforcement` is written only when it is not the default (`Deny`): a Deny policy's
    object stays byte for byte what it was before modes existed, so an upgrade finds every
    object in sync (a round compares the whole spec: writing `enforcement: Deny` everywhere
    would rewrite every object of the fleet once), and an operator or CRD from before modes
    never sees the field unless someone asks for Warn or Audit. The operator reads a missing
    `enforcement` as `Deny`."""
    spec: dict[str, Any] = {
        "policyId": policy.id,
        "boundary": policy.boundary,
        "enabled": policy.enabled,
        "revision": policy.revision,
        "rule": policy.rule.as_dict(),
    }
    if policy.enforcement is not DEFAULT_ENFORCEMENT:
        spec["enforcement"] = policy.enforcement.value
    if policy.exceptions:  # only with some: a policy without exceptions renders as it always did
        spec["exceptions"] = [as_spec(e) for e in policy.exceptions]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(policy.id),
            "labels": {BOUNDARY_LABEL: policy.boundary, MANAGED_BY_LABEL: MANAGED_BY},
        },
        "spec": spec,
    }


def object_size(policy: Policy) -> int:
    """Bytes of the rendered object as compact JSON (about what the apply request carries)."""
    body = json.dumps(render_policy(policy), separators=(",", ":"), ensure_ascii=False)
    return len(body.encode("utf-8"))


def check_object_size(policy: Policy) -> None:
    """`RuleError` if the object a round would apply is larger than `MAX_OBJECT_BYTES`."""
    if not policy.rule.delivered:
        return  # never rendered: it stays in the control plane
    size = object_size(policy)
    if size > MAX_OBJECT_BYTES:
        raise RuleError(
            f"rule: the Policy object would be {size} bytes, at most {MAX_OBJECT_BYTES}; "
            "list fewer or shorter entries"
        )


def validate_policy(row: PolicyRow) -> Policy | InvalidPolicy:
    """A deliverable `Policy`, or an `InvalidPolicy` with the reason it is not: the row's
    fields (`model`), and the object a round would apply within `MAX_OBJECT_BYTES`. The one
    rule for rounds and `import` alike."""
    try:
        check_policy_id(row.id)
        check_boundary_id(row.boundary)
        rule = parse_rule(row.rule)
        policy = Policy(
            id=PolicyId(row.id),
            boundary=BoundaryId(row.boundary),
            rule=rule,
            enabled=row.enabled,
            revision=row.revision,
            enforcement=parse_enforcement(row.enforcement),
            exceptions=stored_exceptions(row.exceptions),
        )
        check_object_size(policy)
    except RuleError as exc:
        return InvalidPolicy(row.id, row.boundary, row.revision, reason=str(exc))
    return policy


def deliverable_policy(row: PolicyRow, *, boundary_exists: bool) -> Policy | InvalidPolicy:
    """`validate_policy`, then the one boundary rule of rounds, status and saves: a policy
    naming a boundary that does not exist is invalid (it could reach no cluster)."""
    result = validate_policy(row)
    if isinstance(result, Policy) and not boundary_exists:
        return InvalidPolicy(row.id, row.boundary, row.revision,
                             reason=f"boundary: {row.boundary!r} does not exist")
    return result
