"""The phase rules, one definition for the status API and the metrics. Pure: time passed in.

A Policy's `status.phase`, written by the in-cluster operator, is read back by every round:

- `Enforcing`, `Inert`, `Unsupported` (the cluster has no ValidatingAdmissionPolicy API) and
  `Error` are shown as they are; a missing phase (not reconciled yet) or one this version does
  not know is `Unknown`.
- A reading older than `STALE_AFTER_INTERVALS` round intervals is stale: never dropped, never
  shown as current. Per policy it is the last known phase flagged `stale`; in per-cluster counts
  (status and the `convergerd_policy_phase` metric) it counts under the pseudo-phase `Stale`, so
  a cluster's counts still add up to the number of policies read there.
- A round replaces a cluster's readings when it listed the cluster's Policies
  (`phases_refreshed`); otherwise the old readings stay, and age into staleness.

The operator's enforcement probe writes the `Verified` condition; it is read back with the
phase and counted per cluster (`verification_of`): `verified` (True: a violating pod was
denied), `admitted` (False, reason `Admitted`: a violating pod was ADMITTED, the policy is not
enforced), `not_verified` (any other False: no namespace of the boundary, the probe failed, the
policy is not Enforcing; or a condition no probe accounts for: a lastProbeTime in the future,
True without one), `stale` (the last probe is older than `VERIFIED_STALE_PERIODS` of the
operators' probe periods: the operator stopped probing; it rewrites an unchanged verdict's
probe time only every `HEARTBEAT_PERIODS`) and `unknown` (Unknown, no condition, or a stale
reading). The metric `convergerd_policy_verification{cluster,result}` folds `not_verified`
and `unknown` into `unverified`.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from convergerd.core.decode import CLOCK_SKEW_S, in_the_future
from convergerd.core.model import PolicyId
from convergerd.core.report import Audit, ClusterOutcome, PhaseReading, Verification

PHASES = ("Enforcing", "Inert", "Unsupported", "Error")
UNSUPPORTED = "Unsupported"
UNKNOWN = "Unknown"
STALE = "Stale"
ALL_PHASES = (*PHASES, UNKNOWN)
STALE_AFTER_INTERVALS = 2.0


def normalize_phase(phase: str | None) -> str:
    """One of `ALL_PHASES`: a missing or unrecognised phase is `Unknown`."""
    return phase if phase in PHASES else UNKNOWN


def stale_after_s(interval_s: float) -> float:
    return STALE_AFTER_INTERVALS * interval_s


def age_s(then: dt.datetime, now: dt.datetime) -> float:
    return max(0.0, (now - then).total_seconds())


def is_stale_age(age: float, interval_s: float) -> bool:
    """True when a reading `age` seconds old is older than two round intervals."""
    return age > stale_after_s(interval_s)


def is_stale(seen_at: dt.datetime, now: dt.datetime, interval_s: float) -> bool:
    return is_stale_age(age_s(seen_at, now), interval_s)


def counted_phase(phase: str | None, age: float, interval_s: float) -> str:
    """Under which phase a reading `age` seconds old is counted: `Stale`, or its own."""
    return STALE if is_stale_age(age, interval_s) else normalize_phase(phase)


VERIFIED, ADMITTED, NOT_VERIFIED, STALE_VERIFICATION, UNKNOWN_VERIFICATION = (
    "verified", "admitted", "not_verified", "stale", "unknown")
VERIFICATIONS = (VERIFIED, ADMITTED, NOT_VERIFIED, STALE_VERIFICATION, UNKNOWN_VERIFICATION)
# The metric's results: `not_verified` and `unknown` are one there.
UNVERIFIED = "unverified"
VERIFICATION_RESULTS = (VERIFIED, ADMITTED, UNVERIFIED, STALE_VERIFICATION)
# The operator probes every probe period but writes only what changed: a probe that confirms
# the verdict it last wrote leaves the status alone, and the probe time (and an unchanged
# audit's auditedAt) is rewritten once it is `HEARTBEAT_PERIODS` probe periods old (at the
# first probe or audit past `heartbeat_after_s`: half a period of slack so a probe that comes
# a moment early does not put it off by a whole period). So a live operator's probe time is
# at most about HEARTBEAT_PERIODS + 1/2 periods old, plus the daemon's own reading lag.
HEARTBEAT_PERIODS = 3
# A probe is current for `HEARTBEAT_PERIODS` + 2 of the operators' probe periods (one missed
# heartbeat is not yet news); a lastProbeTime in the future (`decode.in_the_future`) is one
# nobody probed.
VERIFIED_STALE_PERIODS = HEARTBEAT_PERIODS + 2.0


def heartbeat_after_s(probe_period_s: float) -> float:
    """The age at which the operator rewrites an unchanged verdict's probe time (and an
    unchanged audit's auditedAt)."""
    return (HEARTBEAT_PERIODS - 0.5) * probe_period_s


def verified_stale_after_s(probe_period_s: float) -> float:
    return VERIFIED_STALE_PERIODS * probe_period_s


def probe_time_problem(found: Verification, now: dt.datetime) -> str | None:
    """Why a Verified condition's lastProbeTime cannot be believed (None: it can)."""
    at = found.probed_at
    if at is not None and in_the_future(at, now):
        return (f"lastProbeTime {at.isoformat().replace('+00:00', 'Z')} is in the future: "
                "no probe made it, the condition is not trusted")
    if at is None and found.status == "True":
        return "Verified True without a lastProbeTime: no probe accounts for it"
    return None


def verification_of(reading: PhaseReading, age: float, interval_s: float, *,
                    now: dt.datetime, probe_period_s: float) -> str:
    """One of `VERIFICATIONS` for a reading `age` seconds old, at `now`.

    A lastProbeTime in the future (a forged or broken condition) is `not_verified`; a probe
    older than `VERIFIED_STALE_PERIODS` probe periods (the operator stopped probing: down, or
    not leading anywhere) is `stale`, except `admitted`: a violating pod admitted stays news
    until a later probe says otherwise."""
    found = reading.verified
    if found is None or is_stale_age(age, interval_s):
        return UNKNOWN_VERIFICATION
    if probe_time_problem(found, now) is not None:
        return NOT_VERIFIED
    if found.status == "False" and found.reason == "Admitted":
        return ADMITTED
    at = found.probed_at
    if at is not None and age_s(at, now) > verified_stale_after_s(probe_period_s):
        return STALE_VERIFICATION
    return {"True": VERIFIED, "False": NOT_VERIFIED}.get(found.status, UNKNOWN_VERIFICATION)


def probe_age_classes(now: dt.datetime,
                      probe_period_s: float) -> Callable[[dt.datetime | None], int]:
    """All that `verification_of` reads of a Verified probe time at `now`, as a function of
    it: 0 none, 1 in the future (`in_the_future`), 2 older than `verified_stale_after_s`, 3
    neither. Readings that agree on all else and on this are verified alike: a reader
    verifying many records judges one of each such kind."""
    stale_s = verified_stale_after_s(probe_period_s)

    def probe_age_class(probed_at: dt.datetime | None) -> int:
        if probed_at is None:
            return 0
        # `in_the_future`'s test and, negated (exactly: a timedelta's seconds are a
        # correctly rounded quotient), `age_s`'s (its floor at 0 changes no test against a
        # positive `stale_s`): one subtraction per record.
        ahead = (probed_at - now).total_seconds()
        if ahead > CLOCK_SKEW_S:
            return 1
        return 2 if -ahead > stale_s else 3

    return probe_age_class


def verification_result(verification: str) -> str:
    """The metric's result (one of `VERIFICATION_RESULTS`) for one of `VERIFICATIONS`."""
    return verification if verification in VERIFICATION_RESULTS else UNVERIFIED


def verification_results(counts: Mapping[str, int]) -> dict[str, int]:
    """Counts per one of `VERIFICATIONS` as the metric counts them (every one of
    `VERIFICATION_RESULTS`)."""
    results = dict.fromkeys(VERIFICATION_RESULTS, 0)
    for verification, count in counts.items():
        results[verification_result(verification)] += count
    return results


# One reading as status and the metrics count it: (phase, seen at, its verification (one of
# `VERIFICATIONS`) as if probed when seen, the probe time when that result ages into `stale`),
# times in seconds since the epoch. Decided once when the reading is taken, so a scrape or a
# `/status` over a large fleet is float arithmetic.
TallyEntry = tuple[str, float, str, float | None]
# Readings that agree on the first three are counted together (`TallyGroup`): an operator
# probes each policy at its own time, and a group per distinct probe time cost a whole object
# per policy (bench/RESULTS.md, "Figures once quoted in the code"); a sorted array of the times
# costs 8 bytes.
TallyKey = tuple[str, float, str]


@dataclass(slots=True)
class TallyGroup:
    """Readings counted together: how many never age into `stale` (`plain`), and the sorted
    probe times of the others."""

    plain: int = 0
    probed: array[float] = field(default_factory=lambda: array("d"))

    def __len__(self) -> int:
        return self.plain + len(self.probed)

    def aged(self, now: float, verified_stale_s: float) -> int:
        """How many probe times are older than `verified_stale_s` at `now` (the same test
        for each as `now - probed > verified_stale_s`; true for a prefix of the sorted
        times)."""
        return bisect.bisect_left(self.probed, True,
                                  key=lambda probed: not now - probed > verified_stale_s)


PhaseTally = Mapping[TallyKey, TallyGroup]


def tally_entry(reading: PhaseReading) -> TallyEntry:
    """How `tally_counts` will count `reading`: the probe time is kept only where the result
    can age into `stale` (not for `admitted`, nor for a condition whose time was not trusted
    when it was read)."""
    at = reading.seen_at
    fresh = verification_of(reading, 0.0, 1.0, now=at, probe_period_s=math.inf)
    found = reading.verified
    ages = (found is not None and found.probed_at is not None and fresh != ADMITTED
            and probe_time_problem(found, at) is None)
    probed = found.probed_at.timestamp() if ages and found and found.probed_at else None
    return normalize_phase(reading.phase), at.timestamp(), fresh, probed


def tally(readings: Iterable[PhaseReading]) -> dict[TallyKey, TallyGroup]:
    groups: dict[TallyKey, TallyGroup] = {}
    times: dict[TallyKey, list[float]] = {}
    for reading in readings:
        phase, seen, result, probed = tally_entry(reading)
        key = (phase, seen, result)
        group = groups.get(key)
        if group is None:
            group = groups[key] = TallyGroup()
        if probed is None:
            group.plain += 1
        else:
            times.setdefault(key, []).append(probed)
    for key, probed_times in times.items():
        groups[key].probed = array("d", sorted(probed_times))
    return groups


def tally_grouped(
    groups: Iterable[tuple[PhaseReading, Iterable[dt.datetime | None]]],
) -> dict[TallyKey, TallyGroup]:
    """`tally` of readings given in groups: per group a reading standing for all of them and
    each one's Verified probe time (they agree on all else). A reading's entry depends on its
    probe time only through whether it has one and whether it is after the reading
    (`probe_time_problem`): `tally_entry` runs once per group and such case, not once per
    reading."""
    groups_out: dict[TallyKey, TallyGroup] = {}
    times: dict[TallyKey, list[float]] = {}
    for stand_in, probes in groups:
        seen, found = stand_in.seen_at, stand_in.verified
        entries: dict[bool | None, TallyEntry] = {}
        for probed in probes:
            case = None if probed is None else in_the_future(probed, seen)
            entry = entries.get(case)
            if entry is None:
                reading = stand_in if found is None else replace(
                    stand_in, verified_probed_at=probed)
                entry = entries[case] = tally_entry(reading)
            key = entry[:3]
            group = groups_out.get(key)
            if group is None:
                group = groups_out[key] = TallyGroup()
            if entry[3] is None:
                group.plain += 1
            else:
                times.setdefault(key, []).append(probed.timestamp())  # type: ignore[union-attr]
    for key, probed_times in times.items():
        groups_out[key].probed = array("d", sorted(probed_times))
    return groups_out
@dataclass(frozen=True, slots=True)
class TallyCounts:
    """`tally_counts` at `since` under the given rules, and what they hold until: the oldest
    reading not stale yet and the oldest probe not aged yet (inf: none)."""

    # Kept and shared (`ClusterState.counts`, the metrics' lines, `/status` summaries): read
    # only, so typed as mappings.
    phases: Mapping[str, int]  # every one of `ALL_PHASES` and `Stale`
    verification: Mapping[str, int]  # every one of `VERIFICATIONS`
    shown: Mapping[str, int]  # the phases counted, by name (as `/status` shows them)
    since: float
    rules: tuple[float, float]  # (interval_s, verified_stale_s)
    fresh_seen: float
    unaged_probe: float

    def hold_at(self, now: float, interval_s: float, verified_stale_s: float) -> bool:
        """Whether these are the counts at `now` too: no reading turned stale and no probe
        aged since (the tests `tally_counts` makes, on the oldest of each)."""
        return (self.since <= now and self.rules == (interval_s, verified_stale_s)
                and not is_stale_age(now - self.fresh_seen, interval_s)
                and not now - self.unaged_probe > verified_stale_s)


def tally_counts(
    readings: PhaseTally, now: float, interval_s: float, *, verified_stale_s: float
) -> TallyCounts:
    """Policies per phase and per verification at `now` (seconds since the epoch): a stale
    reading counts as `Stale` and `unknown`, a probe older than `verified_stale_s` as
    `stale`."""
    counts = dict.fromkeys((*ALL_PHASES, STALE), 0)
    checked = dict.fromkeys(VERIFICATIONS, 0)
    fresh_seen = unaged_probe = math.inf
    for (phase, seen, result), group in readings.items():
        n = len(group)
        if is_stale_age(now - seen, interval_s):  # `counted_phase`, the phase being normalized
            counts[STALE] += n
            checked[UNKNOWN_VERIFICATION] += n
            continue
        fresh_seen = min(fresh_seen, seen)
        counts[phase] += n
        aged = group.aged(now, verified_stale_s) if group.probed else 0
        if aged < len(group.probed):
            unaged_probe = min(unaged_probe, group.probed[aged])
        checked[STALE_VERIFICATION] += aged
        checked[result] += n - aged
    shown = {phase: n for phase, n in sorted(counts.items()) if n}
    return TallyCounts(counts, checked, shown, now, (interval_s, verified_stale_s), fresh_seen,
                       unaged_probe)


def phases_refreshed(outcome: ClusterOutcome) -> bool:
    """Whether a round's outcome replaces the cluster's phase readings: when it listed the
    cluster (`ClusterOutcome.listed`). When the listing did not happen (unreached, 401, ...)
    the old readings stay, and age into staleness.
    """
    return outcome.listed


# ---------------------------------------------------------------------------------------------
# The audit: `status.audit`, what the operator found already running that the policy would deny
#
# Per policy on a cluster (`audit_state`): `current` (read from a synced cache, recently),
# `unsynced` (cacheSynced false: the count may be partial), `stale` (the reading is stale, or
# auditedAt is older than `AUDIT_STALE_PERIODS` of the operators' probe periods: the operator
# stopped auditing), `unknown` (unreadable, or an auditedAt after the reading: nobody audited
# then). Per cluster (`AuditTally`, counted when the readings change): the violations summed
# over its policies and whether every audit there is current (`AuditTally.unsettled`).

AUDIT_CURRENT, AUDIT_UNSYNCED, AUDIT_STALE, AUDIT_UNKNOWN = (
    "current", "unsynced", "stale", "unknown")
AUDIT_STATES = (AUDIT_CURRENT, AUDIT_UNSYNCED, AUDIT_STALE, AUDIT_UNKNOWN)
# The operator audits once per probe pass and rewrites an unchanged audit's auditedAt at the
# heartbeat (`HEARTBEAT_PERIODS`): one missed heartbeat is not yet news.
AUDIT_STALE_PERIODS = HEARTBEAT_PERIODS + 2.0


def audit_stale_after_s(probe_period_s: float) -> float:
    return AUDIT_STALE_PERIODS * probe_period_s


# `status.admission` is written when its figures change and at the heartbeat otherwise, with
# `readAt` saying counting still runs: as old as an audit's, it is stale.
ADMISSION_STALE_PERIODS = AUDIT_STALE_PERIODS


def admission_stale(read_at: dt.datetime | None, now: dt.datetime, *,
                    probe_period_s: float) -> bool:
    """Whether admission figures read at `read_at` are too old to be current at `now`: the
    operator stopped counting (or reading the API server's counters)."""
    return (read_at is not None
            and age_s(read_at, now) > ADMISSION_STALE_PERIODS * probe_period_s)


def audit_time_problem(audit: Audit, seen_at: dt.datetime) -> str | None:
    """Why an audit's time cannot be believed (None: it can): after the reading of it."""
    at = audit.audited_at
    if at is not None and in_the_future(at, seen_at):
        return (f"auditedAt {at.isoformat().replace('+00:00', 'Z')} is after the reading of "
                "it: no audit made it, the count is not trusted")
    return None


def known_violations(reading: PhaseReading) -> int | None:
    """The reading's audited count, None when there is no audit or it cannot be believed."""
    found = reading.audit
    if found is None or found.violations is None:
        return None
    return None if audit_time_problem(found, reading.seen_at) else found.violations


def audit_state(reading: PhaseReading, now: dt.datetime, interval_s: float, *,
                probe_period_s: float) -> str | None:
    """One of `AUDIT_STATES` at `now`; None when the Policy carries no audit."""
    found = reading.audit
    if found is None:
        return None
    if known_violations(reading) is None:
        return AUDIT_UNKNOWN
    at = found.audited_at
    if is_stale(reading.seen_at, now, interval_s) or (
            at is not None and age_s(at, now) > audit_stale_after_s(probe_period_s)):
        return AUDIT_STALE
    return AUDIT_CURRENT if found.synced else AUDIT_UNSYNCED


@dataclass(frozen=True, slots=True)
class AuditTally:
    """One cluster's audits, counted when its readings change (a scrape then costs a few
    comparisons per cluster). Times in seconds since the epoch."""

    audited: int = 0  # policies read with an audit
    unknown: int = 0  # of which unreadable (`AUDIT_UNKNOWN`)
    unsynced: int = 0  # of which read from a cache not synced
    violations: int = 0  # summed over the readable ones
    oldest_audit: float | None = None  # the earliest auditedAt of the readable ones
    oldest_seen: float | None = None  # the earliest reading of an audit
    by_policy: Mapping[PolicyId, int] = field(default_factory=dict)  # violations > 0 only

    def unsettled(self, now: float, interval_s: float, audit_stale_s: float) -> bool:
        """Whether some audit here is not current: unreadable, from a cache not synced, or
        stale (`audit_state`)."""
        if not self.audited:
            return False
        return bool(
            self.unknown or self.unsynced
            or (self.oldest_seen is not None and is_stale_age(now - self.oldest_seen, interval_s))
            or (self.oldest_audit is not None and now - self.oldest_audit > audit_stale_s))


def audit_tally(readings: Iterable[PhaseReading]) -> AuditTally:
    """The audits of `readings`, each its own group (`audit_tally_grouped`)."""
    return audit_tally_grouped((r, (r.policy,)) for r in readings)


def audit_tally_grouped(groups: Iterable[tuple[PhaseReading, Sequence[PolicyId]]]) -> AuditTally:
    """`audit_tally` of readings given in groups: per group a reading standing for all of
    them and each one's policy (they agree on all else but their revision and Verified probe
    times, which an audit does not read)."""
    audited = unknown = unsynced = violations = 0
    oldest_audit: float | None = None
    oldest_seen: float | None = None
    by_policy: dict[PolicyId, int] = {}
    for r, policies in groups:
        found = r.audit
        if found is None or not policies:
            continue
        n = len(policies)
        audited += n
        seen = r.seen_at.timestamp()
        oldest_seen = seen if oldest_seen is None else min(oldest_seen, seen)
        count = known_violations(r)
        if count is None:
            unknown += n
            continue
        violations += count * n
        if count:
            by_policy.update(dict.fromkeys(policies, count))
        unsynced += 0 if found.synced else n
        if found.audited_at is not None:
            at = found.audited_at.timestamp()
            oldest_audit = at if oldest_audit is None else min(oldest_audit, at)
    if not audited:
        return NO_AUDITS
    return AuditTally(audited, unknown, unsynced, violations, oldest_audit, oldest_seen,
                      by_policy)


NO_AUDITS = AuditTally()
