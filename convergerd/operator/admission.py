"""STUB — replaced at integration by the real CEL renderer (helper `opcel`'s
`convergerd/operator/admission.py`). Only the interface is binding; the bodies below are the
least the operator's tests need: a ValidatingAdmissionPolicy with one validation `"true"` and
its binding selecting the boundary's namespaces.

Test hook of this stub only: a rule of type `StubRenderError` raises `RenderError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NAME_PREFIX = "stackship-"
BOUNDARY_LABEL = "platform.stackship.se/boundary"


class RenderError(Exception):
    """The Policy cannot be turned into an admission policy. `reason`: a CamelCase slug for the
    Ready condition; `str(exc)`: a message a person can act on."""

    reason: str

    def __init__(self, message: str, *, reason: str = "InvalidRule") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Admission:
    policy: dict[str, Any]  # ValidatingAdmissionPolicy body, name "stackship-<policyId>"
    binding: dict[str, Any]  # ValidatingAdmissionPolicyBinding body, same name


def admission_name(policy_id: str) -> str:
    return NAME_PREFIX + policy_id


def render_admission(spec: Mapping[str, Any]) -> Admission:
    policy_id = spec.get("policyId")
    boundary = spec.get("boundary")
    if not isinstance(policy_id, str) or not policy_id:
        raise RenderError("spec.policyId is missing", reason="InvalidSpec")
    if not isinstance(boundary, str) or not boundary:
        raise RenderError("spec.boundary is missing", reason="InvalidSpec")
    rule = spec.get("rule")
    rule_type = rule.get("type") if isinstance(rule, Mapping) else None
    if rule_type == "StubRenderError":
        raise RenderError("rule type StubRenderError cannot be rendered (stub)",
                          reason="UnknownRuleType")
    name = admission_name(policy_id)
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["pods"],
            }]},
            "validations": [{"expression": "true", "message": f"policy {policy_id}"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {BOUNDARY_LABEL: boundary}}},
        },
    }
    return Admission(policy=policy, binding=binding)


def violating_pod(spec: Mapping[str, Any], *, namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "probe", "image": "invalid.example/probe:latest"}]},
    }
