"""What a round must apply to one cluster: desired Policy objects vs what the cluster holds. Pure.

A round only adds and updates; nothing here ever produces a deletion.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from convergerd.core.decode import (
    MAX_LABEL_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TOKEN_CHARS,
    FieldReader,
    expected,
)
from convergerd.core.frozen import frozen
from convergerd.core.model import Policy
from convergerd.core.render import object_name, render_policy
from convergerd.core.report import Audit, AuditSample, Verification

# The phase and Ready reason of an object read back with a field of the wrong type.
UNKNOWN_PHASE = "Unknown"
MALFORMED_REASON = "Malformed"
CONDITION_STATUSES = ("True", "False", "Unknown")
# Bounds of `status.audit`, written by the operator and so untrusted: a count past a billion
# or more than five samples is not what our operator writes.
MAX_AUDIT_VIOLATIONS = 10**9
MAX_AUDIT_SAMPLE = 5
# Bound of `status.admission`'s counts: failed validations an API server counted, far past
# what one policy sees in the life of a cluster.
MAX_ADMISSIONS = 10**12


class Why(StrEnum):
    MISSING = "missing"  # not in the cluster (never delivered, or deleted there)
    DRIFT = "drift"  # in the cluster, but its spec or our labels differ from the database


@frozen
class ListedPolicy:
    """A Policy object as listed from a cluster: only what the round and the status API read."""

    name: str
    labels: Mapping[str, str]
    spec: Mapping[str, Any]
    resource_version: str
    generation: int | None = None
    phase: str | None = None
    observed_generation: int | None = None
    ready_status: str | None = None
    ready_reason: str | None = None
    ready_message: str | None = None
    verified: Verification | None = None
    audit: Audit | None = None
    # What the operator reports beside the phase, under the reading's names
    # (`facts.READING`): the mode in force, the admission counts, the audit's excepted.
    enforcement_action: str | None = None
    admission_denied: int | None = None
    admission_warned: int | None = None
    admission_audited: int | None = None
    admission_last_hour_denied: int | None = None
    admission_last_hour_warned: int | None = None
    admission_last_hour_audited: int | None = None
    admission_since: dt.datetime | None = None
    admission_read_at: dt.datetime | None = None
    admission_revision: int | None = None
    admission_resets: int | None = None
    admission_note: str | None = None
    admission_problem: str | None = None
    audit_excepted: int | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ListedPolicy:
        """Decoded at the edge (`convergerd.core.decode`): strings cleaned and capped; a field
        with the wrong type reads as absent, and the object's phase is then `Unknown`
        with reason `Malformed` and the field and value as message."""
        r = FieldReader()
        meta = r.mapping(obj, "metadata", "metadata")
        status = r.mapping(obj, "status", "status")
        spec = r.mapping(obj, "spec", "spec")
        conditions = r.sequence(status, "conditions", "status.conditions")
        ready: Mapping[str, Any] = {}
        verified: Mapping[str, Any] | None = None
        for index, condition in enumerate(conditions):
            if not isinstance(condition, Mapping):
                r.problems.append(expected(f"status.conditions[{index}]", "an object",
                                           condition))
            elif condition.get("type") == "Ready" and not ready:
                ready = condition
            elif condition.get("type") == "Verified" and verified is None:
                verified = condition
        where = "status.conditions[Ready]"
        observed = cls(
            name=r.text(meta, "name", "metadata.name", MAX_NAME_CHARS) or "",
            labels=r.labels(meta, "labels", "metadata.labels"),
            # The decoded answer's own dict (nothing else holds it): no copy per object.
            spec=spec if type(spec) is dict else dict(spec),
            resource_version=r.text(meta, "resourceVersion", "metadata.resourceVersion",
                                    MAX_TOKEN_CHARS) or "",
            generation=r.integer(meta, "generation", "metadata.generation"),
            phase=interned(r.text(status, "phase", "status.phase", MAX_REASON_CHARS)),
            observed_generation=r.integer(status, "observedGeneration",
                                          "status.observedGeneration"),
            ready_status=interned(r.text(ready, "status", f"{where}.status", MAX_REASON_CHARS)),
            ready_reason=interned(r.text(ready, "reason", f"{where}.reason", MAX_REASON_CHARS)),
            ready_message=interned(r.message(ready, "message", f"{where}.message")),
            verified=verification(verified) if verified is not None else None,
            # Decoded on its own: a bad audit is an unknown audit, never a bad phase.
            audit=(audited := audit(status["audit"]) if status.get("audit") is not None
                   else None),
            enforcement_action=interned(r.text(status, "enforcementAction",
                                               "status.enforcementAction", MAX_REASON_CHARS)),
            # Decoded on its own, likewise: bad counts are unknown counts, the problem said.
            **(admission(status["admission"]) if status.get("admission") is not None
               else {}),
            audit_excepted=excepted(status["audit"]) if audited is not None
            and audited.violations is not None else None,
        )
        problem = r.problem
        if problem is None:
            return observed
        return dataclasses.replace(observed, phase=UNKNOWN_PHASE, ready_status=None,
                                   ready_reason=MALFORMED_REASON, ready_message=problem,
                                   verified=None, audit=None, enforcement_action=None,
                                   audit_excepted=None, **NO_ADMISSION)


def interned(text: str | None) -> str | None:
    """One object for equal strings read from every cluster (a phase, a reason, an operator's
    message): a round and the status keep a reading per policy per cluster, ~1,000,000 at
    10,000 x 100, and each decoded string would otherwise be its own 50-100 bytes. Interned
    strings are freed with their last reference."""
    return sys.intern(text) if text is not None else None


def _same_time(first: dt.datetime | None, second: dt.datetime | None) -> dt.datetime | None:
    """`second`, as the object `first` when they are equal (a first probe's two times): one
    object less per reading kept."""
    return first if second is not None and second == first else second


def verification(condition: Mapping[str, Any]) -> Verification:
    """The `Verified` condition, decoded on its own: a field of the wrong type (or a status
    other than True, False, Unknown) makes it `Unknown` with reason `Malformed` and the field
    and value as message, and leaves the phase and Ready alone."""
    r = FieldReader()
    where = "status.conditions[Verified]"
    status = r.text(condition, "status", f"{where}.status", MAX_REASON_CHARS)
    if status not in CONDITION_STATUSES:
        r.problems.append(expected(f"{where}.status", "True, False or Unknown", status))
    found = Verification(
        status=interned(status) or UNKNOWN_PHASE,
        reason=interned(r.text(condition, "reason", f"{where}.reason", MAX_REASON_CHARS)),
        message=interned(r.message(condition, "message", f"{where}.message")),
        probed_at=(probed := r.time(condition, "lastProbeTime", f"{where}.lastProbeTime")),
        since=_same_time(probed, r.time(condition, "lastTransitionTime",
                                        f"{where}.lastTransitionTime")),
    )
    problem = r.problem
    if problem is None:
        return found
    return Verification(UNKNOWN_PHASE, MALFORMED_REASON, problem)


def audit(value: object) -> Audit:
    """`status.audit`, decoded on its own: `violations` an integer from 0 to
    `MAX_AUDIT_VIOLATIONS`, `auditedAt` an RFC 3339 time and `cacheSynced` a boolean (all three
    required), `sample` at most `MAX_AUDIT_SAMPLE` objects of strings (`kind` and `name`
    required). Anything else is an unknown audit (violations None) with the field and value
    as `problem`; strings are cleaned and capped. An audit the operator says is `incomplete`
    (some objects of the boundary not judged: its cache at its budget, or objects too large
    to read) is read as not synced: its count may be partial, as an unsynced one's."""
    where = "status.audit"
    r = FieldReader()
    if not isinstance(value, Mapping):
        r.problems.append(expected(where, "an object", value))
        return Audit(None, problem=r.problem)
    violations = r.integer(value, "violations", f"{where}.violations")
    if violations is not None and not 0 <= violations <= MAX_AUDIT_VIOLATIONS:
        r.problems.append(expected(f"{where}.violations",
                                   f"an integer from 0 to {MAX_AUDIT_VIOLATIONS}", violations))
    audited_at = r.time(value, "auditedAt", f"{where}.auditedAt")
    synced = value.get("cacheSynced")
    if not isinstance(synced, bool):
        r.problems.append(expected(f"{where}.cacheSynced", "true or false", synced))
    for key, field in (("violations", "violations"), ("auditedAt", "auditedAt")):
        if value.get(key) is None:
            r.problems.append(f"{where}.{field}: missing")
    excepted_count = value.get("excepted")
    if excepted_count is not None and not _excepted_ok(excepted_count):
        r.problems.append(expected(f"{where}.excepted",
                                   f"an integer from 0 to {MAX_AUDIT_VIOLATIONS}",
                                   excepted_count))
    raw_sample = r.sequence(value, "sample", f"{where}.sample")
    if len(raw_sample) > MAX_AUDIT_SAMPLE:
        r.problems.append(f"{where}.sample: expected at most {MAX_AUDIT_SAMPLE} entries, "
                          f"got {len(raw_sample)}")
        raw_sample = ()
    sample = tuple(s for i, entry in enumerate(raw_sample)
                   if (s := _audit_sample(r, entry, f"{where}.sample[{i}]")) is not None)
    problem = r.problem
    if problem is not None:
        return Audit(None, problem=problem)
    whole = value.get("incomplete") is None
    return Audit(violations, audited_at, synced is True and whole, None, sample)


def _audit_sample(r: FieldReader, entry: object, where: str) -> AuditSample | None:
    if not isinstance(entry, Mapping):
        r.problems.append(expected(where, "an object", entry))
        return None
    kind = r.text(entry, "kind", f"{where}.kind", MAX_REASON_CHARS)
    name = r.text(entry, "name", f"{where}.name", MAX_NAME_CHARS)
    namespace = r.text(entry, "namespace", f"{where}.namespace", MAX_LABEL_VALUE_CHARS)
    message = r.message(entry, "message", f"{where}.message")
    if not kind or not name:
        r.problems.append(f"{where}: kind and name are required")
        return None
    return AuditSample(kind, namespace, name, message)


# `status.admission`'s figures, as the reading names them (`facts.READING`), where each is
# in the object, and none read.
_ADMISSION_COUNTS = (("admission_denied", "denied"), ("admission_warned", "warned"),
                     ("admission_audited", "audited"))
_ADMISSION_LAST_HOUR = (("admission_last_hour_denied", "denied"),
                        ("admission_last_hour_warned", "warned"),
                        ("admission_last_hour_audited", "audited"))
NO_ADMISSION: Final[Mapping[str, Any]] = MappingProxyType(dict.fromkeys((
    *(n for n, _ in (*_ADMISSION_COUNTS, *_ADMISSION_LAST_HOUR)), "admission_since",
    "admission_read_at", "admission_revision", "admission_resets", "admission_note",
    "admission_problem")))


def admission(value: object) -> dict[str, Any]:
    """`status.admission`, decoded on its own, as the reading's fields by name: `denied`,
    `warned`, `audited` and `lastHour`'s three integers from 0 to `MAX_ADMISSIONS`, `since`
    and `readAt` RFC 3339 times (all required), `revision` and `resets` such integers too,
    `note` a string (cleaned and capped). Anything else leaves every figure unknown with the
    field and value as `admission_problem`: never a bad phase. `probesExcluded` is not read
    (the operator's own probes, already left out of the figures), nor `lastHour.since` (the
    later of `since` and an hour before `readAt`)."""
    where = "status.admission"
    r = FieldReader()
    if not isinstance(value, Mapping):
        r.problems.append(expected(where, "an object", value))
        return {**NO_ADMISSION, "admission_problem": r.problem}
    last_hour = r.mapping(value, "lastHour", f"{where}.lastHour")
    found: dict[str, Any] = {}
    for source, prefix, names in ((value, where, _ADMISSION_COUNTS),
                                  (last_hour, f"{where}.lastHour", _ADMISSION_LAST_HOUR)):
        for name, key in names:
            found[name] = _admission_count(r, source, key, f"{prefix}.{key}", required=True)
    found["admission_revision"] = _admission_count(r, value, "revision", f"{where}.revision")
    found["admission_resets"] = _admission_count(r, value, "resets", f"{where}.resets")
    found["admission_since"] = r.time(value, "since", f"{where}.since")
    found["admission_read_at"] = r.time(value, "readAt", f"{where}.readAt")
    for key, name in (("since", "admission_since"), ("readAt", "admission_read_at")):
        if found[name] is None and value.get(key) is None:
            r.problems.append(f"{where}.{key}: missing")
    found["admission_note"] = interned(r.message(value, "note", f"{where}.note"))
    problem = r.problem
    if problem is not None:
        return {**NO_ADMISSION, "admission_problem": problem}
    return {**found, "admission_problem": None}


def _admission_count(r: FieldReader, value: Mapping[str, Any], key: str, where: str, *,
                     required: bool = False) -> int | None:
    count = r.integer(value, key, where)
    if count is None:
        if required and value.get(key) is None:
            r.problems.append(f"{where}: missing")
        return None
    if not 0 <= count <= MAX_ADMISSIONS:
        r.problems.append(expected(where, f"an integer from 0 to {MAX_ADMISSIONS}", count))
        return None
    return count


def excepted(value: Mapping[str, Any]) -> int | None:
    """`status.audit.excepted` of an audit `audit` could read: an integer from 0 to
    `MAX_AUDIT_VIOLATIONS`, absent while no exception is in force (None); any other value
    made the audit unknown (`audit`)."""
    count = value.get("excepted")
    return count if count is None or _excepted_ok(count) else None


def _excepted_ok(count: object) -> bool:
    return (type(count) is int and 0 <= count <= MAX_AUDIT_VIOLATIONS)


@dataclass(frozen=True, slots=True)
class Apply:
    """`body` of a DRIFT apply carries the listed object's resourceVersion as a precondition:
    a save (or delete) that wrote the object after the list makes the apply fail as superseded
    instead of writing the older revision over it."""

    policy: Policy
    body: dict[str, Any]
    why: Why


def differs(body: Mapping[str, Any], observed: ListedPolicy) -> bool:
    """True when the object in the cluster does not carry what we would apply.

    Only fields we own are compared: other managers' labels or annotations are not drift.
    """
    wanted_labels: Mapping[str, str] = body["metadata"]["labels"]
    if not wanted_labels.items() <= observed.labels.items():  # a set comparison, in C
        return True
    return bool(observed.spec != body["spec"])  # any Mapping compares with a dict by content


def with_precondition(body: dict[str, Any], resource_version: str) -> dict[str, Any]:
    """`body` with `metadata.resourceVersion` set (nothing set when it is empty)."""
    if not resource_version:
        return body
    return {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}


class Bodies:
    """Each Policy's apply body (`render_policy`), made once however many clusters it is
    planned for: a round plans every desired policy on every cluster, 1,000,000 renders at
    10,000 x 100 for 100 distinct bodies. Keyed by the object (kept, so its id stays its
    own): a saved policy is a new object. The bodies are shared: never modified
    (`with_precondition` copies)."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[int, tuple[Policy, dict[str, Any]]] = {}

    def __call__(self, policy: Policy) -> dict[str, Any]:
        made = self._made.get(id(policy))
        if made is not None and made[0] is policy:
            return made[1]
        body = render_policy(policy)
        self._made[id(policy)] = (policy, body)
        return body


def plan_cluster(desired: Iterable[Policy], observed: Mapping[str, ListedPolicy],
                 bodies: Callable[[Policy], dict[str, Any]] = render_policy) -> list[Apply]:
    """The applies that bring one cluster in line; empty when it is in sync. `bodies`
    renders a policy (a round's `Bodies` renders each once)."""
    actions: list[Apply] = []
    for policy in desired:
        body = bodies(policy)
        found = observed.get(object_name(policy.id))
        if found is None:
            actions.append(Apply(policy, body, Why.MISSING))
        elif differs(body, found):
            actions.append(Apply(policy, with_precondition(body, found.resource_version),
                                 Why.DRIFT))
    return actions
