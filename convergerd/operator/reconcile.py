"""The operator's decisions, pure (no I/O; time passed in): from a Policy and what exists in the
cluster, the writes to make and the status to report.

- `PolicyObject.from_object`: a Policy as the cluster sent it, decoded defensively (wrong types
  read as absent).
- `writes_for`: the `OperatorWrites`, the admission policy and binding to apply (only when
  what exists differs in a field we set), the binding to delete, or the render error;
  `drifted`: whether those writes repair objects changed by someone else (the probe then runs
  first).
- `ready_condition` / `verified_condition` / `new_status`: the status, with Kubernetes'
  condition rule (lastTransitionTime moves only when the condition's status changes), and
  `status_differs` so an unchanged status is never written; `settled_verified` keeps a
  confirmed verdict as it was written (its probe time moves only at the heartbeat), and
  `is_transition` tells a change from a heartbeat.
- `repaired`: which admission objects a reconcile puts back after someone else deleted or
  edited them (counted, `convergerd_operator_repairs_total{kind}`).
- `probe_outcome`: what a dry-run create of a violating pod proved, for the policy's mode
  (Deny: denied by it; Warn: admitted with its warning; Audit: admitted with neither, its
  binding installed with `[Audit]`); `probe_inconclusive`: no
  pod violates only this policy (other policies of the boundary require what it forbids).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergerd.admission.exceptions import render_excepted
from convergerd.admission.render import (
    VALIDATION_ACTIONS,
    Admission,
    RenderError,
    admission_name,
)
from convergerd.core.decode import (
    MAX_MESSAGE_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    FieldReader,
    clean_text,
    in_the_future,
    rfc3339,
)
from convergerd.core.model import (
    DEFAULT_ENFORCEMENT,
    Enforcement,
    RuleError,
    check_boundary_id,
    check_policy_id,
)

KubeObject = dict[str, Any]

FIELD_MANAGER = "stackship-operator"
POLICY_API_VERSION = "platform.stackship.se/v1alpha1"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "convergerd"
POLICY_LABEL = "platform.stackship.se/policy"
BOUNDARY_LABEL = "platform.stackship.se/boundary"
NAME_PREFIX = "stackship-"
# What the operator lists to find admission objects it made (and those left by deleted Policies).
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

ENFORCING, INERT, UNSUPPORTED, ERROR = "Enforcing", "Inert", "Unsupported", "Error"
READY, VERIFIED = "Ready", "Verified"
TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


def timestamp(moment: dt.datetime) -> str:
    """RFC3339 in UTC with second precision, as Kubernetes writes condition times."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: object) -> dt.datetime | None:
    """A condition time read back, in UTC; None when it is not one (`decode.rfc3339`)."""
    return rfc3339(text)


# --- the Policy, decoded ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyObject:
    name: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    conditions: tuple[Mapping[str, Any], ...]  # string fields (and observedGeneration) only
    # spec.policyId and spec.boundary, only when valid ids: the one builds request paths and
    # object names, the other the namespace selector. None otherwise, and `invalid` says why.
    policy_id: str | None
    enabled: bool
    boundary: str | None = None
    invalid: tuple[str, str] | None = None  # (reason, message) for the Ready condition

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PolicyObject:
        r = FieldReader()
        meta = r.mapping(obj, "metadata", "metadata")
        spec = r.mapping(obj, "spec", "spec")
        status = r.mapping(obj, "status", "status")
        conditions = tuple(
            {k: v for k, v in c.items()
             if isinstance(v, str) or (k == "observedGeneration" and isinstance(v, int))}
            for c in r.sequence(status, "conditions", "status.conditions")
            if isinstance(c, Mapping) and isinstance(c.get("type"), str))
        policy_id, boundary, invalid = _ids(spec)
        return cls(
            name=r.text(meta, "name", "metadata.name", MAX_NAME_CHARS) or "",
            uid=r.text(meta, "uid", "metadata.uid", MAX_NAME_CHARS) or "",
            generation=r.integer(meta, "generation", "metadata.generation"),
            spec=spec,
            status=status,
            conditions=conditions,
            policy_id=policy_id,
            enabled=spec.get("enabled") is not False,  # the CRD defaults it to true
            boundary=boundary,
            invalid=invalid,
        )

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == kind), None)


def _ids(spec: Mapping[str, Any]) -> tuple[str | None, str | None, tuple[str, str] | None]:
    """spec.policyId and spec.boundary checked against the model's id rules before any use:
    the cluster's copy of the CRD schema is not ours to rely on, and a policyId such as
    `x/../../api/v1/namespaces/kube-system/secrets?watch=1&x=` would otherwise become a
    request path. (policy id, boundary, why not) with None for what is not valid."""
    policy_id: Any = spec.get("policyId")
    boundary: Any = spec.get("boundary")
    invalid = None
    try:
        check_boundary_id(boundary)
    except RuleError as exc:
        boundary, invalid = None, ("InvalidBoundary", f"spec.{exc}")
    try:
        check_policy_id(policy_id)
    except RuleError as exc:
        policy_id, invalid = None, ("InvalidPolicyId", f"spec.policyId: {exc}")
    return policy_id, boundary, invalid


# --- what to write ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OperatorWrites:
    name: str  # stackship-<policy id>
    apply_policy: KubeObject | None  # None: what exists already has every field we set
    apply_binding: KubeObject | None
    delete_binding: bool
    phase: str  # when every write succeeds: Enforcing or Inert
    # The mode of the binding once written (`status.enforcementAction`); None: no binding.
    enforcement: Enforcement | None = None


def owned(body: Mapping[str, Any], policy: PolicyObject) -> KubeObject:
    """`body` with our labels and an owner reference to the Policy (garbage collection)."""
    out = dict(body)
    meta = dict(out.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY,
                      POLICY_LABEL: policy.policy_id or ""}
    meta["ownerReferences"] = [{
        "apiVersion": POLICY_API_VERSION, "kind": "Policy", "name": policy.name,
        "uid": policy.uid, "controller": True, "blockOwnerDeletion": True,
    }]
    out["metadata"] = meta
    return out


def contains(want: object, have: object) -> bool:
    """Does `have` hold every field of `want` with the same value? Maps may hold more (server
    defaults, metadata the server sets); lists must match element by element."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            k in have and contains(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return (isinstance(have, list) and len(want) == len(have)
                and all(contains(w, h) for w, h in zip(want, have, strict=True)))
    return want == have and type(want) is type(have)


def render(policy: PolicyObject, now: dt.datetime | None = None) -> Admission:
    """The admission objects for `policy`, owned by it, with the exceptions honoured at `now`
    (None: none, the strict reading); `RenderError` when it cannot be."""
    if policy.policy_id is None:
        raise RenderError("InvalidSpec", "spec.policyId is missing: the Policy cannot be named")
    rendered = render_excepted(policy.spec, now)
    return Admission(policy=owned(rendered.policy, policy),
                     binding=owned(rendered.binding, policy), enforcement=rendered.enforcement)


def writes_for(policy: PolicyObject, *, existing_policy: Mapping[str, Any] | None,
               existing_binding: Mapping[str, Any] | None,
               now: dt.datetime | None = None) -> OperatorWrites:
    """The writes that bring the cluster to `policy`, its exceptions honoured at `now`
    (`render`); raises `RenderError`."""
    admission = render(policy, now)
    name = admission_name(policy.policy_id or "")
    apply_policy = None if (contains(admission.policy, existing_policy)
                            and not _lapsed_conditions(admission.policy, existing_policy)
                            ) else admission.policy
    if policy.enabled:
        apply_binding = (None if contains(admission.binding, existing_binding)
                         else admission.binding)
        return OperatorWrites(name, apply_policy, apply_binding, delete_binding=False,
                              phase=ENFORCING, enforcement=admission.enforcement)
    return OperatorWrites(name, apply_policy, None,
                          delete_binding=existing_binding is not None, phase=INERT)


def _lapsed_conditions(want: Mapping[str, Any], have: Mapping[str, Any] | None) -> bool:
    """`have` holds matchConditions (exceptions) that `want` no longer has: `contains` cannot
    see a field we stopped setting, and the apply without it is what removes it."""
    spec = have.get("spec") if isinstance(have, Mapping) else None
    return (isinstance(spec, Mapping) and bool(spec.get("matchConditions"))
            and "matchConditions" not in want["spec"])


def drifted(policy: PolicyObject, todo: OperatorWrites) -> bool:
    """Were the admission objects of a policy already reported Enforcing at this generation
    changed since (a binding deleted or edited by hand)? Then what is enforced now is probed
    before the repair, so the drift is seen in `Verified`, not silently mended."""
    return (todo.phase == ENFORCING and policy.status.get("phase") == ENFORCING
            and policy.generation is not None
            and policy.status.get("observedGeneration") == policy.generation
            and (todo.apply_policy is not None or todo.apply_binding is not None))


def repaired(policy: PolicyObject, todo: OperatorWrites, *,
             existing_policy: Mapping[str, Any] | None,
             existing_binding: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The admission objects (`policy`, `binding`) these writes put back after someone else
    deleted or edited them: the Policy had already reported this phase at this generation (so
    they were in place), and the object is gone, or another field manager changed it (a field
    we set is theirs now). A new operator version rendering differently is no repair."""
    if (policy.status.get("phase") != todo.phase or policy.generation is None
            or policy.status.get("observedGeneration") != policy.generation):
        return ()
    kinds = []
    if todo.apply_policy is not None and _tampered(existing_policy):
        kinds.append("policy")
    if todo.delete_binding or (todo.apply_binding is not None and _tampered(existing_binding)):
        kinds.append("binding")
    return tuple(kinds)


def _tampered(existing: Mapping[str, Any] | None) -> bool:
    """Gone, or written by a field manager other than ours (the status subresource is the API
    server's own: a ValidatingAdmissionPolicy's type checking)."""
    if existing is None:
        return True
    meta = existing.get("metadata")
    entries = meta.get("managedFields") if isinstance(meta, Mapping) else None
    if not isinstance(entries, list):
        return False
    return any(isinstance(e, Mapping) and e.get("manager") != FIELD_MANAGER
               and not e.get("subresource") for e in entries)


def orphans(existing: Iterable[Mapping[str, Any]],
            policies: Iterable[PolicyObject]) -> list[str]:
    """Names of our admission objects (prefix and label) whose Policy is gone: on a server
    without garbage collection nothing else removes them."""
    wanted = {admission_name(p.policy_id) for p in policies if p.policy_id}
    found = []
    for obj in existing:
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            continue
        name, labels = meta.get("name"), meta.get("labels")
        if (isinstance(name, str) and is_admission_name(name)
                and name not in wanted  # a name from the cluster
                # becomes a DELETE's path: only the names we make, `stackship-<policy id>`
                and isinstance(labels, Mapping) and labels.get(MANAGED_BY_LABEL) == MANAGED_BY):
            found.append(name)
    return sorted(found)


def is_admission_name(name: object) -> bool:
    """Is `name` one we make, `stackship-<valid policy id>`?"""
    if not isinstance(name, str) or not name.startswith(NAME_PREFIX):
        return False
    try:
        check_policy_id(name.removeprefix(NAME_PREFIX))
    except RuleError:
        return False
    return True


# --- conditions and status ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_probe_time: str | None = None


def ready_condition(phase: str, *, name: str, boundary: str, detail: str = "",
                    reason: str | None = None) -> Condition:
    """The Ready condition for a phase; `detail`/`reason` say why for Error and Unsupported."""
    if phase == ENFORCING:
        return Condition(READY, TRUE, "Enforcing",
                         f"ValidatingAdmissionPolicy {name} and its binding are installed: pods "
                         f"and workloads in namespaces labelled {BOUNDARY_LABEL}={boundary} "
                         "are checked on create and update")
    if phase == INERT:
        return Condition(READY, TRUE, "Disabled",
                         f"the policy is disabled: ValidatingAdmissionPolicy {name} is installed "
                         "without a binding, so nothing is checked; set spec.enabled to true "
                         "(save it in the portal) to enforce it")
    if phase == UNSUPPORTED:
        return Condition(READY, FALSE, "ValidatingAdmissionPolicyUnsupported",
                         "this cluster does not serve admissionregistration.k8s.io/v1 "
                         f"validatingadmissionpolicies (Kubernetes 1.30 or later needed){detail}: "
                         "nothing is enforced; upgrade the cluster, the operator checks again "
                         "by itself")
    return Condition(READY, FALSE, reason or "Error", detail or "the policy cannot be enforced")


def verified_pending(phase: str, delay_s: float) -> Condition:
    if phase == ENFORCING:
        return Condition(VERIFIED, UNKNOWN, "Pending",
                         f"the first enforcement probe runs within {delay_s:g} s")
    return Condition(VERIFIED, FALSE, "NotEnforcing",
                     f"nothing to verify: the policy is {phase}")


def condition_key(cond: Condition) -> tuple[str, str, str | None]:
    """What identifies a Verified condition as one this replica wrote: its verdict and the
    probe time (never in the future: the operator stamps its own probes)."""
    return cond.status, cond.reason, cond.last_probe_time


def carried_verified(policy: PolicyObject, phase: str, delay_s: float) -> Condition:
    """The Verified condition between probes: the last probe's result while the policy stays
    Enforcing at the generation that was probed; Pending (a probe soon) otherwise."""
    existing = policy.condition(VERIFIED)
    if (phase == ENFORCING and policy.status.get("phase") == ENFORCING and existing is not None
            and (existing.get("status") in (TRUE, FALSE) or _inconclusive(existing))
            and existing.get("reason") != "NotEnforcing"
            and existing.get("observedGeneration") == policy.generation):
        return Condition(VERIFIED, str(existing["status"]), str(existing.get("reason", "")),
                         str(existing.get("message", "")), existing.get("lastProbeTime"))
    return verified_pending(phase, delay_s)


def _condition_dict(cond: Condition, previous: Mapping[str, Any] | None,
                    generation: int | None, now: dt.datetime) -> dict[str, Any]:
    changed = previous is None or previous.get("status") != cond.status
    since = previous.get("lastTransitionTime") if previous is not None else None
    out: dict[str, Any] = {
        "type": cond.type,
        "status": cond.status,
        "reason": clean_text(cond.reason, MAX_REASON_CHARS) or "Unknown",
        "message": clean_text(cond.message, MAX_MESSAGE_CHARS * 4),
        "lastTransitionTime": timestamp(now) if changed or not since else since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    probe = cond.last_probe_time
    if probe is None and previous is not None and previous.get("lastProbeTime"):
        probe = previous.get("lastProbeTime")  # a pending or failed write keeps the last probe
    if probe is not None:
        out["lastProbeTime"] = probe
    return out


def settled_verified(found: Condition, policy: PolicyObject, *, now: dt.datetime,
                     heartbeat_s: float) -> Condition:
    """What a probe that found `found` reports: the Verified condition already on the Policy
    when the probe only confirmed it (the same status, reason and message, at this generation)
    and its probe time is younger than `heartbeat_s` (and not after `now`: the operator stamps
    its own probes, a later time is forged or broken); `found` otherwise. So a probe that
    confirms what was known writes nothing, and the probe time moves once a heartbeat."""
    known = policy.condition(VERIFIED)
    if known is None or found.last_probe_time is None:
        return found
    last = parse_timestamp(known.get("lastProbeTime"))
    if (last is None or last > now or (now - last).total_seconds() >= heartbeat_s
            or policy.generation is None
            or known.get("observedGeneration") != policy.generation
            or (known.get("status"), known.get("reason"), known.get("message"))
            != (found.status, found.reason, found.message)):
        return found
    return Condition(VERIFIED, found.status, found.reason, found.message,
                     known.get("lastProbeTime"))


def is_transition(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Does `new` say something `current` does not, apart from a condition's lastProbeTime
    (the heartbeat, see `settled_verified`)? A transition is logged at INFO, a heartbeat not."""
    conditions = new.get("conditions")
    if isinstance(conditions, list):
        new = {**new, "conditions": [
            {k: v for k, v in c.items() if k != "lastProbeTime"} for c in conditions]}
    return status_differs(current, new)


ENFORCEMENT_ACTION = "enforcementAction"


def new_status(policy: PolicyObject, phase: str, conditions: Sequence[Condition],
               now: dt.datetime, *, enforcement: Enforcement | None = None) -> dict[str, Any]:
    """The status to report: our conditions replace theirs by type, others are kept;
    `enforcementAction`, the mode of the binding in force (`enforcement`), when there is
    one."""
    ours = {c.type for c in conditions}
    kept = [dict(c) for c in policy.conditions if c.get("type") not in ours]
    made = [_condition_dict(c, policy.condition(c.type), policy.generation, now)
            for c in conditions]
    status: dict[str, Any] = {"phase": phase, "conditions": made + kept}
    if enforcement is not None:
        status[ENFORCEMENT_ACTION] = enforcement.value
    if policy.generation is not None:
        status["observedGeneration"] = policy.generation
    return status


def status_differs(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when `new` says something `current` does not, or no longer says the mode
    `current` shows (the binding is gone): a write is needed (the server-side apply drops
    what we no longer send)."""
    gone = ENFORCEMENT_ACTION in current and ENFORCEMENT_ACTION not in new
    return gone or not contains(dict(new), current)


# --- the enforcement probe ----------------------------------------------------------------

DENIED, ADMITTED, NO_NAMESPACE, PROBE_FAILED = "Denied", "Admitted", "NoBoundaryNamespace", \
    "ProbeFailed"
PROBE_INCONCLUSIVE = "ProbeInconclusive"
# The verdicts of the other modes: admitted with the policy's warning (Warn), admitted with
# neither a denial nor a warning from an installed [Audit] binding (Audit), and the policy's
# binding doing something other than its mode asks (denying under Warn, warning under Audit).
WARNED, AUDIT_ONLY, WRONG_MODE = "Warned", "AuditOnly", "WrongMode"


def _inconclusive(condition: Mapping[str, Any]) -> bool:
    """A probe that could not be made (Unknown, ProbeInconclusive) is a probe's result too:
    carried and repeated at the probe interval, not Pending."""
    return condition.get("status") == UNKNOWN and condition.get("reason") == PROBE_INCONCLUSIVE


def probe_inconclusive(*, name: str, namespace: str, why: str, now: dt.datetime) -> Condition:
    """Verified Unknown: no pod violates only this policy in its boundary (`why` names the
    policies that would deny it first), so no probe can prove or disprove enforcement."""
    return Condition(VERIFIED, UNKNOWN, PROBE_INCONCLUSIVE,
                     f"not probed in namespace {namespace}: {why}; {name} is installed but its "
                     "enforcement cannot be shown apart from theirs", timestamp(now))


def denied_by(message: str, name: str) -> bool:
    """Did kube-apiserver's admission deny the request with ValidatingAdmissionPolicy `name`?

    The one decision made on message text, on purpose: the denial's Status has no field naming
    the policy, only the message the admission dispatcher builds
    (`ValidatingAdmissionPolicy '<p>' with binding '<b>' denied request: ...`)."""
    return f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request" in message


def warned_by(warnings: Sequence[str], name: str) -> str | None:
    """The warning kube-apiserver's admission gave for ValidatingAdmissionPolicy `name` under
    a Warn binding, if any (`Validation failed for ValidatingAdmissionPolicy '<p>' with binding
    '<b>': ...`): on message text for the reason `denied_by` is."""
    prefix = f"Validation failed for ValidatingAdmissionPolicy '{name}' with binding '{name}': "
    return next((w for w in warnings if w.startswith(prefix)), None)


def _check_objects(name: str) -> str:
    return ("check the ValidatingAdmissionPolicy and binding (kubectl get "
            f"validatingadmissionpolicy,validatingadmissionpolicybinding {name})")


def probe_outcome(*, name: str, boundary: str, namespace: str | None, admitted: bool,
                  status: int | None, message: str, now: dt.datetime,
                  enforcement: Enforcement = DEFAULT_ENFORCEMENT, warnings: Sequence[str] = (),
                  installed: Enforcement | None = None) -> Condition:
    """The Verified condition from one probe: a dry-run create of a violating pod in
    `namespace` (None: no namespace of the boundary exists) that was `admitted` (with the
    answer's `warnings`), or refused with `status` (None: no answer) and `message`; judged
    by the policy's mode, `enforcement`. For Audit, `installed` is the mode of the binding
    read back with the probe (None: no binding, or its admission policy is gone)."""
    at = timestamp(now)
    if namespace is None:
        return Condition(VERIFIED, FALSE, NO_NAMESPACE,
                         f"no namespace is labelled {BOUNDARY_LABEL}={boundary}, so nothing was "
                         "probed (and nothing is checked in this cluster yet)", at)
    denied = not admitted and status is not None and denied_by(message, name)
    if admitted or denied:
        warned = warned_by(warnings, name) if admitted else None
        return _judged(name, namespace, enforcement, denied=denied, warned=warned,
                       installed=installed, at=at)
    why = f"HTTP {status}: {message}" if status is not None else message
    return Condition(VERIFIED, FALSE, PROBE_FAILED,
                     f"the dry-run create of a violating pod in namespace {namespace} was not "
                     f"answered by {name}: {why}", at)


def _judged(name: str, namespace: str, enforcement: Enforcement, *, denied: bool,
            warned: str | None, installed: Enforcement | None, at: str) -> Condition:
    """A probe answered by admission (`denied` by this policy, or admitted, `warned` by it or
    not) against the mode it should show."""
    if enforcement is not Enforcement.DENY and (denied or (
            warned is not None and enforcement is Enforcement.AUDIT)):
        did = "denied" if denied else "admitted with a warning"
        return Condition(VERIFIED, FALSE, WRONG_MODE,
                         f"a pod violating the policy was {did} by {name} in namespace "
                         f"{namespace} (dry-run) although its mode is {enforcement.value}: its "
                         "binding's validationActions are not the mode's "
                         f"({_check_objects(name)})", at)
    if denied:
        return Condition(VERIFIED, TRUE, DENIED,
                         f"a pod violating the policy was denied by {name} in namespace "
                         f"{namespace} (dry-run)", at)
    if enforcement is Enforcement.WARN and warned is not None:
        return Condition(VERIFIED, TRUE, WARNED,
                         f"a pod violating the policy was admitted with {name}'s warning in "
                         f"namespace {namespace} (dry-run; mode Warn: nothing is denied): "
                         f"{warned}", at)
    if enforcement is Enforcement.AUDIT and installed is Enforcement.AUDIT:
        return Condition(VERIFIED, TRUE, AUDIT_ONLY,
                         f"{name} and its binding are installed with validationActions [Audit], "
                         "and a pod violating the policy was admitted in namespace "
                         f"{namespace} without a denial or a warning (dry-run; mode Audit: "
                         "failures go to the API server's audit log, which no client sees)",
                         at)
    how, does = {
        Enforcement.DENY: ("", "enforce"),
        Enforcement.WARN: (" without its warning", "check"),
        Enforcement.AUDIT: (" and its binding is not installed with [Audit]", "audit"),
    }[enforcement]
    return Condition(VERIFIED, FALSE, ADMITTED,
                     f"a pod violating the policy was ADMITTED by a dry-run create in "
                     f"namespace {namespace}{how}: {name} does not {does} it; "
                     f"{_check_objects(name)}", at)


def probe_counted(verified: Condition, enforcement: Enforcement, *, name: str, message: str,
                  warnings: Sequence[str], unread: bool = False) -> tuple[str, ...]:
    """The `enforcement_action`s under which kube-apiserver's check_total counted one probe of
    ValidatingAdmissionPolicy `name` (its answer: the refusal's `message`, the `warnings`).

    A probe that proved its mode (`Denied`, `Warned`, `AuditOnly`) failed the binding as it is
    rendered for `enforcement`, once under each of its validationActions (Warn comes with
    Audit). Any other verdict proves only what the answer shows: a denial by `name` was counted
    `deny`, its warning `warn`; an `audit` no client sees is not known, so not taken out.
    An answer that came but could not be read (`unread`: garbage headers or body, past a
    client's limits) was judged by admission all the same: counted as the binding would, or
    its count would be reported as a tenant's."""
    if unread or (verified.status == TRUE and verified.reason in (DENIED, WARNED, AUDIT_ONLY)):
        return tuple(action.lower() for action in VALIDATION_ACTIONS[enforcement])
    return (*(("deny",) if denied_by(message, name) else ()),
            *(("warn",) if warned_by(warnings, name) is not None else ()))


def next_probe_in(policy: PolicyObject, *, now: dt.datetime, interval_s: float,
                  first_delay_s: float) -> float:
    """Seconds until this Enforcing policy's next probe: one interval after the last probe
    recorded on it (so a restart does not probe again at once), or `first_delay_s` when it was
    never probed. Never more than one interval: a probe time in the future (a clock far off, or
    9999-12-31 written by hand) must not put the next probe off for good."""
    verified = policy.condition(VERIFIED)
    last = parse_timestamp(verified.get("lastProbeTime")) if verified is not None else None
    if last is None or in_the_future(last, now) or (
            verified is not None and verified.get("status") == UNKNOWN
            and not _inconclusive(verified)):
        return first_delay_s  # a probe time not yet reached is no probe (forged or broken)
    return min(interval_s, max(0.0, (last - now).total_seconds() + interval_s))
