"""Exceptions to a policy (pure): every bad input refused naming its field and value, grants
checked against the clock and the maximum, the rendered matchConditions admitting exactly the
objects `covers` says (evaluated by the product's CEL evaluator, as kube-apiserver would), the
operator's honoured set and its next change, and the audit counting excepted objects apart."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from convergerd.admission.evaluate import Attributes, PolicyEvaluator
from convergerd.admission.exceptions import honoured, next_change, render_excepted
from convergerd.admission.render import RenderError
from convergerd.admission.verdict import Judge
from convergerd.core.exceptions import (
    EXPIRY_LEAD_S,
    MAX_EXCEPTIONS,
    as_spec,
    check_grant,
    covers,
    parse_exception,
    parse_exceptions,
    parse_expiry,
    selector_from_text,
)
from convergerd.core.model import RuleError
from convergerd.operator.audit import audit, audit_status
from convergerd.operator.workloads import slim

NOW = dt.datetime(2027, 1, 10, 12, 0, tzinfo=dt.UTC)
BASE: dict[str, Any] = {"id": "legacy", "namespace": "team-a-web", "reason": "TICKET-35",
                        "requestedBy": "dev@team-a", "approvedBy": "admin@platform",
                        "expiresAt": "2027-01-31"}


@pytest.mark.parametrize(("change", "message"), [
    ({"id": "Bad_Id"}, "exception.id: 'Bad_Id' is not a DNS label"),
    ({"namespace": None}, "exception.namespace: required"),
    ({"namespace": "a/b"}, "exception.namespace: 'a/b' is not a namespace name"),
    ({"name": "web", "selector": {"matchLabels": {"app": "web"}}},
     "exception: name 'web' and selector {'matchLabels': {'app': 'web'}} exclude each other"),
    ({"name": "Web!"}, "exception.name: 'Web!' is not an object name"),
    ({"selector": {"app": "web"}}, "exception.selector: expected {matchLabels:"),
    ({"selector": {"matchLabels": {}}}, "exception.selector.matchLabels: expected a non-empty"),
    ({"selector": {"matchLabels": {"-bad": "x"}}}, "the key '-bad' is not a valid label key"),
    ({"selector": {"matchLabels": {"app": "a b"}}},
     "exception.selector.matchLabels.app: 'a b' is not a label value"),
    ({"reason": "   "}, "exception.reason: required, a non-empty string"),
    ({"reason": "x" * 513}, "exception.reason: 513 characters, at most 512"),
    ({"approvedBy": "a\nb"}, "exception.approvedBy: 'a\\nb' contains control characters"),
    ({"expiresAt": "31/01/2027"}, "exception.expiresAt: '31/01/2027' is not an ISO 8601"),
    ({"expiresAt": "2027-01-31T12:00:00"}, "has no zone"),
    ({"expiresAt": 5}, "exception.expiresAt: expected an ISO 8601 date or time"),
    ({"colour": "red"}, "exception: unknown field(s) colour"),
])
def test_bad_input_names_the_field_and_value(change: dict[str, Any], message: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_exception(BASE | change)
    assert message in str(caught.value)


def test_expiry_forms_and_the_grant_checks() -> None:
    assert parse_expiry("2027-01-31") == dt.datetime(2027, 1, 31, tzinfo=dt.UTC)
    assert parse_expiry("2027-01-31T14:00:00.5+02:00") == dt.datetime(2027, 1, 31, 12,
                                                                     tzinfo=dt.UTC)
    granted = parse_exception(BASE)
    check_grant(granted, now=NOW, max_days=90)
    with pytest.raises(RuleError, match=r"expiresAt: 2027-01-31T00:00:00Z is not in the future"):
        check_grant(granted, now=dt.datetime(2027, 2, 1, tzinfo=dt.UTC), max_days=90)
    with pytest.raises(RuleError, match=r"is more than 7 days away \(at most "
                                        r"2027-01-17T12:00:00Z; CONVERGERD_EXCEPTION_MAX_DAYS"):
        check_grant(granted, now=NOW, max_days=7)
    # The CR's entry is what the API answers and the database gives back.
    assert parse_exception(as_spec(granted)) == granted


def test_lists_and_selectors() -> None:
    assert selector_from_text("app=web, tier=db") == {"matchLabels": {"app": "web",
                                                                     "tier": "db"}}
    for bad in ("app", "app!=web", "app==web", "app=web,app=db"):
        with pytest.raises(RuleError, match="selector: "):
            selector_from_text(bad)
    two = [BASE, BASE | {"id": "other"}]
    assert [e.id for e in parse_exceptions(two[::-1])] == ["legacy", "other"]  # by id
    with pytest.raises(RuleError, match="exceptions: the id 'legacy' is given twice"):
        parse_exceptions([BASE, BASE])
    with pytest.raises(RuleError, match=f"at most {MAX_EXCEPTIONS} per policy"):
        parse_exceptions([BASE | {"id": f"e{i}"} for i in range(MAX_EXCEPTIONS + 1)])


SPEC: dict[str, Any] = {"policyId": "nolatest", "boundary": "b1", "enabled": True,
                        "revision": 3, "rule": {"type": "ForbidLatestTag"}}
EXCEPTIONS = [
    BASE | {"id": "whole", "namespace": "ns-whole"},
    BASE | {"id": "named", "namespace": "ns-named", "name": "api"},
    BASE | {"id": "labelled", "namespace": "ns-labels",
            "selector": {"matchLabels": {"app": "legacy", "tier": "web"}}},
]
OBJECTS = [(ns, name, labels)
           for ns in ("ns-whole", "ns-named", "ns-labels", "elsewhere")
           for name in ("api", "web")
           for labels in (None, {"app": "legacy"}, {"app": "legacy", "tier": "web", "x": "y"},
                          {"app": "other", "tier": "web"})]


def _pod(ns: str, name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "nginx"}]}}  # denied by the rule


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    kept = slim("Pod", obj)
    assert kept is not None
    return kept


@pytest.mark.parametrize(("ns", "name", "labels"), OBJECTS)
def test_the_rendered_conditions_admit_exactly_what_covers_says(
        ns: str, name: str, labels: dict[str, str] | None) -> None:
    spec = SPEC | {"exceptions": EXCEPTIONS}
    admission = render_excepted(spec, NOW)
    assert [c["name"] for c in admission.policy["spec"]["matchConditions"]] == [
        "exception-labelled", "exception-named", "exception-whole"]
    obj = _pod(ns, name, labels)
    attrs = Attributes(operation="CREATE", group="", version="v1", resource="pods", kind="Pod",
                       namespace=ns, name=name, object=obj, old_object=None)
    namespace = {"metadata": {"name": ns, "labels": {"platform.stackship.se/boundary": "b1"}}}
    denied = PolicyEvaluator().evaluate(admission.policy, admission.binding, attrs,
                                        namespace=namespace)
    excepted = any(covers(e, ns, name, labels) for e in parse_exceptions(EXCEPTIONS))
    assert (not denied) == excepted
    # The audit agrees: the object is excepted, not a violation.
    judged = audit(Judge.of(spec), [_slim(obj)], parse_exceptions(EXCEPTIONS))
    assert (judged.violations, judged.excepted) == ((0, 1) if excepted else (1, 0))


def test_the_operator_honours_until_the_lead_before_expiry() -> None:
    expires = NOW + dt.timedelta(seconds=60)
    spec = SPEC | {"exceptions": [BASE | {"expiresAt": expires.isoformat()}]}
    assert [e.id for e in honoured(spec, NOW)] == ["legacy"]
    assert next_change(spec, NOW) == expires - dt.timedelta(seconds=EXPIRY_LEAD_S)
    later = expires - dt.timedelta(seconds=EXPIRY_LEAD_S)
    assert honoured(spec, later) == ()
    assert next_change(spec, later) is None
    assert "matchConditions" not in render_excepted(spec, later).policy["spec"]
    assert "matchConditions" not in render_excepted(SPEC, NOW).policy["spec"]
    with pytest.raises(RenderError, match=r"spec.exceptions\[0\].namespace"):
        render_excepted(SPEC | {"exceptions": [BASE | {"namespace": "A"}]}, NOW)


def test_the_audit_status_says_excepted_only_with_exceptions_in_force() -> None:
    judge = Judge.of(SPEC)
    pods = [_slim(_pod("ns-whole", "a", None)), _slim(_pod("elsewhere", "b", None))]
    with_them = audit_status(audit(judge, pods, parse_exceptions(EXCEPTIONS[:1])),
                             synced=True, now=NOW)
    assert (with_them["violations"], with_them["excepted"]) == (1, 1)
    assert [s["name"] for s in with_them["sample"]] == ["b"]
    without = audit_status(audit(judge, pods), synced=True, now=NOW)
    assert without["violations"] == 2
    assert "excepted" not in without
