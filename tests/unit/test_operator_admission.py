"""The rendering of a Policy as a ValidatingAdmissionPolicy and binding (operator.admission).

What the CEL means is tested by evaluating it (tests/integration/test_sim_admission.py); here:
the objects' shape, what cannot be rendered, and that no input reaches CEL as code.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.model import RULE_LIST_MAX_ENTRIES
from convergerd.operator.admission import (
    Admission,
    RenderError,
    admission_name,
    cel_string,
    render_admission,
    violating_pod,
)
from convergerd.sim.cel import CelRuntime
from convergerd.sim.vap import Attributes, PolicyEvaluator

BOUNDARY_LABEL = "platform.stackship.se/boundary"


def spec(rule: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"policyId": "p1", "boundary": "team-a", "enabled": True, "revision": 3,
            "rule": rule} | over


def test_policy_and_binding_carry_names_labels_and_the_boundary_selector() -> None:
    adm = render_admission(spec({"type": "ForbidLatestTag"}))
    labels = {"app.kubernetes.io/managed-by": "convergerd", BOUNDARY_LABEL: "team-a",
              "platform.stackship.se/policy": "p1"}
    assert admission_name("p1") == "stackship-p1"
    assert adm.policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert adm.binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert adm.policy["kind"] == "ValidatingAdmissionPolicy"
    assert adm.binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert adm.policy["metadata"] == {"name": "stackship-p1", "labels": labels}
    assert adm.binding["metadata"] == {"name": "stackship-p1", "labels": labels}
    assert adm.policy["spec"]["failurePolicy"] == "Fail"
    assert adm.binding["spec"] == {
        "policyName": "stackship-p1",
        "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {BOUNDARY_LABEL: "team-a"}}},
    }


def test_match_constraints_cover_pods_and_the_workload_kinds_on_create_and_update() -> None:
    rules = render_admission(spec({"type": "ForbidLatestTag"})).policy["spec"][
        "matchConstraints"]["resourceRules"]
    covered = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert covered == {
        ("", "pods"), ("", "pods/ephemeralcontainers"), ("apps", "deployments"),
        ("apps", "replicasets"), ("apps", "statefulsets"), ("apps", "daemonsets"),
        ("batch", "jobs"), ("batch", "cronjobs"),
    }
    assert all(rule["operations"] == ["CREATE", "UPDATE"] for rule in rules)


@pytest.mark.parametrize("rule", [
    {"type": "RequiredLabels", "labels": ["team"]},
    {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
    {"type": "ForbidLatestTag"},
])
def test_every_validation_has_a_message_and_compiles(rule: dict[str, Any]) -> None:
    policy = render_admission(spec(rule)).policy["spec"]
    cel = CelRuntime()
    for validation in policy["validations"]:
        assert validation["message"]
        assert cel.compile_error(validation["expression"]) is None
        assert cel.compile_error(validation["messageExpression"]) is None
    for variable in policy["variables"]:
        assert cel.compile_error(variable["expression"]) is None


@pytest.mark.parametrize(("bad", "reason", "words"), [
    ({"rule": {"type": "AllowedComputePlans", "plans": ["small"]}}, "NotDelivered",
     "control plane only"),
    ({"rule": {"type": "Nope"}}, "InvalidRule", "unknown type 'Nope'"),
    ({"rule": {"type": "RequiredLabels", "labels": []}}, "InvalidRule", "non-empty list"),
    ({"rule": {"type": "RequiredLabels",
               "labels": [f"k{i}" for i in range(RULE_LIST_MAX_ENTRIES + 1)]}},
     "InvalidRule", f"at most {RULE_LIST_MAX_ENTRIES}"),
    ({"rule": {"type": "AllowedRegistries", "registries": ["https://r.io"]}}, "InvalidRule",
     "has a scheme"),
    ({"policyId": "Bad_Id"}, "InvalidPolicyId", "not a DNS label"),
    ({"policyId": "x" * 51}, "InvalidPolicyId", "at most 50"),
    ({"boundary": "a b"}, "InvalidBoundary", "not a valid label value"),
    ({"enabled": "yes"}, "InvalidSpec", "spec.enabled"),
    ({"revision": -1}, "InvalidSpec", "spec.revision"),
    ({"extra": 1}, "InvalidSpec", "unknown field"),
])
def test_what_cannot_be_rendered_says_why(bad: dict[str, Any], reason: str, words: str) -> None:
    with pytest.raises(RenderError) as caught:
        render_admission(spec({"type": "ForbidLatestTag"}) | bad)
    assert caught.value.reason == reason
    assert words in str(caught.value)


def test_a_missing_field_is_named() -> None:
    incomplete = spec({"type": "ForbidLatestTag"})
    del incomplete["boundary"]
    with pytest.raises(RenderError, match=r"spec\.boundary: required"):
        render_admission(incomplete)


@pytest.mark.parametrize("hostile", [
    'team") || true || ("',
    "team' || true || '",
    "team\\",
    "a\nb",
])
def test_hostile_label_keys_and_registries_never_render(hostile: str) -> None:
    for rule in ({"type": "RequiredLabels", "labels": [hostile]},
                 {"type": "AllowedRegistries", "registries": [hostile]}):
        with pytest.raises(RenderError) as caught:
            render_admission(spec(rule))
        assert caught.value.reason == "InvalidRule"
    with pytest.raises(RenderError):
        render_admission(spec({"type": "ForbidLatestTag"}, policyId=hostile))
    with pytest.raises(RenderError):
        render_admission(spec({"type": "ForbidLatestTag"}, boundary=hostile))


@given(st.text(max_size=200))
def test_cel_string_is_read_back_as_exactly_the_input(text: str) -> None:
    """Whatever the text, the literal is one CEL string whose value is the text: nothing of
    it can end the literal and become code."""
    assert CelRuntime().evaluate(cel_string(text), {}) == text


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
_RULES = st.one_of(
    _JSON,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["RequiredLabels", "AllowedRegistries", "ForbidLatestTag",
                                  "AllowedComputePlans", "Other"])},
        optional={"labels": st.lists(st.text(max_size=30) | _JSON, max_size=4),
                  "registries": st.lists(st.text(max_size=30) | _JSON, max_size=4),
                  "plans": _JSON},
    ),
)
_SPECS = st.one_of(
    _JSON,
    st.fixed_dictionaries(
        {},
        optional={"policyId": st.sampled_from(["p1", "a-b", ""]) | _JSON,
                  "boundary": st.sampled_from(["team-a", "x.y_z"]) | _JSON,
                  "enabled": _JSON, "revision": _JSON, "rule": _RULES, "other": _JSON},
    ),
)


@given(_SPECS)
def test_any_spec_renders_or_raises_render_error(raw: Any) -> None:
    result: Admission | RenderError
    try:
        result = render_admission(raw)
    except RenderError as exc:
        result = exc
    if isinstance(result, RenderError):
        assert result.reason
        assert str(result)
    else:
        assert isinstance(result, Admission)


@pytest.mark.parametrize("rule", [
    {"type": "RequiredLabels", "labels": ["team", "app.kubernetes.io/managed-by"]},
    {"type": "AllowedRegistries", "registries": ["stackship-probe-0.invalid"]},
    {"type": "AllowedRegistries", "registries": [f"stackship-probe-{n}.invalid"
                                                 for n in range(RULE_LIST_MAX_ENTRIES)]},
    {"type": "ForbidLatestTag"},
])
def test_the_violating_pod_is_denied_by_its_own_policy(rule: dict[str, Any]) -> None:
    adm = render_admission(spec(rule))
    pod = violating_pod(spec(rule), namespace="team-a-apps", name="probe-1")
    assert pod["metadata"]["namespace"] == "team-a-apps"
    assert pod["metadata"]["name"] == "probe-1"
    namespace = {"metadata": {"name": "team-a-apps", "labels": {BOUNDARY_LABEL: "team-a"}}}
    attrs = Attributes(operation="CREATE", group="", version="v1", resource="pods", kind="Pod",
                       namespace="team-a-apps", name="probe-1", object=pod, old_object=None)
    denial = PolicyEvaluator().first_denial([adm.policy], [adm.binding], attrs,
                                            namespace=namespace)
    assert denial is not None
    assert denial.policy == "stackship-p1"


def test_no_violating_pod_for_a_rule_that_is_never_delivered() -> None:
    with pytest.raises(RenderError):
        violating_pod(spec({"type": "AllowedComputePlans", "plans": ["small"]}),
                      namespace="n", name="p")
