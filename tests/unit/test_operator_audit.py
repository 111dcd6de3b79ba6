"""The audit's verdicts and messages (admission.verdict) equal the rendered CEL's, as
admission.evaluate evaluates it (the evaluator of the simulator's admission and of `policy
eval`): on the simulator's admission corpus and on generated objects."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convergerd.admission.evaluate import Attributes, PolicyEvaluator
from convergerd.admission.render import BOUNDARY_LABEL, render_admission
from convergerd.admission.verdict import Judge, denial, denied
from convergerd.operator.audit import Incomplete, audit, audit_differs, audit_status
from convergerd.operator.workloads import slim
from tests.integration.test_sim_admission import CASES, LABELS, LATEST, REGISTRIES, Case, workload

NS = "team-a-apps"
PLURALS = {"Pod": ("", "v1", "pods"), "Deployment": ("apps", "v1", "deployments"),
           "CronJob": ("batch", "v1", "cronjobs"), "Job": ("batch", "v1", "jobs"),
           "StatefulSet": ("apps", "v1", "statefulsets")}
EVALUATOR = PolicyEvaluator()


def spec(rule: dict[str, Any], enabled: bool = True) -> dict[str, Any]:
    return {"policyId": "p1", "boundary": "team-a", "enabled": enabled, "revision": 1,
            "rule": rule}


def cel_denial(rule: dict[str, Any], obj: dict[str, Any]) -> str | None:
    """The simulator's admission verdict on creating `obj`: its validation message or None."""
    adm = render_admission(spec(rule))
    group, version, plural = PLURALS[obj["kind"]]
    meta = dict(obj["metadata"]) | {"namespace": NS}
    attrs = Attributes(operation="CREATE", group=group, version=version, resource=plural,
                       kind=obj["kind"], namespace=NS, name=meta["name"],
                       object=obj | {"metadata": meta}, old_object=None)
    ns = {"metadata": {"name": NS, "labels": {BOUNDARY_LABEL: "team-a"}}}
    found = EVALUATOR.first_denial([adm.policy], [adm.binding], attrs, namespace=ns)
    return None if found is None else found.message


def audit_denial(rule: dict[str, Any], obj: dict[str, Any]) -> str | None:
    kept = slim(obj["kind"], obj | {"metadata": obj["metadata"] | {"namespace": NS}})
    assert kept is not None
    judge = Judge.of(spec(rule))
    message = denial(judge, kept)
    assert denied(judge, kept) == (message is not None)
    return message


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "CronJob"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_audit_equals_admission_on_the_corpus(case: Case, kind: str) -> None:
    obj = workload(kind, case)
    expected = cel_denial(case.rule, obj)
    assert (expected is not None) == case.denied
    assert audit_denial(case.rule, obj) == expected


IMAGE_PARTS = st.sampled_from(["registry.example.com", "mirror.example.com/team-a",
                               "mirror.example.com", "registry:5000", "nginx", "app", "a/b",
                               "registry.example.com.evil.io", ":latest", ":1.2", ":", "\n", "é",
                               "@sha256:" + "a" * 64, "/", ":latest-alpine", "x"])
IMAGES = st.lists(IMAGE_PARTS, min_size=1, max_size=4).map("".join)
CONTAINERS = st.lists(st.one_of(IMAGES.map(lambda i: {"name": "c", "image": i}),
                                st.just({"name": "no-image"})), max_size=3)
LABEL_KEYS = st.sampled_from(["team", "example.com/cost-center", "app", "Team"])


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(PLURALS)))
    pod_spec: dict[str, Any] = {}
    for field in ("containers", "initContainers", "ephemeralContainers"):
        if draw(st.booleans()):
            pod_spec[field] = draw(CONTAINERS)
    meta: dict[str, Any] = {"name": "obj"}
    if draw(st.booleans()):
        meta["labels"] = draw(st.dictionaries(LABEL_KEYS, st.sampled_from(["", "a"])))
    template = {"spec": pod_spec} if draw(st.booleans()) else {}
    if kind == "Pod":
        body: dict[str, Any] = {"spec": pod_spec} if draw(st.booleans()) else {}
    elif kind == "CronJob":
        body = {"spec": {"jobTemplate": {"spec": {"template": template}}}}
    else:
        body = {"spec": {"template": template}}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta} | body


@settings(max_examples=300, deadline=None)
@given(rule=st.sampled_from([LABELS, REGISTRIES, LATEST]), obj=objects())
def test_the_audit_equals_admission_on_generated_objects(rule: dict[str, Any],
                                                         obj: dict[str, Any]) -> None:
    assert audit_denial(rule, obj) == cel_denial(rule, obj)


def test_unreadable_parts_are_violations() -> None:
    obj = {"kind": "Pod", "metadata": {"name": "p", "namespace": NS, "labels": ["x"]},
           "spec": {"containers": "nope"}}
    kept = slim("Pod", obj)
    assert kept is not None
    for rule in (LABELS, REGISTRIES, LATEST):
        message = denial(Judge.of(spec(rule)), kept)
        assert message is not None
        assert message.startswith("cannot be judged: ")
        assert cel_denial(rule, obj) is not None  # admission fails closed on it too


def test_audit_counts_and_samples_the_first_five_by_namespace_kind_name() -> None:
    judge = Judge.of(spec(LATEST, enabled=False))
    objs = [slim("Pod", {"metadata": {"name": f"p{i}", "namespace": f"ns{i % 3}"},
                         "spec": {"containers": [{"image": "nginx" if i % 2 else "nginx:1"}]}})
            for i in range(20)]
    result = audit(judge, [o for o in objs if o is not None])
    assert result.violations == 10
    assert [(v.namespace, v.name) for v in result.sample] == [
        ("ns0", "p15"), ("ns0", "p3"), ("ns0", "p9"), ("ns1", "p1"), ("ns1", "p13")]
    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    status = audit_status(result, synced=True, now=now)
    assert status["auditedAt"] == "2026-12-03T12:00:00Z"
    assert status["sample"][0] == {
        "kind": "Pod", "namespace": "ns0", "name": "p15",
        "message": "image(s) 'nginx' have no tag or digest, which means tag 'latest': pin a "
                   "version tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)"}
    assert not audit_differs(status, status, now=now, refresh_s=60)
    assert audit_differs(status, status | {"cacheSynced": False}, now=now, refresh_s=60)
    assert audit_differs(status, status, now=now + dt.timedelta(seconds=60), refresh_s=60)
    assert audit_differs(None, status, now=now, refresh_s=60)


def _full(images: list[str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "w", "namespace": NS, "labels": labels or {}},
            "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": {
                "metadata": {"labels": {"app": "w"}},
                "spec": {"containers": [{"name": f"c{n}", "image": i}
                                        for n, i in enumerate(images)]}}}}


def _wide(images: list[str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    kept = slim("Deployment", _full(images, labels))
    assert kept is not None
    return kept


LONG = "registry.example.com/" + "x" * 600 + ":1"  # longer than any valid reference


@pytest.mark.parametrize(("rule", "images", "starts", "admission_denies"), [
    # A cut image may break the rule: the object cannot be judged, never passes unseen (here
    # admission, reading the whole image, admits it: the audit says why it cannot tell).
    (REGISTRIES, [LONG], "cannot be judged: 1 image(s) longer than 512", False),
    (LATEST, ["nginx:1", LONG], "cannot be judged: 1 image(s) longer than 512", False),
    # A kept image already breaks it: admission's own message (it denies it too).
    (REGISTRIES, ["docker.io/nginx:1", LONG], "image(s) 'docker.io/nginx:1' not from an",
     True),
    (LATEST, ["nginx", LONG], "image(s) 'nginx' have no tag or digest", True),
])
def test_an_object_with_images_not_kept_is_never_passed(
        rule: dict[str, Any], images: list[str], starts: str, admission_denies: bool) -> None:
    judge = Judge.of(spec(rule))
    obj = _wide(images)
    message = denial(judge, obj)
    assert message is not None
    assert message.startswith(starts), message
    assert denied(judge, obj)
    assert (cel_denial(rule, _full(images)) is not None) == admission_denies


def test_labels_not_kept_pass_only_when_the_kept_ones_have_every_required_key() -> None:
    judge = Judge.of(spec(LABELS))
    required = dict.fromkeys(LABELS["labels"], "v")
    filler = {f"example.com/k{i:04d}": "v" * 60 for i in range(400)}
    whole = _wide(["a:1"], required | filler)
    assert "labels" in whole["cut"]
    assert denial(judge, whole) is None  # every required key was kept: exact
    assert not denied(judge, whole)
    missing = _wide(["a:1"], filler | required)  # the required keys past the budget
    message = denial(judge, missing)
    assert message is not None
    assert message.startswith("cannot be judged: ")
    assert "not among those kept: " in message
    assert denied(judge, missing)


def test_refused_objects_are_counted_not_judged_and_the_status_says_incomplete() -> None:
    judge = Judge.of(spec(LATEST, enabled=False))
    objs = [_wide(["nginx"]), {"kind": "Pod", "refused": True,
                               "metadata": {"name": "r", "namespace": NS}}]
    result = audit(judge, objs)
    assert (result.violations, result.refused) == (1, 1)
    incomplete = Incomplete(refused=1, lost=0, too_large=(("Deployment", "team-b", "huge"),),
                            too_large_count=1, biggest=(("team-b", 3 * 2**20), (NS, 2**20)),
                            max_bytes=64 * 2**20)
    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
    status = audit_status(result, synced=True, now=now, incomplete=incomplete)
    assert status["incomplete"] == {
        "skipped": 2,
        "reason": "the operator's workload cache is at its budget of 64.0 MiB "
                  "(CONVERGERD_OPERATOR_CACHE_MAX_BYTES): 1 object(s) of this boundary not "
                  "cached; the namespaces holding the most of it: team-b (3.0 MiB), "
                  "team-a-apps (1.0 MiB); 1 object(s) of this boundary larger than the "
                  "operator's response cap (CONVERGERD_MAX_RESPONSE_BYTES) not read: "
                  "violations counts only the objects judged",
        "objects": [{"kind": "Deployment", "namespace": "team-b", "name": "huge",
                     "reason": "TooLarge"}],
        "biggestNamespaces": ["team-b", NS]}
    whole = audit_status(result, synced=True, now=now)
    assert "incomplete" not in whole
    assert audit_differs(whole, status, now=now, refresh_s=60)  # written when it changes
    assert audit_differs(status, whole, now=now, refresh_s=60)
