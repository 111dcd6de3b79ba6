"""The one keeper of this replica's live status of the fleet (`StatusState`): the clusters the
database knows, each with its live facts (`convergerd.status.cluster.ClusterState`: reachability,
last error, last success, counts, Kubernetes version, and the per-policy records with the
phases read back); which are reached insecurely; the last round; the leader (and how often it
changed); the shards as the shard set last told; the invalid policies; the pending deletions;
whether the database answered the last sync; the audit samples; the live rollouts. Pure: no
I/O, time is passed in.

Closed: only the feeders' methods below write it: the round loop (`observing`, `observe_round`,
`set_next_round`), the reachability prober (`observe_probe`), the shard set and its electors
(`set_shards`, `set_leader`), the cluster registry (`set_insecure`), the wiring's follow of the
database (`set_clusters`, `retain_policies`) and the periodic database sync
(`convergerd.status.sync`: `absorb_*`, `set_pending_deletions`, `note_sync`; the leader's
records on standbys, and after a restart). Every reader (the HTTP views, the `/status`
document of `convergerd.status.document`, the metrics at scrape time) gets its read-only face
(`convergerd.status.reader.StatusReader`): clusters as a read-only mapping of `ClusterFacts`,
frozen or read-only facts, and query methods.

Design decisions (the phase rules themselves are `convergerd.status.phases`, shared with the
metrics):

- **Newer fact wins.** A database row replaces what this replica saw only where it is newer.
- **The database's clusters only.** Once the cluster set is known (`set_clusters`), a late
  observation of another cluster (a probe or round in flight when it was deleted) is dropped
  instead of bringing it back.
- **A view stays true until `version` changes.** Every feeder that may change what a view
  shows counts one up (`set_insecure` does not: it is not in the views).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

from convergerd.core.exceptions import ExceptionTally
from convergerd.core.facts import OWN_PROBED_AT
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
from convergerd.core.rollout import Rollout
from convergerd.core.rows import ClusterStateRow, DeliveryRow, PendingDeletions, RoundRow
from convergerd.status.admissions import (
    NO_ADMISSIONS,
    AdmissionTally,
    PolicyAdmissions,
    PolicyTotals,
    admission_tally_grouped,
)
from convergerd.status.cluster import ClusterFacts, ClusterState
from convergerd.status.phases import (
    audit_tally_grouped,
    phases_refreshed,
    tally_grouped,
)
from convergerd.status.reader import Clock, LeaderInfo, RoundSummary
from convergerd.status.records import (
    PolicyRecord,
    ReadBack,
    merge_records,
    newer,
    reading_part,
)
from convergerd.status.rollouts import RolloutFacts, rollout_facts
from convergerd.status.samples import AuditSamples
from convergerd.status.shards import ShardsSeen
from convergerd.status.views import DEFAULT_PROBE_PERIOD_S


class StatusState:
    """What this replica knows, changed in place by its feeders only (a `StatusReader` to
    everyone else).

    Not thread-safe: used from the event loop only.
    """

    def __init__(self, *, identity: str, interval_s: float, clock: Clock = utc_now,
                 probe_period_s: float = DEFAULT_PROBE_PERIOD_S, keep: Iterable[str] = (),
                 shards: int = 1) -> None:
        """`keep`: clusters this replica talks to outside the database's set (the home cluster
        holding the Lease), whose client facts (`insecure`) and counters stay (`tracks`).
        `shards`: `CONVERGERD_SHARDS` (with one, the leader holds shard 0)."""
        self.identity: Final = identity
        self.interval_s: Final = interval_s
        self.probe_period_s: Final = probe_period_s  # the operators': a probe's age limit
        self.clock: Final = clock
        self._keep = frozenset(keep)
        self._clusters: dict[ClusterId, ClusterState] = {}
        self._clusters_view: Mapping[ClusterId, ClusterFacts] = MappingProxyType(self._clusters)
        self._fleet_known = False  # set_clusters was told the database's set
        self._insecure: frozenset[str] = frozenset()  # replaced whole: readers get it as is
        self._last_round: RoundSummary | None = None
        self._next_round_at: dt.datetime | None = None
        self._leader = LeaderInfo()  # frozen, replaced whole
        # The shard set's last word (holders, held, members, share) and what readers see of
        # it (`_seen_shards`: with one shard its holder is the leader).
        self._shards_told: tuple[tuple[str, ...], frozenset[int], tuple[str, ...], int | None] = (
            ("",) * shards, frozenset(), (identity,), None)
        self._shards = self._seen_shards(shards)
        self._invalid: Mapping[str, str] = MappingProxyType({})  # policy id -> reason
        # Exceptions per policy, as the database counted them (`delivery.lapse`, every pass).
        self._exception_tally: tuple[ExceptionTally, ...] = ()
        self._pending = PendingDeletions()  # deletions begun and not finished (database sync)
        self._version = 0
        self._synced_at: dt.datetime | None = None
        self._sync_error: str | None = None
        # Audit samples per policy (`status.samples`); a view shows those of clusters still
        # counting violations.
        self._samples = AuditSamples()
        # Per policy, its clusters' admission tallies summed (`status.admissions`), kept up
        # to date wherever a cluster's tally is replaced (`_retally`).
        self._admissions = PolicyAdmissions()
        # The live rollouts as the last sync read them, with their clusters per revision.
        self._rollouts: tuple[RolloutFacts, ...] = ()

    # -- what readers see (`StatusReader`) -------------------------------------------------

    @property
    def clusters(self) -> Mapping[ClusterId, ClusterFacts]:
        """Each cluster's live facts, read-only: only the feeders' methods below change them."""
        return self._clusters_view

    @property
    def version(self) -> int:
        """Counts the updates: a status view built at one version stays true until the next."""
        return self._version

    @property
    def insecure(self) -> frozenset[str]:
        """The clusters reached without TLS verification or over http://."""
        return self._insecure

    @property
    def invalid(self) -> Mapping[str, str]:
        """The policies that cannot be delivered: id -> reason."""
        return self._invalid

    @property
    def exception_tally(self) -> tuple[ExceptionTally, ...]:
        """Exceptions per policy (in force, expiring soon, expired yet delivered)."""
        return self._exception_tally

    @property
    def pending(self) -> PendingDeletions:
        return self._pending

    @property
    def last_round(self) -> RoundSummary | None:
        return self._last_round

    @property
    def rollouts(self) -> tuple[RolloutFacts, ...]:
        """The live rollouts, by policy, as the last database sync found them."""
        return self._rollouts

    @property
    def next_round_at(self) -> dt.datetime | None:
        return self._next_round_at

    @property
    def synced_at(self) -> dt.datetime | None:
        """When the last database sync that answered did."""
        return self._synced_at

    @property
    def sync_error(self) -> str | None:
        """Why the last database sync failed (None: it answered)."""
        return self._sync_error

    @property
    def shards(self) -> ShardsSeen:
        return self._shards

    @property
    def admission_totals(self) -> Mapping[PolicyId, PolicyTotals]:
        """Per policy, what admission did over the fleet: read-only (`PolicyAdmissions`)."""
        return self._admissions

    def leader(self) -> LeaderInfo:
        return self._leader

    def cluster_ids(self) -> list[ClusterId]:
        return sorted(self._clusters)

    def member(self, cluster: str) -> bool:
        """Whether `cluster` is one of the database's clusters (all are, until that is known)."""
        return not self._fleet_known or ClusterId(cluster) in self._clusters

    def tracks(self, cluster: str) -> bool:
        """Whether facts and counters of `cluster` are kept: a member, or a kept cluster."""
        return cluster in self._keep or self.member(cluster)

    def cluster_or_new(self, cluster: str) -> ClusterFacts:
        """The cluster's facts, or an empty one's (not kept) for a cluster only the database
        knows yet."""
        found = self._clusters.get(ClusterId(cluster))
        return found if found is not None else ClusterState(ClusterId(cluster), self.clock())

    def samples_of(self, policy: PolicyId) -> tuple[tuple[ClusterId, AuditSample], ...]:
        """The policy's kept audit samples, each with its cluster (`AuditSamples.of`)."""
        return self._samples.of(policy)

    def pending_deletions(self) -> tuple[int, dt.datetime | None]:
        """How many deletions are pending and when the oldest began (for the metrics)."""
        return self._pending.total, self._pending.oldest_requested_at

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

    # -- the feeders ---------------------------------------------------------------------

    def _cluster(self, cluster: str) -> ClusterState:
        cid = ClusterId(cluster)
        found = self._clusters.get(cid)
        if found is None:
            found = self._clusters[cid] = ClusterState(cid, known_since=self.clock())
        return found

    def _observed(self, cluster: str) -> ClusterState | None:
        """The cluster's state for an observation, None when it is not one of the database's
        clusters (any cluster before that set is known)."""
        return self._cluster(cluster) if self.member(cluster) else None

    def set_clusters(self, clusters: Iterable[str]) -> None:
        """The clusters the database knows: new ones are added, removed ones forgotten."""
        self._version += 1  # what status shows may have changed
        self._fleet_known = True
        wanted = {ClusterId(c) for c in clusters}
        for gone in set(self._clusters) - wanted:
            self._admissions.change(self._clusters.pop(gone).admission_tally, NO_ADMISSIONS)
        for cluster in wanted:
            self._cluster(cluster)
        self._insecure = frozenset(c for c in self._insecure if self.tracks(c))

    def set_insecure(self, cluster: str, insecure: bool) -> None:
        """From the cluster registry, for every client it opens (insecure ones only when
        CONVERGERD_ALLOW_INSECURE_CLUSTERS allows them). Not in the views: no new version."""
        if insecure and self.tracks(cluster):
            if cluster not in self._insecure:
                self._insecure = self._insecure | {cluster}
        elif cluster in self._insecure:
            self._insecure = self._insecure - {cluster}

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
            self._version += 1  # what status shows may have changed
            self._observe_outcome(outcome, at)
            yield
        self._version += 1
        if report.error is None:  # a round that ran saw every policy
            self._invalid = MappingProxyType({p.id: p.reason for p in report.invalid})
        self._last_round = RoundSummary.from_report(report)

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
            for policy, (own, _, stand_in) in read.items():
                group = groups.get(id(stand_in))
                if group is None:
                    group = groups[id(stand_in)] = (stand_in, [], [])
                group[1].append(own[OWN_PROBED_AT])
                group[2].append(policy)
            state.phase_tally = tally_grouped((r, probes) for r, probes, _ in groups.values())
            state.audit_tally = audit_tally_grouped(
                (r, policies) for r, _, policies in groups.values())
            self._retally(state, admission_tally_grouped(
                (r, policies) for r, _, policies in groups.values()))

    def _retally(self, state: ClusterState, tally: AdmissionTally) -> None:
        """The cluster's admission tally replaced (the old object kept when equal), and the
        fleet's totals per policy with it."""
        old = state.admission_tally
        if tally == old:
            return
        state.admission_tally = tally
        self._admissions.change(old, tally)

    def _read_back(self, cluster: ClusterId, readings: Readings) -> dict[PolicyId, ReadBack]:
        """What each reading writes of its policy's row, per policy (the last reading of a
        policy read twice), its audit without the sample, which is kept per policy
        (`AuditSamples`)."""
        read: dict[PolicyId, ReadBack] = {}
        parts: dict[int, tuple[tuple[Any, ...], tuple[AuditSample, ...]]] = {}
        samples = self._samples
        sampled = samples.policies()
        for policy, own, r in readings.shared():
            part = parts.get(id(r))
            if part is None:
                part = parts[id(r)] = reading_part(r)
            was_read, fresh = part
            if fresh or policy in sampled:
                samples.keep(policy, cluster, fresh)
            read[policy] = (own, was_read, r)
        return read

    def observe_probe(
        self, cluster: str, *, reachable: bool, error: str | None = None,
        server_version: str | None = None, at: dt.datetime | None = None,
    ) -> None:
        self._version += 1  # what status shows may have changed
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
            self._version += 1  # what status shows changed
        since, changes = leader.since, leader.changes
        if (is_leader, holder) != (leader.is_leader, leader.holder):
            since = self.clock()
            if leader.told:
                changes += 1
        self._leader = LeaderInfo(is_leader, holder, epoch, since, told=True, changes=changes)
        self._shards = self._seen_shards(self._shards.count)

    def set_shards(self, *, holders: Sequence[str], held: Iterable[int],
                   members: Iterable[str], share: int | None) -> None:
        """Told by the shard set (`convergerd.leader.shards`) whenever what it sees changes:
        each shard's live holder ("" when free or expired), the shards held here."""
        told = (tuple(holders), frozenset(held), tuple(members), share)
        if told != self._shards_told:
            self._version += 1
        self._shards_told = told
        self._shards = self._seen_shards(self._shards.count)

    def _seen_shards(self, count: int) -> ShardsSeen:
        """The shards as readers see them: as told, but with one shard the leader holds it."""
        holders, held, members, share = self._shards_told
        if count == 1:
            leader = self._leader
            holders = (leader.holder or "",)
            held = frozenset({0}) if leader.is_leader else frozenset()
        return ShardsSeen(count, holders, held, members, share)

    def set_next_round(self, at: dt.datetime | None) -> None:
        self._version += 1  # what status shows may have changed
        self._next_round_at = at

    def set_invalid(self, invalid: Iterable[tuple[str, str]]) -> None:
        self._version += 1  # what status shows may have changed
        self._invalid = MappingProxyType(dict(invalid))

    def set_exception_tally(self, tally: Iterable[ExceptionTally]) -> None:
        # Only the metrics show it: no status view changes, so `version` stays.
        self._exception_tally = tuple(tally)

    def set_pending_deletions(self, pending: PendingDeletions) -> None:
        self._version += 1  # what status shows may have changed
        self._pending = pending

    def absorb_records(
        self, clusters: Iterable[ClusterStateRow], last_round: RoundRow | None,
        invalid: Iterable[InvalidPolicy],
    ) -> None:
        """One database sync, after `set_clusters` was told the clusters of `clusters`: their
        recorded outcomes, the last recorded round, and the invalid policies that round
        recorded (taken unless this replica ran a newer round itself)."""
        self._version += 1  # what status shows may have changed
        self.absorb_cluster_rows(clusters)
        mine = self._last_round
        if last_round is not None and (mine is None or last_round.started_at >= mine.started_at):
            self._invalid = MappingProxyType({p.id: p.reason for p in invalid})
        self.absorb_round_row(last_round)

    def absorb_rollouts(self, rollouts: Iterable[Rollout]) -> None:
        """`absorbing_rollouts` at once."""
        for _ in self.absorbing_rollouts(rollouts):
            pass

    def absorbing_rollouts(self, rollouts: Iterable[Rollout]) -> Iterator[None]:
        """The live rollouts a database sync read, each with how many clusters report its new
        revision and how many another (counted here, once per sync, on the packed records: a
        scrape or a view only reads the counts), one rollout a step (at 10,000 clusters some
        15 ms: the sync gives the loop back between); what readers see changes at the end."""
        clusters = list(self._clusters.values())

        def held(policy: PolicyId) -> Iterator[int | None]:
            for state in clusters:
                yield state.policies.revision_held(policy)

        facts = []
        for rollout in rollouts:
            facts.append(rollout_facts(rollout, held))
            yield
        self._version += 1  # what status shows may have changed
        self._rollouts = tuple(sorted(facts, key=lambda f: f.policy))

    def note_sync(self, error: str | None) -> None:
        """The outcome of a database sync: None when it answered, else why not."""
        self._version += 1  # what status shows may have changed
        self._sync_error = error
        if error is None:
            self._synced_at = self.clock()

    def absorb_cluster_rows(self, rows: Iterable[ClusterStateRow]) -> None:
        """Take what the database recorded where it is newer than what this replica saw itself
        (a standby, or a leader just after a restart)."""
        self._version += 1  # what status shows may have changed
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
        self._version += 1  # what status shows may have changed
        if row is not None and (
            self._last_round is None or row.started_at > self._last_round.started_at
        ):
            self._last_round = RoundSummary.from_row(row)

    def absorb_delivery_rows(
        self, rows: Iterable[DeliveryRow], *, cluster: str | None = None
    ) -> None:
        """Phase readings and deliveries the database holds (recorded by whoever led); with
        `cluster`, these are all of that cluster's rows as of its stored attempt."""
        self._version += 1  # what status shows may have changed
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
            old = state.admission_tally
            state.recount_phases()
            fresh, state.admission_tally = state.admission_tally, old
            self._retally(state, fresh)
