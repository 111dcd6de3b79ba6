"""Plain data for the domain: clusters, boundaries, policies and their validation.

Pure: no I/O. A policy row from the database is validated here into either a `Policy`
(deliverable) or an `InvalidPolicy` (reported with a reason, never written to a cluster).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NewType

from convergerd.core.shown import shown

ClusterId = NewType("ClusterId", str)
BoundaryId = NewType("BoundaryId", str)
PolicyId = NewType("PolicyId", str)

# Rule types that are written to clusters, and the one answered only in the control plane.
DELIVERED_RULE_TYPES = ("RequiredLabels", "AllowedRegistries", "ForbidLatestTag")
CONTROL_PLANE_RULE_TYPES = ("AllowedComputePlans",)
RULE_TYPES = DELIVERED_RULE_TYPES + CONTROL_PLANE_RULE_TYPES

POLICY_ID_MAX_LEN = 50
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Boundary ids end up as label values: at most 63 characters, alphanumerics plus -_. inside.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# A registry prefix: host[:port][/path], no scheme, no trailing slash.
_REGISTRY = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9._-]+)*$")
# A label key: optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# A DNS subdomain: dot-separated DNS labels, at most 253 characters (length checked apart).
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_SUBDOMAIN_MAX_LEN = 253
# Bounds on a rule's lists, so a row cannot grow the object applied to every cluster in its
# boundary (or the database, or status) without limit.
RULE_LIST_MAX_ENTRIES = 64
LABEL_NAME_MAX_LEN = 63
LABEL_KEY_MAX_LEN = _DNS_SUBDOMAIN_MAX_LEN + 1 + LABEL_NAME_MAX_LEN  # prefix/name
REGISTRY_MAX_LEN = 253
PLAN_MAX_LEN = 253
_ENTRY_MAX_LEN = {"labels": LABEL_KEY_MAX_LEN, "registries": REGISTRY_MAX_LEN,
                  "plans": PLAN_MAX_LEN}


class Enforcement(StrEnum):
    """What admission does with a request the policy's rule fails (docs/design.md, "Modes"):
    `Deny` rejects it (the source documents' behaviour, the default), `Warn` admits it with a
    warning to the client, `Audit` admits it and only records the failure in the API server's
    audit log. The values are the database's, the import file's, the API's and the Policy's
    `spec.enforcement`."""

    DENY = "Deny"
    WARN = "Warn"
    AUDIT = "Audit"


DEFAULT_ENFORCEMENT = Enforcement.DENY
ENFORCEMENTS = tuple(e.value for e in Enforcement)


@dataclass(frozen=True, slots=True)
class Cluster:
    id: ClusterId


@dataclass(frozen=True, slots=True)
class Boundary:
    id: BoundaryId
    clusters: frozenset[ClusterId]


@dataclass(frozen=True, slots=True)
class Rule:
    """A validated rule: `params` holds exactly the keys its type defines."""

    type: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def delivered(self) -> bool:
        return self.type in DELIVERED_RULE_TYPES

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, **{k: list(v) for k, v in self.params.items()}}


@dataclass(frozen=True, slots=True)
class PolicyException:
    """An exception to one policy, as granted (checked by `convergerd.core.exceptions`): the
    objects of `namespace` (all of them, or the one named `name`, or those whose labels carry
    every pair of `selector`) are admitted until `expires_at`."""

    id: str
    namespace: str
    reason: str
    requested_by: str
    approved_by: str
    expires_at: dt.datetime  # in UTC
    name: str | None = None
    selector: tuple[tuple[str, str], ...] | None = None  # matchLabels, sorted by key


@dataclass(frozen=True, slots=True)
class Policy:
    id: PolicyId
    boundary: BoundaryId
    rule: Rule
    enabled: bool
    revision: int
    enforcement: Enforcement = DEFAULT_ENFORCEMENT
    # In force when read (unexpired), by id; delivered in the Policy's `spec.exceptions`.
    exceptions: tuple[PolicyException, ...] = ()


@dataclass(frozen=True, slots=True)
class UnreadableJson:
    """Stands for a stored JSON value the bounded decoder would not read (nested too deep, an
    integer too long): the row carries it instead of failing the whole read, and validation
    turns it into an invalid policy whose reason says why."""

    reason: str


@dataclass(frozen=True, slots=True)
class PolicyRow:
    """A policy as stored: not yet validated (the database accepts what module-policies wrote)."""

    id: str
    boundary: str
    rule: Mapping[str, Any] | UnreadableJson
    enabled: bool
    revision: int
    enforcement: str = DEFAULT_ENFORCEMENT.value
    # The unexpired exceptions as stored (`spec.exceptions` entries), checked with the row.
    exceptions: Sequence[Any] | UnreadableJson = ()


@dataclass(frozen=True, slots=True)
class InvalidPolicy:
    id: str
    boundary: str
    revision: int
    reason: str


class RuleError(ValueError):
    """A rule or id that cannot be delivered; the message names the field and the value."""


def check_policy_id(value: str) -> None:
    if not isinstance(value, str) or not value:
        raise RuleError(f"id: must be a non-empty string, got {shown(value)}")
    if len(value) > POLICY_ID_MAX_LEN:
        raise RuleError(
            f"id: {shown(value)} is {len(value)} characters, at most {POLICY_ID_MAX_LEN}"
        )
    if not _DNS_LABEL.fullmatch(value):
        raise RuleError(
            f"id: {shown(value)} is not a DNS label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit)"
        )


def check_boundary_id(value: str) -> None:
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise RuleError(
            f"boundary: {shown(value)} is not a valid label value (at most 63 characters: "
            "letters, digits, '-', '_', '.', starting and ending with a letter or digit)"
        )


def parse_enforcement(value: object) -> Enforcement:
    """A mode as stored, imported or asked for; `RuleError` naming the field and the value
    otherwise. Case matters, as in a binding's `validationActions`: `deny` is refused with a
    hint rather than guessed at."""
    if isinstance(value, str) and value in ENFORCEMENTS:
        return Enforcement(value)
    hint = ""
    if isinstance(value, str) and len(value) <= 5 and value.capitalize() in ENFORCEMENTS:
        hint = f" (the names are case-sensitive: {value.capitalize()})"
    raise RuleError(
        f"enforcement: must be one of {', '.join(ENFORCEMENTS)}, got {shown(value)}{hint}"
    )


def is_object_name(value: object) -> bool:
    """A Kubernetes object name (a DNS subdomain of at most 253 characters): what may stand in
    a request path as one segment (no '/', '?', '%', '..')."""
    return (isinstance(value, str) and len(value) <= _DNS_SUBDOMAIN_MAX_LEN
            and _DNS_SUBDOMAIN.fullmatch(value) is not None)


def is_namespace_name(value: object) -> bool:
    """A namespace name (a DNS label of at most 63 characters)."""
    return isinstance(value, str) and len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def check_cluster_id(value: str) -> None:
    # Length first: the pattern is then matched on at most 63 characters.
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise RuleError(
            f"cluster id: {shown(value)} is not a DNS label of at most 63 characters"
        )


def field_names(keys: Iterable[object]) -> str:
    """Field names for a message: sorted, plain names as written, anything else quoted (so the
    message stays one line); shortened."""
    names = sorted(
        shown(k, 40, style="text") if isinstance(k, str) and k.isprintable() and " " not in k
        else shown(k, 40)
        for k in keys
    )
    return shown(", ".join(names), style="text")


def _string_list(params: Mapping[str, Any], key: str, rule_type: str) -> list[str]:
    value = params.get(key)
    if not isinstance(value, list) or not value:
        raise RuleError(f"rule.{key}: {rule_type} needs a non-empty list, got {shown(value)}")
    if len(value) > RULE_LIST_MAX_ENTRIES:
        raise RuleError(
            f"rule.{key}: {len(value)} entries, at most {RULE_LIST_MAX_ENTRIES}: "
            f"{shown(value)}"
        )
    for item in value:
        if not isinstance(item, str) or not item:
            raise RuleError(
                f"rule.{key}: every entry must be a non-empty string, got {shown(item)}"
            )
        if len(item) > _ENTRY_MAX_LEN[key]:
            raise RuleError(
                f"rule.{key}: {shown(item)} is {len(item)} characters, "
                f"at most {_ENTRY_MAX_LEN[key]}"
            )
    if len(set(value)) != len(value):
        raise RuleError(f"rule.{key}: duplicate entries in {shown(value)}")
    return list(value)


def _label_key_problem(key: str) -> str | None:
    """Kubernetes' rule for a label key (a qualified name): an optional DNS-subdomain prefix
    of at most 253 characters and '/', then a name of at most 63 characters."""
    prefix, slash, name = key.rpartition("/")
    if slash and len(prefix) > _DNS_SUBDOMAIN_MAX_LEN:
        return f"has a prefix of {len(prefix)} characters, at most {_DNS_SUBDOMAIN_MAX_LEN}"
    if len(name) > LABEL_NAME_MAX_LEN:
        return f"has a name of {len(name)} characters, at most {LABEL_NAME_MAX_LEN}"
    if slash and not _DNS_SUBDOMAIN.fullmatch(prefix):
        return "has a prefix that is not a DNS subdomain (lowercase, like 'example.com')"
    if not _LABEL_NAME.fullmatch(name):
        return (
            "is not a valid label key (letters, digits, '-', '_', '.', starting and ending "
            "with a letter or digit, after an optional 'prefix/')"
        )
    return None


def label_key_problem(key: str) -> str | None:
    """What is wrong with a label key (None: nothing), for callers outside rules (a cluster's
    labels, a wave's selector)."""
    return _label_key_problem(key) if len(key) <= LABEL_KEY_MAX_LEN else (
        f"is {len(key)} characters, at most {LABEL_KEY_MAX_LEN}")


def is_label_value(value: object) -> bool:
    """A Kubernetes label value: empty, or at most 63 characters of letters, digits, '-', '_'
    and '.', starting and ending with a letter or digit."""
    return isinstance(value, str) and (value == "" or (
        len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None))


def _registry_problem(prefix: str) -> str | None:
    """What is wrong with a registry prefix (its length is checked with the list)."""
    if any(c.isspace() or not c.isprintable() for c in prefix):
        return "contains whitespace or control characters"
    if "://" in prefix:
        return "has a scheme; write only host[:port][/path], e.g. 'registry.example.com'"
    if prefix.endswith("/"):
        return "ends with '/'; write it without, e.g. 'registry.example.com/team'"
    if not _REGISTRY.fullmatch(prefix):
        return (
            "is not a registry prefix like 'registry.example.com' or "
            "'registry.example.com/team' (lowercase host[:port][/path])"
        )
    return None


def _check_label_key(key: str) -> None:
    problem = label_key_problem(key)
    if problem:
        raise RuleError(f"rule.labels: {shown(key)} {problem}")


def _check_registry(prefix: str) -> None:
    problem = _registry_problem(prefix)
    if problem:
        raise RuleError(f"rule.registries: {shown(prefix)} {problem}")


def parse_rule(raw: Any) -> Rule:
    """Validate a rule mapping (`{type: ..., <params>}`) into a `Rule`."""
    if isinstance(raw, UnreadableJson):
        raise RuleError(f"rule: the stored JSON cannot be read: {raw.reason}")
    if not isinstance(raw, Mapping):
        raise RuleError(f"rule: must be a mapping with a 'type', got {shown(raw)}")
    rule_type = raw.get("type")
    if rule_type not in RULE_TYPES:
        raise RuleError(
            f"rule.type: unknown type {shown(rule_type)}; known: {', '.join(RULE_TYPES)}"
        )
    allowed = {
        "RequiredLabels": ("labels",),
        "AllowedRegistries": ("registries",),
        "ForbidLatestTag": (),
        "AllowedComputePlans": ("plans",),
    }[rule_type]
    unknown = set(raw) - {"type", *allowed}
    if unknown:
        raise RuleError(f"rule: unknown field(s) {field_names(unknown)} for type {rule_type}")
    params: dict[str, tuple[str, ...]] = {}
    for key in allowed:
        values = _string_list(raw, key, rule_type)
        check = {"labels": _check_label_key, "registries": _check_registry}.get(key)
        if check:
            for value in values:
                check(value)
        params[key] = tuple(values)
    return Rule(type=rule_type, params=params)




@dataclass(frozen=True, slots=True)
class Position:
    """Where a policy's rollout stands: with the policy's revision and the scope, what decides
    each cluster's due revision and mode (`core.rollout`). A round's write checks it again at
    write time: a rollout that moved on since the round read it makes the write stale."""

    rollout: int
    state: str
    wave: int
    warn_step: bool


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the database says should exist: the input of a round."""

    clusters: Sequence[Cluster]
    boundaries: Mapping[BoundaryId, Boundary]
    policies: Sequence[Policy]
    invalid: Sequence[InvalidPolicy]
    # The policies delivered per cluster (a rollout, `core.rollout`): each cluster's due Policy,
    # None (or no entry) where nothing is written this round. Every other policy goes
    # everywhere in its scope, as it is.
    staged: Mapping[PolicyId, Mapping[ClusterId, Policy | None]] = field(default_factory=dict)
    # Of the staged policies that follow a rollout, where it stood when it was read.
    positions: Mapping[PolicyId, Position] = field(default_factory=dict)

    def desired_by_cluster(self) -> dict[ClusterId, list[Policy]]:
        """Per known cluster, the delivered policies its boundaries cover (control-plane rules
        never leave: they are not in the result), each as `staged` says for that cluster."""
        result: dict[ClusterId, list[Policy]] = {c.id: [] for c in self.clusters}
        for policy in self.policies:
            if not policy.rule.delivered:
                continue
            boundary = self.boundaries.get(policy.boundary)
            if boundary is None:
                continue
            due = self.staged.get(policy.id)
            if due is not None:
                for cluster_id in boundary.clusters:
                    found = due.get(cluster_id)
                    if found is not None and cluster_id in result:
                        result[cluster_id].append(found)
                continue
            for cluster_id in boundary.clusters:
                if cluster_id in result:
                    result[cluster_id].append(policy)
        return result
