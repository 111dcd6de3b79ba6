"""What this replica knows live about the fleet, for the status API: per cluster reachability,
last error, last success, counts and the phases read back per policy; the last round; the
leader. Updated from `RoundReport`s, the reachability prober and (on standbys, or after a
restart) the rows the database holds. Pure: no I/O, time is passed in.

Design decisions (SPEC.md §7, issue 5):

- **Stale phases.** A phase reading not refreshed for more than `STALE_AFTER_INTERVALS` round
  intervals is stale. It is never dropped and never shown as current: per policy it is shown as
  the last known phase with its age and `stale: true`; in per-cluster counts (and in the
  `convergerd_policy_phase` metric) it is counted under the pseudo-phase `Stale`, so the counts
  of one cluster still add up to the number of policies read there.
- **Unknown phases.** A Policy without `status.phase` yet (the operator has not reconciled it),
  or with a phase this version does not know, counts as `Unknown`.
- **Worst first.** Clusters are ordered: unreached, never checked, failing (a cluster-level
  error or failed policies), then the rest; within each group by lag, largest first.
- **Unsupported roll-up.** A cluster whose fresh readings include `Unsupported` (the operator
  found no ValidatingAdmissionPolicy API) is rolled up under its Kubernetes version.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from convergerd.model import ClusterId, PolicyId
from convergerd.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
)

PHASES = ("Enforcing", "Inert", "Unsupported", "Error")
UNKNOWN = "Unknown"
STALE = "Stale"
ALL_PHASES = (*PHASES, UNKNOWN)
STALE_AFTER_INTERVALS = 2.0
UNKNOWN_VERSION = "unknown"

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---------------------------------------------------------------------------------------------
# Pure helpers


def normalize_phase(phase: str | None) -> str:
    """One of `ALL_PHASES`: a missing or unrecognised phase is `Unknown`."""
    return phase if phase in PHASES else UNKNOWN


def stale_after_s(interval_s: float) -> float:
    return STALE_AFTER_INTERVALS * interval_s


def age_s(then: dt.datetime, now: dt.datetime) -> float:
    return max(0.0, (now - then).total_seconds())


def is_stale(seen_at: dt.datetime, now: dt.datetime, interval_s: float) -> bool:
    """True when a reading is older than two round intervals."""
    return age_s(seen_at, now) > stale_after_s(interval_s)


def phases_refreshed(outcome: ClusterOutcome) -> bool:
    """Whether a round's outcome replaces the cluster's phase readings.

    The round lists every managed Policy of a cluster in one go, so a reached cluster without a
    cluster-level error returns the full set (possibly empty). When the listing did not happen
    (unreached, 401, ...) the old readings stay, and age into staleness.
    """
    return bool(outcome.phases) or (outcome.reached and outcome.error is None)


def phase_counts(
    readings: Iterable[PhaseReading], now: dt.datetime, interval_s: float
) -> dict[str, int]:
    """How many policies are in each phase; stale readings count under `Stale`."""
    counts: Counter[str] = Counter()
    for reading in readings:
        if is_stale(reading.seen_at, now, interval_s):
            counts[STALE] += 1
        else:
            counts[normalize_phase(reading.phase)] += 1
    return dict(sorted(counts.items()))


def is_unsupported(readings: Iterable[PhaseReading], now: dt.datetime, interval_s: float) -> bool:
    return any(
        normalize_phase(r.phase) == "Unsupported" and not is_stale(r.seen_at, now, interval_s)
        for r in readings
    )


def unsupported_rollup(clusters: Iterable[tuple[str, str | None]]) -> dict[str, list[str]]:
    """Unsupported clusters grouped by Kubernetes version: `{version: [cluster, ...]}`."""
    rollup: dict[str, list[str]] = {}
    for cluster, version in clusters:
        rollup.setdefault(version or UNKNOWN_VERSION, []).append(cluster)
    return {v: sorted(cs) for v, cs in sorted(rollup.items())}


def worst_first_key(
    *, cluster: str, reachable: bool | None, failing: bool, lag_s: float | None
) -> tuple[int, float, str]:
    """Sort key: unreached, never checked, failing, the rest; larger lag first; then by id."""
    if reachable is False:
        rank = 0
    elif reachable is None:
        rank = 1
    elif failing:
        rank = 2
    else:
        rank = 3
    return rank, -(lag_s or 0.0), cluster


def iso(moment: dt.datetime | None) -> str | None:
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z") if moment else None


def phase_view(
    reading: PhaseReading | None, now: dt.datetime, interval_s: float
) -> dict[str, Any]:
    """A phase as the status API shows it: last known phase, when seen, age, stale flag."""
    if reading is None:
        return {"phase": None, "ready_reason": None, "ready_message": None,
                "observed_revision": None, "seen_at": None, "age_seconds": None, "stale": None}
    return {
        "phase": normalize_phase(reading.phase),
        "ready_reason": reading.ready_reason,
        "ready_message": reading.ready_message,
        "observed_revision": reading.revision,
        "seen_at": iso(reading.seen_at),
        "age_seconds": round(age_s(reading.seen_at, now), 3),
        "stale": is_stale(reading.seen_at, now, interval_s),
    }


# ---------------------------------------------------------------------------------------------
# What the database holds (the store's rows), as far as the status code reads them


class ClusterStateRowLike(Protocol):
    """One cluster's last recorded outcome, as `Store.cluster_states()` returns it."""

    @property
    def cluster(self) -> str: ...
    @property
    def reached(self) -> bool | None: ...
    @property
    def desired(self) -> int: ...
    @property
    def in_sync(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def error(self) -> str | None: ...
    @property
    def server_version(self) -> str | None: ...
    @property
    def last_attempt_at(self) -> dt.datetime | None: ...
    @property
    def last_success_at(self) -> dt.datetime | None: ...


class RoundRowLike(Protocol):
    """The last round, as `Store.last_round()` returns it."""

    @property
    def started_at(self) -> dt.datetime: ...
    @property
    def finished_at(self) -> dt.datetime | None: ...
    @property
    def result(self) -> str | None: ...
    @property
    def holder(self) -> str | None: ...
    @property
    def counts(self) -> Mapping[str, int]: ...


# ---------------------------------------------------------------------------------------------
# The live state


@dataclass(slots=True)
class ClusterState:
    id: ClusterId
    known_since: dt.datetime
    reachable: bool | None = None  # None: never attempted
    checked_at: dt.datetime | None = None  # last attempt to reach it (round or probe)
    probe_error: str | None = None  # why the last reachability check failed
    last_error: str | None = None  # the last round's cluster-level reason
    last_reason: str | None = None
    last_attempt_at: dt.datetime | None = None  # last round that worked on it
    last_success_at: dt.datetime | None = None  # last round in which it fully converged
    desired: int = 0
    in_sync: int = 0
    failed: int = 0
    server_version: str | None = None
    duration_s: float | None = None
    phases: dict[PolicyId, PhaseReading] = field(default_factory=dict)
    deliveries: dict[PolicyId, Delivery] = field(default_factory=dict)  # last per policy
    successes: dict[PolicyId, dt.datetime] = field(default_factory=dict)  # last ok per policy
    delivered: dict[PolicyId, int] = field(default_factory=dict)  # revision of the last ok

    @property
    def error(self) -> str | None:
        """The readable reason shown in status: unreached now beats an older round error."""
        if self.reachable is False and self.probe_error:
            return self.probe_error
        return self.last_error

    @property
    def failing(self) -> bool:
        return self.error is not None or self.failed > 0

    def lag_s(self, now: dt.datetime) -> float:
        """Seconds since it last fully converged; before any success, since it became known."""
        return age_s(self.last_success_at or self.known_since, now)


@dataclass(frozen=True, slots=True)
class RoundSummary:
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: str | None
    counts: Mapping[str, int]
    holder: str | None
    error: str | None = None

    @classmethod
    def from_report(cls, report: RoundReport) -> RoundSummary:
        return cls(report.started_at, report.finished_at, report.result.value, report.counts(),
                   report.epoch.holder if report.epoch else None, report.error)

    @classmethod
    def from_row(cls, row: RoundRowLike) -> RoundSummary:
        return cls(row.started_at, row.finished_at, row.result, dict(row.counts), row.holder)


@dataclass(slots=True)
class LeaderInfo:
    is_leader: bool = False
    holder: str | None = None
    epoch: Epoch | None = None
    since: dt.datetime | None = None


class StatusState:
    """What this replica knows, updated in place by the round loop, the prober and the elector.

    Not thread-safe: used from the event loop only.
    """

    def __init__(self, *, identity: str, interval_s: float, clock: Clock = utc_now) -> None:
        self.identity = identity
        self.interval_s = interval_s
        self.clock = clock
        self.started_at = clock()
        self.clusters: dict[ClusterId, ClusterState] = {}
        self.last_round: RoundSummary | None = None
        self.next_round_at: dt.datetime | None = None
        self.leader = LeaderInfo()
        self.invalid: dict[str, str] = {}  # policy id -> reason

    # -- updates ---------------------------------------------------------------------------

    def cluster(self, cluster: str) -> ClusterState:
        cid = ClusterId(cluster)
        found = self.clusters.get(cid)
        if found is None:
            found = self.clusters[cid] = ClusterState(cid, known_since=self.clock())
        return found

    def set_clusters(self, clusters: Iterable[str]) -> None:
        """The clusters the database knows: new ones are added, removed ones forgotten."""
        wanted = {ClusterId(c) for c in clusters}
        for gone in set(self.clusters) - wanted:
            del self.clusters[gone]
        for cluster in wanted:
            self.cluster(cluster)

    def observe_round(self, report: RoundReport) -> None:
        for outcome in report.clusters:
            self._observe_outcome(report, outcome)
        self.invalid = {p.id: p.reason for p in report.invalid}
        self.last_round = RoundSummary.from_report(report)

    def _observe_outcome(self, report: RoundReport, outcome: ClusterOutcome) -> None:
        state = self.cluster(outcome.cluster)
        at = report.finished_at or self.clock()
        state.reachable = outcome.reached
        state.checked_at = at
        if outcome.reached:
            state.probe_error = None
        state.last_attempt_at = report.started_at
        state.last_error = outcome.error
        state.last_reason = outcome.reason
        state.desired, state.in_sync, state.failed = (
            outcome.desired, outcome.in_sync, outcome.failed)
        state.duration_s = outcome.duration_s
        if outcome.server_version:
            state.server_version = outcome.server_version
        if outcome.converged:
            # It matched the database as read when the round started.
            state.last_success_at = report.started_at
        if phases_refreshed(outcome):
            state.phases = {r.policy: r for r in outcome.phases}
        for delivery in outcome.deliveries:
            state.deliveries[delivery.policy] = delivery
            if delivery.result is not ApplyResult.FAILED:
                state.successes[delivery.policy] = delivery.at
                state.delivered[delivery.policy] = delivery.revision

    def observe_probe(
        self, cluster: str, *, reachable: bool, error: str | None = None,
        server_version: str | None = None, at: dt.datetime | None = None,
    ) -> None:
        state = self.cluster(cluster)
        state.reachable = reachable
        state.checked_at = at or self.clock()
        state.probe_error = None if reachable else error
        if server_version:
            state.server_version = server_version

    def set_leader(self, is_leader: bool, holder: str | None, epoch: Epoch | None = None) -> None:
        if (is_leader, holder) != (self.leader.is_leader, self.leader.holder):
            self.leader.since = self.clock()
        self.leader.is_leader, self.leader.holder, self.leader.epoch = is_leader, holder, epoch

    def set_next_round(self, at: dt.datetime | None) -> None:
        self.next_round_at = at

    def absorb_cluster_rows(self, rows: Iterable[ClusterStateRowLike]) -> None:
        """Take what the database recorded where it is newer than what this replica saw itself
        (a standby, or a leader just after a restart)."""
        for row in rows:
            state = self.cluster(row.cluster)
            if row.last_success_at and (
                state.last_success_at is None or row.last_success_at > state.last_success_at
            ):
                state.last_success_at = row.last_success_at
            mine = state.last_attempt_at
            if row.last_attempt_at is None or (mine is not None and mine >= row.last_attempt_at):
                continue
            state.last_attempt_at = row.last_attempt_at
            state.desired, state.in_sync, state.failed = row.desired, row.in_sync, row.failed
            state.last_error = row.error
            if row.server_version:
                state.server_version = row.server_version
            if state.reachable is None and row.reached is not None:
                state.reachable = row.reached
                state.checked_at = row.last_attempt_at

    def absorb_round_row(self, row: RoundRowLike | None) -> None:
        if row is None:
            return
        if self.last_round is None or row.started_at > self.last_round.started_at:
            self.last_round = RoundSummary.from_row(row)

    # -- views -----------------------------------------------------------------------------

    def sorted_clusters(self, now: dt.datetime) -> list[ClusterState]:
        return sorted(
            self.clusters.values(),
            key=lambda c: worst_first_key(cluster=c.id, reachable=c.reachable,
                                          failing=c.failing, lag_s=c.lag_s(now)),
        )

    def unsupported(self, now: dt.datetime) -> dict[str, list[str]]:
        return unsupported_rollup(
            (c.id, c.server_version) for c in self.clusters.values()
            if is_unsupported(c.phases.values(), now, self.interval_s)
        )

    def cluster_summary(self, state: ClusterState, now: dt.datetime) -> dict[str, Any]:
        return {
            "id": state.id,
            "reachable": state.reachable,
            "checked_at": iso(state.checked_at),
            "lag_seconds": round(state.lag_s(now), 3),
            "last_success_at": iso(state.last_success_at),
            "last_attempt_at": iso(state.last_attempt_at),
            "desired": state.desired,
            "in_sync": state.in_sync,
            "failed": state.failed,
            "phases": phase_counts(state.phases.values(), now, self.interval_s),
            "last_error": state.error,
            "server_version": state.server_version,
        }

    def round_view(self) -> dict[str, Any] | None:
        r = self.last_round
        if r is None:
            return None
        return {"started_at": iso(r.started_at), "finished_at": iso(r.finished_at),
                "result": r.result, "counts": dict(r.counts), "leader": r.holder,
                "error": r.error}

    def snapshot(self, now: dt.datetime | None = None) -> dict[str, Any]:
        """The `/status` document."""
        now = now or self.clock()
        return {
            "identity": self.identity,
            "now": iso(now),
            "leader": {"is_leader": self.leader.is_leader, "holder": self.leader.holder,
                       "since": iso(self.leader.since)},
            "interval_seconds": self.interval_s,
            "last_round": self.round_view(),
            "next_round_at": iso(self.next_round_at),
            "invalid_policies": [{"id": k, "reason": v} for k, v in sorted(self.invalid.items())],
            "clusters": [self.cluster_summary(c, now) for c in self.sorted_clusters(now)],
            "unsupported_by_version": self.unsupported(now),
        }

    def policy_on_cluster(
        self, cluster: ClusterId, policy: PolicyId, now: dt.datetime
    ) -> dict[str, Any]:
        """What this replica saw of one policy on one cluster (delivery and phase)."""
        state = self.clusters.get(cluster)
        delivery = state.deliveries.get(policy) if state else None
        reading = state.phases.get(policy) if state else None
        delivered = state.delivered.get(policy) if state else None
        if delivered is None and reading is not None:
            delivered = reading.revision  # in sync without an apply: what the cluster holds
        return {
            "delivered_revision": delivered,
            "last_result": delivery.result.value if delivery else None,
            "last_attempt_at": iso(delivery.at) if delivery else None,
            "last_success_at": iso(state.successes.get(policy)) if state else None,
            "last_error": delivery.error if delivery else None,
            **phase_view(reading, now, self.interval_s),
        }
