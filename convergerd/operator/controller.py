"""The operator's engine: keeps every Policy's admission objects and status in line.

Every replica watches the Policies (an `Informer`), so a standby that takes over starts from a
warm cache; only the Lease holder reconciles and writes, each write checked against its term's
fence. One worker reconciles one Policy at a time from a queue of due times:

- a watch event (changed or deleted Policy) makes it due now; a failure, after a backoff;
- a change of its admission objects by someone else (`guard`, the watch on them) makes it due
  before everything else (`URGENT`);
- when it is Enforcing, its next enforcement probe (first `probe_delay_s` after it became
  Enforcing, then every `probe_interval_s`, counted from the probe time recorded on it, so a
  restart does not probe again at once);
- every `probe_interval_s` every Policy is reconciled again (drift the watch missed, while it
  was down, is found this way), and admission objects whose Policy is gone are deleted (owner
  references let a real cluster's garbage collector do it too).

Drift is probed before it is repaired. When a Policy already reported Enforcing at its current
generation would need a write (its binding deleted or edited by hand), the probe runs first,
against what is enforced now: a violating pod admitted is `Verified` False `Admitted` (a
WARNING and `convergerd_operator_probe_admitted`), written with the status. Then the objects
are put back (counted: `convergerd_operator_repairs_total{kind}`), and a follow-up probe runs at
once (again every `REPAIR_REPROBE_S` while ADMITTED, `REPAIR_REPROBES` times) and sets
`Verified` True again. So a binding removed by hand is always visible in the Policy's status
(and to the daemon, which reads it back), never silently mended.

Quiet when nothing changes: a probe that confirms the verdict written keeps the condition as
written (`reconcile.settled_verified`), so nothing is sent; the probe time, and an unchanged
audit's `auditedAt`, are rewritten only at the heartbeat (`status.phases.heartbeat_after_s`,
which the daemon ages them by). INFO lines only for transitions; heartbeats at DEBUG. The
watch may still hold the version our last status write replaced: the reconcile then reads the
object that write answered with (`_current`), so a probe confirming what was just written is
never compared with the version before it.

The probe is a dry-run create of `admission.violating_pod` in a namespace of the Policy's
boundary, built against the other enabled Policies of that boundary in the watch cache, so that
only this Policy can deny it (another policy denying first proves nothing, and left this one
`ProbeFailed`). When no pod violates this Policy alone (`ProbeUnsatisfiable`: the others
require what it forbids), nothing is sent: `Verified` is Unknown `ProbeInconclusive`, naming
the conflicting policies; a change to the spec of a Policy of that boundary makes it due for a
probe again `probe_delay_s` later.

Every log line names the cluster (in the message and `extra={"cluster": ...}`): one process
may run many operators (the demo runs one per simulated cluster).

The audit (`convergerd.operator.audit`): every Policy, enabled or not, is judged against the
workload cache (`convergerd.operator.cache`, run on every replica so a standby takes over warm)
and the result written to its `status.audit` by the leader, under its own field manager
(`AUDIT_FIELD_MANAGER`, so the reconciler's status writes and the audit's never remove each
other's fields). A Policy is audited again when its spec changes, when a cached object of its
boundary changes, when the cache's namespaces or sync state change, and every
`probe_interval_s`; at most once per `AUDIT_MIN_INTERVAL_S` (changes in between are coalesced
into one audit). A cache that is not synced gets `CACHE_GRACE_S` to catch up before an audit
writes `cacheSynced: false` (so a restart or a quick re-list writes nothing). Nothing is
written when the figures did not change, except to refresh `auditedAt` at the heartbeat. A
change of only `status.audit` does not reconcile the Policy again.

Admission counts (`convergerd.operator.admissioncounts`): the leader reads the API server's
`/metrics` every `admission_read_s` (and soon after a Policy's revision is installed), and
writes each Enforcing Policy's `status.admission` under its own field manager
(`ADMISSION_FIELD_MANAGER`) only when what the figures are of changed or a count entered
another reporting step (1, 2, 4, 8, ...: `admissioncounts.reporting_step`), else at the
heartbeat with the figures as they are then. A new leader continues the figures its
predecessor wrote for the same revision, and writes nothing for that alone (the note saying
counting paused goes out with its next figures). Its own probes are taken out of the figures,
under the actions their verdict shows (`reconcile.probe_counted`: a Warn probe is a warning
and an audit); a read answered while a probe ran is not used (`_Probes`), since the probe is
counted before its verdict is known. A read that fails (403: the RBAC rule for `/metrics` is
missing), or is not an API server's answer (`parse_metrics`), is logged, throttled, and
writes nothing.

Discovery (does the cluster serve ValidatingAdmissionPolicy?) is asked at start and every
`recheck_s`; a change reconciles every Policy, so Unsupported turns Enforcing by itself after
an upgrade. What to write is decided in `convergerd.operator.reconcile`; this module does the
I/O, and writes nothing when nothing changed (a restart re-lists and writes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import heapq
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from convergerd.admission.exceptions import honoured, next_change
from convergerd.admission.render import (
    ProbeUnsatisfiable,
    RenderError,
    admission_name,
    enforcement_of,
    enforcement_of_spec,
    violating_pod,
)
from convergerd.admission.verdict import Judge
from convergerd.config import DEFAULT_OPERATOR_CACHE_MAX_BYTES as DEFAULT_CACHE_MAX_BYTES
from convergerd.core.errors import (
    BadResponse,
    ClusterApiError,
    ClusterError,
    ClusterLevelError,
    Fenced,
)
from convergerd.core.exceptions import covers
from convergerd.core.model import (
    Enforcement,
    PolicyException,
    is_namespace_name,
    is_object_name,
)
from convergerd.core.shown import shown
from convergerd.kube.api import Admitted, KubeObject, ObjectList, Resource, WatchApi
from convergerd.kube.watch import Informer
from convergerd.leader.elector import Leadership
from convergerd.leader.lease import Fence
from convergerd.logthrottle import LogThrottle
from convergerd.operator.admissioncounts import (
    METRIC_NAMES,
    AdmissionCounts,
    MetricsError,
    admission_differs,
    parse_metrics,
)
from convergerd.operator.audit import audit, audit_differs, audit_status
from convergerd.operator.cache import WorkloadCache
from convergerd.operator.guard import BINDINGS, VAPS, AdmissionGuard
from convergerd.operator.metrics import OperatorMetrics
from convergerd.operator.reconcile import (
    ADMITTED,
    BOUNDARY_LABEL,
    ENFORCING,
    ERROR,
    FIELD_MANAGER,
    MANAGED_SELECTOR,
    PROBE_INCONCLUSIVE,
    UNKNOWN,
    UNSUPPORTED,
    VERIFIED,
    Condition,
    PolicyObject,
    carried_verified,
    condition_key,
    drifted,
    is_transition,
    new_status,
    next_probe_in,
    orphans,
    probe_counted,
    probe_inconclusive,
    probe_outcome,
    ready_condition,
    repaired,
    settled_verified,
    status_differs,
    verified_pending,
    writes_for,
)
from convergerd.retry import backoff_s, call_with_retries
from convergerd.status.phases import heartbeat_after_s

log = logging.getLogger(__name__)

POLICIES = Resource("platform.stackship.se", "v1alpha1", "policies")
NAMESPACES = Resource("", "v1", "namespaces")
PODS = Resource("", "v1", "pods", namespaced=True)

# A failed reconcile is retried after a backoff from here up to the cap.
RETRY_BASE_S = 2.0
RETRY_CAP_S = 300.0
# Discovery that could not be asked is asked again this soon.
DISCOVERY_RETRY_S = 30.0
# A Policy is audited at most this often (changes in between are coalesced).
AUDIT_MIN_INTERVAL_S = 1.0
AUDIT_FIELD_MANAGER = "stackship-operator-audit"
# An unsynced cache (starting, re-listing after a 410, a watch failing) is given this long to
# catch up before an audit says `cacheSynced: false`: a restart or a quick re-list then writes
# nothing, and a cache that stays behind is still said to be.
CACHE_GRACE_S = 10.0
# Boundary namespaces listed for the probe when the Policy has exceptions (it needs one that
# does not except the probe pod); without exceptions the first one does.
PROBE_NAMESPACES_LISTED = 100
ADMISSION_FIELD_MANAGER = "stackship-operator-admission"
# /metrics is read at most this often, however many revisions are installed at once.
ADMISSION_MIN_INTERVAL_S = 1.0
# A read of /metrics overlapped by a probe is read again, at most this many times in all.
ADMISSION_READ_TRIES = 3
# Due before everything already due: a Policy whose admission objects someone changed.
URGENT = -math.inf
# After a repair the follow-up probe runs at once; kube-apiserver's admission enforces a
# changed policy or binding only once its own watch of them has caught up (not at once, unlike
# the simulator), so an ADMITTED answer right after a repair is asked again this soon, this many
# times (3 s in all), before it counts for a probe period.
REPAIR_REPROBE_S = 0.5
REPAIR_REPROBES = 6


class OperatorApi(WatchApi, Protocol):
    """What the operator needs from its cluster (`kube.objects.ObjectClient`)."""

    async def get(self, resource: Resource, name: str, *, timeout_s: float,
                  namespace: str | None = None) -> KubeObject | None: ...
    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float, namespace: str | None = None,
                           limit: int | None = None,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False,
                           ) -> ObjectList: ...
    async def apply(self, resource: Resource, body: KubeObject, *, field_manager: str,
                    timeout_s: float, subresource: str | None = None) -> KubeObject: ...
    async def delete(self, resource: Resource, name: str, *, timeout_s: float) -> bool: ...
    async def dry_run_create(self, resource: Resource, body: KubeObject, *, timeout_s: float,
                             namespace: str | None = None) -> Admitted: ...
    async def served_resources(self, group: str, version: str, *,
                               timeout_s: float) -> frozenset[str] | None: ...
    async def metrics(self, *, names: tuple[str, ...], timeout_s: float) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Timing:
    request_timeout_s: float
    recheck_s: float
    probe_interval_s: float
    probe_delay_s: float
    admission_read_s: float = 30.0


@dataclass(frozen=True, slots=True)
class _Enforced:
    phase: str
    ready: Condition
    wrote: bool = False
    before: Condition | None = None  # the probe of drifted objects, before their repair
    # The mode of the binding in force (`status.enforcementAction`): the one written, or, when
    # the writes failed, the one read (the previous objects stay in force); None: no binding.
    enforcement: Enforcement | None = None


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _Probes:
    """The enforcement probes in flight. The API server counts a probe when it answers it,
    before the operator knows the verdict and so what to take out of the admission counts
    (`AdmissionCounts.expect_own`): a `/metrics` answer read while a probe ran is not used."""

    def __init__(self) -> None:
        self.running = 0
        self.finished = 0
        self.idle = asyncio.Event()
        self.idle.set()

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        self.running += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.running -= 1
            self.finished += 1
            if not self.running:
                self.idle.set()

    def none_since(self, finished: int) -> bool:
        """No probe ran since `finished` was read off `self.finished` (at idle)."""
        return self.running == 0 and self.finished == finished


class _Due:
    """Policy names by the loop time they are next due, earliest first (one entry per name)."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self.wake = asyncio.Event()

    def at(self, name: str, when: float) -> None:
        if self._at.get(name, math.inf) <= when:
            return
        self._at[name] = when
        heapq.heappush(self._heap, (when, name))
        self.wake.set()

    def pop_due(self, now: float) -> str | None:
        while self._heap:
            when, name = self._heap[0]
            if self._at.get(name) != when:
                heapq.heappop(self._heap)  # superseded by an earlier time
                continue
            if when > now:
                return None
            heapq.heappop(self._heap)
            del self._at[name]
            return name
        return None

    def next_at(self) -> float:
        return self._heap[0][0] if self._heap else math.inf


class Operator:
    def __init__(
        self,
        api: OperatorApi,
        *,
        leadership: Leadership,
        metrics: OperatorMetrics,
        timing: Timing,
        cluster: str,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], dt.datetime] = _utcnow,
        rng: random.Random | None = None,
        cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
    ) -> None:
        self._api = api
        self._leadership = leadership
        self._metrics = metrics
        self._t = timing
        self.cluster = cluster  # named in every log line: one process may run many operators
        self._clock = clock or asyncio.get_running_loop().time
        self._wall = wall
        self._rng = rng or random.Random()
        self.supported: bool | None = None
        self._recheck = asyncio.Event()
        self._discovered = asyncio.Event()  # discovery has answered once
        self._support_changed = asyncio.Event()  # set when `supported` changes
        self._due = _Due()
        self._probe_at: dict[str, float] = {}
        # From the watch: every Policy's spec (the probe's `others`; spec changes told apart
        # from status writes), and the boundary of those whose last probe was inconclusive.
        self._specs: dict[str, Mapping[str, Any]] = {}
        self._inconclusive: dict[str, str] = {}
        # The Verified conditions this replica put in each Policy's status in its current term
        # (the last two: the watch may deliver the one before the last write). Any other one
        # on a Policy (a previous leader's, or written by someone else, e.g. True with a
        # lastProbeTime of 9999-...) is not carried: the Policy is probed again at once.
        self._mine: dict[str, tuple[tuple[str, str, str | None], ...]] = {}
        # Follow-up probes left after a repair (see REPAIR_REPROBES).
        self._settling: dict[str, int] = {}
        # Per Policy, the version the watch held when we wrote its status and the object the
        # write answered: until the watch brings our write, the reconcile reads that answer
        # (a probe that confirms what we just wrote must compare against it, not the version
        # before).
        self._written: dict[str, tuple[str | None, KubeObject]] = {}
        # The admission objects' name (stackship-<id>) to their Policy's, and back.
        self._policy_of: dict[str, str] = {}
        self._admission_of: dict[str, str] = {}
        self._failures: dict[str, int] = {}
        # Lines the cluster's objects set off, one per event otherwise: a few a minute.
        self._throttle = LogThrottle(log)
        self._sweep_at = math.inf
        self._fence: Fence | None = None
        # The audit: due times (rate-limited per Policy), and each Policy as last seen apart
        # from what only the audit writes (a change of status.audit alone is not reconciled).
        self._audit_due = _Due()
        self._audited_at: dict[str, float] = {}
        self._views: dict[str, Any] = {}
        self._unsynced_since: float | None = None
        self._judges: dict[str, tuple[Mapping[str, Any], Judge]] = {}  # by Policy, with spec
        self._audit_failures: dict[str, int] = {}
        # Admission counts: the leader's figures (None when not leading), and what of each
        # Policy tells that a revision was installed (a change reads /metrics soon).
        self._admission: AdmissionCounts | None = None
        self._installed: dict[str, tuple[Any, ...]] = {}
        self._admission_wake = asyncio.Event()
        self._probes = _Probes()
        self.informer = Informer(api, POLICIES, request_timeout_s=timing.request_timeout_s,
                                 on_change=self._on_change,
                                 on_restart=metrics.watch_restarted)
        self.workloads = WorkloadCache(api, request_timeout_s=timing.request_timeout_s,
                                       cluster=cluster, max_bytes=cache_max_bytes,
                                       on_objects=self._objects_changed,
                                       on_state=self._cache_state,
                                       on_restart=metrics.workload_watch_restarted)
        metrics.workload_cache = self.workloads
        self.guard = AdmissionGuard(api, request_timeout_s=timing.request_timeout_s,
                                    on_tampered=self._tampered,
                                    on_restart=metrics.admission_watch_restarted)

    def _extra(self, **fields: str) -> dict[str, str]:
        return {"cluster": self.cluster, **fields}

    @property
    def ready(self) -> bool:
        """The Policies are listed and discovery has answered."""
        return self.informer.synced.is_set() and self.supported is not None

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.informer.run(), name="policy watch")
            tg.create_task(self.workloads.run(), name="workload cache")
            tg.create_task(self._boundaries_when_listed(), name="boundaries")
            tg.create_task(self._discovery(), name="discovery")
            tg.create_task(self._guard(), name="admission watch")
            tg.create_task(self._lead(), name="reconciler")

    # -- events ----------------------------------------------------------------------------

    def _on_change(self, name: str, obj: KubeObject | None) -> None:
        view = _reconcile_view(obj) if obj is not None else None
        if view is None or self._views.get(name) != view:
            self._due.at(name, self._clock())
        if view is None:
            self._views.pop(name, None)
        else:
            self._views[name] = view
        if obj is None:
            self._sweep_at = self._clock()
            self._due.wake.set()
            if name in self._specs and self.informer.synced.is_set():
                self._metrics.policy_deleted()
                log.info("cluster %s: Policy %s deleted: its admission objects go with it (if "
                         "it was not deleted through convergerd, the daemon's next round puts "
                         "it back)", self.cluster, name, extra=self._extra(policy=name))
        admission = self._admission_of.pop(name, None)
        if admission is not None and self._policy_of.get(admission) == name:
            del self._policy_of[admission]
        self._note_installed(name, obj)
        old = self._specs.pop(name, None)
        self._inconclusive.pop(name, None)
        new = None
        if obj is not None:
            policy = PolicyObject.from_object(obj)
            new = self._specs[name] = policy.spec
            if policy.policy_id is not None:
                admission = admission_name(policy.policy_id)
                self._admission_of[name] = admission
                self._policy_of[admission] = name
            verified = policy.condition(VERIFIED)
            if verified is not None and verified.get("reason") == PROBE_INCONCLUSIVE:
                self._inconclusive[name] = str(new.get("boundary", ""))
        if old != new:
            boundaries = {str(s.get("boundary", "")) for s in (old, new) if s is not None}
            self._reprobe_inconclusive(name, boundaries)
            self._audit_soon(name)
            if self.informer.synced.is_set():
                self._set_boundaries()

    def _note_installed(self, name: str, obj: KubeObject | None) -> None:
        """A Policy that tells of another installed revision wakes the admission counts'
        read (its figures start again from that revision)."""
        installed = _installed_key(obj) if obj is not None else None
        if installed != self._installed.get(name):
            self._admission_wake.set()
        if installed is None:
            self._installed.pop(name, None)
        else:
            self._installed[name] = installed

    def _tampered(self, kind: str, admission: str) -> None:
        """The guard saw our admission object `admission` deleted or changed by someone else:
        its Policy is reconciled before anything else due."""
        name = self._policy_of.get(admission)
        if name is None:
            return  # an orphan: the sweep's
        log.debug("cluster %s: %s %s changed outside the operator: reconciling Policy %s now",
                  self.cluster, kind, admission, name, extra=self._extra(policy=name))
        self._due.at(name, URGENT)

    async def _guard(self) -> None:
        """The watch on our admission objects, while the cluster serves them (a cluster
        without them would fail it every few seconds)."""
        while True:
            await self._discovered.wait()
            flipped = asyncio.create_task(self._support_flips())
            if not self.supported:
                await flipped
                continue
            watches = asyncio.create_task(self._watch_admission())
            done, _ = await asyncio.wait([watches, flipped],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in (watches, flipped):
                task.cancel()
            await asyncio.gather(watches, flipped, return_exceptions=True)
            if watches in done:
                watches.result()  # raises what ended it: the watches run forever
                raise RuntimeError("the admission watch ended")
            for informer in self.guard.informers.values():
                informer.invalidate()  # listed afresh if the API comes back

    async def _watch_admission(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for kind, informer in self.guard.informers.items():
                tg.create_task(informer.run(), name=f"watch {kind}")

    async def _support_flips(self) -> None:
        """Until discovery's answer changes."""
        before = self.supported
        while self.supported == before:
            self._support_changed.clear()
            await self._support_changed.wait()

    def _reprobe_inconclusive(self, changed: str, boundaries: set[str]) -> None:
        """A Policy of these boundaries changed its spec (or came or went): the others whose
        probe was inconclusive may have a violating pod now, so probe them again soon. Only
        on spec changes: on status writes two inconclusive Policies would re-probe each other
        forever."""
        when = self._clock() + self._t.probe_delay_s
        for name, boundary in self._inconclusive.items():
            if name != changed and boundary in boundaries:
                self._probe_at[name] = min(self._probe_at.get(name, math.inf), when)
                self._due.at(name, when)

    def _all_due(self) -> None:
        now = self._clock()
        for name in self.informer.objects:
            self._due.at(name, now)
        self._sweep_at = now
        self._due.wake.set()

    # -- the audit -------------------------------------------------------------------------

    def _set_boundaries(self) -> None:
        self.workloads.set_boundaries(str(spec.get("boundary", ""))
                                      for spec in self._specs.values())

    async def _boundaries_when_listed(self) -> None:
        await self.informer.synced.wait()
        self._set_boundaries()

    def _audit_soon(self, name: str) -> None:
        when = max(self._clock(), self._audited_at.get(name, -math.inf) + AUDIT_MIN_INTERVAL_S)
        self._audit_due.at(name, when)

    def _objects_changed(self, namespace: str) -> None:
        boundary = self.workloads.boundary_of(namespace)
        for name, spec in self._specs.items():
            if spec.get("boundary") == boundary:
                self._audit_soon(name)

    def _cache_state(self) -> None:
        if self.workloads.synced:
            self._unsynced_since = None
        elif self._unsynced_since is None:
            self._unsynced_since = self._clock()
        self._audit_all()

    def _audit_all(self) -> None:
        for name in self.informer.objects:
            self._audit_soon(name)

    async def _audits(self) -> None:
        """The leader's audit loop: due Policies one at a time."""
        await self.informer.synced.wait()
        self._audit_all()
        while True:
            now = self._clock()
            name = self._audit_due.pop_due(now)
            if name is not None:
                await self._audit_one(name)
                await asyncio.sleep(0)  # one audit at a time: let the watches in between
                continue
            self._audit_due.wake.clear()
            wait = self._audit_due.next_at() - self._clock()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(None if math.isinf(wait) else wait):
                        await self._audit_due.wake.wait()

    def _judge(self, name: str, policy: PolicyObject) -> Judge | None:
        """The Policy's rule, kept while its spec is the same (it remembers image verdicts);
        None when it cannot be judged."""
        if not is_object_name(name) or policy.invalid is not None:
            return None
        cached = self._judges.get(name)
        if cached is not None and cached[0] == policy.spec:
            return cached[1]
        try:
            judge = Judge.of(policy.spec)
        except RenderError:
            self._judges.pop(name, None)
            return None  # not enforceable in a cluster
        self._judges[name] = (policy.spec, judge)
        return judge

    async def _audit_one(self, name: str) -> None:
        obj = self.informer.objects.get(name)
        if obj is None:
            self._audited_at.pop(name, None)
            self._judges.pop(name, None)
            self._audit_failures.pop(name, None)
            self._metrics.audited(name, None)
            return
        self._audited_at[name] = self._clock()
        # Audited again every probe interval: `auditedAt` says the audit still runs.
        self._audit_due.at(name, self._clock() + self._t.probe_interval_s)
        policy = PolicyObject.from_object(obj)
        judge = self._judge(name, policy)
        if judge is None or policy.boundary is None:
            self._metrics.audited(name, None)
            return  # the Ready condition says why; nothing can be judged
        synced = self.workloads.synced
        if not synced:
            if self._unsynced_since is None:
                self._unsynced_since = self._clock()
            if self._clock() < self._unsynced_since + CACHE_GRACE_S:
                self._audit_due.at(name, self._unsynced_since + CACHE_GRACE_S)
                return
        namespaces = self.workloads.namespaces_of(policy.boundary)
        now = self._wall()
        excepted = self._honoured(name, policy.spec, audit=True)
        result = audit(judge, self.workloads.objects_in(namespaces), exceptions=excepted)
        incomplete = self.workloads.incomplete(namespaces, result.refused)
        new = audit_status(result, synced=synced, now=now, incomplete=incomplete)
        self._metrics.audited(name, result.violations)
        # Written when the figures change, and at the heartbeat (`auditedAt` then says the
        # audit still runs; status.phases ages an audit by the same rule).
        if not audit_differs(policy.status.get("audit"), new, now=now,
                             refresh_s=heartbeat_after_s(self._t.probe_interval_s)):
            return
        changed = audit_differs(policy.status.get("audit"), new, now=now, refresh_s=math.inf)
        body = {"apiVersion": POLICIES.api_version, "kind": "Policy",
                "metadata": {"name": name}, "status": {"audit": new}}
        try:
            await self._write(lambda t: self._api.apply(
                POLICIES, body, field_manager=AUDIT_FIELD_MANAGER, timeout_s=t,
                subresource="status"), "audit")
        except Fenced:
            raise
        except ClusterError as exc:
            failures = self._audit_failures[name] = self._audit_failures.get(name, 0) + 1
            wait = backoff_s(failures, base=RETRY_BASE_S, cap=RETRY_CAP_S, rng=self._rng)
            log.warning("cluster %s: Policy %s: writing its audit failed: %s; again in %.1f s",
                        self.cluster, name, exc, wait, extra=self._extra(policy=name))
            self._audit_due.at(name, self._clock() + wait)
            return
        self._audit_failures.pop(name, None)
        self._metrics.wrote("audit")
        log.log(logging.INFO if changed else logging.DEBUG,
                "cluster %s: Policy %s: audit: %d violation(s)%s%s", self.cluster, name,
                result.violations, "" if synced else " (cache not synced: may be behind)",
                "" if incomplete is None else
                f" (incomplete: {new['incomplete']['skipped']} object(s) not judged)",
                extra=self._extra(policy=name))

    # -- admission counts ------------------------------------------------------------------

    async def _admission_reads(self) -> None:
        """The leader's reads of /metrics: every `admission_read_s`, and soon after a
        revision is installed; figures start afresh each term (continued from the status)."""
        await self.informer.synced.wait()
        self._admission = AdmissionCounts()
        while True:
            self._admission_wake.clear()
            await self._read_admission(self._admission)
            spacing = min(ADMISSION_MIN_INTERVAL_S, self._t.admission_read_s)
            await asyncio.sleep(spacing)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._t.admission_read_s - spacing):
                    await self._admission_wake.wait()

    def _counted(self, counts: AdmissionCounts) -> dict[str, tuple[str, PolicyObject]]:
        """The Enforcing Policies whose admission objects are installed at their current
        generation, by admission policy name: (revision, Policy)."""
        now = self._wall()
        found: dict[str, tuple[str, PolicyObject]] = {}
        for obj in self.informer.objects.values():
            key = _installed_key(obj)
            if key is None:
                continue
            policy = PolicyObject.from_object(obj)
            if policy.policy_id is None or not is_object_name(policy.name):
                continue
            name, revision = admission_name(str(policy.policy_id)), str(key[0])
            found[name] = (revision, policy)
            counts.carry(name, revision, policy.status.get("admission"), now=now)
        return found

    async def _read_admission(self, counts: AdmissionCounts) -> None:
        if not self.supported:
            return
        counted = self._counted(counts)
        if not counted:
            return
        try:
            body = await self._metrics_between_probes()
            if body is None:
                return  # probes kept overlapping: the next read adds what this one would have
            scrape = parse_metrics(body, names=counted.keys())
        except (ClusterError, MetricsError) as exc:
            hint = (" (the operator's ClusterRole needs nonResourceURLs [\"/metrics\"], verbs "
                    "[\"get\"])" if isinstance(exc, ClusterApiError) and exc.status == 403
                    else "")
            self._throttle.log("admission_read", logging.WARNING,
                               "cluster %s: reading /metrics for the admission counts failed: "
                               "%s%s; status.admission is not updated", self.cluster,
                               exc, hint, extra=self._extra())
            return
        now = self._wall()
        counts.observe(scrape, now=now,
                       revisions={name: revision for name, (revision, _) in counted.items()})
        for name, (_, policy) in counted.items():
            report = counts.report(name, now=now)
            if report is None:
                continue
            new = report.as_status()
            if not admission_differs(policy.status.get("admission"), new, now=now,
                                     refresh_s=heartbeat_after_s(self._t.probe_interval_s)):
                continue
            status = {"apiVersion": POLICIES.api_version, "kind": "Policy",
                      "metadata": {"name": policy.name}, "status": {"admission": new}}
            try:
                await self._write(functools.partial(self._apply_admission, status),
                                  "admission")
            except Fenced:
                raise
            except ClusterError as exc:
                log.warning("cluster %s: Policy %s: writing its admission counts failed: %s",
                            self.cluster, policy.name, exc, extra=self._extra(policy=policy.name))
                continue
            self._metrics.wrote("admission")

    async def _metrics_between_probes(self) -> bytes | None:
        """The API server's `/metrics`, read while no probe ran (so every probe it counted has
        been told to the counts); None when probes overlapped each of `ADMISSION_READ_TRIES`.
        Skipping a read loses nothing: each read adds what was counted since the last used."""
        for _ in range(ADMISSION_READ_TRIES):
            await self._probes.idle.wait()
            finished = self._probes.finished
            body = await self._api.metrics(names=METRIC_NAMES,
                                           timeout_s=self._t.request_timeout_s)
            if self._probes.none_since(finished):
                return body
        log.debug("cluster %s: /metrics read while probes ran, %d times: read again later",
                  self.cluster, ADMISSION_READ_TRIES, extra=self._extra())
        return None

    async def _apply_admission(self, body: KubeObject, timeout_s: float) -> KubeObject:
        return await self._api.apply(POLICIES, body, field_manager=ADMISSION_FIELD_MANAGER,
                                     timeout_s=timeout_s, subresource="status")

    # -- discovery -------------------------------------------------------------------------

    async def _discovery(self) -> None:
        while True:
            wait = self._t.recheck_s
            try:
                served = await self._api.served_resources(
                    VAPS.group, VAPS.version, timeout_s=self._t.request_timeout_s)
            except ClusterError as exc:
                log.warning("cluster %s: discovery of %s failed: %s; asking again in %g s",
                            self.cluster, VAPS.group, exc, DISCOVERY_RETRY_S,
                            extra=self._extra())
                wait = min(wait, DISCOVERY_RETRY_S)
            else:
                supported = served is not None and {VAPS.plural, BINDINGS.plural} <= served
                if supported != self.supported:
                    log.info("cluster %s %s ValidatingAdmissionPolicy",
                             self.cluster, "serves" if supported else "does NOT serve",
                             extra=self._extra())
                    self.supported = supported
                    self._support_changed.set()
                    self._metrics.supported = supported
                    self._discovered.set()
                    self._all_due()
            self._recheck.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._recheck.wait()

    # -- leading ---------------------------------------------------------------------------

    async def _lead(self) -> None:
        while True:
            epoch = await self._leadership.wait_leading()
            self._fence = self._leadership.fence(epoch)
            worker = asyncio.create_task(self._work(), name="reconcile worker")
            auditor = asyncio.create_task(self._audits(), name="audit")
            counter = asyncio.create_task(self._admission_reads(), name="admission counts")
            lost = asyncio.create_task(self._leadership.wait_lost(epoch))
            try:
                await asyncio.wait({worker, auditor, counter, lost},
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (worker, auditor, counter, lost):
                    task.cancel()
                await asyncio.gather(worker, auditor, counter, lost, return_exceptions=True)
                self._admission = None
            for task in (worker, auditor, counter):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    if not isinstance(exc, Fenced):
                        raise exc  # type: ignore[misc]
            self._fence = None
            log.info("cluster %s: not leading: reconciling stops until this replica leads "
                     "again", self.cluster, extra=self._extra())

    async def _work(self) -> None:
        await self.informer.synced.wait()
        await self._discovered.wait()
        self._all_due()
        self._probe_at.clear()
        self._settling.clear()
        self._mine.clear()  # a new term vouches for no condition written before it
        next_sweep = self._clock() + self._t.probe_interval_s
        while True:
            now = self._clock()
            if now >= next_sweep:
                self._all_due()
                next_sweep = now + self._t.probe_interval_s
            if self._sweep_at <= now:
                self._sweep_at = math.inf
                await self._sweep()
            name = self._due.pop_due(now)
            if name is not None:
                await self._reconcile_one(name)
                continue
            self._due.wake.clear()
            wait = min(self._due.next_at(), next_sweep, self._sweep_at) - self._clock()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._due.wake.wait()

    def _remaining(self) -> float:
        fence = self._fence
        if fence is None:
            raise Fenced("this replica is not the leader")
        return fence.remaining_s()

    async def _write(self, fn: Callable[[float], Any], what: str) -> Any:
        """One write, within the leader's term, retried on transient errors."""
        budget = min(self._remaining(), 3 * self._t.request_timeout_s)
        timeout = min(self._t.request_timeout_s, budget)

        async def attempt() -> Any:
            return await fn(min(timeout, self._remaining()))

        return await call_with_retries(attempt, deadline=self._clock() + budget, cluster=what)

    # -- one Policy ------------------------------------------------------------------------

    def _current(self, name: str) -> KubeObject | None:
        """The Policy as the watch holds it, or as our last status write left it while the
        watch still holds the version that write replaced."""
        obj = self.informer.objects.get(name)
        written = self._written.pop(name, None)
        if obj is not None and written is not None and _version(obj) == written[0]:
            self._written[name] = written
            return written[1]
        return obj

    async def _reconcile_one(self, name: str) -> None:
        obj = self._current(name)
        if obj is None:
            self._probe_at.pop(name, None)
            self._settling.pop(name, None)
            self._failures.pop(name, None)
            self._mine.pop(name, None)
            self._metrics.set_phase(name, None)
            self._metrics.set_enforcement(name, None)
            return
        if not is_object_name(name):
            # Its status path would be built from it: a real apiserver never names an object
            # so, so nothing is sent for it (nor retried; the next event or sweep logs again).
            self._throttle.log("bad_name", logging.WARNING, "cluster %s: a Policy named %s is "
                               "not a Kubernetes object name: ignored", self.cluster,
                               shown(name), extra=self._extra())
            self._metrics.reconciled("error")
            return
        try:
            wrote = await self._reconcile(PolicyObject.from_object(obj))
        except Fenced:
            raise
        except ClusterError as exc:
            self._metrics.reconciled("error")
            self._retry_later(name, f"{exc.reason}: {exc}")
            return
        self._metrics.reconciled("written" if wrote else "unchanged")

    def _retry_later(self, name: str, why: str) -> None:
        failures = self._failures[name] = self._failures.get(name, 0) + 1
        wait = backoff_s(failures, base=RETRY_BASE_S, cap=RETRY_CAP_S, rng=self._rng)
        wait = max(wait, RETRY_BASE_S / 2)
        log.warning("cluster %s: Policy %s: %s; again in %.1f s", self.cluster, name, why, wait,
                    extra=self._extra(policy=name))
        self._due.at(name, self._clock() + wait)

    async def _reconcile(self, policy: PolicyObject) -> bool:
        """Bring one Policy's admission objects and status in line; True when it wrote."""
        boundary = policy.boundary or ""
        enforced = await self._enforce(policy, boundary)
        phase, ready, wrote = enforced.phase, enforced.ready, enforced.wrote
        if phase == ENFORCING and enforced.before is not None:
            verified = self._settled(enforced.before, policy)
            self._probe_soon(policy.name)
        elif phase == ENFORCING:
            verified = await self._verified(policy, boundary)
        else:
            self._probe_at.pop(policy.name, None)
            verified = verified_pending(phase, self._t.probe_delay_s)
        key = condition_key(verified)
        self._mine[policy.name] = (*self._mine.get(policy.name, ())[-1:], key)
        status = new_status(policy, phase, [ready, verified], self._wall(),
                            enforcement=enforced.enforcement)
        self._metrics.set_phase(policy.name, phase)
        self._metrics.set_enforcement(policy.name, enforced.enforcement)
        if phase != ERROR:
            self._failures.pop(policy.name, None)
        if not status_differs(policy.status, status):
            return wrote
        body = {"apiVersion": POLICIES.api_version, "kind": "Policy",
                "metadata": {"name": policy.name}, "status": status}
        answer = await self._write(lambda t: self._api.apply(
            POLICIES, body, field_manager=FIELD_MANAGER, timeout_s=t, subresource="status"),
            "status")
        seen = self.informer.objects.get(policy.name)
        if isinstance(answer, dict) and seen is not None:
            self._written[policy.name] = (_version(seen), answer)
        self._metrics.wrote("status")
        mode = f", {enforced.enforcement.value}" if enforced.enforcement is not None else ""
        # INFO for a change; the heartbeat (only a probe time moved) at DEBUG.
        log.log(logging.INFO if is_transition(policy.status, status) else logging.DEBUG,
                "cluster %s: Policy %s: %s (%s%s), Verified %s (%s)", self.cluster,
                policy.name, phase, ready.reason, mode, verified.status, verified.reason,
                extra=self._extra(policy=policy.name, phase=phase))
        return True

    def _settled(self, found: Condition, policy: PolicyObject) -> Condition:
        return settled_verified(found, policy, now=self._wall(),
                                heartbeat_s=heartbeat_after_s(self._t.probe_interval_s))

    async def _enforce(self, policy: PolicyObject, boundary: str) -> _Enforced:
        """The admission objects written; the phase, the Ready condition, whether it wrote, and
        what a probe found before a repair of drifted objects."""
        if policy.invalid is not None or policy.policy_id is None:
            # Before any request: the id builds the paths, the boundary the selector. Not
            # retried: only a new spec (a watch event) can change it.
            reason, detail = policy.invalid or ("InvalidPolicyId", "spec.policyId: missing")
            return _Enforced(ERROR, ready_condition(
                ERROR, name="", boundary=boundary, reason=reason,
                detail=f"{detail}: nothing is read or written for this Policy but its status "
                       "until it is saved again with a valid one"))
        if not self.supported:
            return _Enforced(UNSUPPORTED, ready_condition(UNSUPPORTED, name="",
                                                          boundary=boundary))
        name = admission_name(policy.policy_id)
        existing_binding = None
        try:
            timeout = self._t.request_timeout_s
            existing_policy = await self._api.get(VAPS, name, timeout_s=timeout)
            existing_binding = await self._api.get(BINDINGS, name, timeout_s=timeout)
            todo = writes_for(policy, existing_policy=existing_policy,
                              existing_binding=existing_binding, now=self._wall())
            self._honoured(policy.name, policy.spec)  # reconciled again when one lapses
        except RenderError as exc:
            return _Enforced(ERROR, ready_condition(ERROR, name=name, boundary=boundary,
                                                    detail=str(exc), reason=exc.reason),
                             enforcement=enforcement_of(existing_binding))
        except ClusterLevelError as exc:
            if exc.status == 404:
                self._recheck.set()  # the API went away (a downgrade?): ask discovery again
            raise
        before = None
        kinds = repaired(policy, todo, existing_policy=existing_policy,
                         existing_binding=existing_binding)
        if drifted(policy, todo):
            # What is enforced now, before the repair: a binding deleted by hand shows as
            # Verified False Admitted instead of being mended unseen.
            log.warning("cluster %s: Policy %s: its admission objects %s changed outside the "
                        "operator: probing what is enforced before re-applying them",
                        self.cluster, policy.name, name, extra=self._extra(policy=policy.name))
            before = await self.probe(policy, boundary)
        try:
            wrote = await self._apply(todo.apply_policy, todo.apply_binding,
                                      todo.delete_binding, todo.name)
        except ClusterApiError as exc:
            if exc.retryable or exc.status == 404:
                raise
            self._retry_later(policy.name, f"apply failed: {exc}")
            detail = (f"applying the admission objects {name} failed: {exc}; retried with "
                      "backoff (the previous admission policy, if any, stays in force)")
            return _Enforced(ERROR, ready_condition(ERROR, name=name, boundary=boundary,
                                                    detail=detail, reason="ApplyFailed"),
                             enforcement=enforcement_of(existing_binding))
        for kind in kinds:
            self._metrics.repaired(kind)
            log.warning("cluster %s: Policy %s: put back its %s %s, deleted or edited by "
                        "someone else (admission does not guard these objects)", self.cluster,
                        policy.name, "binding" if kind == "binding" else "admission policy",
                        name, extra=self._extra(policy=policy.name, repaired=kind))
        return _Enforced(todo.phase, ready_condition(todo.phase, name=name, boundary=boundary),
                         wrote, before, todo.enforcement)

    async def _apply(self, vap: KubeObject | None, binding: KubeObject | None,
                     delete_binding: bool, name: str) -> bool:
        if vap is not None:
            self.guard.wrote("policy", await self._write(
                lambda t: self._api.apply(VAPS, vap, field_manager=FIELD_MANAGER,
                                          timeout_s=t), name))
            self._metrics.wrote("policy")
        if binding is not None:
            self.guard.wrote("binding", await self._write(
                lambda t: self._api.apply(BINDINGS, binding, field_manager=FIELD_MANAGER,
                                          timeout_s=t), name))
            self._metrics.wrote("binding")
        if delete_binding:
            await self._write(lambda t: self._api.delete(BINDINGS, name, timeout_s=t), name)
            self.guard.deleted("binding", name)
            self._metrics.wrote("delete")
        return vap is not None or binding is not None or delete_binding

    # -- the enforcement probe -------------------------------------------------------------

    async def _verified(self, policy: PolicyObject, boundary: str) -> Condition:
        now = self._clock()
        carried = carried_verified(policy, ENFORCING, self._t.probe_delay_s)
        due = self._probe_at.get(policy.name)
        pending = carried.status == UNKNOWN and carried.reason != PROBE_INCONCLUSIVE
        if not pending and condition_key(carried) not in self._mine.get(policy.name, ()):
            # A probe result this replica did not write in this term: it cannot vouch for it
            # (a previous leader's, or forged), so it probes now instead of carrying it.
            log.info("cluster %s: Policy %s: its Verified condition (%s, probed %s) was not "
                     "written by this leader in this term: probing now", self.cluster,
                     policy.name, carried.reason, shown(carried.last_probe_time),
                     extra=self._extra(policy=policy.name))
            due = now
        elif due is None or (pending and due > now + self._t.probe_delay_s):
            due = now + next_probe_in(policy, now=self._wall(),
                                      interval_s=self._t.probe_interval_s,
                                      first_delay_s=self._t.probe_delay_s)
            self._probe_at[policy.name] = due
        if due > now:
            self._due.at(policy.name, due)
            return carried
        result = await self.probe(policy, boundary)
        wait = self._t.probe_interval_s
        settling = self._settling.pop(policy.name, 0)
        if result.reason == ADMITTED and settling > 0:
            # Just repaired: the API server may not enforce the objects put back yet.
            self._settling[policy.name] = settling - 1
            wait = REPAIR_REPROBE_S
        self._probe_at[policy.name] = self._clock() + wait
        self._due.at(policy.name, self._probe_at[policy.name])
        return self._settled(result, policy)

    def _probe_soon(self, name: str) -> None:
        """After a repair of drifted objects: the follow-up probe, at once (and again soon
        while it is ADMITTED, `REPAIR_REPROBES`)."""
        self._probe_at[name] = self._clock()
        self._settling[name] = REPAIR_REPROBES
        self._due.at(name, URGENT)

    async def probe(self, policy: PolicyObject, boundary: str) -> Condition:
        """A dry-run create of a pod violating `policy` in a namespace of its boundary: the
        Verified condition from the answer."""
        with self._probes.one():
            return await self._probe(policy, boundary)

    async def _probe(self, policy: PolicyObject, boundary: str) -> Condition:
        name = admission_name(policy.policy_id or "")
        planned = await self._probe_pod(policy, boundary, name)
        result = planned if isinstance(planned, Condition) else await self._dry_run(
            name, boundary, *planned)
        self._metrics.probed(policy.name, result.reason)
        if result.reason == ADMITTED:
            log.warning("ENFORCEMENT NOT WORKING: cluster %s: Policy %s: %s", self.cluster,
                        policy.name, result.message,
                        extra=self._extra(policy=policy.name, probe=result.reason))
        elif result.reason == PROBE_INCONCLUSIVE:
            known = policy.condition(VERIFIED) or {}
            log.log(logging.DEBUG if known.get("reason") == PROBE_INCONCLUSIVE else logging.INFO,
                    "cluster %s: Policy %s: enforcement probe: %s", self.cluster, policy.name,
                    result.message, extra=self._extra(policy=policy.name, probe=result.reason))
        elif result.status != "True":
            log.warning("cluster %s: Policy %s: enforcement probe: %s", self.cluster,
                        policy.name, result.message,
                        extra=self._extra(policy=policy.name, probe=result.reason))
        return result

    async def _probe_pod(self, policy: PolicyObject, boundary: str, name: str
                         ) -> Condition | tuple[dict[str, Any] | None, str | None, Enforcement]:
        """The probe's pod, violating `policy` in a namespace of its boundary that none of its
        exceptions covers, and the mode the Policy asks for (no pod when the boundary has no
        namespace); or the inconclusive Verified condition when no such pod can be made."""
        excepted = self._honoured(policy.name, policy.spec)
        namespaces = await self._api.list_objects(
            NAMESPACES, label_selector=f"{BOUNDARY_LABEL}={boundary}",
            timeout_s=self._t.request_timeout_s,
            limit=PROBE_NAMESPACES_LISTED if excepted else 1)
        names = _names(namespaces.items)
        if not names:
            return None, None, Enforcement.DENY
        try:
            pod = violating_pod(policy.spec, namespace=names[0], name=f"{name}-probe",
                                others=self._others(policy, boundary))
            enforcement = enforcement_of_spec(policy.spec)
        except ProbeUnsatisfiable as exc:
            return probe_inconclusive(name=name, namespace=names[0], why=str(exc),
                                      now=self._wall())
        namespace = _not_excepted(names, pod, excepted)
        if namespace is None:
            return probe_inconclusive(
                name=name, namespace=names[0], now=self._wall(),
                why=f"an exception admits the probe pod in every namespace of boundary "
                    f"{boundary} listed ({len(names)})")
        pod["metadata"]["namespace"] = namespace
        return pod, namespace, enforcement

    async def _dry_run(self, name: str, boundary: str, pod: dict[str, Any] | None,
                       namespace: str | None, enforcement: Enforcement) -> Condition:
        """The Verified condition from a dry-run create of `pod` in `namespace` (none: the
        boundary has no namespace to probe in)."""
        admitted, status, message, unread = False, None, "", False
        warnings: Sequence[str] = ()
        installed: Enforcement | None = None
        if pod is not None and namespace is not None:
            try:
                answer = await self._api.dry_run_create(
                    PODS, pod, namespace=namespace, timeout_s=self._t.request_timeout_s)
                admitted, warnings = True, answer.warnings
            except ClusterApiError as exc:
                status, message = exc.status, str(exc)
            except ClusterError as exc:
                message, unread = f"{exc.reason}: {exc}", isinstance(exc, BadResponse)
            if admitted and enforcement is Enforcement.AUDIT:
                # Admitted with no word is also what no binding at all does: read back that
                # ours is there with [Audit], over an admission policy still there.
                installed = await self._installed_mode(name)
        result = probe_outcome(name=name, boundary=boundary, namespace=namespace,
                               admitted=admitted, status=status, message=message,
                               now=self._wall(), enforcement=enforcement,
                               warnings=warnings, installed=installed)
        if self._admission is not None and pod is not None and namespace is not None:
            # The API server counted our probe (a denial, a warning, an audit): not a tenant's.
            self._admission.expect_own(name, probe_counted(
                result, enforcement, name=name, message=message, warnings=warnings,
                unread=unread),
                now=self._wall())
        return result

    def _honoured(self, name: str, spec: Mapping[str, Any], *,
                  audit: bool = False) -> tuple[PolicyException, ...]:
        """The Policy's exceptions honoured now; the Policy is due again (its reconcile, or
        with `audit` its audit) when the next one lapses, so expiry needs nothing from the
        hub. () for a spec whose exceptions cannot be read (its Ready condition says why)."""
        now = self._wall()
        try:
            found, lapse = honoured(spec, now), next_change(spec, now)
        except RenderError:
            return ()
        if lapse is not None:
            due = self._audit_due if audit else self._due
            due.at(name, self._clock() + max(0.0, (lapse - now).total_seconds()))
        return found

    async def _installed_mode(self, name: str) -> Enforcement | None:
        """The mode of binding `name` as the cluster holds it, when its admission policy is
        there too; None otherwise."""
        timeout = self._t.request_timeout_s
        binding = await self._api.get(BINDINGS, name, timeout_s=timeout)
        spec = binding.get("spec") if binding is not None else None
        if not isinstance(spec, Mapping) or spec.get("policyName") != name:
            return None
        if await self._api.get(VAPS, name, timeout_s=timeout) is None:
            return None
        return enforcement_of(binding)

    def _others(self, policy: PolicyObject, boundary: str) -> list[Mapping[str, Any]]:
        """The specs of the other enabled Policies of `boundary` in the cache: what the probe
        pod must satisfy so that only `policy` can deny it."""
        return [spec for name, spec in self._specs.items()
                if name != policy.name and spec.get("enabled") is not False
                and spec.get("boundary") == boundary]

    # -- objects left behind ---------------------------------------------------------------

    async def _sweep(self) -> None:
        """Delete our admission objects whose Policy is gone (a server without garbage
        collection keeps them). Only with a synced cache: an empty cache is not "no Policy"."""
        if not self.supported or not self.informer.synced.is_set():
            return
        policies = [PolicyObject.from_object(o) for o in self.informer.objects.values()]
        try:
            for resource in (BINDINGS, VAPS):
                listed = await self._api.list_objects(
                    resource, label_selector=MANAGED_SELECTOR,
                    timeout_s=self._t.request_timeout_s)
                for name in orphans(listed.items, policies):
                    if await self._write(functools.partial(self._delete, resource, name), name):
                        self.guard.deleted("binding" if resource == BINDINGS else "policy", name)
                        self._metrics.wrote("delete")
                        log.info("cluster %s: deleted %s %s: its Policy is gone",
                                 self.cluster, resource, name,
                                 extra=self._extra(object=name))
        except ClusterError as exc:
            log.warning("cluster %s: cleaning up admission objects of deleted Policies failed: "
                        "%s", self.cluster, exc, extra=self._extra())
            self._sweep_at = self._clock() + RETRY_BASE_S * 5


    async def _delete(self, resource: Resource, name: str, timeout_s: float) -> bool:
        return await self._api.delete(resource, name, timeout_s=timeout_s)


def _installed_key(obj: KubeObject) -> tuple[Any, ...] | None:
    """(revision, generation) of a Policy whose admission objects are installed (Enforcing at
    its current generation), else None: its admission counts start again when this changes."""
    meta, spec, status = (obj.get(k) for k in ("metadata", "spec", "status"))
    if not (isinstance(meta, Mapping) and isinstance(spec, Mapping)
            and isinstance(status, Mapping)):
        return None
    generation = meta.get("generation")
    if status.get("phase") != ENFORCING or status.get("observedGeneration") != generation:
        return None
    return spec.get("revision"), generation


def _reconcile_view(obj: KubeObject) -> Any:
    """What reconciling reads of a Policy: all but its resourceVersion, managedFields,
    status.audit and status.admission (the audit's and the counts' own writes)."""
    meta = obj.get("metadata")
    status = obj.get("status")
    view = dict(obj)
    if isinstance(meta, Mapping):
        view["metadata"] = {k: v for k, v in meta.items()
                            if k not in ("resourceVersion", "managedFields")}
    if isinstance(status, Mapping):
        view["status"] = {k: v for k, v in status.items() if k not in ("audit", "admission")}
    return view


def _version(obj: KubeObject) -> str | None:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return version if isinstance(version, str) else None


def _names(items: Any) -> list[str]:
    """The namespaces listed whose names can stand in the probe's request path, in order."""
    names = []
    for item in items:
        meta = item.get("metadata") if isinstance(item, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if is_namespace_name(name):
            names.append(str(name))
    return names


def _not_excepted(names: list[str], pod: Mapping[str, Any],
                  excepted: tuple[PolicyException, ...]) -> str | None:
    """The first of `names` where no exception admits the probe `pod` (an admitted probe
    would prove nothing), None when there is none."""
    meta = pod["metadata"]
    return next((ns for ns in names if not any(
        covers(e, ns, meta.get("name"), meta.get("labels")) for e in excepted)), None)
