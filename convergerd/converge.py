"""A converge round: every valid, delivered policy onto every cluster its boundary covers.

Apply-only: a round adds and updates, it never deletes. Per cluster it costs one paginated,
label-selected list, plus one server-side apply per missing or drifted object; a cluster in
sync costs exactly the list. Clusters run concurrently under a global bound; each runs under
the round's deadline, so one down or hung cluster costs at most its own timeout and never
delays the others. Every write first asks the fence how long this replica may still write.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from convergerd.decode import as_int
from convergerd.errors import ClusterError, Fenced
from convergerd.kube.api import PolicyApi
from convergerd.lease import Fence
from convergerd.model import ClusterId, Fleet, Policy, PolicyId
from convergerd.plan import Apply, Observed, plan_cluster
from convergerd.render import MANAGED_SELECTOR, object_name, policy_id_of
from convergerd.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class Retrier(Protocol):
    """Runs `fn` with the retry policy (docs/design.md, "Errors from a cluster") until it
    succeeds, fails for good, or
    the next attempt could not finish before `deadline` (loop time)."""

    async def __call__(
        self, fn: Callable[[], Awaitable[T]], *, cluster: str, deadline: float
    ) -> T: ...


class ClusterSource(Protocol):
    def get(self, cluster: ClusterId) -> PolicyApi:
        """The cluster's client; raises `NoCredentials` when the kubeconfig lacks it."""
        ...


@dataclass(frozen=True, slots=True)
class RoundLimits:
    deadline_s: float  # the whole round, from its start
    cluster_concurrency: int
    apply_concurrency: int  # per cluster
    request_timeout_s: float


@dataclass(frozen=True, slots=True)
class Round:
    """Everything a round needs, passed in (no globals): see `run_round`."""

    clusters: ClusterSource
    retrier: Retrier
    fence: Fence
    limits: RoundLimits
    clock: Callable[[], float]  # monotonic (loop time)
    wall: Callable[[], dt.datetime]  # UTC, for records


async def run_round(
    fleet: Fleet, env: Round, *, epoch: Epoch | None = None, report: RoundReport | None = None
) -> RoundReport:
    """Converge every cluster in `fleet`; returns what happened. Raises `Fenced` (after
    cancelling all cluster work) if this replica lost the right to write mid-round.

    `report`, if given, is filled in even when the round is cut (`Fenced`, or the caller
    cancels it): the clusters that finished go to `clusters`, the others, with the deliveries
    they completed, to `cut_short`, so what was done can still be recorded."""
    if report is None:
        report = RoundReport(started_at=env.wall())
    report.epoch = epoch or report.epoch
    report.invalid = list(fleet.invalid)
    deadline = env.clock() + env.limits.deadline_s
    gate = asyncio.Semaphore(env.limits.cluster_concurrency)
    desired = fleet.desired_by_cluster()
    outcomes = {c: ClusterOutcome(cluster=c, desired=len(p)) for c, p in desired.items()}

    async def one(cluster: ClusterId, policies: Sequence[Policy]) -> ClusterOutcome:
        async with gate:
            return await converge_cluster(cluster, policies, env, deadline,
                                          outcome=outcomes[cluster])

    # TaskGroup: a Fenced from any cluster cancels all the others at once.
    tasks: dict[ClusterId, asyncio.Task[ClusterOutcome]] = {}
    try:
        async with asyncio.TaskGroup() as tg:
            for c, p in desired.items():
                tasks[c] = tg.create_task(one(c, p), name=f"converge {c}")
    except* Fenced as group:
        raise group.exceptions[0] from None
    finally:
        # Every task is done here (the TaskGroup waits for its cancelled tasks too).
        finished = {c for c, t in tasks.items()
                    if t.done() and not t.cancelled() and t.exception() is None}
        report.clusters = [o for c, o in outcomes.items() if c in finished]
        report.cut_short = [o for c, o in outcomes.items()
                            if c not in finished and (o.deliveries or o.phases)]
        report.finished_at = env.wall()
    return report


async def converge_cluster(
    cluster: ClusterId,
    desired: Sequence[Policy],
    env: Round,
    deadline: float,
    *,
    outcome: ClusterOutcome | None = None,
) -> ClusterOutcome:
    """`outcome`, if given, is filled in as the work goes (each delivery as it completes)."""
    if outcome is None:
        outcome = ClusterOutcome(cluster=cluster, desired=len(desired))
    started = env.clock()
    try:
        async with asyncio.timeout_at(deadline):
            await _converge(outcome, desired, env, deadline)
    except TimeoutError:
        _fail_cluster(outcome, "round deadline reached before this cluster finished", "deadline")
    except ClusterError as exc:
        _fail_cluster(outcome, str(exc), exc.reason, reached=exc.answered)
    except Fenced:
        raise
    except Exception as exc:
        # Not ours (a client or library bug, an odd object in the cluster): this cluster fails
        # for this round; the round and the daemon go on. Status and metrics get the type
        # only (a message may quote anything); the traceback goes to the log.
        log.exception("cluster %s: unexpected error", cluster, extra={"cluster": cluster})
        _fail_cluster(outcome, f"unexpected error ({type(_first_leaf(exc)).__name__})",
                      "internal_error")
    finally:
        outcome.duration_s = env.clock() - started
    if outcome.error:
        log.warning(
            "cluster %s: %s", cluster, outcome.error,
            extra={"cluster": cluster, "reason": outcome.reason},
        )
    return outcome


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _fail_cluster(
    outcome: ClusterOutcome, error: str, reason: str, *, reached: bool = False
) -> None:
    outcome.error = error
    outcome.reason = reason
    outcome.reached = outcome.reached or reached


async def _converge(
    outcome: ClusterOutcome, desired: Sequence[Policy], env: Round, deadline: float
) -> None:
    api = env.clusters.get(outcome.cluster)
    timeout = env.limits.request_timeout_s

    async def list_once() -> Sequence[Observed]:
        found = await api.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=timeout)
        return [Observed.from_object(obj) for obj in found.items]

    observed = await env.retrier(list_once, cluster=outcome.cluster, deadline=deadline)
    outcome.reached = True
    by_name = {o.name: o for o in observed}
    outcome.phases = _phases(outcome.cluster, by_name, env.wall())

    actions = plan_cluster(desired, by_name)
    now = env.wall()
    pending = {a.policy.id for a in actions}
    for policy in desired:
        if policy.id not in pending:
            outcome.deliveries.append(
                Delivery(outcome.cluster, policy.id, policy.revision, ApplyResult.UNCHANGED, now)
            )
    outcome.in_sync = len(desired) - len(actions)
    if actions:
        await _apply_all(outcome, actions, api, env, deadline)


async def _apply_all(
    outcome: ClusterOutcome, actions: Sequence[Apply], api: PolicyApi, env: Round, deadline: float
) -> None:
    gate = asyncio.Semaphore(env.limits.apply_concurrency)

    async def apply(action: Apply) -> None:
        async with gate:
            delivery = await _apply_one(outcome.cluster, action, api, env, deadline)
        # Recorded as it completes: a round cut short still knows what it did.
        _record(outcome, delivery)

    # A cluster-level error in one apply (401, 403, unreachable) stops this cluster's work:
    # the TaskGroup cancels the siblings and re-raises it (first one wins).
    try:
        async with asyncio.TaskGroup() as tg:
            for a in actions:
                tg.create_task(apply(a))
    except ExceptionGroup as group:
        # Fenced wins over anything raised alongside it (two `except*` clauses that both
        # raise would hand the caller a group instead of `Fenced`).
        fenced, rest = group.split(Fenced)
        if fenced is not None:
            raise fenced.exceptions[0] from None
        errors, other = rest.split(ClusterError) if rest is not None else (None, None)
        if errors is None or other is not None:
            raise
        # What finished before the failure is kept (recorded as it completed); the cluster's
        # reason is the first error.
        raise errors.exceptions[0] from None


def _record(outcome: ClusterOutcome, delivery: Delivery) -> None:
    outcome.deliveries.append(delivery)
    if delivery.result is ApplyResult.FAILED:
        outcome.failed += 1
    else:
        outcome.in_sync += 1


async def _apply_one(
    cluster: ClusterId, action: Apply, api: PolicyApi, env: Round, deadline: float
) -> Delivery:
    attempts = 0

    async def attempt() -> bool:
        nonlocal attempts
        attempts += 1
        # Never let a write outlive the fence: a deposed leader must not land one late.
        budget = min(env.limits.request_timeout_s, env.fence.remaining_s())
        applied = await api.apply_policy(action.body, timeout_s=budget)
        return applied.created

    policy = action.policy
    try:
        created = await env.retrier(attempt, cluster=cluster, deadline=deadline)
    except ClusterError as exc:
        if exc.cluster_level:
            raise
        log.debug("cluster %s: policy %s rejected: %s", cluster, policy.id, exc)
        return Delivery(
            cluster, policy.id, policy.revision, ApplyResult.FAILED, env.wall(),
            error=str(exc), reason=exc.reason, attempts=attempts,
        )
    result = ApplyResult.CREATED if created else ApplyResult.UPDATED
    return Delivery(cluster, policy.id, policy.revision, result, env.wall(), attempts=attempts)


def _phases(
    cluster: ClusterId, observed: Mapping[str, Observed], seen_at: dt.datetime
) -> list[PhaseReading]:
    """What the in-cluster operator reports, read from the same list (no extra requests)."""
    readings = []
    for name, obj in observed.items():
        policy_id = policy_id_of(name)
        if policy_id is None or object_name(policy_id) != name:
            continue
        # The spec is the cluster's copy: anything but a bigint is no revision.
        revision = as_int(obj.spec.get("revision"))
        readings.append(
            PhaseReading(
                cluster=cluster,
                policy=PolicyId(policy_id),
                phase=obj.phase,
                ready_reason=obj.ready_reason,
                ready_message=obj.ready_message,
                revision=revision,
                seen_at=seen_at,
            )
        )
    return readings
