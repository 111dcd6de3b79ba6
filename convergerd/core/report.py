"""What a round or a save found and did, as plain data: produced by the delivery engine,
consumed by the store (deliveries), the metrics, the status API and the save API. Pure.

A round reports per cluster (`ClusterOutcome`) and per policy there (`Delivery`); a save or a
deletion, of one policy, reports per cluster (`ClusterResult`). An apply is a `Delivery` in
both: a save's apply result is made from it, and recorded as one."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import operator
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, overload

from convergerd.core.errors import DEADLINE_REASON
from convergerd.core.facts import (
    DELIVERY_KIND,
    DK_CLUSTER,
    DK_RESULT,
    READING_KIND,
    READING_NAMES,
    READING_OWN,
    check_reading_fields,
    joined,
    reorder,
)
from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId
from convergerd.core.save import Operation, SaveAction

T = TypeVar("T")


def utc_now() -> dt.datetime:
    """The wall clock every record is stamped with (UTC); the default wherever a wall clock is
    injected (rounds, status, the elector, the prober)."""
    return dt.datetime.now(dt.UTC)


# A log line names at most this many clusters and counts the rest: one line per round or
# save, whatever the fleet's size (a round cut by its deadline at 10,000 clusters once named
# thousands).
MAX_NAMED_CLUSTERS = 10


def named_clusters(labels: Iterable[str], total: int) -> str:
    """The first `MAX_NAMED_CLUSTERS` of `labels` (one per cluster, `total` in all), the rest
    counted: `"c0001 (timeout), c0002 (forbidden) and 3 more"`."""
    named = ", ".join(itertools.islice(labels, MAX_NAMED_CLUSTERS))
    more = total - MAX_NAMED_CLUSTERS
    return f"{named} and {more} more" if more > 0 else named


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
    """A Policy's status as read back from a cluster, and when (wall clock, UTC). Its fields
    after `cluster` and `policy` are `core.facts.READING`'s, in its order and with its
    defaults (checked at import): every other shape of a reading is made from that table.
    Readers that want a Verified condition or an audit whole read `verified` and `audit`."""

    cluster: ClusterId
    policy: PolicyId
    phase: str | None
    ready_reason: str | None
    ready_message: str | None
    revision: int | None
    seen_at: dt.datetime
    verified_status: str | None = None  # None: the Policy has no Verified condition
    verified_reason: str | None = None
    verified_message: str | None = None
    verified_probed_at: dt.datetime | None = None
    verified_since: dt.datetime | None = None
    audit_violations: int | None = None
    audit_at: dt.datetime | None = None
    audit_synced: bool | None = None  # None: the Policy has no status.audit
    audit_problem: str | None = None
    audit_sample: tuple[AuditSample, ...] = ()
    enforcement_action: str | None = None  # None: no binding in force (or none said)
    admission_denied: int | None = None
    admission_warned: int | None = None
    admission_audited: int | None = None
    admission_last_hour_denied: int | None = None
    admission_last_hour_warned: int | None = None
    admission_last_hour_audited: int | None = None
    admission_since: dt.datetime | None = None
    admission_read_at: dt.datetime | None = None  # with `admission_problem` None: none read
    admission_revision: int | None = None
    admission_resets: int | None = None
    admission_note: str | None = None
    admission_problem: str | None = None
    audit_excepted: int | None = None

    @property
    def verified(self) -> Verification | None:
        """The Verified condition read (None: none)."""
        if self.verified_status is None:
            return None
        return Verification(self.verified_status, self.verified_reason, self.verified_message,
                            self.verified_probed_at, self.verified_since)

    @property
    def audit(self) -> Audit | None:
        """`status.audit` as read (None: none); one without a count says why."""
        if self.audit_synced is None:
            return None
        problem = self.audit_problem
        if self.audit_violations is None and problem is None:
            problem = "the recorded audit has no count"  # only a database row can lack both
        return Audit(self.audit_violations, self.audit_at, self.audit_synced, problem,
                     self.audit_sample)


check_reading_fields([(f.name, f.default) for f in dataclasses.fields(PhaseReading)[2:]],
                     dataclasses.MISSING)


# The reading's fields a Verified condition and an audit are read into (`PhaseReading.verified`
# and `audit` read them back whole).
VERIFIED_FIELDS = ("verified_status", "verified_reason", "verified_message",
                   "verified_probed_at", "verified_since")
AUDIT_FIELDS = ("audit_violations", "audit_at", "audit_synced", "audit_problem", "audit_sample")
_NO_VERIFIED = (None,) * len(VERIFIED_FIELDS)
_NO_AUDIT = (None, None, None, None, ())


def verified_values(found: Verification | None) -> tuple[Any, ...]:
    """A Verified condition as the values of `VERIFIED_FIELDS` (none: their defaults)."""
    if found is None:
        return _NO_VERIFIED
    return found.status, found.reason, found.message, found.probed_at, found.since


def audit_values(found: Audit | None) -> tuple[Any, ...]:
    """`status.audit` as the values of `AUDIT_FIELDS` (none: their defaults)."""
    if found is None:
        return _NO_AUDIT
    return found.violations, found.audited_at, found.synced, found.problem, found.sample


def verified_fields(found: Verification | None) -> dict[str, Any]:
    """A Verified condition as a reading's fields by name."""
    return dict(zip(VERIFIED_FIELDS, verified_values(found), strict=True))


def audit_fields(found: Audit | None) -> dict[str, Any]:
    """`status.audit` as a reading's fields by name."""
    return dict(zip(AUDIT_FIELDS, audit_values(found), strict=True))


# A delivery's values but its policy and revision, which most of a cluster's deliveries share
# (an in-sync round: one per cluster): `facts.DELIVERY_KIND`.
_DeliveryKind = tuple[ClusterId, ApplyResult, dt.datetime, str | None, str | None, int]
_delivery_kind = operator.attrgetter(*DELIVERY_KIND)  # a tuple, made in C
# A reading's cluster and the fields a cluster's readings share (`facts.READING_KIND`), and
# its own fields (`facts.READING_OWN`), each made in C; and back to `facts.READING`'s order.
_ReadingKind = tuple[Any, ...]
_reading_kind = operator.attrgetter(*READING_KIND)
_reading_own = operator.attrgetter(*READING_OWN)
_reading_values = reorder((*READING_KIND, *READING_OWN), READING_NAMES)
_kind_of_values = reorder(READING_NAMES, READING_KIND[1:])
_OWN_WIDTH = len(READING_OWN)
_own_of_values = reorder(READING_NAMES, READING_OWN)


class _Packed(Sequence[T]):
    """What `Deliveries` and `Readings` share: they compare, hash and print as the list of
    what they hold."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class Deliveries(_Packed[Delivery]):
    """A cluster's deliveries of one round, packed: per delivery its policy, its revision and
    one shared tuple of everything else (most often one per cluster), a fraction of a
    `Delivery`'s size (bench/RESULTS.md, "Figures once quoted in the code"). A round at
    10,000 clusters x 100 policies holds 1,000,000 of them while it is observed and recorded;
    each `Delivery` is made again as it is read."""

    __slots__ = ("_counted", "_kinds", "_policies", "_revisions", "_shared", "_tally")

    def __init__(self, found: Iterable[Delivery] = ()) -> None:
        self._policies: list[PolicyId] = []
        self._revisions: list[int] = []
        self._kinds: list[_DeliveryKind] = []
        self._shared: dict[_DeliveryKind, _DeliveryKind] = {}
        # `counted()` as last made (None: not since the last append): the metrics, the
        # status and the record each count a round's results.
        self._counted: tuple[tuple[Delivery, int], ...] | None = None
        self._tally: dict[ApplyResult, int] = {}
        for d in found:
            self.append(d)

    def append(self, d: Delivery) -> None:
        self._counted = None
        kind: _DeliveryKind = _delivery_kind(d)
        self._policies.append(PolicyId(sys.intern(d.policy)))  # one object per policy id
        self._revisions.append(d.revision)
        self._kinds.append(self._shared.setdefault(kind, kind))
        self._tally[d.result] = self._tally.get(d.result, 0) + 1

    def extend_alike(self, stand_in: Delivery,
                     others: Sequence[tuple[PolicyId, int]]) -> None:
        """Deliveries that agree with `stand_in` on all but their policy and revision (a
        cluster's unchanged ones in a round: 100 of 100 in sync), appended without making a
        `Delivery` for each: `others` are their (policy, revision)."""
        if not others:
            return
        self._counted = None
        kind: _DeliveryKind = _delivery_kind(stand_in)
        kind = self._shared.setdefault(kind, kind)
        self._policies.extend([PolicyId(sys.intern(policy)) for policy, _ in others])
        self._revisions.extend([revision for _, revision in others])
        self._kinds.extend([kind] * len(others))
        self._tally[stand_in.result] = self._tally.get(stand_in.result, 0) + len(others)

    def __len__(self) -> int:
        return len(self._policies)

    def results(self) -> Iterator[ApplyResult]:
        """Each delivery's result (no `Delivery` made)."""
        return (k[DK_RESULT] for k in self._kinds)

    def shared(self) -> Iterator[tuple[PolicyId, int, Delivery]]:
        """Each delivery as its policy, its revision and a `Delivery` standing for every one
        that agrees with it on all else (made once per such group, with the group's first
        policy and revision): a reader works once per group, not once per delivery."""
        made: dict[int, Delivery] = {}
        for policy, revision, k in zip(self._policies, self._revisions, self._kinds,
                                       strict=True):
            stand_in = made.get(id(k))
            if stand_in is None:
                stand_in = made[id(k)] = Delivery(k[DK_CLUSTER], policy, revision, *k[DK_RESULT:])
            yield policy, revision, stand_in

    def counted(self) -> tuple[tuple[Delivery, int], ...]:
        """Per group of deliveries that agree on all but their policy and revision, one of
        them and how many there are (counted by object, not by value: no Python per
        delivery)."""
        if self._counted is not None:
            return self._counted
        kinds = self._kinds
        counts = Counter(map(id, kinds))
        # Walking backwards, each group's last index written is its first delivery's.
        first = dict(zip(map(id, reversed(kinds)), range(len(kinds) - 1, -1, -1), strict=True))
        self._counted = tuple((self[first[k]], n) for k, n in counts.items())
        return self._counted
    def tally(self) -> Mapping[ApplyResult, int]:
        """How many deliveries had each result, counted as they were appended: a round's
        counts (`RoundReport.counts`, several times per round) were 1,000,000 steps at
        10,000 clusters x 100 policies, each holding the event loop (bench/RESULTS.md,
        "Figures once quoted in the code")."""
        return self._tally

    @overload
    def __getitem__(self, index: int) -> Delivery: ...
    @overload
    def __getitem__(self, index: slice) -> list[Delivery]: ...

    def __getitem__(self, index: int | slice) -> Delivery | list[Delivery]:
        if isinstance(index, slice):
            return list(self)[index]
        k = self._kinds[index]
        return Delivery(k[DK_CLUSTER], self._policies[index], self._revisions[index],
                        *k[DK_RESULT:])

    def __iter__(self) -> Iterator[Delivery]:
        for policy, revision, k in zip(self._policies, self._revisions, self._kinds,
                                       strict=True):
            yield Delivery(k[DK_CLUSTER], policy, revision, *k[DK_RESULT:])

    def columns(self) -> tuple[Sequence[PolicyId], Sequence[int], Sequence[_DeliveryKind]]:
        """What is held, read without making a `Delivery` (for the store's rows; not to be
        changed): per delivery its policy, its revision and its kind, (cluster, result, at,
        error, reason, attempts), one object per distinct kind."""
        return self._policies, self._revisions, self._kinds

    def kinds(self) -> Collection[_DeliveryKind]:
        """The distinct kinds of `columns`, in the order they first occur."""
        return self._shared.values()


class Readings(_Packed[PhaseReading]):
    """A cluster's phase readings of one round, packed: per reading its policy, its own
    fields (`facts.READING_OWN`: its revision, its Verified probe times) and one shared tuple
    of everything else (`facts.READING_KIND`: one per distinct phase, Ready, Verified verdict
    and audit, most often one per cluster), a fraction of a `PhaseReading` (bench/RESULTS.md,
    "Figures once quoted in the code"). Each reading is made again as it is read."""

    __slots__ = ("_kinds", "_own", "_policies", "_shared")

    def __init__(self, found: Iterable[PhaseReading] = ()) -> None:
        self._policies: list[PolicyId] = []
        self._own: list[Any] = []  # each reading's own fields, one after the other
        self._kinds: list[_ReadingKind] = []
        self._shared: dict[_ReadingKind, _ReadingKind] = {}
        for p in found:
            self.append(p)

    def append(self, p: PhaseReading) -> None:
        self._add(p.policy, _reading_kind(p), _reading_own(p))

    def add(self, cluster: ClusterId, policy: PolicyId, values: tuple[Any, ...]) -> None:
        """A reading of `policy` on `cluster` given as its fields' values in `facts.READING`'s
        order (`facts.reorder`), as `append` of the `PhaseReading` they make, without making
        one (the round's edge: a reading per policy and cluster)."""
        self._add(policy, (cluster, *_kind_of_values(values)), _own_of_values(values))

    def _add(self, policy: PolicyId, kind: _ReadingKind, own: tuple[Any, ...]) -> None:
        # One object per policy id, however the reading's was made (`converge._phases`
        # interns them already: then this finds it).
        self._policies.append(PolicyId(sys.intern(policy)))
        self._own.extend(joined(own))
        self._kinds.append(self._shared.setdefault(kind, kind))

    def _owns(self) -> Iterator[tuple[Any, ...]]:
        """Each reading's own fields, as a tuple (made in C)."""
        return zip(*[iter(self._own)] * _OWN_WIDTH, strict=True)

    def __len__(self) -> int:
        return len(self._policies)

    @staticmethod
    def _reading(policy: PolicyId, own: tuple[Any, ...], k: _ReadingKind) -> PhaseReading:
        return PhaseReading(k[0], policy, *_reading_values(k + own))

    @overload
    def __getitem__(self, index: int) -> PhaseReading: ...
    @overload
    def __getitem__(self, index: slice) -> list[PhaseReading]: ...

    def __getitem__(self, index: int | slice) -> PhaseReading | list[PhaseReading]:
        if isinstance(index, slice):
            return list(self)[index]
        i = range(len(self))[index]
        own = tuple(self._own[i * _OWN_WIDTH:(i + 1) * _OWN_WIDTH])
        return self._reading(self._policies[i], own, self._kinds[i])

    def shared(self) -> Iterator[tuple[PolicyId, tuple[Any, ...], PhaseReading]]:
        """Each reading as its policy, its own fields (`facts.READING_OWN`) and a reading
        standing for every one that agrees with it on all else (made once per such group,
        with the group's first reading's own values): a reader works once per group, not
        once per reading."""
        made: dict[int, PhaseReading] = {}
        for policy, own, k in zip(self._policies, self._owns(), self._kinds, strict=True):
            stand_in = made.get(id(k))
            if stand_in is None:
                stand_in = made[id(k)] = self._reading(policy, own, k)
            yield policy, own, stand_in

    def __iter__(self) -> Iterator[PhaseReading]:
        reading = self._reading
        for policy, own, k in zip(self._policies, self._owns(), self._kinds, strict=True):
            yield reading(policy, own, k)

    def columns(self) -> tuple[Sequence[PolicyId], tuple[Sequence[Any], ...],
                               Sequence[_ReadingKind]]:
        """What is held, read without making a `PhaseReading` (for the store's rows; not to
        be changed): per reading its policy, per own field (`facts.READING_OWN`) a column of
        its values, and per reading its kind (`facts.READING_KIND`), one object per distinct
        kind."""
        own = self._own
        return self._policies, tuple(own[k::_OWN_WIDTH] for k in range(_OWN_WIDTH)), self._kinds

    def kinds(self) -> Collection[_ReadingKind]:
        """The distinct kinds of `columns`, in the order they first occur."""
        return self._shared.values()


@dataclass(slots=True, init=False)
class ClusterOutcome:
    """One cluster in one round.

    A cluster-level failure (unreached, 401/403, CRD missing, no kubeconfig context) sets
    `error`/`reason` once and stops that cluster's work: `deliveries` then holds only what was
    done before the failure, not one failed entry per policy. Object-level failures (400/409/422)
    are failed `deliveries` with their own error, and `error` stays None.

    `deliveries` and `phases` are held packed (`Deliveries`, `Readings`): a round's report is
    alive, whole, while it is observed and recorded.
    """

    cluster: ClusterId
    reached: bool
    desired: int
    in_sync: int
    failed: int
    error: str | None  # readable cluster-level reason, e.g. "401 Unauthorized"
    reason: str | None  # its metrics slug
    server_version: str | None
    duration_s: float
    deliveries: Deliveries
    phases: Readings
    # Writes skipped or undone because a newer save or a deletion won the race (counted in
    # `in_sync`, never as failed): the newer writer records its own delivery.
    superseded: int

    def __init__(
        self,
        cluster: ClusterId,
        *,
        reached: bool = False,
        desired: int = 0,
        in_sync: int = 0,
        failed: int = 0,
        error: str | None = None,
        reason: str | None = None,
        server_version: str | None = None,
        duration_s: float = 0.0,
        deliveries: Iterable[Delivery] = (),
        phases: Iterable[PhaseReading] = (),
        superseded: int = 0,
    ) -> None:
        self.cluster = cluster
        self.reached = reached
        self.desired = desired
        self.in_sync = in_sync
        self.failed = failed
        self.error = error
        self.reason = reason
        self.server_version = server_version
        self.duration_s = duration_s
        self.deliveries = deliveries if isinstance(deliveries, Deliveries) else Deliveries(
            deliveries)
        self.phases = phases if isinstance(phases, Readings) else Readings(phases)
        self.superseded = superseded

    @property
    def converged(self) -> bool:
        return self.reached and self.error is None and self.in_sync == self.desired

    @property
    def cut_unanswered(self) -> bool:
        """The round's deadline came before the cluster answered (often before its turn
        came): nothing is known about whether it is reachable."""
        return not self.reached and self.reason == DEADLINE_REASON

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
            return dataclasses.replace(c, deliveries=Deliveries(), phases=Readings())

        return dataclasses.replace(
            self, clusters=[bare(c) for c in self.clusters],
            cut_short=[bare(c) for c in self.cut_short], counted=counts)

    def counts(self) -> dict[str, int]:
        if self.counted is not None:
            return dict(self.counted)
        results: Counter[ApplyResult] = Counter()
        for c in self.clusters:
            for result, n in c.deliveries.tally().items():
                results[result] += n
        return {
            "clusters": len(self.clusters),
            "converged": sum(c.converged for c in self.clusters),
            "unreached": sum(not c.reached for c in self.clusters),
            "created": results[ApplyResult.CREATED],
            "updated": results[ApplyResult.UPDATED],
            "failed": results[ApplyResult.FAILED],
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
    SKIPPED = "skipped"  # a removal the guard refused; a due revision that cannot be delivered
    PENDING = "pending"  # still being written when the save answered (hung): recorded when done
    FAILED = ApplyResult.FAILED.value


@dataclass(frozen=True, slots=True)
class ClusterResult:
    """One cluster in one save or deletion (`ClusterResult` in the OpenAPI document)."""

    cluster: ClusterId
    action: SaveAction
    result: FanoutResult
    reason: str | None = None
    error: str | None = None

    @classmethod
    def applied(cls, delivery: Delivery) -> ClusterResult:
        """An apply's result, from the delivery the engine made."""
        return cls(delivery.cluster, SaveAction.APPLY, FanoutResult(delivery.result.value),
                   delivery.reason, delivery.error)

    def as_json(self) -> dict[str, str | None]:
        return {"cluster": self.cluster, "action": self.action, "result": self.result.value,
                "reason": self.reason, "error": self.error}


class FanoutStatus(StrEnum):
    OK = "ok"  # every cluster done
    PARTIAL = "partial"  # a save with failed or pending clusters (still a success: recorded)
    REFUSED = "refused"  # a deletion some cluster did not confirm: the row is kept
    NOT_FOUND = "not_found"
    INVALID = "invalid"
    DELETING = "deleting"  # a save of a policy whose deletion has begun


@dataclass(slots=True)
class FanoutReport:
    """One save or deletion (`Report` in the OpenAPI document)."""

    operation: Operation
    policy: str
    status: FanoutStatus
    revision: int | None = None
    results: list[ClusterResult] = field(default_factory=list)
    skipped_reason: str | None = None
    error: str | None = None  # why INVALID / DELETING / NOT_FOUND
    # A save that follows a rollout: its id, state and wave, and how many clusters of the scope
    # keep another revision for now (None: the revision went to every cluster at once).
    rollout: dict[str, Any] | None = None

    @property
    def failed(self) -> list[ClusterResult]:
        return [r for r in self.results if r.result is FanoutResult.FAILED]
