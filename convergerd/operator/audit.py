"""The audit: what a Policy's rule would deny among the objects already in the cluster (pure).

Admission only judges new requests: a tenant who enables AllowedRegistries learns which running
workloads break it only when each is next rolled out. The audit judges every cached object of
the Policy's boundary (`convergerd.operator.cache`) with the rule, whether the Policy is
enabled or not (an Inert Policy is exactly the one a tenant wants to preview), and the
operator writes the result to the Policy's `status.audit`:

    audit: {violations: 3, auditedAt: "2026-12-03T12:00:00Z", cacheSynced: true,
            sample: [{kind: Pod, namespace: team-a-web, name: api-7f9c, message: "..."}]}

`violations` counts the objects the rule would deny; `sample` is at most `SAMPLE_SIZE` of them
(the first by namespace, kind, name) with admission's message; `cacheSynced` is False while the
cache is not listed yet or a watch is broken or re-listing (the figures may be behind).

The verdicts and messages are the rendered CEL's (`convergerd.operator.admission`), written in
Python over the slim objects the cache keeps (`convergerd.operator.workloads`): the operator
does not carry a CEL runtime. tests/unit/test_operator_audit.py proves them equal to the CEL
as the simulator's admission evaluates it, on the simulator's admission corpus and on
generated objects (property test). A part of an object the CEL could not read (the cache marks
it `invalid`) is a violation: admission fails closed on it (`failurePolicy: Fail`).

What the cache did not keep is never passed unseen (the safe answer, issue 33): an object
whose images or labels were cut (`cut`, see `convergerd.operator.workloads`) is judged on what
was kept when that already breaks the rule (admission's message), else it is a violation
`cannot be judged: ...` (RequiredLabels passes only when every required key was kept). A
stub the cache kept for want of room (`refused`) is not judged but counted, and the status
then says `incomplete` (`Incomplete`): how many objects of the boundary were not judged, why,
the objects too large to read, and the namespaces holding the most of the cache. Without
`incomplete`, every object of the boundary was judged.
"""

from __future__ import annotations

import datetime as dt
import heapq
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convergerd.core.decode import clean_text
from convergerd.core.model import Rule, parse_rule
from convergerd.operator.admission import render_admission
from convergerd.operator.reconcile import timestamp

SAMPLE_SIZE = 5
MESSAGE_MAX_CHARS = 1024  # per sample entry in the status
_CEL_MESSAGE_MAX_CHARS = 5 * 1024  # a longer messageExpression result falls back to `message`
# The rendered CEL's `i.matches(...)`: RE2 search, `$` = end of text.
_EXPLICIT_LATEST = re.compile(r":latest(@.*)?\Z")
_TAGGED = re.compile(r":[^/]*\Z")
_VERDICTS_MAX = 100_000  # images remembered per Policy


@dataclass(frozen=True, slots=True)
class Judge:
    """One Policy's rule with the static messages of its rendered validations."""

    rule: Rule
    messages: tuple[str, ...]  # each validation's `message`, in order
    labels: tuple[str, ...] = ()  # RequiredLabels: the keys
    prefixes: tuple[str, ...] = ()  # AllowedRegistries: each registry with its "/"
    # image -> denied, for the image rules: thousands of pods share a few images
    verdicts: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Judge:
        """`RenderError` for a spec admission could not enforce (nothing to audit)."""
        admission = render_admission(spec)
        validations = admission.policy["spec"]["validations"]
        rule = parse_rule(spec["rule"])
        return cls(rule, tuple(str(v["message"]) for v in validations),
                   labels=tuple(rule.params.get("labels", ())),
                   prefixes=tuple(p + "/" for p in rule.params.get("registries", ())))


@dataclass(frozen=True, slots=True, order=True)
class Violation:
    namespace: str
    kind: str
    name: str
    message: str

    def as_status(self) -> dict[str, str]:
        """Within the CRD schema's limits, whatever the cluster answered (a status the schema
        rejects would be retried for ever)."""
        return {"kind": clean_text(self.kind, 63), "namespace": clean_text(self.namespace, 63),
                "name": clean_text(self.name, 253),
                "message": clean_text(self.message, MESSAGE_MAX_CHARS)}


@dataclass(frozen=True, slots=True)
class AuditResult:
    violations: int
    sample: tuple[Violation, ...]
    refused: int = 0  # objects the cache had no room for: not judged


def _quoted(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _chosen(text: str, static: str) -> str:
    """kube-apiserver's choice: the messageExpression's result when it is one non-empty line
    of at most 5 KiB, else the validation's message."""
    stripped = text.strip()
    if stripped and "\n" not in stripped and len(text) <= _CEL_MESSAGE_MAX_CHARS:
        return stripped
    return static.strip()


def _unreadable(obj: Mapping[str, Any], part: str) -> str | None:
    invalid = obj.get("invalid")
    return invalid.get(part) if isinstance(invalid, Mapping) else None


def _cut(obj: Mapping[str, Any], part: str) -> str | None:
    cut = obj.get("cut")
    return cut.get(part) if isinstance(cut, Mapping) else None


def _required_labels(judge: Judge, obj: Mapping[str, Any]) -> str | None:
    problem = _unreadable(obj, "labels")
    if problem is not None:
        return f"cannot be judged: {problem}"
    labels = obj["metadata"].get("labels") or {}
    missing = [k for k in judge.rule.params["labels"] if k not in labels]
    if not missing:
        return None
    cut = _cut(obj, "labels")
    if cut is not None:  # a missing label may be among those not kept
        return f"cannot be judged: {cut}; not among those kept: {_quoted(missing)}"
    return _chosen(f"missing required label(s) {_quoted(missing)}: add them to "
                   f"metadata.labels of this {obj.get('kind', '')} (on a workload: the object "
                   "itself, not only its pod template)", judge.messages[0])


def _allowed_registries(judge: Judge, images: Sequence[str]) -> str | None:
    prefixes = tuple(judge.rule.params["registries"])
    bad = [i for i in images if not any(i.startswith(p + "/") for p in prefixes)]
    if not bad:
        return None
    listed = ", ".join(f"'{p}/'" for p in prefixes)
    return _chosen(f"image(s) {_quoted(bad)} not from an allowed registry: every image "
                   f"must start with one of {listed}, e.g. {prefixes[0]}/app:1.0",
                   judge.messages[0])


def _forbid_latest(judge: Judge, images: Sequence[str]) -> str | None:
    latest = [i for i in images if _EXPLICIT_LATEST.search(i)]
    if latest:
        return _chosen(f"image(s) {_quoted(latest)} use the tag 'latest', which changes "
                       "under you: pin a version tag (e.g. nginx:1.27.3) or a digest "
                       "(nginx@sha256:...)", judge.messages[0])
    unpinned = [i for i in images if "@" not in i and not _TAGGED.search(i)]
    if unpinned:
        return _chosen(f"image(s) {_quoted(unpinned)} have no tag or digest, which means "
                       "tag 'latest': pin a version tag (e.g. nginx:1.27.3) or a digest "
                       "(nginx@sha256:...)", judge.messages[1])
    return None


def _latest(image: str) -> bool:
    return bool(_EXPLICIT_LATEST.search(image)) or (
        "@" not in image and not _TAGGED.search(image))


def denied(judge: Judge, obj: Mapping[str, Any]) -> bool:
    """`denial(judge, obj) is not None`, without building the message: the audit counts every
    object but words only its sample."""
    invalid = obj.get("invalid")
    if judge.rule.type == "RequiredLabels":
        if invalid and "labels" in invalid:
            return True
        labels = obj["metadata"].get("labels") or {}
        return any(k not in labels for k in judge.labels)
    if invalid and "images" in invalid:
        return True
    if _images_denied(judge, obj.get("images") or ()):
        return True
    return _cut(obj, "images") is not None  # what was not kept may break the rule


def _images_denied(judge: Judge, images: Iterable[str]) -> bool:
    verdicts = judge.verdicts
    for image in images:
        verdict = verdicts.get(image)
        if verdict is None:
            if len(verdicts) >= _VERDICTS_MAX:
                verdicts.clear()
            verdict = verdicts[image] = (
                not image.startswith(judge.prefixes) if judge.rule.type == "AllowedRegistries"
                else _latest(image))
        if verdict:
            return True
    return False


def denial(judge: Judge, obj: Mapping[str, Any]) -> str | None:
    """The message admission would deny `obj` (a slim object) with, None when it admits it."""
    if judge.rule.type == "RequiredLabels":
        return _required_labels(judge, obj)
    problem = _unreadable(obj, "images")
    if problem is not None:
        return f"cannot be judged: {problem}"
    images: Sequence[str] = obj.get("images") or ()
    if judge.rule.type == "AllowedRegistries":
        message = _allowed_registries(judge, images)
    else:
        message = _forbid_latest(judge, images)  # Judge.of refuses control-plane-only rules
    cut = _cut(obj, "images")
    if message is None and cut is not None:
        return f"cannot be judged: {cut}"
    return message


def _order(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(obj.get("kind", "")), str(meta.get("name", ""))


def audit(judge: Judge, objects: Iterable[Mapping[str, Any]]) -> AuditResult:
    """The objects `judge` denies: how many, and the first `SAMPLE_SIZE` (by namespace, kind,
    name) with admission's message."""
    found = []
    refused = 0
    for obj in objects:
        if obj.get("refused"):
            refused += 1
        elif denied(judge, obj):
            found.append(obj)
    sample = []
    for obj in heapq.nsmallest(SAMPLE_SIZE, found, key=_order):
        message = denial(judge, obj)
        assert message is not None  # `denied` and `denial` agree (tested)
        sample.append(Violation(*_order(obj), message))
    return AuditResult(len(found), tuple(sample), refused)


@dataclass(frozen=True, slots=True)
class Incomplete:
    """What one boundary's audit could not judge, and why (`WorkloadCache.incomplete`)."""

    refused: int  # objects of the boundary kept as stubs: no room in the cache's budget
    lost: int  # objects anywhere not even kept as a stub (past the budget's margin)
    too_large: tuple[tuple[str, str, str], ...]  # (kind, namespace, name), the first few
    too_large_count: int  # objects of the boundary too large to list
    biggest: tuple[tuple[str, int], ...]  # (namespace, bytes) holding the most of the cache
    max_bytes: int

    def as_status(self) -> dict[str, Any]:
        """`status.audit.incomplete`, within the CRD schema's limits."""
        why = []
        if self.refused or self.lost:
            held = ", ".join(f"{n} ({size / 2**20:.1f} MiB)" for n, size in self.biggest)
            why.append(f"the operator's workload cache is at its budget of "
                       f"{self.max_bytes / 2**20:.1f} MiB (CONVERGERD_OPERATOR_CACHE_MAX_BYTES):"
                       f" {self.refused} object(s) of this boundary not cached"
                       + (f", {self.lost} in the cluster not even counted" if self.lost else "")
                       + (f"; the namespaces holding the most of it: {held}" if held else ""))
        if self.too_large_count:
            why.append(f"{self.too_large_count} object(s) of this boundary larger than the "
                       "operator's response cap (CONVERGERD_MAX_RESPONSE_BYTES) not read")
        return {
            "skipped": self.refused + self.too_large_count,
            "reason": clean_text("; ".join(why) + ": violations counts only the objects "
                                 "judged", MESSAGE_MAX_CHARS),
            "objects": [{"kind": clean_text(kind, 63), "namespace": clean_text(ns, 63),
                         "name": clean_text(name, 253), "reason": "TooLarge"}
                        for kind, ns, name in self.too_large[:SAMPLE_SIZE]],
            "biggestNamespaces": [clean_text(n, 63) for n, _ in self.biggest[:3]],
        }


def audit_status(result: AuditResult, *, synced: bool, now: dt.datetime,
                 incomplete: Incomplete | None = None) -> dict[str, Any]:
    """`status.audit` for `result`; `incomplete` only when the audit could not judge every
    object of the boundary."""
    status = {"violations": result.violations, "auditedAt": timestamp(now),
              "cacheSynced": synced, "sample": [v.as_status() for v in result.sample]}
    if incomplete is not None:
        status["incomplete"] = incomplete.as_status()
    return status


def audit_differs(current: Any, new: Mapping[str, Any], *, now: dt.datetime,
                  refresh_s: float) -> bool:
    """A write is needed: the figures changed, or the last write is older than `refresh_s`
    (`auditedAt` then says the audit still runs)."""
    if not isinstance(current, Mapping):
        return True
    if any(current.get(k) != new.get(k)
           for k in ("violations", "cacheSynced", "sample", "incomplete")):
        return True
    at = current.get("auditedAt")
    try:
        written = dt.datetime.fromisoformat(str(at).replace("Z", "+00:00"))
    except ValueError:
        return True
    if written.tzinfo is None:
        return True
    return (now - written).total_seconds() >= refresh_s
