"""A policy as the Policy custom resource convergerd applies to a cluster (SPEC.md §3). Pure."""

from __future__ import annotations

from typing import Any

from convergerd.model import Policy

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


def object_name(policy_id: str) -> str:
    return f"policy-{policy_id}"


def policy_id_of(name: str) -> str | None:
    return name.removeprefix("policy-") if name.startswith("policy-") else None


def render_policy(policy: Policy) -> dict[str, Any]:
    """The apply body: exactly the fields convergerd owns (never status)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": object_name(policy.id),
            "labels": {BOUNDARY_LABEL: policy.boundary, MANAGED_BY_LABEL: MANAGED_BY},
        },
        "spec": {
            "policyId": policy.id,
            "boundary": policy.boundary,
            "enabled": policy.enabled,
            "revision": policy.revision,
            "rule": policy.rule.as_dict(),
        },
    }
