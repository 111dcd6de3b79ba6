"""ValidatingAdmissionPolicy evaluation (admission.evaluate), on hand-written policies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from convergerd.admission.evaluate import Attributes, PolicyEvaluator

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "x"}},
       "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}
NS = {"metadata": {"name": "ns1", "labels": {"env": "prod"}}}
RULE = {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
        "operations": ["CREATE", "UPDATE"]}


def vap(validations: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "pol"}, "spec": {
        "matchConstraints": {"resourceRules": [RULE]}, "validations": validations} | spec}


def binding(actions: tuple[str, ...] = ("Deny",), **match: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": "pol", "validationActions": list(actions)}
    if match:
        spec["matchResources"] = match
    return {"metadata": {"name": "bind"}, "spec": spec}


def attrs(**over: Any) -> Attributes:
    base: dict[str, Any] = {"operation": "CREATE", "group": "", "version": "v1",
                            "resource": "pods", "kind": "Pod", "namespace": "ns1", "name": "p",
                            "object": POD, "old_object": None}
    return Attributes(**(base | over))


def message(policy: dict[str, Any], b: dict[str, Any] | None = None, **over: Any) -> str | None:
    denial = PolicyEvaluator().first_denial([policy], [b or binding()], attrs(**over),
                                            namespace=NS)
    return None if denial is None else denial.message


DENY = [{"expression": "false", "message": "no"}]


def test_resource_rules_select_operation_resource_and_subresource() -> None:
    assert message(vap(DENY)) == "no"
    assert message(vap(DENY), operation="DELETE") is None
    assert message(vap(DENY), subresource="status") is None  # "pods" is not "pods/status"
    star = vap(DENY, matchConstraints={"resourceRules": [RULE | {"resources": ["*/*"]}]})
    assert message(star, subresource="status") == "no"
    excluded = vap(DENY, matchConstraints={"resourceRules": [RULE],
                                           "excludeResourceRules": [RULE]})
    assert message(excluded) is None


def test_namespace_and_object_selectors() -> None:
    prod = binding(namespaceSelector={"matchLabels": {"env": "prod"}})
    dev = binding(namespaceSelector={"matchExpressions": [
        {"key": "env", "operator": "In", "values": ["dev"]}]})
    assert message(vap(DENY), prod) == "no"
    assert message(vap(DENY), dev) is None
    assert message(vap(DENY), binding(objectSelector={"matchLabels": {"app": "y"}})) is None
    assert message(vap(DENY), binding(objectSelector={"matchLabels": {"app": "x"}})) == "no"


def test_only_deny_actions_reject_and_admission_objects_are_exempt() -> None:
    assert message(vap(DENY), binding(("Warn", "Audit"))) is None
    assert message(vap(DENY), group="admissionregistration.k8s.io") is None


@pytest.mark.parametrize(("validation", "expected"), [
    ({"expression": "false", "messageExpression": "'bad ' + object.metadata.name",
      "message": "m"}, "bad p"),
    ({"expression": "false", "messageExpression": "'two\\nlines'", "message": "m"}, "m"),
    ({"expression": "false", "messageExpression": "object.nope", "message": "m"}, "m"),
    ({"expression": " false "}, "failed expression: false"),
    ({"expression": "object.nope"},
     "expression 'object.nope' resulted in error: "),
    ({"expression": "authorizer.allowed()"}, "compilation failed"),
])
def test_message_precedence_and_errors(validation: dict[str, Any], expected: str) -> None:
    got = message(vap([validation]))
    assert got is not None
    assert got.startswith(expected) or expected in got


def test_failure_policy_ignore_admits_on_errors_only() -> None:
    assert message(vap([{"expression": "object.nope"}], failurePolicy="Ignore")) is None
    assert message(vap(DENY, failurePolicy="Ignore")) == "no"


def test_variables_are_lazy_and_errors_name_the_variable() -> None:
    variables = [{"name": "broken", "expression": "object.nope"},
                 {"name": "name", "expression": "object.metadata.name"}]
    ok = vap([{"expression": "variables.name == 'p'"}], variables=variables)
    assert message(ok) is None
    bad = vap([{"expression": "variables.broken == 1"}], variables=variables)
    assert "composited variable 'broken' fails to evaluate" in (message(bad) or "")


def test_match_conditions_skip_the_policy_when_false() -> None:
    skip = vap(DENY, matchConditions=[{"name": "c", "expression": "object.metadata.name == 'q'"}])
    assert message(skip) is None
    keep = vap(DENY, matchConditions=[{"name": "c", "expression": "object.metadata.name == 'p'"}])
    assert message(keep) == "no"


def test_reason_sets_the_code() -> None:
    denial = PolicyEvaluator().first_denial(
        [vap([{"expression": "false", "reason": "Forbidden"}])], [binding()], attrs(),
        namespace=NS)
    assert denial is not None
    assert (denial.reason, denial.code) == ("Forbidden", 403)


# --- validationActions and the counter (dispatcher.go, metrics.go) ------------------------------


def outcome(policy: dict[str, Any], *bindings: dict[str, Any], **over: Any) -> Any:
    return PolicyEvaluator().admit([policy], list(bindings) or [binding()], attrs(**over),
                                   namespace=NS)


def checks(result: Any) -> list[tuple[str, str, str, str]]:
    return [(c.policy, c.binding, c.error_type, c.action) for c in result.checks]


def test_warn_admits_with_one_warning_per_failed_validation() -> None:
    two = vap([{"expression": "false", "message": "first"}, {"expression": "true"},
               {"expression": "false", "message": "third"}])
    result = outcome(two, binding(("Warn",)))
    assert result.denial is None
    assert result.warnings == (
        "Validation failed for ValidatingAdmissionPolicy 'pol' with binding 'bind': first",
        "Validation failed for ValidatingAdmissionPolicy 'pol' with binding 'bind': third")
    # A failed validation is `invalid_error` (errors.go ErrorType: only an evaluation that
    # admitted is `no_error`, and those are never counted); the passing one is not counted.
    assert checks(result) == [("pol", "bind", "invalid_error", "warn")] * 2
    assert result.annotations == ()


def test_audit_admits_and_records_the_annotation() -> None:
    result = outcome(vap([{"expression": "true"}, {"expression": "false", "message": "no"}]),
                     binding(("Warn", "Audit")))
    assert result.denial is None
    assert len(result.warnings) == 1
    key, value = result.annotations[0]
    assert key == "validation.policy.admission.k8s.io/validation_failure"
    assert json.loads(value) == [{"message": "no", "policy": "pol", "binding": "bind",
                                  "expressionIndex": 1, "validationActions": ["Warn", "Audit"]}]
    assert checks(result) == [("pol", "bind", "invalid_error", "warn"),
                              ("pol", "bind", "invalid_error", "audit")]
    silent = outcome(vap(DENY), binding(("Audit",)))
    assert (silent.denial, silent.warnings) == (None, ())
    assert checks(silent) == [("pol", "bind", "invalid_error", "audit")]


def test_deny_counts_every_binding_and_reports_the_first() -> None:
    second = {"metadata": {"name": "bind2"}, "spec": {"policyName": "pol",
                                                       "validationActions": ["Deny"]}}
    result = outcome(vap(DENY), second, binding())
    assert result.denial is not None
    assert result.denial.binding == "bind"
    assert checks(result) == [("pol", "bind", "invalid_error", "deny"),
                              ("pol", "bind2", "invalid_error", "deny")]
    assert outcome(vap([{"expression": "true"}])).checks == ()


def test_errors_are_counted_by_type_and_ignored_ones_as_allow() -> None:
    broken = [{"expression": "object.nope.deeper == 1"}]
    failing = outcome(vap(broken))
    assert failing.denial is not None
    assert failing.denial.evaluation == "error"
    assert checks(failing) == [("pol", "bind", "invalid_error", "deny")]
    ignored = outcome(vap(broken, failurePolicy="Ignore"))
    assert ignored.denial is None
    assert checks(ignored) == [("pol", "bind", "invalid_error", "allow")]
    uncompiled = outcome(vap([{"expression": "1 +"}]))
    assert checks(uncompiled) == [("pol", "bind", "compile_error", "deny")]
