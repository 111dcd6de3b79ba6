"""A Policy's rule judged in Python over the slim objects the operator's cache keeps (pure):
the verdict and message of the rendered CEL (`convergerd.admission.render`), without a CEL
runtime in the operator.

tests/unit/test_operator_audit.py proves `denial` equal to the rendered CEL as
`convergerd.admission.evaluate` evaluates it (the evaluator the simulator's admission and
`convergerd policy eval` use), on the simulator's admission corpus and on generated objects
(property test). A part of an object the CEL could not read (the cache marks it `invalid`) is a
violation: admission fails closed on it (`failurePolicy: Fail`).

What the cache did not keep is never passed unseen (the safe answer, issue 33): an object
whose images or labels were cut (`cut`, see `convergerd.operator.workloads`) is judged on what
was kept when that already breaks the rule (admission's message), else it is a violation
`cannot be judged: ...` (RequiredLabels passes only when every required key was kept).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from convergerd.admission.render import render_admission
from convergerd.core.model import Rule, parse_rule

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
