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

Each object is judged by `convergerd.admission.verdict` (the rendered CEL's verdict and message,
in Python over the slim objects the cache keeps, `convergerd.operator.workloads`; an object
whose images or labels were cut is `cannot be judged: ...` unless what was kept already breaks
the rule). A stub the cache kept for want of room (`refused`) is not judged but counted, and
the status then says `incomplete` (`Incomplete`): how many objects of the boundary were not
judged, why, the objects too large to read, and the namespaces holding the most of the cache.
Without `incomplete`, every object of the boundary was judged.

Objects an exception in force admits are judged all the same, and those the rule would deny are
counted apart, as `excepted` (present only while the Policy has exceptions in force): not in
`violations` nor in `sample`, and not hidden either, so the debt stays visible.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from convergerd.admission.verdict import Judge, denial, denied
from convergerd.core.decode import clean_text
from convergerd.core.exceptions import covers
from convergerd.core.model import PolicyException
from convergerd.operator.reconcile import timestamp

SAMPLE_SIZE = 5
MESSAGE_MAX_CHARS = 1024  # per sample entry in the status


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
    excepted: int | None = None  # denied but admitted by an exception; None: none in force


def _order(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(obj.get("kind", "")), str(meta.get("name", ""))


def _excepted(obj: Mapping[str, Any], exceptions: tuple[PolicyException, ...]) -> bool:
    meta = obj["metadata"]
    return any(covers(e, meta.get("namespace"), meta.get("name"), meta.get("labels"))
               for e in exceptions)


def audit(judge: Judge, objects: Iterable[Mapping[str, Any]],
          exceptions: tuple[PolicyException, ...] = ()) -> AuditResult:
    """The objects `judge` denies: how many, and the first `SAMPLE_SIZE` (by namespace, kind,
    name) with admission's message; those `exceptions` admit counted apart."""
    found = []
    refused = excepted = 0
    for obj in objects:
        if obj.get("refused"):
            refused += 1
        elif denied(judge, obj):
            if exceptions and _excepted(obj, exceptions):
                excepted += 1
            else:
                found.append(obj)
    sample = []
    for obj in heapq.nsmallest(SAMPLE_SIZE, found, key=_order):
        message = denial(judge, obj)
        assert message is not None  # `denied` and `denial` agree (tested)
        sample.append(Violation(*_order(obj), message))
    return AuditResult(len(found), tuple(sample), refused,
                       excepted if exceptions else None)


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
    if result.excepted is not None:
        status["excepted"] = result.excepted
    return status


def audit_differs(current: Any, new: Mapping[str, Any], *, now: dt.datetime,
                  refresh_s: float) -> bool:
    """A write is needed: the figures changed, or the last write is older than `refresh_s`
    (`auditedAt` then says the audit still runs)."""
    if not isinstance(current, Mapping):
        return True
    if any(current.get(k) != new.get(k)
           for k in ("violations", "cacheSynced", "sample", "incomplete", "excepted")):
        return True
    at = current.get("auditedAt")
    try:
        written = dt.datetime.fromisoformat(str(at).replace("Z", "+00:00"))
    except ValueError:
        return True
    if written.tzinfo is None:
        return True
    return (now - written).total_seconds() >= refresh_s
