"""Prometheus metrics on the process's own registry (docs/design.md, "Status and metrics"; no
default-registry globals).

Every series is produced at scrape time by one collector from plain values kept here, so
derived values are true when Prometheus reads them:

- `convergerd_cluster_lag_seconds{cluster}` is `now - last success` computed at scrape time: a
  cluster that has not converged for an hour shows ~3600 even when no round ran. A cluster that
  never converged (since this process knows of it) lags since the moment it became known to this
  process (construction, `set_clusters`, or its first round), unless the database's last success
  was fed in with `seed_last_success` (the runtime does that at start and on standbys, so a
  restart does not reset the lag). A success is stamped with the round's end, as the database
  records it, so every replica reports the same lag.
- `convergerd_cluster_last_success_timestamp_seconds{cluster}` is absent until a success is
  known (a 0 would read as "1970").
- `convergerd_policy_phase{cluster,phase}`: phases read back in the last listing of that cluster.
  Readings older than two round intervals count under `phase="Stale"` instead of their last
  known phase (see `convergerd.status.phases`), so `sum by (cluster)` is still the policy count
  there.
- `convergerd_policy_verification{cluster,result}`: the operator's enforcement probe as read
  back in the same listing: `verified` (a violating pod was denied), `admitted` (a violating pod
  was ADMITTED: the policy is not enforced there; alert `ConvergerdPolicyNotEnforced`),
  `unverified` (any other False, Unknown, no condition, a stale reading, or a condition no
  probe accounts for: a lastProbeTime in the future), `stale` (the last probe is older than two
  of the operators' probe periods, `CONVERGERD_OPERATOR_PROBE_MINUTES`). Every result of every
  cluster with readings is present (0 included), and they add up to the policy count there.
- Counters carry no `_created` samples (they would double the series count for nothing).
- Counters of every known cluster exist from the start at zero (applies by result, failures
  and retries by the known reasons), so `rate()`/`increase()` see the first failure.

No metric has a per-policy label. Beyond the contract's set, for on-call:
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
`convergerd_pending_deletions` and `convergerd_pending_deletion_oldest_seconds` (deletions some
cluster did not confirm, from the database on every replica; alert
`ConvergerdDeletionPending`), plus the
standard `process_*` and `python_gc_*` collectors.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from convergerd import __version__
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    PhaseReading,
    RoundReport,
    RoundResult,
)
from convergerd.status.phases import (
    ADMITTED,
    ALL_PHASES,
    STALE,
    STALE_VERIFICATION,
    UNSUPPORTED,
    UNVERIFIED,
    VERIFICATION_RESULTS,
    counted_phase,
    is_stale_age,
    normalize_phase,
    phases_refreshed,
    probe_time_problem,
    verification_of,
    verification_result,
    verified_stale_after_s,
)

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
APPLY_VERBS = frozenset({"apply", "patch"})
ROUND_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0, 450.0, 600.0)
APPLY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[str, ...]
WallClock = Callable[[], float]


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


@dataclass(slots=True)
class _Cluster:
    known_since: float
    up: float | None = None
    last_success: float | None = None
    out_of_sync: int | None = None
    server_version: str | None = None
    round_duration_s: float | None = None
    # (phase, seen at, verification result when fresh, probe time when the result ages)
    phases: list[tuple[str, float, str, float | None]] = field(default_factory=list)


class Metrics:
    """The metrics of one convergerd process. Implements `convergerd.kube.api.RequestObserver`.

    `clock` is the wall clock in seconds since the epoch (lag and timestamps); `interval_s` is
    the round interval, used to decide when a phase reading is stale.
    """

    def __init__(
        self,
        *,
        interval_s: float = 300.0,
        clock: WallClock = time.time,
        version: str = __version__,
        clusters: Iterable[str] = (),
        process_collectors: bool = True,
        keep: Iterable[str] = (),
        pending_deletions: Callable[[], tuple[int, dt.datetime | None]] | None = None,
        probe_period_s: float = 600.0,
    ) -> None:
        """`clusters`: known from the start (zeroed series). `keep`: clusters whose series stay
        whatever the database's set (the home cluster: its Lease requests are counted).
        `pending_deletions()`: how many deletions are pending and when the oldest began, read
        at scrape time from their one keeper (`StatusState.pending_deletions`).
        `probe_period_s`: the operators' probe period (a Verified probe's age limit)."""
        self.interval_s = interval_s
        self.verified_stale_s = verified_stale_after_s(probe_period_s)
        self.clock = clock
        self.version = version
        self.registry = CollectorRegistry(auto_describe=False)
        self._clusters: dict[str, _Cluster] = {}
        self._applies: dict[Labels, float] = {}
        self._failures: dict[Labels, float] = {}
        self._retries: dict[Labels, float] = {}
        self._requests: dict[Labels, float] = {}
        self._apply_latency: dict[str, _Histogram] = {}
        self._rounds: dict[str, float] = {r.value: 0.0 for r in RoundResult}
        self._round_duration = _Histogram(ROUND_BUCKETS)
        self._last_round_end: float | None = None
        self._is_leader = 0.0
        self._leader: tuple[bool, str | None] | None = None
        self._transitions = 0.0
        self._invalid = 0
        self._loop_lag_s = 0.0
        self._record_failures: dict[Labels, float] = {
            (r,): 0.0 for r in RECORD_FAILURE_REASONS}
        self._insecure: set[str] = set()
        self._status_shed: dict[Labels, float] = {}
        # Once the database's cluster set is known (`set_clusters`), series exist only for it
        # and `keep`: a late observation of a removed cluster (a request or probe in flight
        # when it was deleted) is dropped instead of bringing its series back for good.
        self._fleet: frozenset[str] | None = None
        self._keep = frozenset(keep)
        self._pending_deletions = pending_deletions
        self.registry.register(_Collector(self))
        if process_collectors:
            ProcessCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        for cluster in clusters:
            self.add_cluster(cluster)

    # -- cluster set -----------------------------------------------------------------------

    def add_cluster(self, cluster: str) -> None:
        if cluster in self._clusters:
            return
        self._clusters[cluster] = _Cluster(known_since=self.clock())
        for result in ApplyResult:
            self._applies.setdefault((cluster, result.value), 0.0)
        for reason in FAILURE_REASONS:
            self._failures.setdefault((cluster, reason), 0.0)
        for reason in RETRY_REASONS:
            self._retries.setdefault((cluster, reason), 0.0)

    def set_clusters(self, clusters: Iterable[str]) -> None:
        """The clusters the database knows: new ones get zeroed series, removed ones lose all."""
        wanted = set(clusters)
        self._fleet = frozenset(wanted)
        labelled = {key[0] for series in (self._applies, self._failures, self._retries,
                                          self._requests) for key in series}
        for gone in (set(self._clusters) | set(self._apply_latency) | labelled) - wanted:
            if not self._tracks(gone):
                self.remove_cluster(gone)
        for cluster in sorted(wanted):
            self.add_cluster(cluster)

    def _tracks(self, cluster: str) -> bool:
        """Whether `cluster` may have series: all until the set is known, then its members
        and the kept ones."""
        return self._fleet is None or cluster in self._fleet or cluster in self._keep

    def sizes(self) -> dict[str, int]:
        """How many clusters and labelled series are held (watched by the soak benchmark)."""
        return {"clusters": len(self._clusters),
                "series": sum(len(s) for s in (self._applies, self._failures, self._retries,
                                                self._requests, self._apply_latency))}

    def remove_cluster(self, cluster: str) -> None:
        self._clusters.pop(cluster, None)
        self._apply_latency.pop(cluster, None)
        self._insecure.discard(cluster)
        for series in (self._applies, self._failures, self._retries, self._requests):
            for key in [k for k in series if k[0] == cluster]:
                del series[key]

    def seed_last_success(self, cluster: str, at: dt.datetime | float | None) -> None:
        """A last success known from elsewhere (the database); kept only if newer."""
        if at is None or not self._tracks(cluster):
            return
        ts = at.timestamp() if isinstance(at, dt.datetime) else at
        self.add_cluster(cluster)
        state = self._clusters[cluster]
        if state.last_success is None or ts > state.last_success:
            state.last_success = ts

    # -- updates ---------------------------------------------------------------------------

    def observe_round(self, report: RoundReport) -> None:
        for outcome in report.clusters:
            self._observe_outcome(report, outcome)
        if report.error is None:  # a round that could not run saw no policies at all
            self._invalid = len(report.invalid)
        self._rounds[report.result.value] += 1
        end = report.finished_at.timestamp() if report.finished_at else self.clock()
        self._last_round_end = end
        if report.finished_at is not None:
            self._round_duration.observe(
                max(0.0, (report.finished_at - report.started_at).total_seconds()))

    def _observe_outcome(self, report: RoundReport, outcome: ClusterOutcome) -> None:
        cluster = outcome.cluster
        if not self._tracks(cluster):
            return
        self.add_cluster(cluster)
        state = self._clusters[cluster]
        state.up = 1.0 if outcome.reached else 0.0
        state.out_of_sync = max(0, outcome.desired - outcome.in_sync)
        state.round_duration_s = outcome.duration_s
        if outcome.server_version:
            state.server_version = outcome.server_version
        if outcome.converged:
            self.seed_last_success(cluster, report.finished_at or report.started_at)
        if phases_refreshed(outcome):
            state.phases = [_phase_of(r) for r in outcome.phases]
        for delivery in outcome.deliveries:
            self._applies[(cluster, delivery.result.value)] += 1
            if delivery.result is ApplyResult.FAILED:
                self._count_failure(cluster, delivery.reason)
        if outcome.error is not None:
            # A cluster-level failure stops the cluster's work: counted once per round.
            self._count_failure(cluster, outcome.reason)

    def _count_failure(self, cluster: str, reason: str | None) -> None:
        key = (cluster, reason or "error")
        self._failures[key] = self._failures.get(key, 0.0) + 1

    def set_cluster_up(self, cluster: str, up: bool, server_version: str | None = None) -> None:
        """From the reachability prober (or anything else that just tried the cluster)."""
        if not self._tracks(cluster):
            return
        self.add_cluster(cluster)
        state = self._clusters[cluster]
        state.up = 1.0 if up else 0.0
        if server_version:
            state.server_version = server_version

    def set_leader(self, is_leader: bool, holder: str | None) -> None:
        """What the elector sees. A transition is any change of (leading, holder) after the
        first observation: this replica gaining or losing it, or another holder taking over."""
        now = (is_leader, holder)
        if self._leader is not None and now != self._leader:
            self._transitions += 1
        self._leader = now
        self._is_leader = 1.0 if is_leader else 0.0

    def record_refused(self, reason: str) -> None:
        """A record the database refused for good (`convergerd.store.store.RecordObserver`)."""
        key = (reason,)
        self._record_failures[key] = self._record_failures.get(key, 0.0) + 1

    def set_cluster_insecure(self, cluster: str, insecure: bool) -> None:
        """From the cluster registry, for every client it opens (insecure ones only when
        CONVERGERD_ALLOW_INSECURE_CLUSTERS allows them)."""
        if insecure and self._tracks(cluster):
            self._insecure.add(cluster)
        else:
            self._insecure.discard(cluster)

    def status_read_shed(self, path: str) -> None:
        """A status view answered 429: over `CONVERGERD_STATUS_READS_PER_SECOND`."""
        self._status_shed[(path,)] = self._status_shed.get((path,), 0.0) + 1

    def set_loop_lag(self, seconds: float) -> None:
        self._loop_lag_s = max(0.0, seconds)

    # -- RequestObserver -------------------------------------------------------------------

    def request_done(
        self, cluster: str, verb: str, status: int | None, duration_s: float
    ) -> None:
        if not self._tracks(cluster):
            return
        key = (cluster, verb, "none" if status is None else str(status))
        self._requests[key] = self._requests.get(key, 0.0) + 1
        if verb in APPLY_VERBS:
            hist = self._apply_latency.get(cluster)
            if hist is None:
                hist = self._apply_latency[cluster] = _Histogram(APPLY_BUCKETS)
            hist.observe(duration_s)

    def retry(self, cluster: str, reason: str) -> None:
        if not self._tracks(cluster):
            return
        key = (cluster, reason)
        self._retries[key] = self._retries.get(key, 0.0) + 1

    # -- exposition ------------------------------------------------------------------------

    def _pending_families(self) -> Iterator[Metric]:
        pending = self._pending_deletions() if self._pending_deletions else (0, None)
        count, age = pending_deletion_values(pending, self.clock())
        yield GaugeMetricFamily("convergerd_pending_deletions",
                                "Policy deletions begun and not finished: some cluster did not "
                                "confirm the removal (a retry of the DELETE finishes them)",
                                value=count)
        yield GaugeMetricFamily("convergerd_pending_deletion_oldest_seconds",
                                "How long the oldest pending deletion has been pending (0: none)",
                                value=age)

    def render(self) -> bytes:
        """The Prometheus text exposition; serve it with `CONTENT_TYPE`."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        yield from self._cluster_families(self.clock())
        yield from self._fleet_families()

    def _policy_counts(self, c: _Cluster, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Policies per phase and per verification result (stale readings: `Stale`,
        `unverified`; probes older than two probe periods: `stale`)."""
        counts = dict.fromkeys((*ALL_PHASES, STALE), 0)
        checked = dict.fromkeys(VERIFICATION_RESULTS, 0)
        for ph, seen, result, probed in c.phases:
            counts[counted_phase(ph, now - seen, self.interval_s)] += 1
            if is_stale_age(max(0.0, now - seen), self.interval_s):
                checked[UNVERIFIED] += 1
            elif probed is not None and now - probed > self.verified_stale_s:
                checked[STALE_VERIFICATION] += 1
            else:
                checked[result] += 1
        return counts, checked

    def _cluster_families(self, now: float) -> Iterator[Metric]:
        clusters = sorted(self._clusters.items())

        lag = GaugeMetricFamily("convergerd_cluster_lag_seconds",
                                "Seconds since the cluster last fully converged (at scrape time)",
                                labels=["cluster"])
        last = GaugeMetricFamily("convergerd_cluster_last_success_timestamp_seconds",
                                 "When the cluster last fully converged (Unix time)",
                                 labels=["cluster"])
        up = GaugeMetricFamily("convergerd_cluster_up",
                               "1 if the last attempt (round or reachability check) reached it",
                               labels=["cluster"])
        oos = GaugeMetricFamily("convergerd_cluster_out_of_sync_policies",
                                "Policies not in sync on the cluster after the last round",
                                labels=["cluster"])
        phase = GaugeMetricFamily("convergerd_policy_phase",
                                  "Policies in each phase on the cluster (Stale: not read back for "
                                  "more than two intervals)", labels=["cluster", "phase"])
        verification = GaugeMetricFamily(
            "convergerd_policy_verification", "Policies by what the operator's enforcement "
            "probe last found on the cluster (admitted: a violating pod was admitted, the "
            "policy is not enforced)", labels=["cluster", "result"])
        info = GaugeMetricFamily("convergerd_cluster_server_info",
                                 "Kubernetes version of the cluster", labels=["cluster", "version"])
        cdur = GaugeMetricFamily("convergerd_cluster_round_duration_seconds",
                                 "How long the last round worked on the cluster",
                                 labels=["cluster"])
        unsupported: dict[str, int] = {}
        for name, c in clusters:
            since = c.last_success if c.last_success is not None else c.known_since
            lag.add_metric([name], max(0.0, now - since))
            if c.last_success is not None:
                last.add_metric([name], c.last_success)
            if c.up is not None:
                up.add_metric([name], c.up)
            if c.out_of_sync is not None:
                oos.add_metric([name], float(c.out_of_sync))
            if c.server_version:
                info.add_metric([name, c.server_version], 1.0)
            if c.round_duration_s is not None:
                cdur.add_metric([name], c.round_duration_s)
            counts, checked = self._policy_counts(c, now)
            for ph, count in counts.items():
                phase.add_metric([name, ph], float(count))
            for result, count in checked.items():
                verification.add_metric([name, result], float(count))
            if counts[UNSUPPORTED]:
                version = c.server_version or "unknown"
                unsupported[version] = unsupported.get(version, 0) + 1
        yield from (lag, last, up, oos, phase, verification, info, cdur)

        insecure = GaugeMetricFamily("convergerd_cluster_insecure",
                                     "1 if the cluster is reached without TLS verification or "
                                     "over http:// (allowed by a setting)", labels=["cluster"])
        for name in sorted(self._insecure):
            insecure.add_metric([name], 1.0)
        yield insecure

        unsup = GaugeMetricFamily("convergerd_unsupported_clusters",
                                  "Clusters whose policies are Unsupported (no "
                                  "ValidatingAdmissionPolicy), by Kubernetes version",
                                  labels=["version"])
        for version, count in sorted(unsupported.items()):
            unsup.add_metric([version], float(count))
        yield unsup

    def _fleet_families(self) -> Iterator[Metric]:
        yield _counter("convergerd_applies", "Policy applies by result",
                       ["cluster", "result"], self._applies)
        yield _counter("convergerd_apply_failures", "Failed applies and cluster-level failures "
                       "by reason", ["cluster", "reason"], self._failures)
        yield _counter("convergerd_retries", "Retried requests to clusters by reason",
                       ["cluster", "reason"], self._retries)
        yield _counter("convergerd_cluster_requests", "Requests to clusters by verb and status "
                       "code (none: no HTTP answer)", ["cluster", "verb", "code"], self._requests)
        yield _counter("convergerd_rounds", "Converge rounds by result", ["result"],
                       {(k,): v for k, v in self._rounds.items()})
        yield _counter("convergerd_leader_transitions", "Leadership changes seen by this replica",
                       [], {(): self._transitions})
        yield _counter("convergerd_record_failures", "Records the database refused for good "
                       "(dropped), by reason", ["reason"], self._record_failures)
        yield _counter("convergerd_status_reads_shed", "Status view requests answered 429 "
                       "(over CONVERGERD_STATUS_READS_PER_SECOND), by path", ["path"],
                       self._status_shed)

        apply_latency = HistogramMetricFamily(
            "convergerd_apply_duration_seconds", "Latency of apply requests per cluster",
            labels=["cluster"])
        for name, hist in sorted(self._apply_latency.items()):
            apply_latency.add_metric([name], hist.buckets(), hist.sum)
        yield apply_latency
        rounds = HistogramMetricFamily("convergerd_round_duration_seconds",
                                       "Duration of converge rounds")
        rounds.add_metric([], self._round_duration.buckets(), self._round_duration.sum)
        yield rounds

        yield GaugeMetricFamily("convergerd_is_leader", "1 if this replica holds the Lease",
                                value=self._is_leader)
        yield GaugeMetricFamily("convergerd_invalid_policies",
                                "Policies that cannot be delivered (bad id, type or params)",
                                value=float(self._invalid))
        yield from self._pending_families()
        yield GaugeMetricFamily("convergerd_event_loop_lag_seconds",
                                "How late the event loop ran the last heartbeat",
                                value=self._loop_lag_s)
        yield GaugeMetricFamily("convergerd_round_interval_seconds",
                                "Configured time between converge rounds", value=self.interval_s)
        if self._last_round_end is not None:
            yield GaugeMetricFamily("convergerd_last_round_timestamp_seconds",
                                    "When the last converge round ended (Unix time)",
                                    value=self._last_round_end)
        build = GaugeMetricFamily("convergerd_build_info", "convergerd version",
                                  labels=["version"])
        build.add_metric([self.version], 1.0)
        yield build


def pending_deletion_values(
    pending: tuple[int, dt.datetime | None], now: float
) -> tuple[float, float]:
    """(pending deletions, seconds the oldest has been pending; 0 when none)."""
    count, oldest = pending
    age = max(0.0, now - oldest.timestamp()) if oldest is not None else 0.0
    return float(count), age


def _phase_of(reading: PhaseReading) -> tuple[str, float, str, float | None]:
    """Decided once when read, so a scrape over a large fleet is float arithmetic: the result
    as if probed now, and the probe time when that result ages into `stale` (not for
    `admitted`, nor for a condition whose time was not trusted when it was read)."""
    at = reading.seen_at
    fresh = verification_of(reading, 0.0, 1.0, now=at, probe_period_s=math.inf)
    found = reading.verified
    ages = (found is not None and found.probed_at is not None and fresh != ADMITTED
            and probe_time_problem(found, at) is None)
    probed = found.probed_at.timestamp() if ages and found and found.probed_at else None
    return normalize_phase(reading.phase), at.timestamp(), verification_result(fresh), probed


def _counter(
    name: str, doc: str, labels: list[str], values: dict[Labels, float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect()


FANOUT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)


class FanoutMetrics:
    """Saves and deletions (`convergerd.delivery.fanout`) and the NOTIFY listener; register with
    `metrics.registry.register(...)`. No per-policy label:

    - `convergerd_saves_total{trigger,result}` (trigger `api` or `notify`; result `ok`,
      `partial`, `not_found`, `invalid`, `deleting`), `convergerd_deletes_total{result}`
      (`ok`, `refused`, `not_found`);
    - `convergerd_fanout_duration_seconds{operation}` (histogram, `save` or `delete`);
    - `convergerd_notify_listener_connected` (gauge 1/0) and
      `convergerd_notify_listener_reconnects_total`;
    - `convergerd_notifications_total{handling}`: notifications received, by what this replica
      did with them (`queued` for a save, `standby`: left to the leader, `duplicate`: already
      queued, `invalid`: not a policy id, `overflow`: too many queued).
    """

    def __init__(self) -> None:
        self._saves: dict[Labels, float] = {
            (t, r): 0.0 for t in ("api", "notify") for r in ("ok", "partial")}
        self._deletes: dict[Labels, float] = {(r,): 0.0 for r in ("ok", "refused")}
        self._duration = {op: _Histogram(FANOUT_BUCKETS) for op in ("save", "delete")}
        self._connected = 0.0
        self._reconnects = 0.0
        self._notifications: dict[Labels, float] = {
            (h,): 0.0 for h in ("queued", "standby", "duplicate", "invalid", "overflow")}

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
                       ["trigger", "result"], self._saves)
        yield _counter("convergerd_deletes", "Policy deletions by result", ["result"],
                       self._deletes)
        duration = HistogramMetricFamily(
            "convergerd_fanout_duration_seconds", "Duration of save and delete fan-outs",
            labels=["operation"])
        for op, hist in sorted(self._duration.items()):
            duration.add_metric([op], hist.buckets(), hist.sum)
        yield duration
        yield GaugeMetricFamily("convergerd_notify_listener_connected",
                                "1 while the database notification listener is connected",
                                value=self._connected)
        yield _counter("convergerd_notify_listener_reconnects",
                       "Times the notification listener lost its connection and reconnected",
                       [], {(): self._reconnects})
        yield _counter("convergerd_notifications",
                       "Database notifications received, by what this replica did with them",
                       ["handling"], self._notifications)


__all__ = ["CONTENT_TYPE", "FanoutMetrics", "Metrics"]
