"""Enforcement modes in the operator (docs/design.md, "Modes"): the binding's
validationActions from `spec.enforcement`, `status.enforcementAction`, what the probe proves
in each mode; the warnings an answer carries; the evaluator's warnings for Warn bindings."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from convergerd.admission.evaluate import Attributes, PolicyEvaluator
from convergerd.admission.render import (
    RenderError,
    enforcement_of,
    render_admission,
    violating_pod,
)
from convergerd.core.decode import MAX_MESSAGE_CHARS, MAX_WARNINGS, warning_texts
from convergerd.core.model import Enforcement
from convergerd.operator.reconcile import (
    ENFORCEMENT_ACTION,
    INERT,
    PolicyObject,
    new_status,
    probe_counted,
    probe_outcome,
    ready_condition,
    status_differs,
    writes_for,
)

T0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
NAME = "stackship-p1"
LATEST: dict[str, Any] = {"type": "ForbidLatestTag"}
LABELS: dict[str, Any] = {"type": "RequiredLabels", "labels": ["team"]}


def spec(rule: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"policyId": "p1", "boundary": "b1", "enabled": True, "revision": 1,
            "rule": rule or LATEST, **fields}


def policy(status: dict[str, Any] | None = None, **fields: Any) -> PolicyObject:
    return PolicyObject.from_object({
        "metadata": {"name": "policy-p1", "uid": "u-1", "generation": 2},
        "spec": spec(**fields), "status": status or {}})


# --- the binding ------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "actions", "mode"), [
    ({}, ["Deny"], Enforcement.DENY),  # a Policy from before modes
    ({"enforcement": "Deny"}, ["Deny"], Enforcement.DENY),
    ({"enforcement": "Warn"}, ["Warn", "Audit"], Enforcement.WARN),
    ({"enforcement": "Audit"}, ["Audit"], Enforcement.AUDIT),
])
def test_the_binding_s_actions_follow_the_mode(
    fields: dict[str, Any], actions: list[str], mode: Enforcement
) -> None:
    rendered = render_admission(spec(**fields))
    assert rendered.binding["spec"]["validationActions"] == actions
    assert rendered.enforcement is mode
    assert enforcement_of(rendered.binding) is mode
    # The admission policy itself does not depend on the mode.
    assert rendered.policy == render_admission(spec()).policy


@pytest.mark.parametrize(("value", "words"), [
    ("deny", "spec.enforcement: must be one of Deny, Warn, Audit, got 'deny' "
             "(the names are case-sensitive: Deny)"),
    ("Dryrun", "spec.enforcement: must be one of Deny, Warn, Audit, got 'Dryrun'"),
    (None, "spec.enforcement: must be one of Deny, Warn, Audit, got None"),
    (["Warn"], "spec.enforcement: must be one of Deny, Warn, Audit, got ['Warn']"),
])
def test_a_mode_that_is_not_one_cannot_be_rendered_and_is_named(value: Any, words: str) -> None:
    with pytest.raises(RenderError) as caught:
        render_admission(spec(enforcement=value))
    assert caught.value.reason == "InvalidEnforcement"
    assert str(caught.value) == words


@pytest.mark.parametrize(("actions", "mode"), [
    (["Deny"], Enforcement.DENY), (["Deny", "Audit"], Enforcement.DENY),
    (["Warn"], Enforcement.WARN), (["Audit", "Warn"], Enforcement.WARN),
    (["Audit"], Enforcement.AUDIT), ([], None), (["Nope"], None), ("Deny", None)])
def test_a_binding_read_back_is_named_by_what_it_does_to_a_failing_request(
    actions: Any, mode: Enforcement | None
) -> None:
    assert enforcement_of({"spec": {"validationActions": actions}}) is mode
    assert enforcement_of(None) is None


def test_other_policies_that_only_warn_or_audit_need_not_admit_the_probe_pod() -> None:
    """Only a denying policy can stop the probe: one in Warn or Audit mode admits what it
    fails, so it neither shapes the pod nor makes the probe inconclusive."""
    pod = violating_pod(spec(LATEST), namespace="n", name="p",
                        others=[spec(LATEST, policyId="o1", enforcement="Warn"),
                                spec(LABELS, policyId="o2", enforcement="Audit")])
    assert set(pod["metadata"].get("labels", {})) == {
        "app.kubernetes.io/managed-by", "platform.stackship.se/policy"}  # no "team"
    denying = violating_pod(spec(LATEST), namespace="n", name="p",
                            others=[spec(LABELS, policyId="o2")])
    assert "team" in denying["metadata"]["labels"]


# --- status.enforcementAction -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["Deny", "Warn", "Audit"])
def test_the_mode_of_the_binding_written_is_the_enforcement_action(mode: str) -> None:
    todo = writes_for(policy(enforcement=mode), existing_policy=None, existing_binding=None)
    assert todo.enforcement is Enforcement(mode)
    status = new_status(policy(), todo.phase, [], T0, enforcement=todo.enforcement)
    assert status[ENFORCEMENT_ACTION] == mode


def test_a_disabled_policy_has_no_binding_so_no_enforcement_action() -> None:
    todo = writes_for(policy(enabled=False, enforcement="Warn"), existing_policy=None,
                      existing_binding=None)
    assert (todo.phase, todo.enforcement) == (INERT, None)
    assert ENFORCEMENT_ACTION not in new_status(policy(), INERT, [], T0,
                                                enforcement=todo.enforcement)


def test_an_enforcement_action_no_longer_true_is_written_away() -> None:
    """The server-side apply drops the field we stop sending, but only if we write: a status
    that only lost the mode (the binding went with it) is a change."""
    ready = ready_condition(INERT, name=NAME, boundary="b1")
    current = new_status(policy(), INERT, [ready], T0, enforcement=Enforcement.WARN)
    inert = new_status(policy(status=current), INERT, [ready], T0)
    assert status_differs(current, inert)
    assert not status_differs(inert, inert)
    switched = new_status(policy(status=current), INERT, [ready], T0,
                          enforcement=Enforcement.DENY)
    assert status_differs(current, switched)


# --- what the probe proves --------------------------------------------------------------------

DENIAL = (f'pods "stackship-p1-probe" is forbidden: ValidatingAdmissionPolicy \'{NAME}\' with '
          f"binding '{NAME}' denied request: image(s) 'x' use the tag 'latest'")
WARNING = (f"Validation failed for ValidatingAdmissionPolicy '{NAME}' with binding '{NAME}': "
           "image(s) 'x' use the tag 'latest'")
OTHER_WARNING = WARNING.replace(NAME, "stackship-other")


def outcome(mode: str, *, admitted: bool = True, warnings: tuple[str, ...] = (),
            denial: str | None = None, installed: Enforcement | None = None) -> tuple[str, str]:
    found = probe_outcome(name=NAME, boundary="b1", namespace="team-a", admitted=admitted,
                          status=None if admitted else 422, message=denial or "", now=T0,
                          enforcement=Enforcement(mode), warnings=warnings, installed=installed)
    return found.status, found.reason


@pytest.mark.parametrize(("mode", "answer", "verdict"), [
    # Deny: only this policy's denial proves it.
    ("Deny", {"admitted": False, "denial": DENIAL}, ("True", "Denied")),
    ("Deny", {}, ("False", "Admitted")),
    ("Deny", {"warnings": (WARNING,)}, ("False", "Admitted")),  # binding edited to Warn
    # Warn: admitted with this policy's warning, nothing else.
    ("Warn", {"warnings": (OTHER_WARNING, WARNING)}, ("True", "Warned")),
    ("Warn", {}, ("False", "Admitted")),  # no binding, or no validation failing
    ("Warn", {"warnings": (OTHER_WARNING,)}, ("False", "Admitted")),
    ("Warn", {"admitted": False, "denial": DENIAL}, ("False", "WrongMode")),
    # Audit: admitted with no word from this policy, over its [Audit] binding read back.
    ("Audit", {"installed": Enforcement.AUDIT}, ("True", "AuditOnly")),
    ("Audit", {"installed": Enforcement.AUDIT, "warnings": (OTHER_WARNING,)},
     ("True", "AuditOnly")),
    ("Audit", {"installed": None}, ("False", "Admitted")),  # no binding: nothing audited
    ("Audit", {"installed": Enforcement.WARN, "warnings": (WARNING,)}, ("False", "WrongMode")),
    ("Audit", {"admitted": False, "denial": DENIAL}, ("False", "WrongMode")),
    # Refused by something else: the probe failed, in any mode.
    ("Warn", {"admitted": False, "denial": "quota exceeded"}, ("False", "ProbeFailed")),
])
def test_the_probe_proves_each_mode(mode: str, answer: dict[str, Any],
                                    verdict: tuple[str, str]) -> None:
    assert outcome(mode, **answer) == verdict


@pytest.mark.parametrize(("mode", "answer", "counted"), [
    # A verdict that proves the mode: the binding as rendered judged it, under each action.
    ("Deny", {"admitted": False, "denial": DENIAL}, ("deny",)),
    ("Warn", {"warnings": (WARNING,)}, ("warn", "audit")),  # Warn comes with Audit
    ("Audit", {"installed": Enforcement.AUDIT}, ("audit",)),
    # Any other: only what the answer shows (an audit no client sees is not known).
    ("Deny", {}, ()),
    ("Deny", {"warnings": (WARNING,)}, ("warn",)),  # binding edited to Warn
    ("Warn", {"admitted": False, "denial": DENIAL}, ("deny",)),
    ("Warn", {"warnings": (OTHER_WARNING,)}, ()),
    ("Audit", {"installed": None}, ()),
    ("Audit", {"installed": Enforcement.WARN, "warnings": (WARNING,)}, ("warn",)),
    ("Deny", {"admitted": False, "denial": "quota exceeded"}, ()),
])
def test_a_probe_is_taken_out_of_the_admission_counts_under_what_counted_it(
        mode: str, answer: dict[str, Any], counted: tuple[str, ...]) -> None:
    admitted = answer.get("admitted", True)
    message = answer.get("denial") or ""
    warnings = answer.get("warnings", ())
    found = probe_outcome(name=NAME, boundary="b1", namespace="team-a", admitted=admitted,
                          status=None if admitted else 422, message=message, now=T0,
                          enforcement=Enforcement(mode), warnings=warnings,
                          installed=answer.get("installed"))
    assert probe_counted(found, Enforcement(mode), name=NAME, message=message,
                         warnings=warnings) == counted


@pytest.mark.parametrize(("mode", "counted"), [
    ("Deny", ("deny",)), ("Warn", ("warn", "audit")), ("Audit", ("audit",))])
def test_a_probe_answered_but_unreadable_was_counted_all_the_same(
        mode: str, counted: tuple[str, ...]) -> None:
    """Admission judged it (the API server answered): garbage in the answer's headers must not
    leave the probe's count in the Policy's figures as a tenant's."""
    message = ("bad_response: create answer: its status line or headers are malformed or "
               "longer than 8,190 bytes")
    found = probe_outcome(name=NAME, boundary="b1", namespace="team-a", admitted=False,
                          status=None, message=message, now=T0, enforcement=Enforcement(mode))
    assert found.status == "False"
    assert probe_counted(found, Enforcement(mode), name=NAME, message=message, warnings=(),
                         unread=True) == counted
    assert probe_counted(found, Enforcement(mode), name=NAME, message=message,
                         warnings=()) == ()


def test_a_warned_probe_says_what_the_warning_said() -> None:
    found = probe_outcome(name=NAME, boundary="b1", namespace="team-a", admitted=True,
                          status=None, message="", now=T0, enforcement=Enforcement.WARN,
                          warnings=(WARNING,))
    assert "admitted with stackship-p1's warning in namespace team-a" in found.message
    assert WARNING in found.message


def test_the_audit_verdict_says_what_it_cannot_see() -> None:
    found = probe_outcome(name=NAME, boundary="b1", namespace="team-a", admitted=True,
                          status=None, message="", now=T0, enforcement=Enforcement.AUDIT,
                          installed=Enforcement.AUDIT)
    assert "audit log, which no client sees" in found.message


# --- warnings on an answer --------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "texts"), [
    (['299 - "plain"'], ("plain",)),
    (['299 - "a \\"quoted\\" back\\\\slash"'], ('a "quoted" back\\slash',)),
    (['299 - "one", 299 - "two"', '299 kube-apiserver "three" "Sat, 01 Jan 2000 00:00:00 GMT"'],
     ("one", "two", "three")),
    (['199 - "not persistent"', '299 - "kept"'], ("kept",)),
    (['garbage', '299 - "after garbage"'], ("after garbage",)),
    (['299 - "ok", nonsense, 299 - "lost"'], ("ok",)),
    (['299 - "esc\x1b[31m and\nbreak"'], ("esc\ufffd[31m and break",)),
])
def test_warning_headers_are_read_as_kube_apiserver_writes_them(
    headers: list[str], texts: tuple[str, ...]
) -> None:
    assert warning_texts(headers) == texts


def test_warnings_are_bounded_in_number_and_length() -> None:
    many = [f'299 - "w{i}"' for i in range(1000)]
    assert len(warning_texts(many)) == MAX_WARNINGS
    [long] = warning_texts(['299 - "' + "x" * 100_000 + '"'])
    assert len(long) == MAX_MESSAGE_CHARS


# --- the evaluator's warnings -----------------------------------------------------------------


def test_a_warn_binding_admits_with_kube_apiserver_s_warning_and_deny_still_denies() -> None:
    evaluator = PolicyEvaluator()
    warn = render_admission(spec(enforcement="Warn"))
    deny = render_admission(spec(LABELS, policyId="p2"))
    pod = violating_pod(spec(enforcement="Warn"), namespace="team-a", name="p")
    attrs = Attributes(operation="CREATE", group="", version="v1", resource="pods", kind="Pod",
                       namespace="team-a", name="p", object=pod, old_object=None)
    namespace = {"metadata": {"name": "team-a",
                              "labels": {"platform.stackship.se/boundary": "b1"}}}
    alone = evaluator.admit([warn.policy], [warn.binding], attrs, namespace=namespace)
    assert alone.denial is None
    [warning] = alone.warnings
    assert warning.startswith(f"Validation failed for ValidatingAdmissionPolicy '{NAME}' with "
                              f"binding '{NAME}': image(s) ")
    both = evaluator.admit([warn.policy, deny.policy], [warn.binding, deny.binding], attrs,
                            namespace=namespace)
    assert both.denial is not None
    assert both.denial.policy == "stackship-p2"
    assert both.warnings == alone.warnings  # warned as well as denied, as kube-apiserver does
    audit = render_admission(spec(enforcement="Audit"))
    silent = evaluator.admit([audit.policy], [audit.binding], attrs, namespace=namespace)
    assert (silent.denial, silent.warnings) == (None, ())
