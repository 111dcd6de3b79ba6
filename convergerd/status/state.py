"""The one keeper of this replica's live status of the fleet: the clusters the database knows,
per cluster reachability, last error, last success, counts, Kubernetes version, whether it is
reached insecurely, and the phases read back per policy; the last round; the leader (and how
often it changed); the invalid policies; the pending deletions; whether the database answered
the last sync. Written by the round loop (`observe_round`), the reachability prober
(`observe_probe`), the elector (`set_leader`), the cluster registry (`set_insecure`) and the
periodic database sync (`convergerd.status.sync`: the leader's records on standbys, and after
a restart); the HTTP handlers and the metrics (at scrape time) only read it. Pure: no I/O,
time is passed in.

Design decisions (the phase rules themselves are `convergerd.status.phases`, shared with the
metrics):

- **Worst first.** Clusters are ordered: unreached, never checked, failing (a cluster-level
  error or failed policies), then the rest; within each group by lag, largest first.
- **Unsupported roll-up.** A cluster whose fresh readings include `Unsupported` (the operator
  found no ValidatingAdmissionPolicy API) is rolled up under its Kubernetes version.
- **Newer fact wins.** A database row replaces what this replica saw only where it is newer.
- **The database's clusters only.** Once the cluster set is known (`set_clusters`), a late
  observation of another cluster (a probe or round in flight when it was deleted) is dropped
  instead of bringing it back.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from convergerd.core.exceptions import ExceptionTally
from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId
from convergerd.core.report import (
    AuditSample,
    ClusterOutcome,
    Epoch,
    PhaseReading,
    Readings,
    RoundReport,
    utc_now,
)
from convergerd.core.rows import ClusterStateRow, DeliveryRow, PendingDeletions, RoundRow
from convergerd.core.shards import orphaned, shard_of
from convergerd.status.listing import FleetTally, listing, worst_first_key
from convergerd.status.phases import (
    NO_AUDITS,
    AuditTally,
    PhaseTally,
    TallyCounts,
    TallyGroup,
    TallyKey,
    age_s,
    audit_stale_after_s,
    audit_tally,
    audit_tally_grouped,
    known_violations,
    phases_refreshed,
    stale_after_s,
    tally,
    tally_counts,
    tally_grouped,
    verified_stale_after_s,
)
from convergerd.status.records import (
    PolicyRecord,
    PolicyRecords,
    ReadBack,
    merge_records,
    newer,
    reading_part,
)
from convergerd.status.samples import AuditSamples
from convergerd.status.views import (
    AUDIT_POLICIES_LISTED,
    DEFAULT_PROBE_PERIOD_S,
    iso,
    unsupported_of,
    unsupported_rollup,
)

Clock = Callable[[], dt.datetime]



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
    # Filled in by `__post_init__` (it needs `id`): the per-policy records, compactly.
    policies: PolicyRecords = field(init=False)
    own_round_at: dt.datetime | None = None  # when this replica's own round last worked on it
    stored_attempt_at: dt.datetime | None = None  # the database's last attempt, as last read
    rows_read_for: dt.datetime | None = None  # the database attempt whose rows were absorbed
    # The readings as status and the metrics count them, recounted whenever they change
    # (`recount_phases`): a scrape then costs a few additions per cluster, not per policy.
    # Replaced whole, never changed in place (`counts` keeps its answer for the same tally).
    phase_tally: dict[TallyKey, TallyGroup] = field(default_factory=dict)
    audit_tally: AuditTally = NO_AUDITS  # likewise, the audits (`phases.audit_tally`)
    # `counts`' last answer, kept while it holds: (the tally counted, the counts).
    _counted: tuple[PhaseTally, TallyCounts] | None = None

    @property
    def caught_up(self) -> bool:
        """The last round that worked on it left it in sync."""
        return (self.last_attempt_at is not None and self.last_error is None
                and self.in_sync == self.desired)

    def __post_init__(self) -> None:
        self.policies = PolicyRecords(self.id)

    def needs_rows(self) -> bool:
        """Whether the database holds per-policy records newer than this replica has: a round
        by another replica (this one is a standby) that was not read yet."""
        stored = self.stored_attempt_at
        return stored is not None and not (
            (self.own_round_at is not None and self.own_round_at >= stored)
            or (self.rows_read_for is not None and self.rows_read_for >= stored)
        )

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

    def readings(self) -> list[PhaseReading]:
        return self.policies.readings()

    def counts(self, now: float, interval_s: float, verified_stale_s: float) -> TallyCounts:
        """The readings' counts at `now` (`phases.tally_counts`), counted again only when the
        tally changed or a count did (a reading turned stale, a probe aged): status and every
        scrape ask for each cluster's."""
        kept = self._counted
        if (kept is not None and kept[0] is self.phase_tally
                and kept[1].hold_at(now, interval_s, verified_stale_s)):
            return kept[1]
        counted = tally_counts(self.phase_tally, now, interval_s,
                               verified_stale_s=verified_stale_s)
        self._counted = (self.phase_tally, counted)  # the tally held: `is` stays true to it
        return counted

    def recount_phases(self) -> None:
        """Told after the readings changed."""
        readings = self.readings()
        self.phase_tally = tally(readings)
        self.audit_tally = audit_tally(readings)


@dataclass(frozen=True, slots=True)
class RoundSummary:
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: str | None
    counts: Mapping[str, int]
    leader: str | None  # who ran it (the epoch holder)
    error: str | None = None

    @classmethod
    def from_report(cls, report: RoundReport) -> RoundSummary:
        return cls(report.started_at, report.finished_at, report.result.value, report.counts(),
                   report.epoch.holder if report.epoch else None, report.error)

    @classmethod
    def from_row(cls, row: RoundRow) -> RoundSummary:
        leader = row.epoch.holder if row.epoch else row.identity
        return cls(row.started_at, row.finished_at, str(row.result), dict(row.counts), leader,
                   row.error)


@dataclass(slots=True)
class LeaderInfo:
    is_leader: bool = False
    holder: str | None = None
    epoch: Epoch | None = None
    since: dt.datetime | None = None
    told: bool = False  # whether the elector has said anything yet
    # Changes of (leading, holder) after the first one told: this replica gaining or losing
    # it, or another holder taking over (`convergerd_leader_transitions_total`).
    changes: int = 0


class StatusState:
    """What this replica knows, updated in place by the round loop, the prober and the elector.

    Not thread-safe: used from the event loop only.
    """

    def __init__(self, *, identity: str, interval_s: float, clock: Clock = utc_now,
                 probe_period_s: float = DEFAULT_PROBE_PERIOD_S, keep: Iterable[str] = (),
                 shards: int = 1) -> None:
        """`keep`: clusters this replica talks to outside the database's set (the home cluster
        holding the Lease), whose client facts (`insecure`) and counters stay (`tracks`).
        `shards`: `CONVERGERD_SHARDS` (with one, the leader holds shard 0)."""
        self.identity = identity
        self.shards = shards
        self._shard_holders: tuple[str, ...] = ("",) * shards
        self._shards_held: frozenset[int] = frozenset()
        self.shard_members: tuple[str, ...] = (identity,)
        self.shard_share: int | None = None
        self.interval_s = interval_s
        self.probe_period_s = probe_period_s  # the operators': a Verified probe's age limit
        self.clock = clock
        self.started_at = clock()
        # Written only here, by the feeders' methods; readers get `clusters`, a read-only view.
        self._clusters: dict[ClusterId, ClusterState] = {}
        self._clusters_view: Mapping[ClusterId, ClusterState] = MappingProxyType(self._clusters)
        self.fleet_known = False  # set_clusters was told the database's set
        self.keep = frozenset(keep)
        self.insecure: set[str] = set()  # clusters reached without TLS verification or http://
        self.last_round: RoundSummary | None = None
        self.next_round_at: dt.datetime | None = None
        self._leader = LeaderInfo()
        self.invalid: dict[str, str] = {}  # policy id -> reason
        # Exceptions per policy, as the database counted them (`delivery.lapse`, every pass).
        self.exception_tally: tuple[ExceptionTally, ...] = ()
        self.pending = PendingDeletions()  # deletions begun and not finished (database sync)
        self.version = 0  # counts the updates: a status view built at one version stays true
        self.synced_at: dt.datetime | None = None  # the last database sync that answered
        self.sync_error: str | None = None  # why the last database sync failed, if it did
        # Audit samples per policy (`status.samples`); a view shows those of clusters still
        # counting violations.
        self._samples = AuditSamples()

    # -- queries ---------------------------------------------------------------------------

    @property
    def clusters(self) -> Mapping[ClusterId, ClusterState]:
        """Each cluster's live state, read-only: only the feeders' methods below change it."""
        return self._clusters_view

    def suspects(self) -> list[ClusterId]:
        """The clusters last found unreachable (a round tries them last)."""
        return [c.id for c in self._clusters.values() if c.reachable is False]

    def caught_up(self) -> list[ClusterId]:
        """The clusters the last round that worked on them left in sync."""
        return [c.id for c in self._clusters.values() if c.caught_up]

    def unreachable(self, cluster: ClusterId) -> bool:
        """Whether `cluster` was last found unreachable."""
        state = self._clusters.get(cluster)
        return state is not None and state.reachable is False

    def needing_rows(self) -> list[ClusterId]:
        """The clusters whose per-policy records the database holds newer than kept here
        (`ClusterState.needs_rows`): what a database sync reads."""
        return [c.id for c in self._clusters.values() if c.needs_rows()]

    def record_count(self) -> int:
        """How many (policy, cluster) records are kept."""
        return sum(len(c.policies) for c in self._clusters.values())

    # -- updates ---------------------------------------------------------------------------

    def cluster(self, cluster: str) -> ClusterState:
        cid = ClusterId(cluster)
        found = self._clusters.get(cid)
        if found is None:
            found = self._clusters[cid] = ClusterState(cid, known_since=self.clock())
        return found

    def _observed(self, cluster: str) -> ClusterState | None:
        """The cluster's state for an observation, None when it is not one of the database's
        clusters (any cluster before that set is known)."""
        return self.cluster(cluster) if self.member(cluster) else None

    def member(self, cluster: str) -> bool:
        """Whether `cluster` is one of the database's clusters (all are, until that is known)."""
        return not self.fleet_known or ClusterId(cluster) in self._clusters

    def tracks(self, cluster: str) -> bool:
        """Whether facts and counters of `cluster` are kept: a member, or a kept cluster."""
        return cluster in self.keep or self.member(cluster)

    def cluster_ids(self) -> list[ClusterId]:
        return sorted(self._clusters)

    def set_clusters(self, clusters: Iterable[str]) -> None:
        """The clusters the database knows: new ones are added, removed ones forgotten."""
        self.version += 1  # what status shows may have changed
        self.fleet_known = True
        wanted = {ClusterId(c) for c in clusters}
        for gone in set(self._clusters) - wanted:
            del self._clusters[gone]
        for cluster in wanted:
            self.cluster(cluster)
        self.insecure = {c for c in self.insecure if self.tracks(c)}

    def set_insecure(self, cluster: str, insecure: bool) -> None:
        """From the cluster registry, for every client it opens (insecure ones only when
        CONVERGERD_ALLOW_INSECURE_CLUSTERS allows them). Not in the views: no new version."""
        if insecure and self.tracks(cluster):
            self.insecure.add(cluster)
        else:
            self.insecure.discard(cluster)

    def retain_policies(self, policies: Iterable[str]) -> None:
        """The policies the database holds: a record of any other one is dropped unless its
        object is still read back from the cluster (a round never deletes, so that reading
        is real and bounded by what the cluster holds)."""
        wanted = {PolicyId(p) for p in policies}
        self._samples.retain(wanted)
        for state in self._clusters.values():
            records = state.policies
            for gone in [p for p in records if p not in wanted and records[p].phase is None]:
                del records[gone]

    def observe_round(self, report: RoundReport) -> None:
        for _ in self.observing(report):
            pass

    def observing(self, report: RoundReport) -> Iterator[None]:
        """`observe_round` a cluster at a time, so its caller can let others run between
        clusters (`RoundLoop._observe`): a reader then sees each cluster as before the round
        or as after it, never half of it, and the fleet's round (`last_round`, `invalid`) as
        before until the last step. Each step changes `version`."""
        at = report.finished_at or self.clock()
        for outcome in report.clusters:
            self.version += 1  # what status shows may have changed
            self._observe_outcome(outcome, at)
            yield
        self.version += 1
        if report.error is None:  # a round that ran saw every policy
            self.invalid = {p.id: p.reason for p in report.invalid}
        self.last_round = RoundSummary.from_report(report)

    def _observe_outcome(self, outcome: ClusterOutcome, at: dt.datetime) -> None:
        state = self._observed(outcome.cluster)
        if state is None:
            return
        if not outcome.cut_unanswered:  # else what the prober or an earlier round saw stands
            state.reachable = outcome.reached
            state.checked_at = at
        if outcome.reached:
            state.probe_error = None
        state.last_attempt_at = state.own_round_at = at
        state.last_error = outcome.error
        state.last_reason = outcome.reason
        state.desired, state.in_sync, state.failed = (
            outcome.desired, outcome.in_sync, outcome.failed)
        state.duration_s = outcome.duration_s
        if outcome.server_version:
            state.server_version = outcome.server_version
        if outcome.converged:
            state.last_success_at = at  # the round's end, as the database records it
        refreshed = phases_refreshed(outcome)
        if not outcome.deliveries and not refreshed:
            return
        read = self._read_back(state.id, outcome.phases) if refreshed else None
        state.policies.take_round(outcome.deliveries, read)
        if read is not None:
            # Counted per group of readings that agree but for their policy, revision and
            # probe times (most often one per cluster).
            groups: dict[int, tuple[PhaseReading, list[dt.datetime | None], list[PolicyId]]] = {}
            for policy, (probed, _, _, _, stand_in) in read.items():
                group = groups.get(id(stand_in))
                if group is None:
                    group = groups[id(stand_in)] = (stand_in, [], [])
                group[1].append(probed)
                group[2].append(policy)
            state.phase_tally = tally_grouped((r, probes) for r, probes, _ in groups.values())
            state.audit_tally = audit_tally_grouped(
                (r, policies) for r, _, policies in groups.values())

    def _read_back(self, cluster: ClusterId, readings: Readings) -> dict[PolicyId, ReadBack]:
        """What each reading writes of its policy's row, per policy (the last reading of a
        policy read twice), its audit without the sample, which is kept per policy
        (`AuditSamples`)."""
        read: dict[PolicyId, ReadBack] = {}
        parts: dict[int, tuple[tuple[Any, ...], tuple[AuditSample, ...]]] = {}
        samples = self._samples
        sampled = samples.policies()
        for policy, revision, probed, since, r in readings.shared():
            part = parts.get(id(r))
            if part is None:
                part = parts[id(r)] = reading_part(r)
            was_read, fresh = part
            if fresh or policy in sampled:
                samples.keep(policy, cluster, fresh)
            # One object for both times when they are equal, as `record_row` keeps them.
            kept_since = probed if since is not None and since == probed else since
            read[policy] = (probed, kept_since, revision, was_read, r)
        return read

    def observe_probe(
        self, cluster: str, *, reachable: bool, error: str | None = None,
        server_version: str | None = None, at: dt.datetime | None = None,
    ) -> None:
        self.version += 1  # what status shows may have changed
        state = self._observed(cluster)
        if state is None:
            return
        state.reachable = reachable
        state.checked_at = at or self.clock()
        state.probe_error = None if reachable else error
        if server_version:
            state.server_version = server_version

    def set_leader(self, is_leader: bool, holder: str | None, epoch: Epoch | None = None) -> None:
        """Told by the elector (its `on_change` hook) whenever who leads changes."""
        leader = self._leader
        if (is_leader, holder, epoch) != (leader.is_leader, leader.holder, leader.epoch):
            self.version += 1  # what status shows changed
        if (is_leader, holder) != (leader.is_leader, leader.holder):
            leader.since = self.clock()
            if leader.told:
                leader.changes += 1
        leader.is_leader, leader.holder, leader.epoch = is_leader, holder, epoch
        leader.told = True

    def leader(self) -> LeaderInfo:
        return self._leader

    def set_shards(self, *, holders: Sequence[str], held: Iterable[int],
                   members: Iterable[str], share: int | None) -> None:
        """Told by the shard set (`convergerd.leader.shards`) whenever what it sees changes:
        each shard's live holder ("" when free or expired), the shards held here."""
        view = (tuple(holders), frozenset(held), tuple(members), share)
        if view != (self._shard_holders, self._shards_held, self.shard_members,
                    self.shard_share):
            self.version += 1
        self._shard_holders, self._shards_held, self.shard_members, self.shard_share = view

    def shard_holders(self) -> tuple[str, ...]:
        """Per shard, the holder this replica sees ("" when free or expired)."""
        if self.shards == 1:
            return (self._leader.holder or "",)
        return self._shard_holders

    def shards_held(self) -> frozenset[int]:
        if self.shards == 1:
            return frozenset({0}) if self._leader.is_leader else frozenset()
        return self._shards_held

    def shard_of(self, cluster: str) -> int:
        return 0 if self.shards == 1 else shard_of(cluster, self.shards)

    def since_round_s(self, state: ClusterState, now: dt.datetime) -> float:
        """Seconds since a round last finished on the cluster (by any replica, as recorded),
        or since it joined the fleet when none has."""
        return age_s(state.last_attempt_at or state.known_since, now)

    def orphans(self, now: dt.datetime) -> list[ClusterId]:
        """The clusters without a finished round for more than two intervals."""
        return [c.id for c in self._clusters.values()
                if orphaned(self.since_round_s(c, now), self.interval_s)]

    def shard_last_rounds(self) -> dict[int, dt.datetime]:
        """Per shard with a recorded round, when its last round finished: the latest round
        end on any of its clusters (from the database records, so the same on every
        replica)."""
        last: dict[int, dt.datetime] = {}
        for c in self._clusters.values():
            if c.last_attempt_at is None:
                continue
            k = self.shard_of(c.id)
            if k not in last or c.last_attempt_at > last[k]:
                last[k] = c.last_attempt_at
        return last

    def shards_view(self, now: dt.datetime) -> dict[str, Any]:
        holders = self.shard_holders()
        last = self.shard_last_rounds()
        sizes = Counter(self.shard_of(c) for c in self._clusters)
        orphans = Counter(self.shard_of(c) for c in self.orphans(now))
        return {
            "count": self.shards,
            "held_here": sorted(self.shards_held()),
            "members": list(self.shard_members),
            "share": self.shard_share,
            "orphan_clusters": sum(orphans.values()),
            "shards": [
                {"shard": k, "holder": holders[k] or None, "clusters": sizes.get(k, 0),
                 "orphan_clusters": orphans.get(k, 0), "last_round_at": iso(last.get(k))}
                for k in range(self.shards)],
        }

    def set_next_round(self, at: dt.datetime | None) -> None:
        self.version += 1  # what status shows may have changed
        self.next_round_at = at

    def set_invalid(self, invalid: Iterable[tuple[str, str]]) -> None:
        self.version += 1  # what status shows may have changed
        self.invalid = dict(invalid)

    def set_exception_tally(self, tally: Iterable[ExceptionTally]) -> None:
        self.exception_tally = tuple(tally)

    def set_pending_deletions(self, pending: PendingDeletions) -> None:
        self.version += 1  # what status shows may have changed
        self.pending = pending

    def pending_deletions(self) -> tuple[int, dt.datetime | None]:
        """How many deletions are pending and when the oldest began (for the metrics)."""
        return self.pending.total, self.pending.oldest_requested_at

    def absorb_records(
        self, clusters: Iterable[ClusterStateRow], last_round: RoundRow | None,
        invalid: Iterable[InvalidPolicy],
    ) -> None:
        """One database sync, after `set_clusters` was told the clusters of `clusters`: their
        recorded outcomes, the last recorded round, and the invalid policies that round
        recorded (taken unless this replica ran a newer round itself)."""
        self.version += 1  # what status shows may have changed
        self.absorb_cluster_rows(clusters)
        mine = self.last_round
        if last_round is not None and (mine is None or last_round.started_at >= mine.started_at):
            self.invalid = {p.id: p.reason for p in invalid}
        self.absorb_round_row(last_round)

    def note_sync(self, error: str | None) -> None:
        """The outcome of a database sync: None when it answered, else why not."""
        self.version += 1  # what status shows may have changed
        self.sync_error = error
        if error is None:
            self.synced_at = self.clock()

    def absorb_cluster_rows(self, rows: Iterable[ClusterStateRow]) -> None:
        """Take what the database recorded where it is newer than what this replica saw itself
        (a standby, or a leader just after a restart)."""
        self.version += 1  # what status shows may have changed
        for row in rows:
            state = self._observed(row.cluster)
            if state is None:
                continue
            state.stored_attempt_at = row.last_attempt_at
            if newer(row.last_success_at, state.last_success_at):
                state.last_success_at = row.last_success_at
            if not newer(row.last_attempt_at, state.last_attempt_at):
                continue
            state.last_attempt_at = row.last_attempt_at
            state.desired, state.in_sync, state.failed = row.desired, row.in_sync, row.failed
            state.last_error, state.last_reason = row.last_error, row.last_reason
            if row.server_version:
                state.server_version = row.server_version
            if row.reachable is not None and not newer(state.checked_at, row.last_attempt_at):
                state.reachable = row.reachable
                state.checked_at = row.last_attempt_at

    def absorb_round_row(self, row: RoundRow | None) -> None:
        self.version += 1  # what status shows may have changed
        if row is not None and (
            self.last_round is None or row.started_at > self.last_round.started_at
        ):
            self.last_round = RoundSummary.from_row(row)

    def absorb_delivery_rows(
        self, rows: Iterable[DeliveryRow], *, cluster: str | None = None
    ) -> None:
        """Phase readings and deliveries the database holds (recorded by whoever led); with
        `cluster`, these are all of that cluster's rows as of its stored attempt."""
        self.version += 1  # what status shows may have changed
        if cluster is not None and (whole := self._observed(cluster)) is not None:
            whole.rows_read_for = whole.stored_attempt_at
        changed: dict[ClusterId, tuple[ClusterState, dict[PolicyId, PolicyRecord]]] = {}
        for row in rows:
            state = self._observed(row.cluster)
            if state is None:
                continue
            if state.id not in changed:
                changed[state.id] = (state, state.policies.whole())
            records = changed[state.id][1]
            pid = PolicyId(row.policy)
            records[pid] = merge_records(records.get(pid), PolicyRecord.from_row(row))
        for state, records in changed.values():
            state.policies.repack(records)
            state.recount_phases()

    # -- views -----------------------------------------------------------------------------

    def merged_policies(
        self, cluster: str, rows: Iterable[DeliveryRow] = ()
    ) -> dict[PolicyId, PolicyRecord]:
        """The cluster's per-policy records merged with `rows` just read from the database
        (the newer fact winning), without changing what this replica keeps."""
        live = self._clusters.get(ClusterId(cluster))
        merged = dict(live.policies) if live is not None else {}
        for row in rows:
            pid = PolicyId(row.policy)
            merged[pid] = merge_records(merged.get(pid), PolicyRecord.from_row(row))
        return merged

    def cluster_or_new(self, cluster: str) -> ClusterState:
        """The cluster's state, or an empty one (not kept) for a cluster only the database
        knows yet."""
        found = self._clusters.get(ClusterId(cluster))
        return found if found is not None else ClusterState(ClusterId(cluster), self.clock())

    def sorted_clusters(self, now: dt.datetime) -> list[ClusterState]:
        return sorted(
            self._clusters.values(),
            key=lambda c: worst_first_key(cluster=c.id, reachable=c.reachable,
                                          failing=c.failing, lag_s=c.lag_s(now)),
        )

    def cluster_summary(self, state: ClusterState, now: dt.datetime) -> dict[str, Any]:
        """The cluster as `/status` lists it. Its phase and verification counts are its
        readings' tally (`ClusterState.phase_tally`, what the metrics count too), so a summary
        costs a few numbers, not one per policy."""
        counted = state.counts(now.timestamp(), self.interval_s,
                               verified_stale_after_s(self.probe_period_s))
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
            # Shared with the next summaries while the counts hold: never changed.
            "phases": counted.shown,
            "verification": counted.verification,
            "last_error": state.error,
            "last_reason": state.last_reason if state.error == state.last_error else "unreachable",
            "server_version": state.server_version,
            "audit": self.cluster_audit_view(state, now),
            "shard": (k := self.shard_of(state.id)),
            "holder": self.shard_holders()[k] or None,
            "orphaned": orphaned(self.since_round_s(state, now), self.interval_s),
        }

    def _audit_unsettled(self, tally: AuditTally, now: dt.datetime) -> bool:
        return tally.unsettled(now.timestamp(), self.interval_s,
                               audit_stale_after_s(self.probe_period_s))

    def cluster_audit_view(self, state: ClusterState, now: dt.datetime) -> dict[str, Any] | None:
        """A cluster's audits summed over its policies (None: none read there)."""
        tally = state.audit_tally
        if not tally.audited:
            return None
        return {"violations": tally.violations, "policies_with_violations": len(tally.by_policy),
                "policies_audited": tally.audited, "unknown": tally.unknown,
                "unsynced": self._audit_unsettled(tally, now)}

    def audit_fleet_view(self, now: dt.datetime) -> dict[str, Any]:
        """The audits over the fleet, and per policy its total (worst first, at most
        `AUDIT_POLICIES_LISTED` listed): cost grows with the violating (cluster, policy) pairs,
        not with the fleet's policies."""
        totals: dict[PolicyId, list[int]] = {}
        audited = violations = with_violations = unsynced = 0
        for state in self._clusters.values():
            tally = state.audit_tally
            if not tally.audited:
                continue
            audited += 1
            violations += tally.violations
            with_violations += tally.violations > 0
            unsynced += self._audit_unsettled(tally, now)
            for pid, count in tally.by_policy.items():
                entry = totals.setdefault(pid, [0, 0])
                entry[0] += count
                entry[1] += 1
        worst = sorted(totals.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return {"violations": violations, "clusters_audited": audited,
                "clusters_with_violations": with_violations, "unsynced_clusters": unsynced,
                "policies_with_violations": len(worst),
                "policies": [{"id": pid, "violations": v, "clusters": n}
                             for pid, (v, n) in worst[:AUDIT_POLICIES_LISTED]]}

    def audit_sample_view(self, policy: str) -> list[dict[str, Any]]:
        """The policy's kept samples, of clusters whose current reading still counts
        violations."""
        pid = PolicyId(policy)
        shown_samples = []
        for cluster, sample in self._samples.of(pid):
            live = self._clusters.get(cluster)
            record = live.policies.get(pid) if live is not None else None
            if record is None or record.phase is None or not known_violations(record.phase):
                continue
            shown_samples.append({"cluster": cluster, "kind": sample.kind,
                                  "namespace": sample.namespace, "name": sample.name,
                                  "message": sample.message})
        return shown_samples

    def pending_view(self, now: dt.datetime) -> dict[str, Any]:
        return {
            "count": self.pending.total,
            "oldest_first": [
                {"id": p.policy, "requested_at": iso(p.requested_at),
                 "pending_seconds": round(age_s(p.requested_at, now), 3),
                 "clusters_holding": p.holders, "held_by": list(p.held_by)}
                for p in self.pending.oldest_first],
        }

    def round_view(self) -> dict[str, Any] | None:
        r = self.last_round
        if r is None:
            return None
        return {"started_at": iso(r.started_at), "finished_at": iso(r.finished_at),
                "result": r.result, "counts": dict(r.counts), "leader": r.leader,
                "error": r.error}

    def snapshot(self, now: dt.datetime | None = None) -> dict[str, Any]:
        """The `/status` document listing every cluster: `snapshot_head`, the fleet's counts
        and the clusters' summaries, worst first (`convergerd.api.server` builds the same
        document in slices, and past `Settings.status_max_clusters` a summary of it)."""
        now = now or self.clock()
        clusters = [self.cluster_summary(state, now) for state in self.sorted_clusters(now)]
        tally = FleetTally(stale_after_s(self.interval_s))
        tally.add(clusters)
        return {**self.snapshot_head(now, unsupported_of(clusters)), "fleet": tally.counts,
                "listing": listing(order="worst_first", listed=len(clusters), complete=True,
                                   following=None),
                "clusters": clusters}

    def snapshot_head(self, now: dt.datetime,
                      unsupported: Iterable[tuple[str, str | None]]) -> dict[str, Any]:
        """The `/status` document but its clusters; `unsupported`: the Unsupported clusters
        and their versions (`unsupported_of` the summaries)."""
        leader = self.leader()
        return {
            "identity": self.identity,
            "now": iso(now),
            "leader": {"is_leader": leader.is_leader, "holder": leader.holder,
                       "since": iso(leader.since)},
            "interval_seconds": self.interval_s,
            "stale_after_seconds": stale_after_s(self.interval_s),
            "verified_stale_after_seconds": verified_stale_after_s(self.probe_period_s),
            "last_round": self.round_view(),
            "next_round_at": iso(self.next_round_at),
            "invalid_policies": [{"id": k, "reason": v} for k, v in sorted(self.invalid.items())],
            "pending_deletions": self.pending_view(now),
            "shards": self.shards_view(now),
            "unsupported_by_version": unsupported_rollup(unsupported),
            "audit": self.audit_fleet_view(now),
        }
