"""Field validation a kind's strategy does before admission, for the fields the simulator
checks (pure): a ValidatingAdmissionPolicyBinding's `validationActions`, as
k8s.io/kubernetes/pkg/apis/admissionregistration/validation/validation.go
`validateValidationActions` does it: each one of Deny, Warn, Audit, none twice, at least one,
and never Deny with Warn. An object that fails is refused with 422 Invalid naming the fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from convergerd.sim import status
from convergerd.sim.resources import VALIDATING_ADMISSION_POLICY_BINDINGS, ResourceType

_ACTIONS = ("Audit", "Deny", "Warn")  # sets.List order: sorted
_FIELD = "spec.validationActions"
_DENY_AND_WARN = ("must not contain both Deny and Warn (repeating the same validation failure "
                  "information in the API response and headers serves no purpose)")


def _go_value(actions: list[Any]) -> str:
    """The field error's value as Go's `%#v` prints the internal typed slice."""
    items = ", ".join(json.dumps(a) if isinstance(a, str) else json.dumps(str(a))
                      for a in actions)
    return f"[]admissionregistration.ValidationAction{{{items}}}"


def binding_causes(binding: Mapping[str, Any]) -> list[dict[str, str]]:
    """The field errors of a binding's `validationActions` ([] when valid)."""
    spec = binding.get("spec")
    actions = spec.get("validationActions") if isinstance(spec, Mapping) else None
    actions = actions if isinstance(actions, list) else []
    causes: list[dict[str, str]] = []
    seen: set[str] = set()
    supported = ", ".join(json.dumps(a) for a in _ACTIONS)
    for i, action in enumerate(actions):
        where = f"{_FIELD}[{i}]"
        text = str(action)
        if text not in _ACTIONS:
            causes.append(status.field_error(where, "NotSupported", f"supported values: "
                                             f"{supported}", value=json.dumps(text)))
        if text in seen:
            causes.append(status.field_error(where, "Duplicate", value=json.dumps(text)))
        seen.add(text)
    if {"Deny", "Warn"} <= seen:
        causes.append(status.field_error(_FIELD, "Invalid", _DENY_AND_WARN,
                                         value=_go_value(actions)))
    if not seen:
        causes.append(status.field_error(_FIELD, "Required",
                                         "at least one validation action is required"))
    return causes


def validate(rt: ResourceType, obj: Mapping[str, Any]) -> None:
    """Raise the 422 Invalid kube-apiserver answers for `obj`, when it has field errors."""
    if rt is not VALIDATING_ADMISSION_POLICY_BINDINGS:
        return
    causes = binding_causes(obj)
    if causes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        raise status.invalid_object(rt, name, causes)
