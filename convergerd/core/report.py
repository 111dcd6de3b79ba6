"""What a round or a save found and did, as plain data: produced by the delivery engine,
consumed by the store (deliveries), the metrics, the status API and the save API. Pure.

A round reports per cluster (`ClusterOutcome`) and per policy there (`Delivery`); a save or a
deletion, of one policy, reports per cluster (`ClusterResult`). An apply is a `Delivery` in
both: a save's apply result is made from it, and recorded as one."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum

from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId


def utc_now() -> dt.datetime:
    """The wall clock every record is stamped with (UTC); the default wherever a wall clock is
    injected (rounds, status, the elector, the prober)."""
    return dt.datetime.now(dt.UTC)


class ApplyResult(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    FAILED = "failed"


class RoundResult(StrEnum):
    OK = "ok"  # every cluster converged
    PARTIAL = "partial"  # some clusters or policies failed
    FAILED = "failed"  # no cluster converged (or the round could not run)


@dataclass(frozen=True, slots=True)
class Epoch:
    """Who led when a round ran: the Lease holder and its transition count."""

    holder: str
    transitions: int

    def __str__(self) -> str:
        return f"{self.holder}#{self.transitions}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One policy on one cluster in one round (or one save)."""

    cluster: ClusterId
    policy: PolicyId
    revision: int
    result: ApplyResult
    at: dt.datetime
    error: str | None = None
    reason: str | None = None
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class Verification:
    """The `Verified` condition the operator's enforcement probe writes, as read back."""

    status: str  # True, False or Unknown
    reason: str | None = None  # Denied, Admitted, NoBoundaryNamespace, ProbeFailed, Pending, ...
    message: str | None = None
    probed_at: dt.datetime | None = None  # lastProbeTime
    since: dt.datetime | None = None  # lastTransitionTime


@dataclass(frozen=True, slots=True)
class AuditSample:
    """One existing object the operator's audit found the policy would deny."""

    kind: str
    namespace: str | None
    name: str
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Audit:
    """`status.audit` as read back: how many existing objects in the boundary's namespaces the
    policy would deny, as the operator counted them from its watch-fed cache.

    `violations` None: the audit could not be read (`problem` says why) and is shown as
    unknown. `sample` (at most five) travels from the listing to the status state, which keeps
    samples per policy, not per policy and cluster (`StatusState.observe_round`)."""

    violations: int | None
    audited_at: dt.datetime | None = None
    synced: bool = False  # cacheSynced: the operator's cache had listed everything
    problem: str | None = None
    sample: tuple[AuditSample, ...] = ()


@dataclass(frozen=True, slots=True)
class PhaseReading:
    """A Policy's status as read back from a cluster, and when (wall clock, UTC)."""

    cluster: ClusterId
    policy: PolicyId
    phase: str | None
    ready_reason: str | None
    ready_message: str | None
    revision: int | None
    seen_at: dt.datetime
    verified: Verification | None = None  # None: the Policy has no Verified condition
    audit: Audit | None = None  # None: the Policy has no status.audit


@dataclass(slots=True)
class ClusterOutcome:
    """One cluster in one round.

    A cluster-level failure (unreached, 401/403, CRD missing, no kubeconfig context) sets
    `error`/`reason` once and stops that cluster's work: `deliveries` then holds only what was
    done before the failure, not one failed entry per policy. Object-level failures (400/409/422)
    are failed `deliveries` with their own error, and `error` stays None.
    """

    cluster: ClusterId
    reached: bool = False
    desired: int = 0
    in_sync: int = 0
    failed: int = 0
    error: str | None = None  # readable cluster-level reason, e.g. "401 Unauthorized"
    reason: str | None = None  # its metrics slug
    server_version: str | None = None
    duration_s: float = 0.0
    deliveries: list[Delivery] = field(default_factory=list)
    phases: list[PhaseReading] = field(default_factory=list)
    # Writes skipped or undone because a newer save or a deletion won the race (counted in
    # `in_sync`, never as failed): the newer writer records its own delivery.
    superseded: int = 0

    @property
    def converged(self) -> bool:
        return self.reached and self.error is None and self.in_sync == self.desired

    @property
    def listed(self) -> bool:
        """Whether the round listed the cluster's Policies: one list returns every managed
        Policy, so a reached cluster without a cluster-level error returns the full set
        (possibly empty); readings mean the list answered before a later error."""
        return bool(self.phases) or (self.reached and self.error is None)


@dataclass(slots=True)
class RoundReport:
    started_at: dt.datetime
    finished_at: dt.datetime | None = None
    epoch: Epoch | None = None
    clusters: list[ClusterOutcome] = field(default_factory=list)
    invalid: list[InvalidPolicy] = field(default_factory=list)
    cancelled: bool = False
    error: str | None = None  # the round could not run at all (e.g. database down)
    # A cancelled round's clusters that had not finished: their completed deliveries and
    # readings are recorded (they happened); their state is not (the round did not finish it).
    cut_short: list[ClusterOutcome] = field(default_factory=list)
    counted: dict[str, int] | None = None  # a `summary()`'s counts, made before it was bare

    @property
    def result(self) -> RoundResult:
        if self.error is not None or self.cancelled:
            return RoundResult.FAILED
        if all(c.converged for c in self.clusters):
            return RoundResult.OK
        if any(c.converged for c in self.clusters):
            return RoundResult.PARTIAL
        return RoundResult.FAILED

    def summary(self) -> RoundReport:
        """What outlives the round (`RoundLoop.last_report`): its clusters' outcomes without
        their per-policy deliveries and readings (the status state keeps those compactly),
        and its counts. At 10,000 clusters x 100 policies the details are hundreds of MB,
        which the next round would otherwise hold twice while it is built."""
        counts = self.counts()

        def bare(c: ClusterOutcome) -> ClusterOutcome:
            return dataclasses.replace(c, deliveries=[], phases=[])

        return dataclasses.replace(
            self, clusters=[bare(c) for c in self.clusters],
            cut_short=[bare(c) for c in self.cut_short], counted=counts)

    def counts(self) -> dict[str, int]:
        if self.counted is not None:
            return dict(self.counted)
        applies = [d for c in self.clusters for d in c.deliveries]
        return {
            "clusters": len(self.clusters),
            "converged": sum(c.converged for c in self.clusters),
            "unreached": sum(not c.reached for c in self.clusters),
            "created": sum(d.result is ApplyResult.CREATED for d in applies),
            "updated": sum(d.result is ApplyResult.UPDATED for d in applies),
            "failed": sum(d.result is ApplyResult.FAILED for d in applies),
            "invalid": len(self.invalid),
        }


class FanoutResult(StrEnum):
    """What a save or a deletion did on one cluster: what a delivery records (`ApplyResult`),
    and what only a save or a deletion reports."""

    # In this order in the API's document and in a save's log line (`fanout.counts`).
    CREATED = ApplyResult.CREATED.value
    UPDATED = ApplyResult.UPDATED.value
    UNCHANGED = ApplyResult.UNCHANGED.value
    SUPERSEDED = "superseded"  # the cluster holds a newer revision than this save read
    REMOVED = "removed"  # gone from the cluster (404 included)
    SKIPPED = "skipped"  # a removal the mass-removal guard refused
    FAILED = ApplyResult.FAILED.value


@dataclass(frozen=True, slots=True)
class ClusterResult:
    """One cluster in one save or deletion (`ClusterResult` in the OpenAPI document)."""

    cluster: ClusterId
    action: str  # "apply" or "remove"
    result: FanoutResult
    reason: str | None = None
    error: str | None = None

    @classmethod
    def applied(cls, delivery: Delivery) -> ClusterResult:
        """An apply's result, from the delivery the engine made."""
        return cls(delivery.cluster, "apply", FanoutResult(delivery.result.value),
                   delivery.reason, delivery.error)

    def as_json(self) -> dict[str, str | None]:
        return {"cluster": self.cluster, "action": self.action, "result": self.result.value,
                "reason": self.reason, "error": self.error}


class FanoutStatus(StrEnum):
    OK = "ok"  # every cluster done
    PARTIAL = "partial"  # a save with failed clusters (still a success: recorded)
    REFUSED = "refused"  # a deletion some cluster did not confirm: the row is kept
    NOT_FOUND = "not_found"
    INVALID = "invalid"
    DELETING = "deleting"  # a save of a policy whose deletion has begun


@dataclass(slots=True)
class FanoutReport:
    """One save or deletion (`Report` in the OpenAPI document)."""

    operation: str  # "save" or "delete"
    policy: str
    status: FanoutStatus
    revision: int | None = None
    results: list[ClusterResult] = field(default_factory=list)
    skipped_reason: str | None = None
    error: str | None = None  # why INVALID / DELETING / NOT_FOUND

    @property
    def failed(self) -> list[ClusterResult]:
        return [r for r in self.results if r.result is FanoutResult.FAILED]
