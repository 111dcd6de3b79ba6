"""ValidatingAdmissionPolicy evaluation (admission.evaluate), on hand-written policies."""

from __future__ import annotations

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
