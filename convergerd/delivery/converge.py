"""A converge round: every valid, delivered policy onto every cluster its boundary covers.

Apply-only: a round adds and updates, it never deletes. Per cluster it costs one paginated,
label-selected list, plus one server-side apply per missing or drifted object; a cluster in
sync costs exactly the list. Clusters run concurrently under a global bound; each runs under
the round's deadline, so one down or hung cluster costs at most its own timeout. Clusters last
seen unreachable run in a small lane of their own (`Round.suspects`), so even a tenth of the
fleet hung never holds the slots the healthy clusters wait for; one seen unreachable after the
round began goes behind the others when its turn comes (`Round.suspected`), and one that hung
unseen gives its slot back after a few typical answers' time: `convergerd.slots.Lanes`, the
scheduler a save's fan-out runs on too. Every
write goes through `apply.Writer`, as a save's: it first asks the fence how long this replica
may still write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import operator
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from convergerd.config import SlotTuning
from convergerd.core.errors import ClusterError, DatabaseUnavailable, Fenced
from convergerd.core.facts import READING_NAMES, reorder
from convergerd.core.model import ClusterId, Fleet, Policy, PolicyId, Position
from convergerd.core.plan import (
    Apply,
    Bodies,
    ListedPolicy,
    Why,
    plan_cluster,
    with_precondition,
)
from convergerd.core.removal import Current
from convergerd.core.render import MANAGED_SELECTOR, object_name, policy_id_from_name, render_policy
from convergerd.core.report import (
    AUDIT_FIELDS,
    VERIFIED_FIELDS,
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    Readings,
    RoundReport,
    audit_values,
    named_clusters,
    verified_values,
)
from convergerd.delivery.apply import (
    ClusterCalls,
    ClusterFailure,
    ClusterSource,
    Writer,
    cluster_failure,
    cluster_revision,
)
from convergerd.kube.api import Applied
from convergerd.leader.lease import Fence
from convergerd.slots import DEFAULT_SLOTS, Lanes

log = logging.getLogger(__name__)


class WriteGuard(Protocol):
    async def current(self, policies: Sequence[PolicyId]) -> Mapping[PolicyId, Current]:
        """The database's view of `policies` now; a policy without an entry has no row any
        more. Raises `DatabaseUnavailable`."""
        ...

    async def current_policy(self, policy_id: PolicyId) -> Policy | None:
        """The policy as the database holds it now (None: gone, being deleted or invalid).
        Raises `DatabaseUnavailable`."""
        ...


@dataclass(frozen=True, slots=True)
class RoundLimits:
    deadline_s: float  # the whole round, from its start
    cluster_concurrency: int
    apply_concurrency: int  # per cluster


@dataclass(frozen=True, slots=True)
class Round:
    """Everything a round needs, passed in (no globals): see `run_round`."""

    clusters: ClusterSource
    calls: ClusterCalls  # retries, request timeout, loop and wall clocks (as saves have)
    fence: Fence
    limits: RoundLimits
    # Checks writes against the database at write time (see `_guard_writes`); None: no check.
    guard: WriteGuard | None = None
    # Clusters last seen unreachable (by a round or the prober): they run in a lane of their
    # own (`slots.suspect_slots`), the rest of them behind every healthy cluster, so while they hang
    # they hold none of the slots the healthy clusters wait for.
    suspects: frozenset[ClusterId] = frozenset()
    # Clusters the last round left in sync: the others (behind, failed, new) take the slots
    # first, so work that outlasts one round's deadline (a first round at 10,000 x 100) is
    # finished in as many rounds as it takes, not re-listing the in-sync clusters first.
    caught_up: frozenset[ClusterId] = frozenset()
    # Whether a cluster is seen unreachable now (the prober's latest verdict), asked when its
    # turn for a slot comes: one that went unreachable since the round began gives its slot
    # back and waits behind the others, so a tenth of the fleet hanging just before a round
    # holds the healthy clusters' slots for one probe, not for their timeouts.
    suspected: Callable[[ClusterId], bool] | None = None
    # Shared by the rounds of every shard this process holds (`delivery.rounds`): the
    # cluster concurrency bounds the process, not each shard's round. None: this round's own.
    slots: asyncio.Semaphore | None = None
    # How the slots treat clusters that hear nothing (`config.SlotTuning`).
    tuning: SlotTuning = DEFAULT_SLOTS
    # The revision the round read of each policy it delivers per cluster (`Fleet.staged`): a
    # cluster may be due an older one, so the write-time check compares the database with
    # this, not with the revision written. Set by `run_round` from the fleet.
    staged_revisions: Mapping[PolicyId, int] = dataclasses.field(default_factory=dict)
    # Where the rollout each of them follows stood when the round read it (`Fleet.positions`):
    # one that moved on since (the next wave, a halt) makes the write stale.
    staged_positions: Mapping[PolicyId, Position] = dataclasses.field(default_factory=dict)
    # Each desired Policy's apply body, made once for the round's every cluster.
    bodies: Bodies = dataclasses.field(default_factory=Bodies)


async def run_round(
    fleet: Fleet, env: Round, *, epoch: Epoch | None = None, report: RoundReport | None = None
) -> RoundReport:
    """Converge every cluster in `fleet`; returns what happened. Raises `Fenced` (after
    cancelling all cluster work) if this replica lost the right to write mid-round.

    `report`, if given, is filled in even when the round is cut (`Fenced`, or the caller
    cancels it): the clusters that finished go to `clusters`, the others, with the deliveries
    they completed, to `cut_short`, so what was done can still be recorded."""
    if report is None:
        report = RoundReport(started_at=env.calls.wall())
    report.epoch = epoch or report.epoch
    report.invalid = list(fleet.invalid)
    deadline = env.calls.clock() + env.limits.deadline_s
    desired = fleet.desired_by_cluster()
    if fleet.staged:
        env = dataclasses.replace(env, staged_revisions={
            p.id: p.revision for p in fleet.policies if p.id in fleet.staged},
            staged_positions=fleet.positions)
    outcomes = {c: ClusterOutcome(cluster=c, desired=len(p)) for c, p in desired.items()}
    # The suspects in their lane, the others patient (`slots.Lanes`): a suspect whose lane is
    # full waits behind every healthy cluster (made last), so once the healthy part is done
    # the suspects left take all the slots instead of waiting out their timeouts eight at a
    # time until the round's deadline.
    lanes: Lanes[ClusterId, Sequence[Policy]] = Lanes(
        env.limits.cluster_concurrency, suspects=env.suspects.intersection(desired),
        ceiling_s=env.calls.request_timeout_s, suspected=env.suspected, shared=env.slots,
        tuning=env.tuning)

    finished: set[ClusterId] = set()

    async def one(cluster: ClusterId, policies: Sequence[Policy],
                  heard: Callable[[], None]) -> None:
        await converge_cluster(cluster, policies, env, deadline, outcome=outcomes[cluster],
                               heard=heard)
        finished.add(cluster)

    # Clusters take the slots in this order: the clusters the last round left in sync after
    # the others, the suspects last (`Lanes.run`). A Fenced from any cluster cancels all the
    # others at once.
    try:
        await lanes.run(sorted(desired.items(), key=lambda cp: cp[0] in env.caught_up), one)
    except* Fenced as group:
        raise group.exceptions[0] from None
    finally:
        # Every cluster's work is done or cancelled here.
        report.clusters = [o for c, o in outcomes.items() if c in finished]
        report.cut_short = [o for c, o in outcomes.items()
                            if c not in finished and (o.deliveries or o.phases)]
        report.finished_at = env.calls.wall()
    log_failed_clusters(report)
    return report


async def converge_cluster(
    cluster: ClusterId,
    desired: Sequence[Policy],
    env: Round,
    deadline: float,
    *,
    outcome: ClusterOutcome | None = None,
    heard: Callable[[], None] | None = None,
) -> ClusterOutcome:
    """`outcome`, if given, is filled in as the work goes (each delivery as it completes);
    `heard`, if given, is called on the cluster's first answer."""
    if outcome is None:
        outcome = ClusterOutcome(cluster=cluster, desired=len(desired))
    started = env.calls.clock()
    try:
        async with asyncio.timeout_at(deadline):
            await _converge(outcome, desired, env, deadline, heard)
    except Fenced:
        raise
    except Exception as exc:
        _fail_cluster(outcome, cluster_failure(
            exc, cluster, deadline_error="round deadline reached before this cluster finished",
            during="a round"))
    finally:
        outcome.duration_s = env.calls.clock() - started
    if outcome.error:
        # Per cluster at debug only: the round logs its failed clusters in one line.
        log.debug("cluster %s: %s", cluster, outcome.error,
                  extra={"cluster": cluster, "reason": outcome.reason})
    return outcome


def log_failed_clusters(report: RoundReport) -> None:
    """One warning for the clusters that failed this round, whatever their number: counts by
    reason and the first few named with their error (each cluster's own is in `/status`, the
    metrics and the debug log)."""
    failed = [o for o in report.clusters if o.error]
    if not failed:
        return
    reasons = Counter(o.reason or "unknown" for o in failed)
    log.warning(
        "round: %d of %d clusters failed (%s): %s", len(failed), len(report.clusters),
        ", ".join(f"{reason} {n}" for reason, n in reasons.most_common()),
        named_clusters((f"{o.cluster} ({o.error})" for o in failed), len(failed)),
        extra={"failed_clusters": len(failed), "failed_reasons": dict(reasons)},
    )


def _fail_cluster(outcome: ClusterOutcome, failure: ClusterFailure) -> None:
    outcome.error = failure.error
    outcome.reason = failure.reason
    outcome.reached = outcome.reached or failure.reached


async def _converge(
    outcome: ClusterOutcome, desired: Sequence[Policy], env: Round, deadline: float,
    heard: Callable[[], None] | None,
) -> None:
    writer = Writer(outcome.cluster, env.clusters.get(outcome.cluster), env.calls, env.fence,
                    deadline)
    timeout = env.calls.request_timeout_s

    async def list_once() -> Sequence[ListedPolicy]:
        found = await writer.api.list_policies(label_selector=MANAGED_SELECTOR,
                                               timeout_s=timeout)
        return [ListedPolicy.from_object(obj) for obj in found.items]

    observed = await writer.call(list_once)
    outcome.reached = True
    if heard is not None:
        heard()
    by_name = {o.name: o for o in observed}
    outcome.phases = _phases(outcome.cluster, by_name, env.calls.wall())

    actions = plan_cluster(desired, by_name, env.bodies)
    pending = {a.policy.id for a in actions}
    unchanged = [(p.id, p.revision) for p in desired if p.id not in pending]
    if unchanged:
        outcome.deliveries.extend_alike(
            Delivery(outcome.cluster, *unchanged[0], ApplyResult.UNCHANGED, env.calls.wall()),
            unchanged)
    outcome.in_sync = len(desired) - len(actions)
    if actions:
        actions = await _guard_writes(outcome, actions, env)
        await _apply_all(outcome, actions, writer, env)


async def _guard_writes(
    outcome: ClusterOutcome, actions: Sequence[Apply], env: Round
) -> list[Apply]:
    """After the list, before writing, ask the database again: a policy whose deletion began,
    that a save moved to another revision, or whose rollout moved on since the round read the
    fleet is not written (superseded). A save can land between the round's read and its list
    (at fleet scale, during any round, on every cluster not listed yet): the list then shows
    the save's revision, and without this check the round would write its older one over it.
    What is saved after this check writes the cluster after it: an update carries the
    resourceVersion listed, so the save's write wins either way; a create is settled after it
    (`_settle_creates`)."""
    if env.guard is None or not actions:
        return list(actions)
    current = await _ask(env.guard, [a.policy.id for a in actions], outcome.cluster)
    if current is None:
        return list(actions)
    kept = []
    for action in actions:
        if _stale(action.policy, current.get(action.policy.id), env):
            outcome.superseded += 1
            outcome.in_sync += 1
            continue
        kept.append(action)
    return kept


async def _ask(
    guard: WriteGuard, policies: list[PolicyId], cluster: ClusterId
) -> Mapping[PolicyId, Current] | None:
    """None when the database cannot answer: the round goes on without the check (rounds keep
    clusters converged through a database outage; a deletion cannot begin while it lasts)."""
    try:
        return await guard.current(policies)
    except DatabaseUnavailable as exc:
        log.warning("cluster %s: write-time check skipped (database unavailable: %s)",
                    cluster, exc, extra={"cluster": cluster})
        return None


def _stale(policy: Policy, now: Current | None, env: Round) -> bool:
    """Whether the database moved on from what the round read: the policy is gone or being
    deleted, or holds another revision than the one read (for a policy delivered per cluster,
    the revision read, not the one due here), or its rollout stands elsewhere."""
    if now is None or now.deleting:
        return True
    staged = env.staged_revisions.get(policy.id)
    if staged is None:
        return now.revision != policy.revision
    return now.revision != staged or now.rollout != env.staged_positions.get(policy.id)


@dataclass(slots=True)
class _Done:
    action: Apply
    delivery: Delivery | None  # None: superseded
    applied: Applied | None = None


async def _apply_all(
    outcome: ClusterOutcome, actions: Sequence[Apply], writer: Writer, env: Round
) -> None:
    # Creates are checked against the database once more before they are recorded (see
    # `_settle_creates`); everything else is recorded as it completes, so a round cut short
    # still knows what it did.
    unsettled: list[_Done] = []
    todo = iter(actions)

    async def worker() -> None:
        for action in todo:  # shared by the workers: each action is applied once
            done = await _apply_one(writer, action)
            if env.guard is not None and action.why is Why.MISSING and done.applied is not None:
                unsettled.append(done)
            else:
                _record(outcome, done.delivery)

    # `apply_concurrency` workers, not a task per action (100 policies would be 100 tasks per
    # cluster). A cluster-level error in one apply (401, 403, unreachable) stops this
    # cluster's work: the TaskGroup cancels the other workers and re-raises it.
    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(min(env.limits.apply_concurrency, len(actions))):
                tg.create_task(worker())
    except ExceptionGroup as group:
        # Fenced wins over anything raised alongside it (two `except*` clauses that both
        # raise would hand the caller a group instead of `Fenced`).
        fenced, rest = group.split(Fenced)
        if fenced is not None:
            _record_unsettled(outcome, unsettled)
            raise fenced.exceptions[0] from None
        errors, other = rest.split(ClusterError) if rest is not None else (None, None)
        if errors is None or other is not None:
            _record_unsettled(outcome, unsettled)
            raise
        # What finished before the failure is kept; the cluster's reason is the first error.
        await _settle_and_record(outcome, unsettled, writer, env)
        raise errors.exceptions[0] from None
    except BaseException:
        _record_unsettled(outcome, unsettled)  # cancelled: the writes made still count
        raise
    await _settle_and_record(outcome, unsettled, writer, env)


def _record_unsettled(outcome: ClusterOutcome, unsettled: list[_Done]) -> None:
    for item in unsettled:
        _record(outcome, item.delivery)
    unsettled.clear()


async def _settle_and_record(
    outcome: ClusterOutcome, done: list[_Done], writer: Writer, env: Round
) -> None:
    try:
        await _settle_creates(done, writer, env)
    finally:
        for item in done:
            _record(outcome, item.delivery)


async def _settle_creates(done: list[_Done], writer: Writer, env: Round) -> None:
    """After creating what the list did not have, ask the database once more. A deletion that
    began meanwhile may have removed the object before this write landed: the write is undone
    (the deletion marks the database before it removes, so either it removes after this write
    or this check sees the mark). A save that moved the policy on meanwhile may have been
    overwritten by this older revision: the current revision is applied over it, with this
    write's resourceVersion as precondition."""
    created = {d.action.policy.id: d for d in done
               if d.action.why is Why.MISSING and d.applied is not None}
    if env.guard is None or not created:
        return
    current = await _ask(env.guard, list(created), writer.cluster)
    if current is None:
        return
    for pid, item in created.items():
        now = current.get(pid)
        if not _stale(item.action.policy, now, env):
            continue
        assert item.applied is not None
        item.delivery = None  # superseded: the newer writer's record stands
        if now is None or now.deleting:
            await _undo_create(writer, item.action)
        elif pid in env.staged_revisions:
            continue  # a newer save started a rollout: it and the next round say what is due
        elif now.revision > item.action.policy.revision:
            saved = await _saved_policy(env.guard, pid, writer.cluster)
            if saved is not None and saved.revision > item.action.policy.revision:
                item.delivery = await _repair(writer, saved, item.applied)


async def _undo_create(writer: Writer, action: Apply) -> None:
    cluster, name = writer.cluster, object_name(action.policy.id)
    try:
        await writer.remove(name)
    except ClusterError as exc:
        # The deletion's own retry removes it (the policy stays marked until every cluster did).
        log.warning("cluster %s: could not undo the creation of %s, whose deletion began: %s",
                    cluster, name, exc, extra={"cluster": cluster})
        return
    log.info("cluster %s: %s was deleted while this round created it: creation undone",
             cluster, name, extra={"cluster": cluster})


async def _saved_policy(guard: WriteGuard, policy_id: PolicyId,
                        cluster: ClusterId) -> Policy | None:
    """The newer revision a create was overtaken by, or None when the database cannot say (the
    next round applies it)."""
    try:
        return await guard.current_policy(policy_id)
    except DatabaseUnavailable as exc:
        log.warning("cluster %s: policy %s was saved while this round created it; its saved "
                    "revision could not be read (database unavailable: %s): the next round "
                    "applies it", cluster, policy_id, exc, extra={"cluster": cluster})
        return None


async def _repair(writer: Writer, policy: Policy, applied: Applied) -> Delivery | None:
    rv = str((applied.object.get("metadata") or {}).get("resourceVersion") or "")
    action = Apply(policy, with_precondition(render_policy(policy), rv), Why.DRIFT)
    log.info("cluster %s: policy %s was saved (revision %d) while this round created it: "
             "applying the saved revision", writer.cluster, policy.id, policy.revision,
             extra={"cluster": writer.cluster})
    return (await _apply_one(writer, action)).delivery


def _record(outcome: ClusterOutcome, delivery: Delivery | None) -> None:
    if delivery is None:
        outcome.superseded += 1
        outcome.in_sync += 1
        return
    outcome.deliveries.append(delivery)
    if delivery.result is ApplyResult.FAILED:
        outcome.failed += 1
    else:
        outcome.in_sync += 1


async def _apply_one(writer: Writer, action: Apply) -> _Done:
    written = await writer.apply(action.policy, action.body)
    return _Done(action, written.delivery, written.applied)


# A listed Policy's reading, in `facts.READING`'s order: the fields it holds under their own
# names (passed on by name), its revision and when it was listed, its Verified condition and
# audit (`report.verified_values`, `audit_values`); any other field its default.
_LISTED = tuple(f.name for f in dataclasses.fields(ListedPolicy) if f.name in READING_NAMES)
_listed = operator.attrgetter(*_LISTED)
_reading = reorder((*_LISTED, "revision", "seen_at", *VERIFIED_FIELDS, *AUDIT_FIELDS),
                   READING_NAMES)


def _phases(
    cluster: ClusterId, observed: Mapping[str, ListedPolicy], seen_at: dt.datetime
) -> Readings:
    """What the in-cluster operator reports, read from the same list (no extra requests),
    packed (`Readings`: readings that agree but for their policy, revision and probe times,
    most often a cluster's all, are held as one)."""
    readings = Readings()
    for name, obj in observed.items():
        policy_id = policy_id_from_name(name)
        if policy_id is None or object_name(policy_id) != name:
            continue
        readings.add(cluster, PolicyId(sys.intern(policy_id)), _reading(  # one id per policy
            (*_listed(obj), cluster_revision(obj), seen_at, *verified_values(obj.verified),
             *audit_values(obj.audit))))
    return readings
