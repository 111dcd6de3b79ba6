"""The Policy object convergerd writes and what a round decides to apply (docs/design.md, "What
lands in a cluster" and "Delivery semantics")."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from convergerd.core.model import BoundaryId, Policy, PolicyId, PolicyRow
from convergerd.core.plan import Bodies, ListedPolicy, Why, plan_cluster
from convergerd.core.render import render_policy, validate_policy


def make_policy(
    pid: str = "p-regs",
    boundary: str = "team-a",
    rule: dict[str, Any] | None = None,
    *,
    enabled: bool = True,
    revision: int = 3,
) -> Policy:
    result = validate_policy(
        PolicyRow(
            id=pid,
            boundary=boundary,
            rule=rule or {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
            enabled=enabled,
            revision=revision,
        )
    )
    assert isinstance(result, Policy)
    return result


def in_cluster(policy: Policy, **status: Any) -> dict[str, Any]:
    """The object as a cluster would list it after our apply: server fields added."""
    obj = copy.deepcopy(render_policy(policy))
    obj["metadata"].update(
        resourceVersion="1234", generation=3, uid="u-1", creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "stackship-platform", "operation": "Apply"}],
    )
    obj["status"] = status or {
        "phase": "Enforcing",
        "observedGeneration": 3,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Installed",
                        "message": "bound", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }
    return obj


def observed(*objects: dict[str, Any]) -> dict[str, ListedPolicy]:
    return {o.name: o for o in (ListedPolicy.from_object(obj) for obj in objects)}


# --- render ------------------------------------------------------------------------------


def test_rendered_object_is_exactly_the_spec_shape() -> None:
    assert render_policy(make_policy()) == {
        "apiVersion": "platform.stackship.se/v1alpha1",
        "kind": "Policy",
        "metadata": {
            "name": "policy-p-regs",
            "labels": {
                "platform.stackship.se/boundary": "team-a",
                "app.kubernetes.io/managed-by": "convergerd",
            },
        },
        "spec": {
            "policyId": "p-regs",
            "boundary": "team-a",
            "enabled": True,
            "revision": 3,
            "rule": {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
        },
    }


@pytest.mark.parametrize(
    ("rule", "rendered"),
    [
        ({"type": "ForbidLatestTag"}, {"type": "ForbidLatestTag"}),
        ({"type": "RequiredLabels", "labels": ["app", "team"]},
         {"type": "RequiredLabels", "labels": ["app", "team"]}),
        ({"type": "AllowedRegistries", "registries": ["a.io", "b.io/x"]},
         {"type": "AllowedRegistries", "registries": ["a.io", "b.io/x"]}),
    ],
)
def test_each_rule_type_renders_its_params(rule: dict[str, Any], rendered: Any) -> None:
    assert render_policy(make_policy(rule=rule))["spec"]["rule"] == rendered


def test_rendered_object_never_carries_status_or_namespace() -> None:
    body = render_policy(make_policy())
    assert "status" not in body
    assert "namespace" not in body["metadata"]


def test_disabled_policy_renders_enabled_false() -> None:
    assert render_policy(make_policy(enabled=False))["spec"]["enabled"] is False


def test_rendering_is_json_plain() -> None:
    # Only JSON types: tuples would be sent as lists anyway, but compare unequal to what is read.
    body = render_policy(make_policy(rule={"type": "RequiredLabels", "labels": ["app"]}))
    assert type(body["spec"]["rule"]["labels"]) is list
    assert type(body["spec"]["policyId"]) is str


# --- plan --------------------------------------------------------------------------------


def test_missing_object_is_applied() -> None:
    p = make_policy()
    [action] = plan_cluster([p], {})
    assert action.why is Why.MISSING
    assert action.policy == p
    assert action.body == render_policy(p)


def test_identical_object_needs_nothing() -> None:
    p = make_policy()
    assert plan_cluster([p], observed(in_cluster(p))) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "revision"), 2),
        (("spec", "enabled"), False),
        (("spec", "boundary"), "team-b"),
        (("spec", "policyId"), "other"),
        (("spec", "rule"), {"type": "AllowedRegistries", "registries": ["evil.example.com"]}),
        (("spec", "rule"), {"type": "ForbidLatestTag"}),
        (("spec", "extra"), "added by hand"),
    ],
)
def test_spec_drift_is_applied(path: tuple[str, str], value: Any) -> None:
    p = make_policy()
    obj = in_cluster(p)
    obj[path[0]][path[1]] = value
    [action] = plan_cluster([p], observed(obj))
    assert action.why is Why.DRIFT
    # The listed object's resourceVersion rides along as the write's precondition.
    expected = render_policy(p)
    expected["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    assert action.body == expected


def test_spec_field_removed_in_cluster_is_drift() -> None:
    p = make_policy()
    obj = in_cluster(p)
    del obj["spec"]["rule"]
    [action] = plan_cluster([p], observed(obj))
    assert action.why is Why.DRIFT


@pytest.mark.parametrize(
    "labels",
    [
        {"app.kubernetes.io/managed-by": "convergerd"},  # boundary label removed
        {"platform.stackship.se/boundary": "team-b", "app.kubernetes.io/managed-by": "convergerd"},
        {"platform.stackship.se/boundary": "team-a"},  # managed-by removed
        {"platform.stackship.se/boundary": "team-a", "app.kubernetes.io/managed-by": "someone"},
    ],
)
def test_our_label_removed_or_changed_is_drift(labels: dict[str, str]) -> None:
    p = make_policy()
    obj = in_cluster(p)
    obj["metadata"]["labels"] = labels
    [action] = plan_cluster([p], observed(obj))
    assert action.why is Why.DRIFT


def test_someone_elses_labels_and_annotations_are_not_drift() -> None:
    p = make_policy()
    obj = in_cluster(p)
    obj["metadata"]["labels"]["team.example.com/owner"] = "alice"
    obj["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    assert plan_cluster([p], observed(obj)) == []


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Error", "conditions": [{"type": "Ready", "status": "False"}]},
        {"phase": "Unsupported"},
        {"phase": "Inert", "observedGeneration": 1},
        {},
    ],
)
def test_status_differences_are_not_drift(status: dict[str, Any]) -> None:
    p = make_policy()
    obj = in_cluster(p)
    obj["status"] = status
    assert plan_cluster([p], observed(obj)) == []


def test_server_metadata_is_not_drift() -> None:
    p = make_policy()
    obj = in_cluster(p)
    obj["metadata"].update(resourceVersion="99999", generation=12, finalizers=["x"])
    assert plan_cluster([p], observed(obj)) == []


def test_a_plan_never_deletes_objects_no_longer_desired() -> None:
    kept, moved = make_policy("p-kept"), make_policy("p-moved", boundary="team-b")
    stranger = in_cluster(make_policy("p-stranger"))
    actions = plan_cluster([kept], observed(in_cluster(kept), in_cluster(moved), stranger))
    assert actions == []  # the objects not desired here stay; a round only adds and updates


def test_plan_covers_only_what_differs_in_a_mixed_cluster() -> None:
    same, drifted, missing = make_policy("same"), make_policy("drifted"), make_policy("missing")
    old = in_cluster(drifted)
    old["spec"]["revision"] = 1
    actions = plan_cluster([same, drifted, missing], observed(in_cluster(same), old))
    assert {(a.policy.id, a.why) for a in actions} == {
        (PolicyId("drifted"), Why.DRIFT),
        (PolicyId("missing"), Why.MISSING),
    }


def test_policy_moved_to_another_boundary_is_drift() -> None:
    p = make_policy(boundary="team-b")
    old = in_cluster(make_policy(boundary="team-a"))
    [action] = plan_cluster([p], observed(old))
    assert action.why is Why.DRIFT
    assert action.body["metadata"]["labels"]["platform.stackship.se/boundary"] == BoundaryId(
        "team-b"
    )


def test_observed_reads_phase_and_ready_condition() -> None:
    obj = in_cluster(make_policy(), phase="Error", observedGeneration=2, conditions=[
        {"type": "Other", "status": "True", "reason": "X", "message": "not this"},
        {"type": "Ready", "status": "False", "reason": "CelCompile", "message": "bad expr"},
    ])
    o = ListedPolicy.from_object(obj)
    assert (o.name, o.phase, o.observed_generation) == ("policy-p-regs", "Error", 2)
    assert (o.ready_status, o.ready_reason, o.ready_message) == ("False", "CelCompile", "bad expr")
    assert (o.resource_version, o.generation) == ("1234", 3)


def test_observed_without_status_has_no_phase() -> None:
    obj = in_cluster(make_policy())
    del obj["status"]
    o = ListedPolicy.from_object(obj)
    assert (o.phase, o.ready_status, o.ready_reason) == (None, None, None)


def test_a_round_renders_each_policy_once_and_a_saved_policy_again() -> None:
    """The round's `Bodies` gives every cluster the same body of a policy, made once; a save
    (a new `Policy`, the same id) is rendered anew, and the plan is what rendering gives."""
    bodies = Bodies()
    p = make_policy()
    assert bodies(p) is bodies(p)
    assert bodies(p) == render_policy(p)
    saved = make_policy(revision=4)
    assert bodies(saved)["spec"]["revision"] == 4
    assert bodies(p)["spec"]["revision"] == 3
    assert plan_cluster([p], observed(in_cluster(p)), bodies) == []
    [action] = plan_cluster([saved], observed(in_cluster(p)), bodies)
    assert action.why is Why.DRIFT
    assert action.body["spec"]["revision"] == 4
