"""Prometheus metrics on the process's own registry (docs/design.md, "Status and metrics"; no
default-registry globals).

Every series is produced at scrape time by one collector, so derived values are true when
Prometheus reads them. One owner per fact: the counters and histograms are kept here; every
gauge of what this replica knows is read from the status state through its read-only face
(`convergerd.status.reader.StatusReader`; nothing here keeps a copy of it, so a feeder writes
each fact once, to the state):

- `convergerd_cluster_lag_seconds{cluster}` is `now - last success` computed at scrape time: a
  cluster that has not converged for an hour shows ~3600 even when no round ran. A cluster that
  never converged (since this process knows of it) lags since the moment it became known to the
  state, unless the database's last success was absorbed (the status sync does that at start
  and on standbys, so a restart does not reset the lag). A success is stamped with the round's
  end, as the database records it, so every replica reports the same lag.
- `convergerd_cluster_last_success_timestamp_seconds{cluster}` is absent until a success is
  known (a 0 would read as "1970").
- `convergerd_cluster_up{cluster}`, `convergerd_cluster_out_of_sync_policies{cluster}` (absent
  until a round, or its record, worked on the cluster), `convergerd_cluster_server_info`:
  from the last round or reachability check, or the database's newer record.
- `convergerd_policy_phase{cluster,phase}`: phases read back in the last listing of that cluster
  (or recorded by the replica that read them, when newer). Readings older than two round
  intervals count under `phase="Stale"` instead of their last known phase (see
  `convergerd.status.phases`), so `sum by (cluster)` is still the policy count there.
- `convergerd_policy_verification{cluster,result}`: the operator's enforcement probe as read
  back in the same listing: `verified` (a violating pod was denied), `admitted` (a violating pod
  was ADMITTED: the policy is not enforced there; alert `ConvergerdPolicyNotEnforced`),
  `unverified` (any other False, Unknown, no condition, a stale reading, or a condition no
  probe accounts for: a lastProbeTime in the future), `stale` (the last probe is older than five
  of the operators' probe periods, `CONVERGERD_OPERATOR_PROBE_MINUTES`). Every result of every
  cluster with readings is present (0 included), and they add up to the policy count there.
- `convergerd_audit_violations{cluster}`: the operator's audit of what already runs (existing
  objects the policies would deny), summed over the cluster's policies, as last read (absent
  where no audit was read); `convergerd_audit_clusters_with_violations` and
  `convergerd_audit_unsynced_clusters` (some audit there is not current: the operator's cache
  not synced, unreadable, or stale) over the fleet. Per policy: the status API and
  `convergerd status`, never a label (policies x clusters series).
- Counters carry no `_created` samples (they would double the series count for nothing).
- Counters of every known cluster exist from the start at zero (applies by result, failures
  and retries by the known reasons), so `rate()`/`increase()` see the first failure.

- Per policy (fleet totals, never per policy and cluster; `StatusReader.admission_totals`):
  `convergerd_policy_admissions{policy,action}` (failed validations denied, warned, audited,
  summed over the clusters, each since its installed revision),
  `convergerd_policy_admissions_last_hour{policy,action}`,
  `convergerd_policy_clusters_by_enforcement{policy,enforcement}` (clusters whose binding in
  force has that mode: a policy saved as Deny still Warn somewhere shows here),
  `convergerd_policy_audit_excepted{policy}`.

No other metric has a per-policy label. Beyond the contract's set, for on-call:
`convergerd_apply_duration_seconds{cluster}` (apply request latency, few buckets),
`convergerd_retries_total{cluster,reason}`,
`convergerd_cluster_requests_total{cluster,verb,code}` (code `none`: no HTTP answer),
`convergerd_event_loop_lag_seconds`, `convergerd_build_info{version}`,
`convergerd_unsupported_clusters{version}`, `convergerd_cluster_server_info{cluster,version}`,
`convergerd_cluster_round_duration_seconds{cluster}`, `convergerd_last_round_timestamp_seconds`,
`convergerd_round_interval_seconds` (so alert rules can say "three intervals" portably),
`convergerd_record_failures_total{reason}` (records the database refused for good and that were
dropped: a cluster's rows of a round, or a whole round; reason from the SQLSTATE class),
`convergerd_cluster_insecure{cluster}` (1 for a cluster reached without TLS verification or over
http://, allowed by CONVERGERD_ALLOW_INSECURE_CLUSTERS; absent for the others),
`convergerd_http_connections_refused_total{reason}` (what the HTTP server's bounds did:
`HTTP_BOUNDS_REASONS`), `convergerd_policy_revisions_pruned_total` (kept revisions the
retention deleted, on the leader), `convergerd_pending_deletions` and
`convergerd_pending_deletion_oldest_seconds` (deletions some cluster did not confirm, from
the database on every replica; alert `ConvergerdDeletionPending`), plus the standard
`process_*` and `python_gc_*` collectors.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import cast

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from convergerd import __version__
from convergerd.config import RolloutSettings
from convergerd.core.exceptions import ExceptionTally
from convergerd.core.model import PolicyId
from convergerd.core.report import ApplyResult, ClusterOutcome, RoundReport, RoundResult
from convergerd.core.rollout import LIVE_STATES, OnHalt, State
from convergerd.status.admissions import ENFORCEMENT_ACTIONS, PolicyTotals
from convergerd.status.cluster import ClusterFacts
from convergerd.status.phases import (
    UNSUPPORTED,
    TallyCounts,
    audit_stale_after_s,
    verification_results,
    verified_stale_after_s,
)
from convergerd.status.reader import StatusReader
from convergerd.status.rollouts import RolloutFacts
from convergerd.status.shards import last_rounds, orphans

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Failure and retry reasons initialised at zero for every cluster: the slugs errors are really
# raised with (errors.py's status classes; the client's `connect_error` and `timeout` for no
# answer; the round's `deadline`), so the series that will count a failure exists before it.
# Every reason a cluster or an apply can fail with, zeroed for each cluster up front so an
# alert's increase() sees the first failure too.
FAILURE_REASONS = (
    "connect_error", "timeout", "deadline", "server_error", "throttled", "unauthorized",
    "forbidden", "crd_missing", "bad_request", "conflict", "invalid", "no_context",
    "no_token", "unsupported_auth", "insecure", "bad_response", "internal_error",
)
RETRY_REASONS = ("connect_error", "server_error", "throttled")
# convergerd.store.errors.REJECTION_REASONS, its `other`, and `internal` (not the database's).
RECORD_FAILURE_REASONS = ("data", "constraint", "access", "limit", "raised", "other", "internal")
# What the HTTP server's bounds do (`convergerd.api.server`), each counted from zero:
# `over_capacity` (a request answered 503 with Retry-After), `evicted_idle` (an idle connection
# closed for a new one), `header_timeout`, `answer_unread`, `malformed` (refused by the parser).
HTTP_BOUNDS_REASONS = ("over_capacity", "evicted_idle", "header_timeout", "answer_unread",
                       "malformed")
APPLY_VERBS = frozenset({"apply", "patch"})
ROUND_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0, 450.0, 600.0)
APPLY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[str, ...]
# A live rollout's states, in this order in `convergerd_rollout_state`.
ROLLOUT_STATES = tuple(s.value for s in State if s in LIVE_STATES)


class _Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        result: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            result.append(("+Inf" if math.isinf(bound) else repr(bound), float(running)))
        return result


class Metrics:
    """The metrics of one convergerd process. Implements `convergerd.kube.api.RequestObserver`.

    Keeps what is its own, counters and histograms; every gauge of what this replica knows
    (reachability, lag, counts, versions, phases, leader, invalid policies, pending
    deletions, insecure clusters) is read from `state`, the one keeper of those facts, when
    Prometheus scrapes. Time, the round interval and the operators' probe period are the
    state's too.
    """

    def __init__(
        self,
        *,
        state: StatusReader,
        version: str = __version__,
        process_collectors: bool = True,
        approval_alert_s: float = RolloutSettings().approval_alert_s,
    ) -> None:
        """Counters exist at zero for `state`'s clusters from the start; clusters that join
        later get theirs from `follow_clusters`. Counters exist only for the clusters `state`
        tracks (`StatusReader.tracks`: the database's, and the kept home cluster, whose Lease
        requests are counted): a late observation of a removed cluster (a request in flight
        when it was deleted) is dropped instead of bringing its series back for good."""
        self.state = state
        self.version = version
        # A rollout waiting for approval longer is overdue (CONVERGERD_ROLLOUT_APPROVAL_ALERT_
        # MINUTES): `convergerd_rollout_approval_overdue`.
        self.approval_alert_s = approval_alert_s
        self._rollout_halts: dict[Labels, float] = {(h.value,): 0.0 for h in OnHalt}
        self.registry = CollectorRegistry(auto_describe=False)
        self._applies: dict[Labels, float] = {}
        self._failures: dict[Labels, float] = {}
        self._retries: dict[Labels, float] = {}
        self._requests: dict[Labels, float] = {}
        self._apply_latency: dict[str, _Histogram] = {}
        self._rounds: dict[str, float] = {r.value: 0.0 for r in RoundResult}
        self._round_duration = _Histogram(ROUND_BUCKETS)
        self._loop_lag_s = 0.0
        self._record_failures: dict[Labels, float] = {
            (r,): 0.0 for r in RECORD_FAILURE_REASONS}
        self._status_shed: dict[Labels, float] = {}
        self._http_refused: dict[Labels, float] = {(r,): 0.0 for r in HTTP_BOUNDS_REASONS}
        self._revisions_pruned = 0.0
        # What the exposition keeps between scrapes: counter families' lines by what they
        # were written for, a cluster's phase and verification lines by its counts; and how
        # often series were dropped (`_forget`), which counters' lines are kept by too.
        self._counters_kept: dict[str, tuple[tuple[int, int, float], _Lines]] = {}
        self._counted_kept: dict[str, tuple[TallyCounts, _Lines, _Lines]] = {}
        self._generation = 0
        # Everything served: these families (`render` writes them), then the others'
        # (`register`; prometheus_client writes them).
        self._others = CollectorRegistry(auto_describe=False)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self.collect))
        self.registry.register(self._others)
        if process_collectors:
            ProcessCollector(registry=self._others)
            GCCollector(registry=self._others)
        self.follow_clusters()

    # -- cluster set -----------------------------------------------------------------------

    def _zero(self, cluster: str) -> None:
        for result in ApplyResult:
            self._applies.setdefault((cluster, result.value), 0.0)
        for reason in FAILURE_REASONS:
            self._failures.setdefault((cluster, reason), 0.0)
        for reason in RETRY_REASONS:
            self._retries.setdefault((cluster, reason), 0.0)

    def follow_clusters(self) -> None:
        """The counters follow the state's cluster set, after it changed: a new cluster's
        exist at zero from now on, a removed one's are dropped (back later: from zero)."""
        labelled = {key[0] for series in (self._applies, self._failures, self._retries,
                                          self._requests) for key in series}
        for gone in (set(self._apply_latency) | labelled):
            if not self.state.tracks(gone):
                self._forget(gone)
        for cluster in self.state.cluster_ids():
            self._zero(cluster)

    def _forget(self, cluster: str) -> None:
        self._generation += 1
        self._apply_latency.pop(cluster, None)
        for series in (self._applies, self._failures, self._retries, self._requests):
            for key in [k for k in series if k[0] == cluster]:
                del series[key]

    def sizes(self) -> dict[str, int]:
        """How many clusters have counters and how many labelled series are held (watched by
        the soak benchmark)."""
        return {"clusters": len({key[0] for key in self._applies}),
                "series": sum(len(s) for s in (self._applies, self._failures, self._retries,
                                                self._requests, self._apply_latency))}

    # -- updates ---------------------------------------------------------------------------

    def observe_round(self, report: RoundReport) -> None:
        """Count a round: its result and duration, and per cluster the applies and failures
        (what the round found goes to `StatusState.observe_round`)."""
        for _ in self.observing(report):
            pass

    def observing(self, report: RoundReport) -> Iterator[None]:
        """`observe_round` a cluster at a time (as `StatusState.observing`); the round itself
        is counted at the last step."""
        for outcome in report.clusters:
            self._count_outcome(outcome)
            yield
        self._rounds[report.result.value] += 1
        if report.finished_at is not None:
            self._round_duration.observe(
                max(0.0, (report.finished_at - report.started_at).total_seconds()))

    def _count_outcome(self, outcome: ClusterOutcome) -> None:
        cluster = outcome.cluster
        if not self.state.tracks(cluster):
            return
        self._zero(cluster)
        for delivery, n in outcome.deliveries.counted():
            self._applies[(cluster, delivery.result.value)] += n
            if delivery.result is ApplyResult.FAILED:
                self._count_failure(cluster, delivery.reason, n)
        if outcome.error is not None:
            # A cluster-level failure stops the cluster's work: counted once per round.
            self._count_failure(cluster, outcome.reason)

    def _count_failure(self, cluster: str, reason: str | None, n: int = 1) -> None:
        key = (cluster, reason or "error")
        self._failures[key] = self._failures.get(key, 0.0) + n

    def record_refused(self, reason: str) -> None:
        """A record the database refused for good (`convergerd.store.store.RecordObserver`)."""
        key = (reason,)
        self._record_failures[key] = self._record_failures.get(key, 0.0) + 1

    def status_read_shed(self, path: str) -> None:
        """A status view answered 429: over `CONVERGERD_STATUS_READS_PER_SECOND`."""
        self._status_shed[(path,)] = self._status_shed.get((path,), 0.0) + 1

    def http_connection_refused(self, reason: str) -> None:
        """What the HTTP server's bounds did (`convergerd.api.server.BoundsObserver`)."""
        self._http_refused[(reason,)] = self._http_refused.get((reason,), 0.0) + 1

    def revisions_pruned(self, revisions: int) -> None:
        """Kept policy revisions the retention deleted (`store.revisions.Pruner`)."""
        self._revisions_pruned += revisions

    def rollout_halted(self, on_halt: str) -> None:
        """A rollout the gate job halted (`delivery.rollouts`): `revert` or `pause`."""
        self._rollout_halts[(on_halt,)] = self._rollout_halts.get((on_halt,), 0.0) + 1

    def set_loop_lag(self, seconds: float) -> None:
        self._loop_lag_s = max(0.0, seconds)

    # -- RequestObserver -------------------------------------------------------------------

    def request_done(
        self, cluster: str, verb: str, status: int | None, duration_s: float
    ) -> None:
        if not self.state.tracks(cluster):
            return
        key = (cluster, verb, "none" if status is None else str(status))
        self._requests[key] = self._requests.get(key, 0.0) + 1
        if verb in APPLY_VERBS:
            hist = self._apply_latency.get(cluster)
            if hist is None:
                hist = self._apply_latency[cluster] = _Histogram(APPLY_BUCKETS)
            hist.observe(duration_s)

    def retry(self, cluster: str, reason: str) -> None:
        if not self.state.tracks(cluster):
            return
        key = (cluster, reason)
        self._retries[key] = self._retries.get(key, 0.0) + 1

    # -- exposition ------------------------------------------------------------------------

    def register(self, collector: Collector) -> None:
        """Serve `collector`'s families too, after these (and the process collectors)."""
        self._others.register(collector)

    def render(self) -> bytes:
        """The Prometheus text exposition; serve it with `CONTENT_TYPE`. The same text as
        prometheus_client's `generate_latest(self.registry)`, written without a `Sample`
        object per series (~40 series per cluster)."""
        text = "".join(family.text() for family in self._families(keep=True))
        return text.encode() + generate_latest(self._others)

    def collect(self) -> Iterator[Metric]:
        """The same families, made anew (nothing kept from an earlier scrape)."""
        return (family.metric() for family in self._families(keep=False))

    def _families(self, *, keep: bool) -> Iterator[_Family]:
        """`keep`: reuse and keep the parts that did not change since the last scrape."""
        now = self.state.clock().timestamp()
        yield from self._cluster_families(now, keep=keep)
        yield from self._fleet_families(now, keep=keep)
        yield from self._shard_families()
        yield from _admission_families(self.state.admission_totals)

    def _shard_families(self) -> Iterator[_Family]:
        """Who holds which shard, as this replica sees the Leases, and when each shard's last
        round ended as the database recorded it: the same answer from every replica, so an
        orphan shows wherever Prometheus scrapes."""
        state = self.state
        now, shards = state.clock(), state.shards
        yield _gauge("convergerd_shards_held", "Shards (Leases) this replica holds",
                     float(len(shards.held)))
        holder = _Family("convergerd_shard_holder",
                         "1 per shard for the holder seen in its Lease (holder=\"\" "
                         "when free or expired)", labels=("shard", "holder"))
        holder.add_rows([((str(k), who), 1.0) for k, who in enumerate(shards.holders)])
        yield holder
        last = _Family("convergerd_shard_last_round_timestamp_seconds",
                       "When a round last finished on the shard's clusters (Unix "
                       "time, from the database records)", labels=("shard",))
        last.add_rows([((str(k),), at.timestamp())
                       for k, at in sorted(last_rounds(state.clusters.values(),
                                                        shards).items())])
        yield last
        yield _gauge("convergerd_orphan_clusters",
                     "Clusters without a finished round for more than two intervals",
                     float(len(orphans(state.clusters.values(), now, state.interval_s))))

    def _counted_lines(self, name: str, counted: TallyCounts,
                       keep: bool) -> tuple[_Lines, _Lines]:
        """A cluster's phase and verification series, made again only when its counts
        change (`ClusterState.counts` keeps them while they hold; a round that read the same
        phases makes equal ones)."""
        kept = self._counted_kept.get(name) if keep else None
        if kept is not None and (kept[0] is counted or (
                (kept[0].phases, kept[0].verification) == (counted.phases, counted.verification))):
            self._counted_kept[name] = (counted, kept[1], kept[2])
            return kept[1], kept[2]
        phases = _Lines([((name, ph), float(n)) for ph, n in counted.phases.items()],
                        kept=keep)
        checked = _Lines([((name, result), float(n)) for result, n
                          in verification_results(counted.verification).items()], kept=keep)
        if keep:
            self._counted_kept[name] = (counted, phases, checked)
        return phases, checked

    def _cluster_families(self, now: float, *, keep: bool) -> Iterator[_Family]:
        state = self.state
        interval_s = state.interval_s
        verified_stale_s = verified_stale_after_s(state.probe_period_s)
        clusters = sorted(state.clusters.items())
        if len(self._counted_kept) > 2 * len(clusters):  # removed clusters' series go
            self._counted_kept = {k: v for k, v in self._counted_kept.items()
                                  if k in state.clusters}

        lag = _Family("convergerd_cluster_lag_seconds",
                      "Seconds since the cluster last fully converged (at scrape time)",
                      labels=("cluster",))
        last = _Family("convergerd_cluster_last_success_timestamp_seconds",
                       "When the cluster last fully converged (Unix time)", labels=("cluster",))
        up = _Family("convergerd_cluster_up",
                     "1 if the last attempt (round or reachability check) reached it",
                     labels=("cluster",))
        oos = _Family("convergerd_cluster_out_of_sync_policies",
                      "Policies not in sync on the cluster after the last round",
                      labels=("cluster",))
        phase = _Family("convergerd_policy_phase",
                        "Policies in each phase on the cluster (Stale: not read back for "
                        "more than two intervals)", labels=("cluster", "phase"))
        verification = _Family(
            "convergerd_policy_verification", "Policies by what the operator's enforcement "
            "probe last found on the cluster (admitted: a violating pod was admitted, the "
            "policy is not enforced)", labels=("cluster", "result"))
        info = _Family("convergerd_cluster_server_info",
                       "Kubernetes version of the cluster", labels=("cluster", "version"))
        cdur = _Family("convergerd_cluster_round_duration_seconds",
                       "How long the last round worked on the cluster", labels=("cluster",))
        rows: dict[str, list[Row]] = {"lag": [], "last": [], "up": [], "oos": [], "info": [],
                                      "cdur": []}
        unsupported: dict[str, int] = {}
        for name, c in clusters:
            labels = (name,)
            success = c.last_success_at.timestamp() if c.last_success_at is not None else None
            since = success if success is not None else c.known_since.timestamp()
            rows["lag"].append((labels, max(0.0, now - since)))
            if success is not None:
                rows["last"].append((labels, success))
            if c.reachable is not None:
                rows["up"].append((labels, 1.0 if c.reachable else 0.0))
            if c.last_attempt_at is not None:  # counts known: from a round, or its record
                rows["oos"].append((labels, float(max(0, c.desired - c.in_sync))))
            if c.server_version:
                rows["info"].append(((name, c.server_version), 1.0))
            if c.duration_s is not None:
                rows["cdur"].append((labels, c.duration_s))
            counted = c.counts(now, interval_s, verified_stale_s)
            phases, checked = self._counted_lines(name, counted, keep)
            phase.add(phases)
            verification.add(checked)
            if counted.phases[UNSUPPORTED]:
                version = c.server_version or "unknown"
                unsupported[version] = unsupported.get(version, 0) + 1
        for family, key in ((lag, "lag"), (last, "last"), (up, "up"), (oos, "oos"),
                            (info, "info"), (cdur, "cdur")):
            family.add_rows(rows[key])
        yield from (lag, last, up, oos, phase, verification, info, cdur)
        yield from self._audit_families(now, clusters)

        insecure = _Family("convergerd_cluster_insecure",
                           "1 if the cluster is reached without TLS verification or "
                           "over http:// (allowed by a setting)", labels=("cluster",))
        insecure.add_rows([((flagged,), 1.0) for flagged in sorted(state.insecure)])
        yield insecure

        unsup = _Family("convergerd_unsupported_clusters",
                        "Clusters whose policies are Unsupported (no "
                        "ValidatingAdmissionPolicy), by Kubernetes version", labels=("version",))
        unsup.add_rows([((version,), float(count))
                        for version, count in sorted(unsupported.items())])
        yield unsup

    def _audit_families(self, now: float,
                        clusters: Sequence[tuple[str, ClusterFacts]]) -> Iterator[_Family]:
        audit = _Family(
            "convergerd_audit_violations", "Existing objects on the cluster that its policies "
            "would deny, summed over the policies (the operator's audit, as last read)",
            labels=("cluster",))
        audit_stale_s = audit_stale_after_s(self.state.probe_period_s)
        with_violations = unsynced = 0
        rows: list[Row] = []
        for name, c in clusters:
            audited = c.audit_tally
            if audited.audited:
                rows.append(((name,), float(audited.violations)))
                with_violations += audited.violations > 0
                unsynced += audited.unsettled(now, self.state.interval_s, audit_stale_s)
        audit.add_rows(rows)
        yield audit
        yield _gauge("convergerd_audit_clusters_with_violations",
                     "Clusters where the operator's audit counts existing objects "
                     "that a policy would deny", float(with_violations))
        yield _gauge("convergerd_audit_unsynced_clusters",
                     "Clusters with an audit that is not current: the operator's "
                     "cache not synced, unreadable, or older than five probe periods",
                     float(unsynced))

    def _counter(self, name: str, doc: str, labels: Labels,
                 values: dict[Labels, float], keep: bool) -> _Family:
        """A counter family, its series written again only when a value changed: counters
        only grow and series are only dropped by `follow_clusters` (`_generation`), so the
        number of series and their sum change with any of them."""
        if not keep:
            return _counter(name, doc, labels, values)
        family = _Family(name, doc, labels=labels, kind="counter")
        mark = (self._generation, len(values), sum(values.values()))
        kept = self._counters_kept.get(name)
        if kept is None or kept[0] != mark:
            kept = self._counters_kept[name] = (mark, _Lines(sorted(values.items()),
                                                             kept=True))
        family.add(kept[1])
        return family

    def _rollout_families(self, now: float) -> Iterator[_Family]:
        waves, states, clusters, overdue = rollout_rows(self.state.rollouts, now,
                                                        self.approval_alert_s)
        for name, doc, labels, rows in (
            ("convergerd_rollout_wave", "The current wave (0 first) of each live rollout",
             ("policy",), waves),
            ("convergerd_rollout_state", "Each live rollout's state: 1 for the one it is in "
             "(progressing, waiting_approval, paused, halted)", ("policy", "state"), states),
            ("convergerd_rollout_clusters", "Clusters reporting a live rollout's new revision "
             "(new) or another one (old), as of the last database sync",
             ("policy", "revision_kind"), clusters),
            ("convergerd_rollout_approval_overdue", "1 when a rollout has waited for "
             "approval longer than CONVERGERD_ROLLOUT_APPROVAL_ALERT_MINUTES",
             ("policy",), overdue),
        ):
            family = _Family(name, doc, labels=labels)
            family.add_rows(rows)
            yield family

    def _fleet_families(self, now: float, *, keep: bool) -> Iterator[_Family]:
        state = self.state
        leader = state.leader()
        yield self._counter("convergerd_applies", "Policy applies by result",
                            ("cluster", "result"), self._applies, keep)
        yield self._counter("convergerd_apply_failures", "Failed applies and cluster-level "
                            "failures by reason", ("cluster", "reason"), self._failures, keep)
        yield self._counter("convergerd_retries", "Retried requests to clusters by reason",
                            ("cluster", "reason"), self._retries, keep)
        yield self._counter("convergerd_cluster_requests", "Requests to clusters by verb and "
                            "status code (none: no HTTP answer)", ("cluster", "verb", "code"),
                            self._requests, keep)
        yield _counter("convergerd_rounds", "Converge rounds by result", ("result",),
                       {(k,): v for k, v in self._rounds.items()})
        yield _counter("convergerd_leader_transitions", "Leadership changes seen by this "
                       "replica", (), {(): float(leader.changes)})
        yield _counter("convergerd_record_failures", "Records the database refused for good "
                       "(dropped), by reason", ("reason",), self._record_failures)
        yield _counter("convergerd_status_reads_shed", "Status view requests answered 429 "
                       "(over CONVERGERD_STATUS_READS_PER_SECOND), by path", ("path",),
                       self._status_shed)
        yield _counter("convergerd_http_connections_refused", "What the HTTP server's bounds "
                       "did to a connection or request, by reason", ("reason",),
                       self._http_refused)
        yield _counter("convergerd_policy_revisions_pruned", "Kept policy revisions deleted by "
                       "the retention (CONVERGERD_REVISION_RETENTION, "
                       "CONVERGERD_REVISION_RETENTION_DAYS)", (),
                       {(): self._revisions_pruned})

        yield _counter("convergerd_rollout_halts", "Rollouts a failed gate halted, by what "
                       "the strategy did (revert: the wave's clusters sent back; pause: left "
                       "halted), on the leader that judged them", ("on_halt",),
                       self._rollout_halts)
        yield from self._rollout_families(now)

        yield _histograms("convergerd_apply_duration_seconds",
                          "Latency of apply requests per cluster", ("cluster",),
                          {(k,): v for k, v in self._apply_latency.items()})
        yield _histograms("convergerd_round_duration_seconds", "Duration of converge rounds",
                          (), {(): self._round_duration})

        yield _gauge("convergerd_is_leader", "1 if this replica holds the Lease",
                     1.0 if leader.is_leader else 0.0)
        yield _gauge("convergerd_invalid_policies",
                     "Policies that cannot be delivered (bad id, type or params)",
                     float(len(state.invalid)))
        yield from _exception_families(state.exception_tally)
        count, age = pending_deletion_values(self.state.pending_deletions(), now)
        yield _gauge("convergerd_pending_deletions",
                     "Policy deletions begun and not finished: some cluster did not "
                     "confirm the removal (a retry of the DELETE finishes them)", count)
        yield _gauge("convergerd_pending_deletion_oldest_seconds",
                     "How long the oldest pending deletion has been pending (0: none)", age)
        yield _gauge("convergerd_event_loop_lag_seconds",
                     "How late the event loop ran the last heartbeat", self._loop_lag_s)
        yield _gauge("convergerd_round_interval_seconds",
                     "Configured time between converge rounds", state.interval_s)
        last_round = state.last_round
        if last_round is not None and last_round.finished_at is not None:
            yield _gauge("convergerd_last_round_timestamp_seconds",
                         "When the last converge round ended (Unix time)",
                         last_round.finished_at.timestamp())
        build = _Family("convergerd_build_info", "convergerd version", labels=("version",))
        build.add_rows([((self.version,), 1.0)])
        yield build


def _admission_families(totals: Mapping[PolicyId, PolicyTotals]) -> Iterator[_Family]:
    """Per policy, fleet totals (never per policy and cluster): what admission did
    (`StatusReader.admission_totals`, kept up to date as clusters' readings change, so a
    scrape costs a few lines per policy). Every policy counted somewhere has all its
    series (0 included); excepted only where some cluster says it."""
    admissions = _Family(
        "convergerd_policy_admissions", "Failed validations of the policy by what admission "
        "did (action: deny, warn, audit), summed over the clusters, each since its installed "
        "revision (the API server's counts, as the operators report them)",
        labels=("policy", "action"))
    last_hour = _Family(
        "convergerd_policy_admissions_last_hour", "The same over the last hour of each "
        "cluster's last read", labels=("policy", "action"))
    modes = _Family(
        "convergerd_policy_clusters_by_enforcement", "Clusters where the policy's binding in "
        "force has this mode (Deny, Warn, Audit; other: a mode this version does not know)",
        labels=("policy", "enforcement"))
    excepted = _Family(
        "convergerd_policy_audit_excepted", "Existing objects the policy would deny that an "
        "exception admits, summed over the clusters whose audit says it",
        labels=("policy",))
    rows: tuple[list[Row], list[Row], list[Row], list[Row]] = ([], [], [], [])
    for policy, t in sorted(totals.items()):
        for action, since, hour in (("deny", t.denied, t.last_hour_denied),
                                    ("warn", t.warned, t.last_hour_warned),
                                    ("audit", t.audited, t.last_hour_audited)):
            rows[0].append(((policy, action), float(since)))
            rows[1].append(((policy, action), float(hour)))
        rows[2].extend(((policy, mode), float(n)) for mode, n in t.clusters_by_enforcement.items()
                       if n or mode in ENFORCEMENT_ACTIONS)
        if t.excepted is not None:
            rows[3].append(((policy,), float(t.excepted)))
    for family, family_rows in zip((admissions, last_hour, modes, excepted), rows, strict=True):
        family.add_rows(family_rows)
        yield family


def rollout_rows(rollouts: Sequence[RolloutFacts], now: float, approval_alert_s: float
                 ) -> tuple[list[Row], list[Row], list[Row], list[Row]]:
    """The live rollouts' rows: wave, state (one series per live state, 1 for its own),
    clusters per revision kind (new, old), approval overdue. Per-policy labels only for a
    rollout in progress: a policy whose rollout ended has none."""
    waves: list[Row] = []
    states: list[Row] = []
    clusters: list[Row] = []
    overdue: list[Row] = []
    for r in rollouts:
        policy = str(r.policy)
        waves.append(((policy,), float(r.wave)))
        states.extend(((policy, s), 1.0 if r.state == s else 0.0) for s in ROLLOUT_STATES)
        clusters.append(((policy, "new"), float(r.clusters_new)))
        clusters.append(((policy, "old"), float(r.clusters_old)))
        waited = now - r.since.timestamp() if r.since is not None else 0.0
        late = r.state is State.WAITING_APPROVAL and waited > approval_alert_s
        overdue.append(((policy,), 1.0 if late else 0.0))
    return waves, states, clusters, overdue


def pending_deletion_values(
    pending: tuple[int, dt.datetime | None], now: float
) -> tuple[float, float]:
    """(pending deletions, seconds the oldest has been pending; 0 when none)."""
    count, oldest = pending
    age = max(0.0, now - oldest.timestamp()) if oldest is not None else 0.0
    return float(count), age


# ---------------------------------------------------------------------------------------------
# The exposition: families as rows of label values and values, written as prometheus_client's
# `generate_latest` writes them (tests/unit/test_metrics.py compares the two), or handed to a
# registry as its metric families.

Row = tuple[Labels, float]
# How the exposition writes a value (prometheus_client's, not annotated).
_go = cast("Callable[[float], str]", floatToGoString)
# Values of series that are counts, written without a call.
_COUNTS = {float(n): _go(n) for n in range(1, 1024)}


def _value(value: float) -> str:
    return _COUNTS.get(value) or _go(value)


def _escaped(value: str) -> str:
    """A label value as the exposition escapes it."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _lines(sample: str, names: Labels, rows: Iterable[Row]) -> str:
    """The exposition's lines of `rows`, samples named `sample`, labels sorted by name."""
    if not names:
        return "".join(f"{sample} {_value(value)}\n" for _, value in rows)
    if len(names) == 1:
        start = f'{sample}{{{names[0]}="'
        return "".join(f'{start}{_escaped(v)}"}} {_value(value)}\n' for (v,), value in rows)
    order = sorted(range(len(names)), key=names.__getitem__)
    keys = [(f'{names[i]}="', i) for i in order]
    return "".join(
        f'{sample}{{{",".join(f"{key}{_escaped(values[i])}" + chr(34) for key, i in keys)}}} '
        f"{_value(value)}\n" for values, value in rows)


class _Lines:
    """Rows of one family, written once. A part kept between scrapes (`kept`) lets its rows
    go once written (memory: only `render` uses kept parts, `collect` makes its own)."""

    __slots__ = ("_text", "kept", "rows")

    def __init__(self, rows: list[Row], *, kept: bool = False) -> None:
        self.rows: list[Row] | None = rows
        self.kept = kept
        self._text: str | None = None

    def text(self, sample: str, names: Labels) -> str:
        if self._text is None:
            assert self.rows is not None
            self._text = _lines(sample, names, self.rows)
            if self.kept:
                self.rows = None
        return self._text


class _Family:
    """One gauge or counter family, its rows in parts (`_Lines`, some kept between scrapes)."""

    def __init__(self, name: str, doc: str, *, labels: Labels = (),
                 kind: str = "gauge") -> None:
        self.name, self.doc, self.labels, self.kind = name, doc, labels, kind
        self.parts: list[_Lines] = []

    def add(self, lines: _Lines) -> None:
        self.parts.append(lines)

    def add_rows(self, rows: list[Row]) -> None:
        self.parts.append(_Lines(rows))

    def _head(self, name: str, kind: str) -> str:
        doc = self.doc.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"

    def text(self) -> str:
        sample = f"{self.name}_total" if self.kind == "counter" else self.name
        return self._head(sample, self.kind) + "".join(
            part.text(sample, self.labels) for part in self.parts)

    def metric(self) -> Metric:
        family: GaugeMetricFamily | CounterMetricFamily = (
            CounterMetricFamily(self.name, self.doc, labels=self.labels)
            if self.kind == "counter" else GaugeMetricFamily(self.name, self.doc,
                                                             labels=self.labels))
        for part in self.parts:
            assert part.rows is not None, "a family with kept parts is written, not collected"
            for values, value in part.rows:
                family.add_metric(values, value)
        return family


class _HistogramFamily(_Family):
    """Histograms, one per row of label values."""

    def __init__(self, name: str, doc: str, labels: Labels,
                 histograms: Mapping[Labels, _Histogram]) -> None:
        super().__init__(name, doc, labels=labels, kind="histogram")
        self.histograms = sorted(histograms.items())

    def text(self) -> str:
        out = [self._head(self.name, self.kind)]
        names = (*self.labels, "le")
        for values, hist in self.histograms:
            buckets = hist.buckets()
            out.append(_lines(f"{self.name}_bucket", names,
                              (((*values, le), count) for le, count in buckets)))
            out.append(_lines(f"{self.name}_count", self.labels, [(values, buckets[-1][1])]))
            out.append(_lines(f"{self.name}_sum", self.labels, [(values, hist.sum)]))
        return "".join(out)

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, hist in self.histograms:
            family.add_metric(values, hist.buckets(), hist.sum)
        return family


def _exception_families(tally: Sequence[ExceptionTally]) -> Iterator[_Family]:
    """Per policy (a fleet total, never per cluster), the policies that have exceptions."""
    for name, doc, field in (
            ("convergerd_policy_exceptions", "Exceptions in force per policy", "in_force"),
            ("convergerd_policy_exceptions_expiring_7d",
             "Exceptions in force per policy that expire within 7 days", "expiring_soon"),
            ("convergerd_policy_exceptions_expired_delivered",
             "Expired exceptions per policy that some cluster is still recorded with (a "
             "revision of the policy that carried them, or not lapsed yet)",
             "expired_delivered")):
        family = _Family(name, doc, labels=("policy",))
        family.add_rows([((t.policy,), float(getattr(t, field))) for t in tally])
        yield family


def _gauge(name: str, doc: str, value: float) -> _Family:
    family = _Family(name, doc)
    family.add_rows([((), value)])
    return family


def _counter(name: str, doc: str, labels: Labels, values: Mapping[Labels, float]) -> _Family:
    family = _Family(name, doc, labels=labels, kind="counter")
    family.add_rows(sorted(values.items()))
    return family


def _histograms(name: str, doc: str, labels: Labels,
                histograms: Mapping[Labels, _Histogram]) -> _HistogramFamily:
    return _HistogramFamily(name, doc, labels, histograms)


class _Collector:
    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return self._families()


# What the listener does with a notification (`convergerd.delivery.listener`), each counted
# from zero.
NOTIFICATION_HANDLINGS = ("queued", "standby", "duplicate", "invalid", "overflow",
                          "sender_overflow", "unknown_overflow")
FANOUT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)


class FanoutMetrics:
    """Saves and deletions (`convergerd.delivery.fanout`) and the NOTIFY listener; register with
    `metrics.registry.register(...)`. No per-policy label:

    - `convergerd_saves_total{trigger,result}` (trigger `api`, `notify`, `unsaved` (the gate
      job's save of a revision whose save never ran) or `rollout <step>`; result `ok`,
      `partial`, `not_found`, `invalid`, `deleting`), `convergerd_deletes_total{result}`
      (`ok`, `refused`, `not_found`);
    - `convergerd_fanout_duration_seconds{operation}` (histogram, `save` or `delete`);
    - `convergerd_notify_listener_connected` (gauge 1/0) and
      `convergerd_notify_listener_reconnects_total`;
    - `convergerd_notifications_total{handling}`: notifications received, by what this replica
      did with them (`queued` for a save, `standby`: left to the leader, `duplicate`: already
      queued; dropped: `invalid`: not a policy id, `overflow`: too many queued,
      `sender_overflow`: its sending backend has its share queued, `unknown_overflow`: an id
      the last round did not load, over the budget of those).
    """

    def __init__(self) -> None:
        self._saves: dict[Labels, float] = {
            (t, r): 0.0 for t in ("api", "notify") for r in ("ok", "partial")}
        self._deletes: dict[Labels, float] = {(r,): 0.0 for r in ("ok", "refused")}
        self._duration = {op: _Histogram(FANOUT_BUCKETS) for op in ("save", "delete")}
        self._connected = 0.0
        self._reconnects = 0.0
        self._notifications: dict[Labels, float] = {
            (h,): 0.0 for h in NOTIFICATION_HANDLINGS}

    def fanout_done(self, operation: str, trigger: str, result: str, duration_s: float) -> None:
        if operation == "save":
            key = (trigger, result)
            self._saves[key] = self._saves.get(key, 0.0) + 1
        else:
            self._deletes[(result,)] = self._deletes.get((result,), 0.0) + 1
        self._duration.setdefault(operation, _Histogram(FANOUT_BUCKETS)).observe(duration_s)

    def listener_connected(self, connected: bool) -> None:
        self._connected = 1.0 if connected else 0.0

    def listener_reconnect(self) -> None:
        self._reconnects += 1

    def notification(self, handling: str) -> None:
        self._notifications[(handling,)] = self._notifications.get((handling,), 0.0) + 1

    def collect(self) -> Iterator[Metric]:
        yield _counter("convergerd_saves", "Policy saves by trigger and result",
                       ("trigger", "result"), self._saves).metric()
        yield _counter("convergerd_deletes", "Policy deletions by result", ("result",),
                       self._deletes).metric()
        yield _histograms("convergerd_fanout_duration_seconds",
                          "Duration of save and delete fan-outs", ("operation",),
                          {(k,): v for k, v in self._duration.items()}).metric()
        yield GaugeMetricFamily("convergerd_notify_listener_connected",
                                "1 while the database notification listener is connected",
                                value=self._connected)
        yield _counter("convergerd_notify_listener_reconnects",
                       "Times the notification listener lost its connection and reconnected",
                       (), {(): self._reconnects}).metric()
        yield _counter("convergerd_notifications",
                       "Database notifications received, by what this replica did with them",
                       ("handling",), self._notifications).metric()


# ---------------------------------------------------------------------------------------------
# Readiness


# Why a replica is not ready, as `convergerd_unready{reason}` labels it: every one is exported
# (0 while it holds) so an alert tells "ready" from "not scraped".
UNREADY_REASONS = ("lease_unreachable", "lease_stalled", "database")


class ReadinessMetrics:
    """`convergerd_unready{reason}`: 1 while this replica is not ready for that reason, read at
    scrape time from the same checks as `/readyz` (`not_ready`: the supervisor's readiness
    checks, `supervise.HealthCheck.not_ready`), and `database` from the status state's last
    database sync (`StatusReader.sync_error`, every min(interval, 30 s)): a scrape does not ask
    the database."""

    def __init__(self, not_ready: Callable[[], Iterable[tuple[str, str]]],
                 state: StatusReader) -> None:
        self._not_ready = not_ready
        self._state = state

    def collect(self) -> Iterator[Metric]:
        failing = {reason for reason, _ in self._not_ready()}
        if self._state.sync_error is not None:
            failing.add("database")
        family = GaugeMetricFamily(
            "convergerd_unready", "1 while this replica is not ready (GET /readyz answers 503) "
            "for this reason: lease_unreachable, lease_stalled, database", labels=("reason",))
        for reason in UNREADY_REASONS:
            family.add_metric((reason,), 1.0 if reason in failing else 0.0)
        yield family


__all__ = ["CONTENT_TYPE", "FanoutMetrics", "Metrics", "ReadinessMetrics"]
