"""A Policy's spec as the ValidatingAdmissionPolicy and binding that enforce it (pure).

The rule becomes CEL that kube-apiserver evaluates on CREATE and UPDATE of Pods and of the
workload kinds that carry a pod template. Every value taken from the Policy (id, boundary,
label keys, registry prefixes) is validated first (`convergerd.core.model`) and then written into
CEL only as a quoted string literal (`cel_string`), never spliced into the expression text.

What the rules mean:
- RequiredLabels: the object's own `metadata.labels` carry every listed key.
- AllowedRegistries: every image (containers, initContainers, ephemeralContainers) starts
  with `<prefix>/` for one listed prefix; `registry.example.com.evil.io/x` is not under
  `registry.example.com`.
- ForbidLatestTag: no image has the tag `latest`, written (`app:latest`, also with a digest)
  or implied (neither tag nor digest: `app`, `host:5000/app`).

The binding's `validationActions` follow `spec.enforcement` (`VALIDATION_ACTIONS`; absent is
`Deny`, the source documents' mode): `Deny` rejects what fails, `Warn` admits it with a
warning to the client (and an audit record), `Audit` admits it and only records it.

`violating_pod` builds the enforcement probe's pod: one that this policy fails and every other
enabled policy of its boundary that denies admits (or `ProbeUnsatisfiable` when none exists).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from convergerd.core.model import (
    DEFAULT_ENFORCEMENT,
    Enforcement,
    Rule,
    RuleError,
    check_boundary_id,
    check_policy_id,
    parse_enforcement,
    parse_rule,
)
from convergerd.core.shown import shown

API_VERSION = "admissionregistration.k8s.io/v1"
NAME_PREFIX = "stackship-"
BOUNDARY_LABEL = "platform.stackship.se/boundary"
POLICY_LABEL = "platform.stackship.se/policy"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "convergerd"
# The Policy fields a spec may carry (the custom resource's schema).
_SPEC_FIELDS = frozenset({"policyId", "boundary", "enabled", "revision", "rule", "enforcement",
                          "exceptions"})  # exceptions: rendered by `admission.exceptions`
# A mode as the binding's `validationActions`. kube-apiserver refuses Deny with Warn (the
# failure would be reported twice); Warn comes with Audit so a warned request is in the audit
# log too.
VALIDATION_ACTIONS: Mapping[Enforcement, tuple[str, ...]] = {
    Enforcement.DENY: ("Deny",),
    Enforcement.WARN: ("Warn", "Audit"),
    Enforcement.AUDIT: ("Audit",),
}

# The matched kinds: (apiGroup, version, resources). `pods/ephemeralcontainers` is how
# ephemeral containers are added to a running Pod; without it they would escape the rules.
RESOURCE_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "v1", ("pods", "pods/ephemeralcontainers")),
    ("apps", "v1", ("deployments", "replicasets", "statefulsets", "daemonsets")),
    ("batch", "v1", ("jobs", "cronjobs")),
)

# The pod spec of each matched kind, every step guarded with has(): a missing template is the
# API's validation error to report, not this policy's (an empty spec has no images).
_POD_SPEC = (
    "object.kind == 'Pod' ? (has(object.spec) ? object.spec : {}) : "
    "object.kind == 'CronJob' ? "
    "(has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) "
    "&& has(object.spec.jobTemplate.spec.template) "
    "&& has(object.spec.jobTemplate.spec.template.spec) "
    "? object.spec.jobTemplate.spec.template.spec : {}) : "
    "(has(object.spec) && has(object.spec.template) && has(object.spec.template.spec) "
    "? object.spec.template.spec : {})"
)
# Every container of the pod spec, then the images that are set.
_CONTAINERS = (
    "(has(variables.podSpec.containers) ? variables.podSpec.containers : []) + "
    "(has(variables.podSpec.initContainers) ? variables.podSpec.initContainers : []) + "
    "(has(variables.podSpec.ephemeralContainers) ? variables.podSpec.ephemeralContainers : [])"
)
_IMAGES = "variables.containers.filter(c, has(c.image)).map(c, c.image)"
_VARIABLES = (
    {"name": "podSpec", "expression": _POD_SPEC},
    {"name": "containers", "expression": _CONTAINERS},
    {"name": "images", "expression": _IMAGES},
)
# An image reference `[host[:port]/]path[:tag][@digest]`: the tag is a ':' after the last '/'.
_EXPLICIT_LATEST = "i.matches(':latest(@.*)?$')"
_UNPINNED = "!i.contains('@') && !i.matches(':[^/]*$')"


class RenderError(Exception):
    """A Policy that cannot become an admission policy. `reason` is a CamelCase slug for the
    Ready condition; the message says what to change."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Admission:
    policy: dict[str, Any]  # the ValidatingAdmissionPolicy body
    binding: dict[str, Any]  # the ValidatingAdmissionPolicyBinding body, same name
    enforcement: Enforcement = DEFAULT_ENFORCEMENT  # what the binding's actions say


def enforcement_of(binding: Mapping[str, Any] | None) -> Enforcement | None:
    """The mode a binding read from the cluster has, by what it does to a request that fails:
    any `Deny` denies, else any `Warn` warns, else `Audit` records; None for no binding or one
    whose actions say none of these (not ours to name)."""
    spec = binding.get("spec") if isinstance(binding, Mapping) else None
    actions = spec.get("validationActions") if isinstance(spec, Mapping) else None
    if not isinstance(actions, list):
        return None
    for mode in (Enforcement.DENY, Enforcement.WARN, Enforcement.AUDIT):
        if mode.value in actions:
            return mode
    return None


def admission_name(policy_id: str) -> str:
    return f"{NAME_PREFIX}{policy_id}"


def cel_string(value: str) -> str:
    """`value` as a CEL string literal: double-quoted, with backslash, quote and every
    non-printable character escaped, so no input can end the literal or the expression."""
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable() and code < 0x80:
            out.append(ch)
        elif 0xD800 <= code <= 0xDFFF:
            # a lone surrogate cannot be written in CEL at all; validation rejects it first
            raise RenderError("InvalidRule", f"{shown(value)} contains a lone surrogate")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _cel_list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(cel_string(v) for v in values) + "]"


def _labels(policy_id: str, boundary: str) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY,
        BOUNDARY_LABEL: boundary,
        POLICY_LABEL: policy_id,
    }


def _required_labels(keys: tuple[str, ...]) -> list[dict[str, Any]]:
    keys_cel = _cel_list(keys)
    present = "(has(object.metadata.labels) && k in object.metadata.labels)"
    listed = ", ".join(f"'{k}'" for k in keys)
    return [
        {
            "expression": f"{keys_cel}.all(k, {present})",
            "message": (
                f"missing required label(s): this object's metadata.labels must have every "
                f"one of {listed}; add them (on a workload: to the object itself, not only "
                "to its pod template)"
            ),
            "messageExpression": (
                f"'missing required label(s) ' + {keys_cel}.filter(k, !{present})"
                ".map(k, \"'\" + k + \"'\").join(', ') + "
                "': add them to metadata.labels of this ' + object.kind"
                " + ' (on a workload: the object itself, not only its pod template)'"
            ),
        }
    ]


def _allowed_registries(prefixes: tuple[str, ...]) -> list[dict[str, Any]]:
    with_slash = _cel_list(tuple(p + "/" for p in prefixes))
    allowed = f"{with_slash}.exists(p, i.startsWith(p))"
    listed = ", ".join(f"'{p}/'" for p in prefixes)
    return [
        {
            "expression": f"variables.images.all(i, {allowed})",
            "message": (
                f"an image comes from a registry that is not allowed here: every image "
                f"(containers, initContainers, ephemeralContainers) must start with one of "
                f"{listed}; use the full reference, e.g. '{prefixes[0]}/app:1.0'"
            ),
            "messageExpression": (
                "'image(s) ' + variables.images.filter(i, !"
                f"{allowed}).map(i, \"'\" + i + \"'\").join(', ') + "
                f"' not from an allowed registry: every image must start with one of ' + "
                f"{cel_string(listed)} + ', e.g. ' + {cel_string(prefixes[0] + '/app:1.0')}"
            ),
        }
    ]


def _forbid_latest() -> list[dict[str, Any]]:
    return [
        {
            "expression": f"!variables.images.exists(i, {_EXPLICIT_LATEST})",
            "message": (
                "an image uses the tag 'latest', which changes under you: pin a version tag "
                "(e.g. nginx:1.27.3) or a digest (nginx@sha256:...)"
            ),
            "messageExpression": (
                f"'image(s) ' + variables.images.filter(i, {_EXPLICIT_LATEST})"
                ".map(i, \"'\" + i + \"'\").join(', ') + "
                "' use the tag \\'latest\\', which changes under you: pin a version tag "
                "(e.g. nginx:1.27.3) or a digest (nginx@sha256:...)'"
            ),
        },
        {
            "expression": f"!variables.images.exists(i, {_UNPINNED})",
            "message": (
                "an image has no tag or digest, which means tag 'latest': pin a version tag "
                "(e.g. nginx:1.27.3) or a digest (nginx@sha256:...)"
            ),
            "messageExpression": (
                f"'image(s) ' + variables.images.filter(i, {_UNPINNED})"
                ".map(i, \"'\" + i + \"'\").join(', ') + "
                "' have no tag or digest, which means tag \\'latest\\': pin a version tag "
                "(e.g. nginx:1.27.3) or a digest (nginx@sha256:...)'"
            ),
        },
    ]


def _validations(rule: Rule) -> list[dict[str, Any]]:
    if rule.type == "RequiredLabels":
        return _required_labels(tuple(rule.params["labels"]))
    if rule.type == "AllowedRegistries":
        return _allowed_registries(tuple(rule.params["registries"]))
    if rule.type == "ForbidLatestTag":
        return _forbid_latest()
    raise RenderError(
        "NotDelivered",
        f"rule.type: {rule.type} is answered in the control plane only and is never "
        "enforced in a cluster; nothing to install",
    )


@dataclass(frozen=True)
class _Parsed:
    policy_id: str
    boundary: str
    rule: Rule
    enforcement: Enforcement = DEFAULT_ENFORCEMENT


def _parse(spec: Mapping[str, Any]) -> _Parsed:
    if not isinstance(spec, Mapping):
        raise RenderError("InvalidSpec", f"spec: must be a mapping, got {shown(spec)}")
    unknown = set(spec) - _SPEC_FIELDS
    if unknown:
        names = shown(sorted(map(str, unknown)))
        raise RenderError("InvalidSpec", f"spec: unknown field(s) {names}")
    for key in ("policyId", "boundary", "rule"):
        if key not in spec:
            raise RenderError("InvalidSpec", f"spec.{key}: required")
    enabled = spec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RenderError(
            "InvalidSpec", f"spec.enabled: must be true or false, got {shown(enabled)}"
        )
    revision = spec.get("revision", 0)
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
        raise RenderError(
            "InvalidSpec", f"spec.revision: must be a non-negative integer, got {shown(revision)}"
        )
    policy_id, boundary = spec["policyId"], spec["boundary"]
    try:
        check_policy_id(policy_id)
    except RuleError as exc:
        raise RenderError("InvalidPolicyId", f"spec.policyId: {exc}") from None
    try:
        check_boundary_id(boundary)
    except RuleError as exc:
        raise RenderError("InvalidBoundary", f"spec.{exc}") from None
    try:
        rule = parse_rule(spec["rule"])
    except RuleError as exc:
        raise RenderError("InvalidRule", f"spec.{exc}") from None
    try:
        # Absent: a Policy written before modes, or by a daemon that writes only the others.
        enforcement = parse_enforcement(spec.get("enforcement", DEFAULT_ENFORCEMENT.value))
    except RuleError as exc:
        raise RenderError("InvalidEnforcement", f"spec.{exc}") from None
    return _Parsed(policy_id=policy_id, boundary=boundary, rule=rule, enforcement=enforcement)


def enforcement_of_spec(spec: Mapping[str, Any]) -> Enforcement:
    """A Policy spec's mode (absent: Deny); `RenderError` for a spec that cannot be enforced."""
    return _parse(spec).enforcement


def render_admission(spec: Mapping[str, Any]) -> Admission:
    """The admission policy and binding for a Policy's `spec`; `RenderError` for a spec that
    cannot be enforced (bad or missing fields, an unknown or control-plane-only rule type,
    parameters over the limits)."""
    parsed = _parse(spec)
    validations = _validations(parsed.rule)
    name = admission_name(parsed.policy_id)
    labels = _labels(parsed.policy_id, parsed.boundary)
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": [version],
                        "resources": list(resources),
                        "operations": ["CREATE", "UPDATE"],
                    }
                    for group, version, resources in RESOURCE_RULES
                ]
            },
            "variables": [dict(v) for v in _VARIABLES],
            "validations": validations,
        },
    }
    binding = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "policyName": name,
            "validationActions": list(VALIDATION_ACTIONS[parsed.enforcement]),
            "matchResources": {
                "namespaceSelector": {"matchLabels": {BOUNDARY_LABEL: parsed.boundary}}
            },
        },
    }
    return Admission(policy=policy, binding=binding, enforcement=parsed.enforcement)


# Hosts for the probe's image: reserved (.invalid never resolves), so nothing is ever pulled.
_PROBE_HOSTS = tuple(f"stackship-probe-{n}.invalid" for n in range(70))
# The path under an allowed registry prefix, when the other policies of the boundary leave no
# choice of registry: one of these is not a prefix the policy itself allows (it lists <= 64).
_PROBE_PATHS = tuple(f"stackship-probe-{n}" for n in range(70))
_PROBE_LABEL_VALUE = "stackship-probe"


class ProbeUnsatisfiable(Exception):
    """No Pod violates this policy while every other enabled policy of its boundary admits it
    (they require what it forbids): a probe would be denied by another policy, so it proves
    nothing. The message names the conflicting policies."""


def _unlisted_host(prefixes: tuple[str, ...]) -> str:
    """A registry host that none of `prefixes` covers (at most 64 prefixes: one is left)."""
    for host in _PROBE_HOSTS:
        image = f"{host}/probe:1"
        if not any(image.startswith(p + "/") for p in prefixes):
            return host
    raise RenderError("InvalidRule", "spec.rule.registries: covers every probe registry")


def _under(image: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    """Does AllowedRegistries with `prefixes` admit `image` (it starts with `<prefix>/`)?"""
    return any(image.startswith(p + "/") for p in prefixes)


def _others(parsed: _Parsed, others: Iterable[Mapping[str, Any]], *,
            every_mode: bool = False) -> list[_Parsed]:
    """The other policies that deny in this boundary: enabled, renderable, delivered, mode
    Deny (`every_mode`: any mode), same boundary, not this policy. Anything else cannot deny
    the probe (a Warn or Audit policy admits what it fails)."""
    found = []
    for other in others:
        try:
            o = _parse(other)
            _validations(o.rule)
        except RenderError:
            continue
        if (other.get("enabled", True) is not False and o.boundary == parsed.boundary
                and (every_mode or o.enforcement is Enforcement.DENY)
                and o.policy_id != parsed.policy_id):
            found.append(o)
    return found


def _ids(policies: Iterable[_Parsed]) -> str:
    return ", ".join(sorted({p.policy_id for p in policies}))


def _probe_labels(parsed: _Parsed, others: list[_Parsed]) -> dict[str, str]:
    """Every key the others require, and ours; for RequiredLabels without one of its keys."""
    required = {k for o in others if o.rule.type == "RequiredLabels"
                for k in o.rule.params["labels"]}
    labels = dict.fromkeys(sorted(required), _PROBE_LABEL_VALUE)
    labels |= {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: parsed.policy_id}
    if parsed.rule.type != "RequiredLabels":
        return labels
    own = set(parsed.rule.params["labels"])
    if own <= required:
        conflicting = [o for o in others if o.rule.type == "RequiredLabels"
                       and own & set(o.rule.params["labels"])]
        raise ProbeUnsatisfiable(
            f"every label {parsed.policy_id} requires is required by {_ids(conflicting)} in "
            f"boundary {parsed.boundary} too: a pod without one is denied by those first")
    return {k: v for k, v in labels.items() if k not in own - required}


def _probe_image(parsed: _Parsed, others: list[_Parsed], tag: str) -> str:
    """An image every other AllowedRegistries policy admits and, when this policy is one, that
    it does not: under one of the others' prefixes when they list any."""
    lists = [tuple(o.rule.params["registries"]) for o in others
             if o.rule.type == "AllowedRegistries"]
    own: tuple[str, ...] = ()
    if parsed.rule.type == "AllowedRegistries":
        own = tuple(parsed.rule.params["registries"])
    if not lists:
        return f"{_unlisted_host(own)}/probe{tag}"
    # An image admitted by every list starts with `<q>/` for the longest prefix q it matches,
    # and q is in one of the lists: trying each is complete.
    candidates = sorted({q for prefixes in lists for q in prefixes
                         if all(_under(q + "/", p) for p in lists)})
    for q in candidates:
        if _under(q + "/", own):
            continue  # everything under q is allowed by this policy too
        for path in _PROBE_PATHS:
            image = f"{q}/{path}/probe{tag}"
            if not _under(image, own):
                return image
    registries = [o for o in others if o.rule.type == "AllowedRegistries"]
    if not candidates:
        raise ProbeUnsatisfiable(
            f"the AllowedRegistries policies {_ids(registries)} of boundary {parsed.boundary} "
            "allow no registry in common: every pod is denied by one of them first")
    raise ProbeUnsatisfiable(
        f"every registry allowed by {_ids(registries)} in boundary {parsed.boundary} is also "
        f"allowed by {parsed.policy_id}: a pod from any other registry is denied by those "
        "first")


def violating_pod(spec: Mapping[str, Any], *, namespace: str, name: str,
                  others: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A valid Pod that this policy's rule fails and every other denying policy of its boundary
    admits: for the enforcement probe's dry-run create in a boundary namespace, so a denial
    (or, in mode Warn, a warning) can only be this policy's. `others` are the specs of the
    other enabled Policies of the boundary (anything else in it, or a spec that cannot be
    enforced, is ignored). One in mode Warn or Audit admits what it fails, but the API server
    counts the failure (its `status.admission`) and warns: the Pod passes those too when a
    Pod can, and is not made unsatisfiable by them when none can.

    The Pod breaks only this policy's rule: it carries every label the others require (leaving
    out one this policy requires, when it is RequiredLabels), its image is pinned (tag `1`;
    unpinned when this policy is ForbidLatestTag) and from a reserved `.invalid` host, or,
    when the others allow only some registries, from a path `stackship-probe-<n>/probe` under
    one they allow (and this policy does not, when it is AllowedRegistries). The create is a
    dry run: nothing is stored and no kubelet ever sees the Pod, so no image is ever pulled.

    Raises `ProbeUnsatisfiable` when no such Pod exists (the others require what this policy
    forbids), `RenderError` for a spec that cannot be enforced."""
    parsed = _parse(spec)
    _validations(parsed.rule)  # control-plane rules have no violating pod either
    others = list(others)
    try:
        # Passing the Warn and Audit policies too, when a pod can: the API server counts
        # (and warns of) what fails them, and a probe of this policy is not theirs to count.
        return _violating_pod(parsed, _others(parsed, others, every_mode=True), namespace,
                              name)
    except ProbeUnsatisfiable:
        return _violating_pod(parsed, _others(parsed, others), namespace, name)


def _violating_pod(parsed: _Parsed, enforced: list[_Parsed], namespace: str,
                   name: str) -> dict[str, Any]:
    if parsed.rule.type == "ForbidLatestTag":
        same = [o for o in enforced if o.rule.type == "ForbidLatestTag"]
        if same:
            raise ProbeUnsatisfiable(
                f"{_ids(same)} forbid the tag latest in boundary {parsed.boundary} too: a pod "
                "with it is denied by those first")
    labels = _probe_labels(parsed, enforced)
    tag = "" if parsed.rule.type == "ForbidLatestTag" else ":1"
    image = _probe_image(parsed, enforced, tag)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "probe", "image": image}]},
    }
