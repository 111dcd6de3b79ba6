"""The rendering of a Policy as a ValidatingAdmissionPolicy and binding (admission.render).

What the CEL means is tested by evaluating it (tests/integration/test_sim_admission.py); here:
the objects' shape, what cannot be rendered, and that no input reaches CEL as code.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.admission.cel import CelRuntime
from convergerd.admission.evaluate import Attributes, PolicyEvaluator
from convergerd.admission.render import (
    Admission,
    ProbeUnsatisfiable,
    RenderError,
    admission_name,
    cel_string,
    render_admission,
    violating_pod,
)
from convergerd.core.model import RULE_LIST_MAX_ENTRIES

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


# --- the probe pod among the other policies of its boundary --------------------------------

NAMESPACE = {"metadata": {"name": "team-a-apps", "labels": {BOUNDARY_LABEL: "team-a"}}}
_EVALUATOR = PolicyEvaluator()


def _denied_by(policy_spec: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Does the admission policy rendered from `policy_spec`, with its binding, deny `pod`?"""
    adm = render_admission(policy_spec)
    attrs = Attributes(operation="CREATE", group="", version="v1", resource="pods", kind="Pod",
                       namespace="team-a-apps", name=pod["metadata"]["name"], object=pod,
                       old_object=None, dry_run=True)
    return bool(_EVALUATOR.evaluate(adm.policy, adm.binding, attrs, namespace=NAMESPACE))


def _assert_only_spec_denies(own: dict[str, Any], others: list[dict[str, Any]]) -> None:
    pod = violating_pod(own, namespace="team-a-apps", name="probe-1", others=others)
    assert _denied_by(own, pod), pod
    for other in others:
        assert not _denied_by(other, pod), (other["policyId"], pod)


LABELS = {"type": "RequiredLabels", "labels": ["app.kubernetes.io/name", "team"]}
REGISTRIES = {"type": "AllowedRegistries",
              "registries": ["registry.team-a.example.com", "mirror.example.com/team-a"]}
LATEST = {"type": "ForbidLatestTag"}
OTHER_RULES = {
    "RequiredLabels": {"type": "RequiredLabels", "labels": ["owner", "team"]},
    "AllowedRegistries": {"type": "AllowedRegistries", "registries": ["mirror.example.com"]},
}


_PAIRS = [(own, other) for own in (LABELS, REGISTRIES, LATEST)
          for other in (LABELS, REGISTRIES, LATEST)
          if not own["type"] == other["type"] == "ForbidLatestTag"]  # unsatisfiable: below


@pytest.mark.parametrize(("own", "other"), _PAIRS,
                         ids=[f"{a['type']}-{b['type']}" for a, b in _PAIRS])
def test_the_probe_pod_violates_only_its_own_policy_for_every_pair_of_rules(
    own: dict[str, Any], other: dict[str, Any]
) -> None:
    """Two policies in one boundary: the pod is denied by its own and admitted by the other,
    also when both have the same type (a different list: one is left to violate)."""
    partner = OTHER_RULES.get(other["type"], other) if own["type"] == other["type"] else other
    _assert_only_spec_denies(spec(own, policyId="own"), [spec(partner, policyId="other")])


def test_the_demo_boundary_team_a_probes_each_policy_apart() -> None:
    """The registries probe carries the required labels; the labels probe comes from an
    allowed registry, pinned; so each is denied by its own policy only."""
    registries = spec(REGISTRIES, policyId="team-a-registries")
    labels = spec(LABELS, policyId="team-a-labels")
    _assert_only_spec_denies(registries, [labels])
    _assert_only_spec_denies(labels, [registries])
    pod = violating_pod(labels, namespace="team-a-apps", name="p", others=[registries])
    image = pod["spec"]["containers"][0]["image"]
    assert image.startswith(("registry.team-a.example.com/", "mirror.example.com/team-a/"))
    assert image.endswith(":1")


def test_the_probe_pod_among_all_three_rules_and_a_path_the_policy_itself_allows() -> None:
    own = spec({"type": "AllowedRegistries",
                "registries": ["mirror.example.com/stackship-probe-0", "registry.example.com"]},
               policyId="own")
    others = [spec({"type": "AllowedRegistries", "registries": ["mirror.example.com"]},
                   policyId="o1"),
              spec(LABELS, policyId="o2"), spec(LATEST, policyId="o3")]
    _assert_only_spec_denies(own, others)
    pod = violating_pod(own, namespace="n", name="p", others=others)
    assert pod["spec"]["containers"][0]["image"] == \
        "mirror.example.com/stackship-probe-1/probe:1"


def test_without_others_the_image_is_from_a_reserved_never_resolving_host() -> None:
    for rule in (LABELS, REGISTRIES, LATEST):
        pod = violating_pod(spec(rule), namespace="n", name="p")
        image = pod["spec"]["containers"][0]["image"]
        assert image.split("/", 1)[0].endswith(".invalid"), image


@pytest.mark.parametrize("mode", ["Warn", "Audit"])
def test_the_probe_pod_passes_warn_and_audit_policies_too_when_it_can(mode: str) -> None:
    """A Warn or Audit policy admits what it fails, but the API server counts the failure
    (`status.admission`) and warns: another policy's probe failing it was counted on it as a
    tenant's admission at every probe. The probe pod passes them when a pod can; one it
    cannot pass (it forbids what this policy's probe must do) is failed, never unsatisfiable."""
    own = spec(LATEST, policyId="own")
    for rule in (LABELS, REGISTRIES):
        pod = violating_pod(own, namespace="n", name="p",
                            others=[spec(rule, policyId="other", enforcement=mode)])
        assert _denied_by(own, pod)
        assert not _denied_by(spec(rule, policyId="other"), pod), (rule, pod)
    pod = violating_pod(own, namespace="n", name="p",
                        others=[spec(LATEST, policyId="other", enforcement=mode)])
    assert _denied_by(own, pod)


def test_others_that_are_not_enforced_in_the_boundary_are_ignored() -> None:
    """Disabled, another boundary, unrenderable or control-plane-only, or this policy itself:
    none of them can deny the probe, so none of them can make it unsatisfiable."""
    own = spec(LATEST, policyId="own")
    ignored = [spec(LATEST, policyId="off", enabled=False),
               spec(LATEST, policyId="elsewhere", boundary="team-b"),
               spec({"type": "Nope"}, policyId="bad"),
               spec({"type": "AllowedComputePlans", "plans": ["small"]}, policyId="cp"),
               spec(LATEST, policyId="own"),
               {"not": "a spec"}]
    pod = violating_pod(own, namespace="n", name="p", others=ignored)
    assert _denied_by(own, pod)


@pytest.mark.parametrize(("own", "others", "named"), [
    (LATEST, [LATEST], ["o0"]),
    (REGISTRIES, [REGISTRIES], ["o0"]),
    # Everything the other allows is under a prefix this one allows too.
    ({"type": "AllowedRegistries", "registries": ["mirror.example.com"]},
     [{"type": "AllowedRegistries", "registries": ["mirror.example.com/team-a"]}], ["o0"]),
    ({"type": "RequiredLabels", "labels": ["team"]}, [LABELS], ["o0"]),
    # Each key is required by one of two others.
    (LABELS, [{"type": "RequiredLabels", "labels": ["team"]},
              {"type": "RequiredLabels", "labels": ["app.kubernetes.io/name", "owner"]}],
     ["o0", "o1"]),
    # The others allow no registry in common: nothing can be created in the boundary.
    (LABELS, [{"type": "AllowedRegistries", "registries": ["a.example.com"]},
              {"type": "AllowedRegistries", "registries": ["b.example.com"]}], ["o0", "o1"]),
])
def test_no_pod_violates_only_this_policy_is_reported_naming_the_others(
    own: dict[str, Any], others: list[dict[str, Any]], named: list[str]
) -> None:
    specs = [spec(rule, policyId=f"o{i}") for i, rule in enumerate(others)]
    with pytest.raises(ProbeUnsatisfiable) as caught:
        violating_pod(spec(own, policyId="own"), namespace="n", name="p", others=specs)
    for pid in named:
        assert pid in str(caught.value)
    assert "team-a" in str(caught.value)


_SMALL_RULES = st.one_of(
    st.just({"type": "ForbidLatestTag"}),
    st.builds(lambda keys: {"type": "RequiredLabels", "labels": keys},
              st.lists(st.sampled_from(["team", "owner", "app.kubernetes.io/name"]),
                       min_size=1, max_size=3, unique=True)),
    st.builds(lambda prefixes: {"type": "AllowedRegistries", "registries": prefixes},
              st.lists(st.sampled_from(["r.example.com", "r.example.com/a", "m.example.com",
                                        "m.example.com/stackship-probe-0", "r.example.com:5000"]),
                       min_size=1, max_size=3, unique=True)),
)


@given(st.lists(_SMALL_RULES, min_size=1, max_size=4))
def test_the_probe_pod_is_denied_by_its_policy_and_admitted_by_the_others_or_unsatisfiable(
    rules: list[dict[str, Any]]
) -> None:
    own, *rest = [spec(rule, policyId=f"p{i}") for i, rule in enumerate(rules)]
    try:
        pod = violating_pod(own, namespace="team-a-apps", name="probe-1", others=rest)
    except ProbeUnsatisfiable:
        # Only another policy of the same type, or others with no registry in common, can
        # leave no pod that violates this one alone.
        types = [o["rule"]["type"] for o in rest]
        assert own["rule"]["type"] in types or types.count("AllowedRegistries") >= 2, rules
        return
    assert _denied_by(own, pod), (own, pod)
    for other in rest:
        assert not _denied_by(other, pod), (other, pod)


@given(st.lists(_SPECS, max_size=4))
def test_any_other_specs_give_a_probe_pod_or_unsatisfiable(others: list[Any]) -> None:
    """The others come from the cluster (any Policy object's spec): whatever they hold, the
    probe gets a pod or ProbeUnsatisfiable, never another error."""
    own = spec({"type": "RequiredLabels", "labels": ["team"]}, policyId="own")
    try:
        pod = violating_pod(own, namespace="team-a-apps", name="probe-1", others=others)
    except ProbeUnsatisfiable:
        return
    assert _denied_by(own, pod)
