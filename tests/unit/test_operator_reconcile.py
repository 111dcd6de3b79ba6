"""The operator's pure decisions: the writes, conditions, status, probe outcomes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from convergerd.admission.render import RenderError
from convergerd.operator.guard import slim
from convergerd.operator.reconcile import (
    ENFORCING,
    INERT,
    Condition,
    PolicyObject,
    carried_verified,
    contains,
    drifted,
    is_admission_name,
    is_transition,
    new_status,
    next_probe_in,
    orphans,
    probe_inconclusive,
    probe_outcome,
    ready_condition,
    repaired,
    settled_verified,
    status_differs,
    timestamp,
    writes_for,
)

T0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=3)


def policy(*, enabled: bool = True, generation: int = 2, status: dict[str, Any] | None = None,
           rule: dict[str, Any] | None = None) -> PolicyObject:
    return PolicyObject.from_object({
        "metadata": {"name": "policy-p1", "uid": "u-1", "generation": generation},
        "spec": {"policyId": "p1", "boundary": "b1", "enabled": enabled,
                 "rule": rule or {"type": "ForbidLatestTag"}},
        "status": status or {},
    })


def test_writes_apply_only_what_differs_and_deletes_the_binding_when_disabled() -> None:
    first = writes_for(policy(), existing_policy=None, existing_binding=None)
    assert first.apply_policy is not None
    assert first.apply_binding is not None
    assert first.phase == ENFORCING
    assert first.apply_policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # What the server holds has more (defaults, server metadata): nothing to apply.
    served_policy = {**first.apply_policy, "status": {}, "metadata": {
        **first.apply_policy["metadata"], "resourceVersion": "9", "generation": 1}}
    again = writes_for(policy(), existing_policy=served_policy,
                       existing_binding=first.apply_binding)
    assert (again.apply_policy, again.apply_binding, again.delete_binding) == (None, None, False)
    off = writes_for(policy(enabled=False), existing_policy=served_policy,
               existing_binding=first.apply_binding)
    assert off.delete_binding
    assert off.apply_binding is None
    assert off.phase == INERT


def test_drift_is_a_write_to_a_policy_already_enforcing_at_this_generation() -> None:
    installed = writes_for(policy(), existing_policy=None, existing_binding=None)
    vap, binding = installed.apply_policy, installed.apply_binding
    enforcing = {"phase": ENFORCING, "observedGeneration": 2}
    # The binding is gone although the status says Enforcing at this generation: drift.
    assert drifted(policy(status=enforcing), writes_for(policy(status=enforcing),
                                                        existing_policy=vap,
                                                        existing_binding=None))
    # Nothing to write: no drift.
    assert not drifted(policy(status=enforcing), writes_for(
        policy(status=enforcing), existing_policy=vap, existing_binding=binding))
    # A new generation, or never Enforcing: the write is the policy's own change.
    older = {"phase": ENFORCING, "observedGeneration": 1}
    assert not drifted(policy(status=older), installed)
    assert not drifted(policy(status={"phase": "Unsupported", "observedGeneration": 2}),
                       installed)
    assert not drifted(policy(), installed)


def test_writes_for_raises_the_renderers_error() -> None:
    with pytest.raises(RenderError) as caught:
        writes_for(policy(rule={"type": "NoSuchRule"}), existing_policy=None,
             existing_binding=None)
    assert caught.value.reason == "InvalidRule"


@pytest.mark.parametrize(("want", "have", "expected"), [
    ({"a": 1}, {"a": 1, "b": 2}, True),
    ({"a": 1}, {"a": 2}, False),
    ({"a": [{"x": 1}]}, {"a": [{"x": 1, "d": 0}]}, True),
    ({"a": [1, 2]}, {"a": [1]}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": 1}, None, False),
])
def test_contains(want: Any, have: Any, expected: bool) -> None:
    assert contains(want, have) is expected


def test_condition_transition_time_moves_only_when_the_status_changes() -> None:
    ready = ready_condition(ENFORCING, name="stackship-p1", boundary="b1")
    first = new_status(policy(), ENFORCING, [ready], T0)
    assert first["observedGeneration"] == 2
    same = new_status(policy(status=first), ENFORCING, [ready], T1)
    assert not status_differs(first, same)
    error = ready_condition("Error", name="stackship-p1", boundary="b1", reason="ApplyFailed",
                            detail="applying failed: 422 ...")
    failed = new_status(policy(status=first), "Error", [error], T1)
    assert status_differs(first, failed)
    assert failed["conditions"][0]["lastTransitionTime"] == timestamp(T1)
    assert same["conditions"][0]["lastTransitionTime"] == timestamp(T0)


def test_probe_outcomes() -> None:
    name = "stackship-p1"
    denied = probe_outcome(
        name=name, boundary="b1", namespace="team-a", admitted=False, status=422,
        message=('422: pods "x" is forbidden: ValidatingAdmissionPolicy \'stackship-p1\' with '
                 "binding 'stackship-p1' denied request: no"), now=T0)
    assert (denied.status, denied.reason, denied.last_probe_time) == (
        "True", "Denied", "2025-01-02T03:04:05Z")
    other = probe_outcome(
        name=name, boundary="b1", namespace="team-a", admitted=False, status=422,
        message="ValidatingAdmissionPolicy 'someone-else' with binding 'x' denied request",
        now=T0)
    assert (other.status, other.reason) == ("False", "ProbeFailed")
    admitted = probe_outcome(name=name, boundary="b1", namespace="team-a", admitted=True,
                             status=None, message="", now=T0)
    assert (admitted.status, admitted.reason) == ("False", "Admitted")
    nowhere = probe_outcome(name=name, boundary="b1", namespace=None, admitted=False,
                            status=None, message="", now=T0)
    assert nowhere.reason == "NoBoundaryNamespace"
    assert "platform.stackship.se/boundary=b1" in nowhere.message


def test_next_probe_counts_from_the_recorded_probe_and_a_new_generation_resets() -> None:
    ready = ready_condition(ENFORCING, name="stackship-p1", boundary="b1")
    probed = probe_outcome(name="stackship-p1", boundary="b1", namespace="ns", admitted=True,
                           status=None, message="", now=T0)
    status = new_status(policy(), ENFORCING, [ready, probed], T0)
    recorded = policy(status=status)
    assert next_probe_in(recorded, now=T1, interval_s=600, first_delay_s=5) == 420
    assert carried_verified(recorded, ENFORCING, 5).reason == "Admitted"
    changed = policy(status=status, generation=3)
    assert carried_verified(changed, ENFORCING, 5).status == "Unknown"
    assert next_probe_in(policy(), now=T1, interval_s=600, first_delay_s=5) == 5


def test_an_inconclusive_probe_is_unknown_carried_and_repeated_at_the_interval() -> None:
    """Not Pending: the policy is not probed again every few seconds, and the status does not
    flap between Pending and ProbeInconclusive."""
    ready = ready_condition(ENFORCING, name="stackship-p1", boundary="b1")
    why = "every label p1 requires is required by p2 in boundary b1 too"
    found = probe_inconclusive(name="stackship-p1", namespace="ns", why=why, now=T0)
    assert (found.status, found.reason) == ("Unknown", "ProbeInconclusive")
    assert "p2" in found.message
    assert found.last_probe_time == timestamp(T0)
    recorded = policy(status=new_status(policy(), ENFORCING, [ready, found], T0))
    carried = carried_verified(recorded, ENFORCING, 5)
    assert (carried.status, carried.reason) == ("Unknown", "ProbeInconclusive")
    assert next_probe_in(recorded, now=T1, interval_s=600, first_delay_s=5) == 420
    pending = policy(status=new_status(policy(), ENFORCING, [
        ready, carried_verified(policy(), ENFORCING, 5)], T0))
    assert next_probe_in(pending, now=T1, interval_s=600, first_delay_s=5) == 5


def test_orphans_are_ours_without_a_policy() -> None:
    ours = {"app.kubernetes.io/managed-by": "convergerd"}
    existing: list[dict[str, Any]] = [
        {"metadata": {"name": "stackship-p1", "labels": ours}},
        {"metadata": {"name": "stackship-gone", "labels": ours}},
        {"metadata": {"name": "stackship-foreign"}},
        {"metadata": {"name": "other", "labels": ours}},
        {"metadata": "garbage"},
    ]
    assert orphans(existing, [policy()]) == ["stackship-gone"]


def test_a_policy_with_wrong_types_decodes_as_absent_fields() -> None:
    odd = PolicyObject.from_object({"metadata": {"name": "policy-x", "generation": "2"},
                                    "spec": {"policyId": 7}, "status": {"conditions": "no"}})
    assert odd.generation is None
    assert odd.policy_id is None
    assert odd.conditions == ()


def test_a_probe_time_in_the_future_is_no_probe() -> None:
    """lastProbeTime 9999-...: not a reason to wait until then; probed as never probed."""
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    forged = policy(status={"phase": "Enforcing", "observedGeneration": 2, "conditions": [
        {"type": "Verified", "status": "True", "reason": "Denied", "observedGeneration": 2,
         "lastProbeTime": "9999-12-31T23:59:59Z"}]})
    assert next_probe_in(forged, now=now, interval_s=600.0, first_delay_s=10.0) == 10.0
    skewed = policy(status={"phase": "Enforcing", "observedGeneration": 2, "conditions": [
        {"type": "Verified", "status": "True", "reason": "Denied", "observedGeneration": 2,
         "lastProbeTime": "2026-01-01T00:00:30Z"}]})  # a clock 30 s ahead: believed ...
    # ... but the next probe is never more than one interval away.
    assert next_probe_in(skewed, now=now, interval_s=600.0, first_delay_s=10.0) == 600.0


# -- quiet when nothing changes (issue 35, item 5) ---------------------------------------------

HEARTBEAT_S = 1500.0


READY = ready_condition(ENFORCING, name="stackship-p1", boundary="b1")


def _condition(status: str, reason: str, message: str, at: dt.datetime) -> Condition:
    return Condition("Verified", status, reason, message, timestamp(at))


def verified_on(probed: dt.datetime, *, message: str = "denied in team-a",
                generation: int = 2) -> PolicyObject:
    """A Policy whose status the operator wrote with a probe at `probed` (Ready and Verified)."""
    unwritten = policy(generation=generation)
    status = new_status(unwritten, ENFORCING,
                        [READY, _condition("True", "Denied", message, probed)], T0)
    return policy(generation=2, status=status)


def found(at: dt.datetime, *, message: str = "denied in team-a", status: str = "True",
          reason: str = "Denied") -> Condition:
    return _condition(status, reason, message, at)


@pytest.mark.parametrize(("known", "probe", "kept"), [
    # the same verdict, probed within the heartbeat: the known condition, as written
    (verified_on(T0), found(T1), True),
    # the heartbeat is due: the new probe time
    (verified_on(T0), found(T0 + dt.timedelta(seconds=HEARTBEAT_S)), False),
    # a different verdict, message, or generation: a transition
    (verified_on(T0), found(T1, status="False", reason="Admitted"), False),
    (verified_on(T0), found(T1, message="denied in team-b"), False),
    (verified_on(T0, generation=1), found(T1), False),
    # a probe time after now (forged, or a clock far off) is no probe
    (verified_on(T1 + dt.timedelta(seconds=5)), found(T1), False),
    # nothing known
    (policy(), found(T1), False),
])
def test_a_probe_that_confirms_the_known_verdict_writes_nothing(
    known: PolicyObject, probe: Condition, kept: bool
) -> None:
    now = dt.datetime.strptime(str(probe.last_probe_time),
                               "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    settled = settled_verified(probe, known, now=now, heartbeat_s=HEARTBEAT_S)
    assert (settled.status, settled.reason, settled.message) == (
        probe.status, probe.reason, probe.message)
    status = new_status(known, ENFORCING, [READY, settled], now)
    assert status_differs(known.status, status) is not kept
    if not kept:
        assert settled.last_probe_time == probe.last_probe_time


def test_a_heartbeat_is_no_transition_but_a_new_verdict_is() -> None:
    ready = READY
    known = verified_on(T0)
    current = new_status(known, ENFORCING, [ready, _condition("True", "Denied",
                                                              "denied in team-a", T0)], T0)
    held = PolicyObject.from_object({**_raw(known), "status": current})
    beat = new_status(held, ENFORCING, [ready, _condition("True", "Denied", "denied in team-a",
                                                          T1)], T1)
    assert status_differs(current, beat)
    assert not is_transition(current, beat)
    admitted = new_status(held, ENFORCING, [ready, _condition("False", "Admitted", "ADMITTED",
                                                              T1)], T1)
    assert is_transition(current, admitted)


def _raw(p: PolicyObject) -> dict[str, Any]:
    return {"metadata": {"name": p.name, "uid": p.uid, "generation": p.generation},
            "spec": dict(p.spec)}


# -- repairs (issue 35, item 4) ------------------------------------------------------------------


def served(body: dict[str, Any], *managers: str) -> dict[str, Any]:
    """`body` as the server holds it, written by these field managers."""
    entries: list[dict[str, Any]] = [
        {"manager": m, "operation": "Apply" if m == "stackship-operator" else "Update",
         "apiVersion": "admissionregistration.k8s.io/v1", "fieldsType": "FieldsV1",
         "fieldsV1": {}} for m in managers]
    return {**body, "metadata": {**body["metadata"], "managedFields": entries}}


def test_a_repair_is_an_object_gone_or_edited_by_someone_else() -> None:
    settled = policy(status={"phase": ENFORCING, "observedGeneration": 2})
    first = writes_for(settled, existing_policy=None, existing_binding=None)
    assert first.apply_policy is not None
    assert first.apply_binding is not None
    vap = served(first.apply_policy, "stackship-operator")
    # The binding deleted by hand: put back, a repair.
    todo = writes_for(settled, existing_policy=vap, existing_binding=None)
    assert repaired(settled, todo, existing_policy=vap, existing_binding=None) == ("binding",)
    # Its validationActions edited with kubectl: a field of ours is kubectl-edit's now.
    edited = served({**first.apply_binding, "spec": {**first.apply_binding["spec"],
                                                     "validationActions": ["Warn"]}},
                    "stackship-operator", "kubectl-edit")
    todo = writes_for(settled, existing_policy=vap, existing_binding=edited)
    assert repaired(settled, todo, existing_policy=vap, existing_binding=edited) == ("binding",)
    # The API server's own status writer (a VAP's type checking) is no one else.
    checked = served(first.apply_policy, "stackship-operator")
    checked["metadata"]["managedFields"].append(
        {"manager": "kube-apiserver", "operation": "Update", "subresource": "status"})
    checked["spec"] = {**checked["spec"], "failurePolicy": "Ignore"}
    todo = writes_for(settled, existing_policy=checked, existing_binding=first.apply_binding)
    assert repaired(settled, todo, existing_policy=checked,
                    existing_binding=first.apply_binding) == ()


def test_first_writes_and_a_new_spec_are_no_repairs() -> None:
    fresh = policy()
    todo = writes_for(fresh, existing_policy=None, existing_binding=None)
    assert repaired(fresh, todo, existing_policy=None, existing_binding=None) == ()
    saved_again = policy(generation=3, status={"phase": ENFORCING, "observedGeneration": 2})
    todo = writes_for(saved_again, existing_policy=None, existing_binding=None)
    assert repaired(saved_again, todo, existing_policy=None, existing_binding=None) == ()


def test_the_guard_keeps_a_name_and_a_version_of_our_objects_only() -> None:
    big = {"metadata": {"name": "stackship-p1", "resourceVersion": "7",
                        "annotations": {"x": "y" * 10_000}}, "spec": {"a": ["b"] * 1000}}
    assert slim(big) == {"metadata": {"name": "stackship-p1", "resourceVersion": "7"}}
    assert slim({"metadata": {"name": "stackship-../x"}}) is None
    assert slim({"metadata": {"name": "someone-elses"}}) is None
    assert is_admission_name("stackship-p1")
    assert not is_admission_name("stackship-")
