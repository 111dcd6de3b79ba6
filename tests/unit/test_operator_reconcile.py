"""The operator's pure decisions: the writes, conditions, status, probe outcomes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from convergerd.admission.render import RenderError
from convergerd.operator.reconcile import (
    ENFORCING,
    INERT,
    PolicyObject,
    carried_verified,
    contains,
    drifted,
    new_status,
    next_probe_in,
    orphans,
    probe_inconclusive,
    probe_outcome,
    ready_condition,
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
