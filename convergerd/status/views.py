"""The status API's JSON views of what the state keeps: one policy on one cluster
(`record_view`, its phase, Verified and audit), one policy's audits over its clusters, the
Unsupported roll-up, and how a time is shown (`iso`). Pure: what is kept in, plain JSON out;
`convergerd.status.state` shows the fleet with these.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from convergerd.config import default_of
from convergerd.core.report import PhaseReading
from convergerd.status.admissions import (
    ACTIONS,
    ENFORCEMENT_LABELS,
    admission_read,
    enforcement_label,
    known_admissions,
)
from convergerd.status.phases import (
    AUDIT_CURRENT,
    UNSUPPORTED,
    admission_stale,
    age_s,
    audit_state,
    audit_time_problem,
    is_stale,
    known_violations,
    normalize_phase,
    probe_time_problem,
    verification_of,
    verified_stale_after_s,
)
from convergerd.status.records import PolicyRecord

UNKNOWN_VERSION = "unknown"

# Policies listed in the fleet's audit view.
AUDIT_POLICIES_LISTED = 100

# The operators' probe period when the caller does not say (CONVERGERD_OPERATOR_PROBE_MINUTES).
DEFAULT_PROBE_PERIOD_S: float = default_of("operator_probe_minutes") * 60.0


def unsupported_rollup(clusters: Iterable[tuple[str, str | None]]) -> dict[str, list[str]]:
    """Unsupported clusters grouped by Kubernetes version: `{version: [cluster, ...]}`."""
    rollup: dict[str, list[str]] = {}
    for cluster, version in clusters:
        rollup.setdefault(version or UNKNOWN_VERSION, []).append(cluster)
    return {v: sorted(cs) for v, cs in sorted(rollup.items())}



@functools.lru_cache(maxsize=1 << 14)  # a view shows the same times often (a round's end)
def iso(moment: dt.datetime | None) -> str | None:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z") if moment else None



def phase_view(
    reading: PhaseReading | None, now: dt.datetime, interval_s: float, *,
    probe_period_s: float = DEFAULT_PROBE_PERIOD_S,
) -> dict[str, Any]:
    """A phase as the status API shows it: last known phase, when seen, age, stale flag."""
    if reading is None:
        return {"phase": None, "ready_reason": None, "ready_message": None,
                "observed_revision": None, "seen_at": None, "age_seconds": None, "stale": None,
                "verified": None, "audit": None, "enforcement_action": None, "admission": None}
    return {
        "phase": normalize_phase(reading.phase),
        "ready_reason": reading.ready_reason,
        "ready_message": reading.ready_message,
        "observed_revision": reading.revision,
        "seen_at": iso(reading.seen_at),
        "age_seconds": round(age_s(reading.seen_at, now), 3),
        "stale": is_stale(reading.seen_at, now, interval_s),
        "verified": verified_view(reading, now, interval_s, probe_period_s=probe_period_s),
        "audit": audit_view(reading, now, interval_s, probe_period_s=probe_period_s),
        "enforcement_action": reading.enforcement_action,
        "admission": admission_view(reading, now, probe_period_s=probe_period_s),
    }


def admission_view(reading: PhaseReading, now: dt.datetime, *,
                   probe_period_s: float) -> dict[str, Any] | None:
    """What admission did with the policy there, as the API server counted it (None: the
    Policy carries no `status.admission`): failed validations denied, warned and audited
    since `revision` was installed (`since`) and over the hour before `read_at`; null counts
    when they cannot be read (`problem` says why); `stale` when counting stopped; `resets` and
    `note` as the operator says them (counters that started again, what cannot be counted)."""
    if not admission_read(reading):
        return None
    counts = known_admissions(reading)
    d, w, a, hd, hw, ha = counts if counts is not None else (None,) * 6
    at = reading.admission_read_at
    return {"denied": d, "warned": w, "audited": a,
            "last_hour": {"denied": hd, "warned": hw, "audited": ha},
            "revision": reading.admission_revision, "since": iso(reading.admission_since),
            "read_at": iso(at),
            "stale": admission_stale(at, now, probe_period_s=probe_period_s),
            "resets": reading.admission_resets, "note": reading.admission_note,
            "problem": reading.admission_problem}


def audit_view(reading: PhaseReading, now: dt.datetime, interval_s: float, *,
               probe_period_s: float) -> dict[str, Any] | None:
    """The operator's audit of what already runs (None: the Policy carries none): the count
    (null when it cannot be read or believed, `problem` says why), when and whether the
    operator's cache was synced, and what that makes it (`state`, `audit_state`)."""
    found = reading.audit
    if found is None:
        return None
    return {"violations": known_violations(reading), "audited_at": iso(found.audited_at),
            "cache_synced": found.synced if found.violations is not None else None,
            "excepted": reading.audit_excepted,
            "state": audit_state(reading, now, interval_s, probe_period_s=probe_period_s),
            "problem": found.problem or audit_time_problem(found, reading.seen_at)}


def verified_view(reading: PhaseReading, now: dt.datetime, interval_s: float, *,
                  probe_period_s: float) -> dict[str, Any] | None:
    """The enforcement probe's verdict as the operator wrote it (None: no Verified condition
    read back), with what it counts as (`verification`), whether the probe is too old to be
    current (`stale`), and why the condition is not trusted (`untrusted`, else null)."""
    found = reading.verified
    if found is None:
        return None
    at = found.probed_at
    return {"status": found.status, "reason": found.reason, "message": found.message,
            "probed_at": iso(at), "since": iso(found.since),
            "verification": verification_of(reading, age_s(reading.seen_at, now), interval_s,
                                             now=now, probe_period_s=probe_period_s),
            "stale": at is not None and age_s(at, now) > verified_stale_after_s(probe_period_s),
            "untrusted": probe_time_problem(found, now)}


def record_view(
    record: PolicyRecord, now: dt.datetime, interval_s: float, *,
    probe_period_s: float = DEFAULT_PROBE_PERIOD_S,
) -> dict[str, Any]:
    """One policy on one cluster as the status API shows it."""
    delivered = record.delivered_revision
    if delivered is None and record.phase is not None:
        delivered = record.phase.revision  # in the cluster without an apply from us (seen)
    return {
        "delivered_revision": delivered,
        "last_result": record.last_result,
        "last_attempt_at": iso(record.last_attempt_at),
        "last_success_at": iso(record.last_success_at),
        "last_error": record.last_error,
        "last_reason": record.last_reason,
        **phase_view(record.phase, now, interval_s, probe_period_s=probe_period_s),
    }


def policy_audit_view(audits: Iterable[Mapping[str, Any] | None],
                      sample: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy's audits over its clusters (`audit_view` of each, None where none was read):
    the total of the counts that can be read, how many clusters count violations, how many
    audits cannot be read (`unknown`) or are not current, and the kept sample."""
    read = [a for a in audits if a is not None]
    known = [a["violations"] for a in read if a["violations"] is not None]
    return {"violations": sum(known), "clusters_audited": len(read),
            "clusters_with_violations": sum(n > 0 for n in known),
            "clusters_unknown": len(read) - len(known),
            "clusters_not_current": sum(a["state"] != AUDIT_CURRENT for a in read),
            "sample": sample,
            # Where an audit says it: objects an exception admits that the rule would deny.
            "excepted": _sum_said(a.get("excepted") for a in read)}


def _sum_said(values: Iterable[int | None]) -> int | None:
    """The sum of the values said (None: none)."""
    said = [v for v in values if v is not None]
    return sum(said) if said else None


def policy_admission_view(clusters: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One policy's admission over its clusters (each a `phase_view`): the counts summed over
    the clusters that can say them (each since its installed revision), the last hour's, how
    many clusters count, cannot be read or are stale, and the clusters per mode in force."""
    counted = [c["admission"] for c in clusters if c.get("admission") is not None]
    modes = dict.fromkeys(ENFORCEMENT_LABELS, 0)
    for c in clusters:
        label = enforcement_label(c.get("enforcement_action"))
        if label is not None:
            modes[label] += 1
    known = [a for a in counted if a["problem"] is None and a["denied"] is not None]
    return {
        **{_SINCE[action]: sum(a[_SINCE[action]] for a in known) for action in ACTIONS},
        "last_hour": {_SINCE[action]: sum(a["last_hour"][_SINCE[action]] for a in known)
                      for action in ACTIONS},
        "clusters_counted": len(known), "clusters_unknown": len(counted) - len(known),
        "clusters_stale": sum(bool(a["stale"]) for a in known),
        "clusters_with_resets": sum(bool(a["resets"]) for a in known),
        "clusters_by_enforcement": modes,
    }


# A figure's key in the views, by the API server's action.
_SINCE = {"deny": "denied", "warn": "warned", "audit": "audited"}


def unsupported_of(summaries: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, str | None]]:
    """The clusters of `/status` summaries with fresh `Unsupported` readings, and their
    Kubernetes versions (for `unsupported_rollup`)."""
    return ((s["id"], s["server_version"]) for s in summaries if s["phases"].get(UNSUPPORTED))
