"""The operator's Prometheus metrics, on its own registry (prefix `convergerd_operator_`).

No per-policy label: policies are counted per phase, and the policies a probe found ADMITTED
(enforcement not working) are one gauge, `convergerd_operator_probe_admitted`.

- `convergerd_operator_reconciles_total{result}`: `unchanged` (nothing written), `written`,
  `error`;
- `convergerd_operator_policies{phase}`: Policies per phase last reported;
- `convergerd_operator_policies_by_enforcement{enforcement}`: Policies per mode of their binding
  in force (`status.enforcementAction`: Deny, Warn, Audit), so a Warn policy is never counted
  as one that denies;
- `convergerd_operator_watch_restarts_total{reason}`: `closed` (the server ended the watch),
  `expired` (410: re-listed), or an error reason;
- `convergerd_operator_probes_total{result}`: Denied, Warned, AuditOnly (the probe proved the
  policy's mode), Admitted, WrongMode, NoBoundaryNamespace, ProbeFailed, ProbeInconclusive (no
  pod violates only this policy: not probed);
- `convergerd_operator_probe_admitted`: policies whose last probe was ADMITTED;
- `convergerd_operator_vap_supported`: 1 when the cluster serves ValidatingAdmissionPolicy
  (absent until known);
- `convergerd_operator_is_leader`: 1/0;
- `convergerd_operator_writes_total{kind}`: `policy`, `binding`, `delete`, `status`, `audit`
  (a Policy's `status.audit`), `admission` (its `status.admission`);
- `convergerd_operator_repairs_total{kind}`: admission objects (`policy`, `binding`) put back
  after someone deleted or edited them (`guard`, `reconcile.repaired`); the alert
  `ConvergerdOperatorRepairsRepeated` fires when someone keeps undoing them;
- `convergerd_operator_policy_deletions_total`: Policies seen deleted in this cluster (by the
  daemon's delete, or by hand: then nothing is enforced for that policy until the daemon's next
  round puts it back);
- `convergerd_operator_admission_watch_restarts_total{reason}`: as the Policy watch's, for the
  watch on our admission objects (`guard`);
- `convergerd_operator_workload_cache_objects`: objects in the workload cache;
- `convergerd_operator_workload_cache_synced`: 1 when every kind is listed and every watch
  current (the audit's `cacheSynced`);
- `convergerd_operator_workload_cache_bytes` and `..._budget_bytes`: what the cache holds as
  it accounts it (`workloads.cost`), and its budget (CONVERGERD_OPERATOR_CACHE_MAX_BYTES);
- `convergerd_operator_workload_cache_skipped{reason}`: objects the cache does not hold:
  `budget` (no room: kept as a stub, or past the margin not even that), `too_large` (larger
  than the response cap: stepped past by the lists, anywhere in the cluster);
- `convergerd_operator_workload_watch_restarts_total{reason}`: as the Policy watch's, for the
  workload cache's watches (namespaces and every workload kind), and `too_large` (an event
  larger than the response cap, stepped past);
- `convergerd_operator_audit_violations`: objects the Policies' rules would deny, summed over
  the Policies as last audited (enabled or not; absent until an audit ran);
- `convergerd_operator_http_connections_refused_total{reason}`: what the HTTP server's bounds
  did (as the daemon's `convergerd_http_connections_refused_total`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from convergerd import __version__
from convergerd.core.model import ENFORCEMENTS, Enforcement
from convergerd.operator.reconcile import (
    ADMITTED,
    AUDIT_ONLY,
    DENIED,
    ENFORCING,
    ERROR,
    INERT,
    NO_NAMESPACE,
    PROBE_FAILED,
    PROBE_INCONCLUSIVE,
    UNSUPPORTED,
    WARNED,
    WRONG_MODE,
)
from convergerd.status.metrics import HTTP_BOUNDS_REASONS

PHASES = (ENFORCING, INERT, UNSUPPORTED, ERROR)
RECONCILE_RESULTS = ("unchanged", "written", "error")
PROBE_RESULTS = (DENIED, WARNED, AUDIT_ONLY, ADMITTED, WRONG_MODE, NO_NAMESPACE, PROBE_FAILED,
                 PROBE_INCONCLUSIVE)
WRITE_KINDS = ("policy", "binding", "delete", "status", "audit", "admission")
REPAIR_KINDS = ("policy", "binding")


class CacheFacts(Protocol):
    """What the metrics read of the workload cache at scrape."""

    @property
    def synced(self) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def used_bytes(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def refused_objects(self) -> int: ...
    @property
    def lost(self) -> int: ...
    @property
    def too_large_objects(self) -> int: ...


class OperatorMetrics:
    def __init__(self) -> None:
        self.reconciles = dict.fromkeys(RECONCILE_RESULTS, 0.0)
        self.probes = dict.fromkeys(PROBE_RESULTS, 0.0)
        self.writes = dict.fromkeys(WRITE_KINDS, 0.0)
        self.watch_restarts: dict[str, float] = {"closed": 0.0, "expired": 0.0}
        self.repairs = dict.fromkeys(REPAIR_KINDS, 0.0)
        self.policy_deletions = 0.0
        self.admission_watch_restarts: dict[str, float] = {"closed": 0.0, "expired": 0.0}
        self.phases: dict[str, str] = {}  # policy name -> phase last reported
        self.modes: dict[str, Enforcement] = {}  # policy name -> mode of its binding in force
        self.admitted: set[str] = set()  # policy names whose last probe was admitted
        self.supported: bool | None = None
        self.is_leader = False
        self.workload_cache: CacheFacts | None = None
        self.workload_watch_restarts: dict[str, float] = {"closed": 0.0, "expired": 0.0}
        self.violations: dict[str, int] = {}  # policy name -> violations last audited
        self.http_refused = dict.fromkeys(HTTP_BOUNDS_REASONS, 0.0)
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_Collector(self))

    def reconciled(self, result: str) -> None:
        self.reconciles[result] = self.reconciles.get(result, 0.0) + 1

    def wrote(self, kind: str) -> None:
        self.writes[kind] = self.writes.get(kind, 0.0) + 1

    def watch_restarted(self, reason: str) -> None:
        self.watch_restarts[reason] = self.watch_restarts.get(reason, 0.0) + 1

    def repaired(self, kind: str) -> None:
        self.repairs[kind] = self.repairs.get(kind, 0.0) + 1

    def policy_deleted(self) -> None:
        self.policy_deletions += 1

    def admission_watch_restarted(self, reason: str) -> None:
        self.admission_watch_restarts[reason] = self.admission_watch_restarts.get(reason, 0.0) + 1

    def workload_watch_restarted(self, reason: str) -> None:
        self.workload_watch_restarts[reason] = self.workload_watch_restarts.get(reason, 0.0) + 1

    def http_connection_refused(self, reason: str) -> None:
        """What the HTTP server's bounds did (`convergerd.api.server.BoundsObserver`)."""
        self.http_refused[reason] = self.http_refused.get(reason, 0.0) + 1

    def audited(self, name: str, violations: int | None) -> None:
        if violations is None:
            self.violations.pop(name, None)
        else:
            self.violations[name] = violations

    def probed(self, name: str, result: str) -> None:
        self.probes[result] = self.probes.get(result, 0.0) + 1
        if result == ADMITTED:
            self.admitted.add(name)
        else:
            self.admitted.discard(name)

    def set_phase(self, name: str, phase: str | None) -> None:
        if phase is None:
            self.phases.pop(name, None)
            self.admitted.discard(name)
        else:
            self.phases[name] = phase
            if phase != ENFORCING:
                self.admitted.discard(name)

    def set_enforcement(self, name: str, mode: Enforcement | None) -> None:
        if mode is None:
            self.modes.pop(name, None)
        else:
            self.modes[name] = mode

    def set_leader(self, is_leader: bool, holder: str | None = None) -> None:
        self.is_leader = is_leader

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        p = "convergerd_operator_"
        yield _counter(p + "reconciles", "Policy reconciles by result", "result", self.reconciles)
        yield _counter(p + "writes", "Writes to the cluster by kind", "kind", self.writes)
        yield _counter(p + "watch_restarts", "Policy watch restarts by reason", "reason",
                       self.watch_restarts)
        yield _counter(p + "probes", "Enforcement probes by result", "result", self.probes)
        yield _counter(p + "repairs", "Admission objects put back after someone deleted or "
                       "edited them, by kind", "kind", self.repairs)
        deletions = CounterMetricFamily(p + "policy_deletions", "Policies seen deleted in "
                                        "this cluster")
        deletions.add_metric([], self.policy_deletions)
        yield deletions
        yield _counter(p + "admission_watch_restarts", "Restarts of the watch on our admission "
                       "objects, by reason", "reason", self.admission_watch_restarts)
        phases = GaugeMetricFamily(p + "policies", "Policies by the phase last reported",
                                   labels=["phase"])
        counts = dict.fromkeys(PHASES, 0)
        for phase in self.phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in sorted(counts.items()):
            phases.add_metric([phase], float(count))
        yield phases
        modes = GaugeMetricFamily(p + "policies_by_enforcement", "Policies by the mode of "
                                  "their binding in force (status.enforcementAction)",
                                  labels=["enforcement"])
        by_mode = dict.fromkeys(ENFORCEMENTS, 0)
        for mode in self.modes.values():
            by_mode[mode.value] += 1
        for mode_name, count in by_mode.items():
            modes.add_metric([mode_name], float(count))
        yield modes
        yield GaugeMetricFamily(p + "probe_admitted", "Policies whose last enforcement probe "
                                "was ADMITTED (not enforced)", value=float(len(self.admitted)))
        if self.supported is not None:
            yield GaugeMetricFamily(p + "vap_supported", "1 if the cluster serves "
                                    "ValidatingAdmissionPolicy", value=float(self.supported))
        yield GaugeMetricFamily(p + "is_leader", "1 if this replica holds the operator Lease",
                                value=float(self.is_leader))
        cache = self.workload_cache
        if cache is not None:
            yield GaugeMetricFamily(p + "workload_cache_objects", "Objects in the workload "
                                    "cache (the kinds the rules judge, in boundary namespaces)",
                                    value=float(len(cache)))
            yield GaugeMetricFamily(p + "workload_cache_synced", "1 if every workload kind is "
                                    "listed and every watch is current", value=float(cache.synced))
            yield GaugeMetricFamily(p + "workload_cache_bytes", "Bytes the workload cache "
                                    "holds, as it accounts them", value=float(cache.used_bytes))
            yield GaugeMetricFamily(p + "workload_cache_budget_bytes", "The workload cache's "
                                    "budget (CONVERGERD_OPERATOR_CACHE_MAX_BYTES)",
                                    value=float(cache.max_bytes))
            skipped = GaugeMetricFamily(p + "workload_cache_skipped", "Objects the workload "
                                        "cache does not hold, by reason (budget, too_large)",
                                        labels=["reason"])
            skipped.add_metric(["budget"], float(cache.refused_objects + cache.lost))
            skipped.add_metric(["too_large"], float(cache.too_large_objects))
            yield skipped
        yield _counter(p + "workload_watch_restarts", "Workload cache watch restarts by reason",
                       "reason", self.workload_watch_restarts)
        if self.violations:
            yield GaugeMetricFamily(p + "audit_violations", "Objects the Policies' rules would "
                                    "deny, as last audited", value=float(sum(
                                        self.violations.values())))
        yield _counter(p + "http_connections_refused", "What the HTTP server's bounds did to a "
                       "connection or request, by reason", "reason", self.http_refused)
        build = GaugeMetricFamily(p + "build_info", "convergerd version", labels=["version"])
        build.add_metric([__version__], 1.0)
        yield build


def _counter(name: str, doc: str, label: str, values: dict[str, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class _Collector:
    def __init__(self, metrics: OperatorMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect()
