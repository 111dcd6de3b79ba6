"""Save and delete: one policy to (or from) every cluster concerned, at once.

A save reads the policy from the database and, concurrently on every cluster in its scope,
applies it: at once, one request per cluster, where the records say the cluster holds an older
revision or none (a new revision, the usual case); after reading the live object where the
records say it holds this revision or a newer one (`removal.read_first`: `unchanged` is not
written, a newer revision is left alone, and a write carries the live resourceVersion as
precondition). Then it checks that the database holds no newer revision: every writer writes a
revision it read there, so if none is newer, no cluster holds one this save wrote over; if one
is, the newest is saved instead, every cluster read first. Then it removes the policy from
clusters that hold it but left its scope (`convergerd.core.removal` decides, with the
mass-removal guard). A deletion marks the policy in the database first (rounds stop
delivering it; a round that read it before checks again at write time), removes
`policy-<id>` everywhere it may be installed (404 counts as removed), and deletes the row only
when every cluster removed it.

Clusters are reached through the same registry, retry policy and error classes as rounds,
written through the same `apply.Writer` (the fence asked before every write), and scheduled by
the same `slots.Lanes` (the suspects' lane, the patient healthy lane), under one short overall
deadline. A cluster that fails is recorded (deliveries) and reported; it never fails the
others. Hung clusters do not hold a save's answer: it lists them `pending`, and their writes go
on until the deadline, recorded when they end (a deletion waits for every cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from convergerd.config import Settings, SlotTuning
from convergerd.core.errors import DatabaseRejected, DatabaseUnavailable, Fenced
from convergerd.core.model import ClusterId, Policy, PolicyId
from convergerd.core.plan import ListedPolicy, differs, with_precondition
from convergerd.core.removal import Current, Target, delete_targets, plan_save
from convergerd.core.render import deliverable_policy, object_name, render_policy
from convergerd.core.report import (
    ApplyResult,
    ClusterResult,
    Delivery,
    FanoutReport,
    FanoutResult,
    FanoutStatus,
    named_clusters,
)
from convergerd.core.rollout import Staged, Start
from convergerd.core.save import Operation, SaveAction, Work
from convergerd.core.spread import Spread
from convergerd.delivery.apply import (
    ClusterCalls,
    Writer,
    cluster_calls,
    cluster_failure,
    cluster_revision,
)
from convergerd.kube.api import KubeObject, PolicyApi
from convergerd.leader.lease import Fence
from convergerd.retry import RetryObserver
from convergerd.slots import DEFAULT_SLOTS, Lanes

log = logging.getLogger(__name__)

# Why a cluster was left as it is by `Saver.deliver_due` (`skipped`): the content it is due
# cannot be delivered.
UNDELIVERABLE = "undeliverable"

# A save re-reads and re-applies when the object changed between its read and its write; a
# cluster where it keeps changing after this many tries is reported as failed (conflict).
_SAVE_ATTEMPTS = 3

# One cluster's part of a fan-out, given the deadline (loop time); a job names its cluster.
Step = Callable[[float], Awaitable[ClusterResult]]
Job = tuple[ClusterId, SaveAction, Step]


class SaveApi(PolicyApi, Protocol):
    async def get_policy(self, name: str, *, timeout_s: float) -> KubeObject | None:
        """The Policy object, or None when there is none."""
        ...


class SaveClusters(Protocol):
    def get(self, cluster: ClusterId) -> SaveApi:
        """The cluster's client; raises `NoCredentials` when the kubeconfig lacks it."""
        ...


class SaveStore(Protocol):
    """What saves and deletions read and record (`convergerd.store.store.Store`)."""

    async def save_target(self, policy_id: str, /) -> Target | None: ...
    async def begin_deletion(self, policy_id: str, /) -> Target | None: ...
    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str], /) -> bool:
        ...
    async def record_deliveries(self, deliveries: Sequence[Delivery], /) -> None: ...
    async def forget_deliveries(self, policy_id: str, clusters: Sequence[str], /) -> None: ...
    async def current(self, policy_ids: Sequence[PolicyId], /) -> dict[PolicyId, Current]: ...
    async def start_rollout(self, policy_id: str, revision: int, *, by: str,
                            already_delivered: bool, now: bool = False) -> Start: ...
    async def staged_rollout(self, policy_id: str, /) -> Staged | None: ...


class SavePeers(Protocol):
    """The other shard holders (`convergerd.delivery.spread.Peers`)."""

    async def fan_out(self, policy: Policy, work: Sequence[Work], env: FanoutEnv) -> Spread | None:
        """Every cluster's result, part of them written by the holders of their shards; None
        when no other replica is asked (the save is written here, as without shards)."""
        ...


class Expectations(Protocol):
    """Told which clusters a fan-out is about to reach (`status.probe.Answers`: the prober
    leaves them to it)."""

    def expecting(self, clusters: Collection[str]) -> contextlib.AbstractContextManager[None]:
        ...


class FanoutObserver(Protocol):
    def fanout_done(self, operation: str, trigger: str, result: str, duration_s: float) -> None:
        ...


@dataclass(frozen=True, slots=True)
class FanoutEnv:
    """Everything a save or a deletion needs, passed in: see `fanout_env`."""

    clusters: SaveClusters
    calls: ClusterCalls  # retries, request timeout, loop and wall clocks (as rounds have)
    fence: Fence
    deadline_s: float
    concurrency: int
    expected: Expectations | None = None
    # Whether a cluster is seen unreachable now (the prober's verdict, as rounds ask it): the
    # ones seen so when the fan-out starts are its suspects (`slots.Lanes`).
    suspected: Callable[[ClusterId], bool] | None = None
    # How the slots treat clusters that hear nothing (`config.SlotTuning`), as in rounds.
    tuning: SlotTuning = DEFAULT_SLOTS


def fanout_env(
    settings: Settings, clusters: SaveClusters, fence: Fence, observer: RetryObserver,
    expected: Expectations | None = None, *,
    suspected: Callable[[ClusterId], bool] | None = None,
) -> FanoutEnv:
    """What a save or delete runs with: the rounds' clients and `apply.cluster_calls`, under
    the save deadline. Pure wiring (tests build saves with it too)."""
    return FanoutEnv(
        clusters=clusters,
        calls=cluster_calls(settings, observer),
        fence=fence,
        deadline_s=settings.saves.deadline_s,
        concurrency=settings.rounds.cluster_concurrency,
        expected=expected,
        suspected=suspected,
        tuning=settings.tuning.slots,
    )


# ---------------------------------------------------------------------------------------------
# Per cluster


async def _guarded(cluster: ClusterId, action: SaveAction, work: Step, env: FanoutEnv,
                   deadline: float, *, heard: Callable[[], None]) -> ClusterResult:
    """One cluster's work under the overall deadline; every failure becomes its result.
    `heard` is called when the cluster answered (its work done, or failed with an answer)."""
    try:
        async with asyncio.timeout_at(deadline):
            result = await work(deadline)
    except Fenced as exc:
        return ClusterResult(cluster, action, FanoutResult.FAILED, "fenced", str(exc))
    except Exception as exc:
        failure = cluster_failure(
            exc, cluster, deadline_error=f"not done within the {env.deadline_s:g} s deadline",
            during=action)
        if failure.reached:
            heard()
        return ClusterResult(cluster, action, FanoutResult.FAILED, failure.reason,
                             failure.error)
    heard()
    return result


def _writer(cluster: ClusterId, api: SaveApi, env: FanoutEnv, deadline: float) -> Writer:
    return Writer(cluster, api, env.calls, env.fence, deadline)


async def _apply_to(
    cluster: ClusterId, policy: Policy, body: dict[str, Any], env: FanoutEnv, deadline: float,
    *, read: bool,
) -> ClusterResult:
    """Write `body` (the rendered `policy`) to one cluster: at once (`read` False: one request,
    the usual case), or after reading the live object (`read` True: the cluster is recorded
    with this revision or a newer one, see `removal.read_first`)."""
    api = env.clusters.get(cluster)
    writer = _writer(cluster, api, env, deadline)
    if not read:
        written = await writer.apply(policy, body)
        if written.delivery is not None:  # always, without a precondition
            return ClusterResult.applied(written.delivery)
    name = object_name(policy.id)
    timeout = env.calls.request_timeout_s
    for _ in range(_SAVE_ATTEMPTS):
        live = await writer.call(lambda: api.get_policy(name, timeout_s=timeout))
        write = body
        if live is not None:
            observed = ListedPolicy.from_object(live)
            revision = cluster_revision(observed)
            if revision is not None and revision > policy.revision:
                return ClusterResult(cluster, SaveAction.APPLY, FanoutResult.SUPERSEDED, None,
                                     f"the cluster holds revision {revision}")
            if not differs(body, observed):
                return ClusterResult(cluster, SaveAction.APPLY, FanoutResult.UNCHANGED)
            write = with_precondition(body, observed.resource_version)
        written = await writer.apply(policy, write)
        if written.delivery is None:
            continue  # written by someone else between our read and our write: look again
        return ClusterResult.applied(written.delivery)
    return ClusterResult(cluster, SaveAction.APPLY, FanoutResult.FAILED, "conflict",
                         f"{name} kept changing under {_SAVE_ATTEMPTS} attempts")


async def _remove_from(
    cluster: ClusterId, policy_id: str, env: FanoutEnv, deadline: float
) -> ClusterResult:
    await _writer(cluster, env.clusters.get(cluster), env, deadline).remove(
        object_name(policy_id))
    return ClusterResult(cluster, SaveAction.REMOVE, FanoutResult.REMOVED)


def _key(r: ClusterResult) -> tuple[str, str]:
    return r.cluster, r.action


@dataclass(slots=True)
class FanOut:
    """A fan-out's answer: every cluster's result, those still being written as `pending`;
    `rest`, when some are, gives every cluster's final result once their writes end (by the
    deadline at the latest)."""

    results: list[ClusterResult]
    rest: asyncio.Task[list[ClusterResult]] | None = None

    @property
    def pending(self) -> list[ClusterResult]:
        return [r for r in self.results if r.result is FanoutResult.PENDING]


async def _fan_out(
    jobs: Sequence[Job], env: FanoutEnv, deadline: float | None = None, *,
    answer_early: bool = False,
) -> FanOut:
    """Every job (one per cluster), on the rounds' scheduler (`slots.Lanes`: `env.concurrency`
    slots, the clusters seen unreachable in a lane of their own and started last, a cluster
    that hears nothing within the patience giving its slot back), until `deadline` (loop time;
    default: the save deadline from now). Every result, sorted.

    With `answer_early`, the answer does not wait for the hung clusters (the suspects, and the
    clusters that stepped aside): it comes when every other cluster is done, the hung ones
    not done yet listed as `pending`; their writes go on until the deadline (`FanOut.rest`)."""
    if deadline is None:
        deadline = env.calls.clock() + env.deadline_s
    suspected = env.suspected
    lanes: Lanes[ClusterId, tuple[SaveAction, Step]] = Lanes(
        env.concurrency, ceiling_s=env.calls.request_timeout_s, suspected=suspected,
        suspects=[c for c, _, _ in jobs if suspected is not None and suspected(c)],
        tuning=env.tuning)
    results: dict[tuple[str, str], ClusterResult] = {}
    holding = {(c, a) for c, a, _ in jobs if c not in lanes.suspects}  # hold the answer
    answer = asyncio.Event()

    def let_go(key: tuple[str, str]) -> None:
        holding.discard(key)
        if not holding:
            answer.set()

    def aside(cluster: ClusterId, job: tuple[SaveAction, Step]) -> None:
        let_go((cluster, job[0]))

    async def one(cluster: ClusterId, job: tuple[SaveAction, Step],
                  heard: Callable[[], None]) -> None:
        action, step = job
        key = (cluster, action)
        results[key] = await _guarded(cluster, action, step, env, deadline, heard=heard)
        let_go(key)

    async def run_all() -> list[ClusterResult]:
        expecting = (env.expected.expecting([c for c, _, _ in jobs])
                     if env.expected is not None else contextlib.nullcontext())
        with expecting:
            await lanes.run(((c, (a, s)) for c, a, s in jobs), one, on_aside=aside)
        return sorted(results.values(), key=_key)

    if not holding:
        answer.set()
    run = asyncio.create_task(run_all(), name="save fan-out")
    waiting = asyncio.create_task(answer.wait() if answer_early else asyncio.Event().wait())
    try:
        await asyncio.wait([run, waiting], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        run.cancel()
        raise
    finally:
        waiting.cancel()
    if run.done():
        return FanOut(run.result())
    answered = dict(results)
    for cluster, action, _ in jobs:
        answered.setdefault((cluster, action), ClusterResult(
            cluster, action, FanoutResult.PENDING, None,
            f"no answer yet: written until the {env.deadline_s:g} s deadline, the result "
            "recorded"))
    return FanOut(sorted(answered.values(), key=_key), run)


async def save_work(
    policy: Policy, work: Sequence[Work], env: FanoutEnv, *,
    fence_of: Callable[[ClusterId], Fence | None] | None = None, deadline: float | None = None,
) -> list[ClusterResult]:
    """Apply `policy` to (or remove it from) each cluster of `work`, at once, under `env`'s
    fence, or the one `fence_of` gives a cluster (a shard's Lease), until `deadline` (loop
    time; default: the save deadline from now). Every result, sorted."""
    return (await _fan_out(save_jobs(policy, work, env, fence_of), env, deadline)).results


def save_jobs(
    policy: Policy, work: Sequence[Work], env: FanoutEnv,
    fence_of: Callable[[ClusterId], Fence | None] | None = None,
) -> list[Job]:
    """A save's job per cluster of `work`, under `env`'s fence or the one `fence_of` gives."""
    body = render_policy(policy)  # once: every cluster gets the same object

    def env_for(cluster: ClusterId) -> FanoutEnv:
        fence = fence_of(cluster) if fence_of is not None else None
        return env if fence is None else dataclasses.replace(env, fence=fence)

    jobs: list[Job] = []
    for w in work:
        cluster_env = env_for(w.cluster)
        if w.action is SaveAction.REMOVE:
            jobs.append((w.cluster, w.action, functools.partial(
                _remove_from, w.cluster, policy.id, cluster_env)))
        else:
            jobs.append((w.cluster, w.action, functools.partial(
                _apply_to, w.cluster, policy, body, cluster_env, read=w.read)))
    return jobs


# ---------------------------------------------------------------------------------------------
# Save and delete


def deliveries_of(
    results: Iterable[ClusterResult], policy_id: str, revision: int, at: dt.datetime
) -> list[Delivery]:
    """What the database records: applies by result, failed removals as failed deliveries (so
    the cluster still counts as holding the policy). Superseded and removed leave no record."""
    out = []
    pid = PolicyId(policy_id)
    for r in results:
        if r.result in (FanoutResult.CREATED, FanoutResult.UPDATED, FanoutResult.UNCHANGED):
            out.append(Delivery(r.cluster, pid, revision, ApplyResult(r.result.value), at))
        elif r.result is FanoutResult.FAILED:
            error = r.error if r.action is SaveAction.APPLY else f"removing failed: {r.error}"
            out.append(Delivery(r.cluster, pid, revision, ApplyResult.FAILED, at,
                                error=error, reason=r.reason))
    return out


class Saver:
    """Saves and deletions for the HTTP API and the database notifications."""

    def __init__(
        self,
        *,
        store: SaveStore,
        env: Callable[[], FanoutEnv],
        guard_share: float,
        observer: FanoutObserver | None = None,
        peers: SavePeers | None = None,
    ) -> None:
        """`peers`: with shards, the other holders write their shards' part of each save."""
        self._store = store
        self._env = env
        self._guard_share = guard_share
        self._observer = observer
        self._peers = peers
        # The writes to hung clusters still going after their save answered (`_finish_later`),
        # by policy, each ended by its save's deadline, or by the policy's next save or
        # deletion here (an older revision must not land after it).
        self._late: dict[str, asyncio.Task[None]] = {}

    async def save(
        self, policy_id: str, *, allow_mass_removal: bool = False, trigger: str = "api",
        now: bool = False,
    ) -> FanoutReport:
        """Raises `DatabaseUnavailable` when the policy cannot be read. A policy with a rollout
        strategy starts a rollout and is written to its first wave's clusters only (the others
        keep their revision: rounds keep them there); `now` skips the waves (a rollback's
        `--now`): every cluster at once."""
        started = time.monotonic()
        report = await self._save(policy_id, allow_mass_removal, trigger, now=now)
        self._observe(report, trigger, started)
        return report

    async def _save(
        self, policy_id: str, allow_mass_removal: bool, trigger: str, *, read_all: bool = False,
        now: bool = False,
    ) -> FanoutReport:
        await self._stop_late(policy_id)
        target = await self._store.save_target(policy_id)
        if target is None:
            return FanoutReport(Operation.SAVE, policy_id, FanoutStatus.NOT_FOUND,
                                error="no such policy")
        revision = target.row.revision
        if target.deleting:
            return FanoutReport(Operation.SAVE, policy_id, FanoutStatus.DELETING, revision,
                          error="its deletion has begun: DELETE it again to finish")
        policy = deliverable_policy(target.row, boundary_exists=target.boundary_exists)
        if not isinstance(policy, Policy):
            return FanoutReport(Operation.SAVE, policy_id, FanoutStatus.INVALID, revision,
                                error=policy.reason)
        plan = plan_save(target, delivered=policy.rule.delivered,
                         guard_share=self._guard_share, allow_mass_removal=allow_mass_removal)
        start = await self._start(target, trigger, allow_mass_removal, now=now)
        if isinstance(start, FanoutReport):
            return start
        groups = due_groups(policy, plan.apply_to, start.staged)
        read = plan.apply_to if read_all else plan.read_first
        env = self._env()
        removals = [Work(c, SaveAction.REMOVE) for c in sorted(plan.remove_from)]
        spread = None
        if start.staged is None:
            work = [Work(c, SaveAction.APPLY, c in read) for c in sorted(plan.apply_to)]
            spread = (await self._peers.fan_out(policy, work + removals, env) if self._peers
                      else None)
        if spread is not None:
            fan = FanOut(spread.results)
        else:
            jobs = save_jobs(policy, removals, env)
            for due_policy, clusters in groups:
                jobs += save_jobs(due_policy, [Work(c, SaveAction.APPLY, c in read)
                                               for c in clusters], env)
            fan = await _fan_out(jobs, env, answer_early=True)
        if fan.rest is not None:
            self._finish_later(policy_id, revision, fan, env, trigger)
        results = fan.results
        if plan.apply_to - read and await self._overtaken(policy_id, revision):
            # A newer revision was saved while this one was written without reading first:
            # this save may have landed over it on some clusters. Save the newest revision,
            # reading every cluster first (its writes carry preconditions, as a standby's
            # always did); what it finds and does is the answer, and what is recorded (its
            # `_stop_late` stops this revision's pending writes first).
            log.info("policy %s: revision %d was overtaken during its save (%s): saving the "
                     "newest revision, reading every cluster first", policy_id, revision,
                     trigger, extra={"policy": policy_id, "trigger": trigger})
            return await self._save(policy_id, allow_mass_removal, trigger, read_all=True)
        results += [ClusterResult(c, SaveAction.REMOVE, FanoutResult.SKIPPED, "guard",
                                  plan.skipped_reason) for c in sorted(plan.skipped)]
        await self._record(policy_id, revision, results, env)
        report = FanoutReport(Operation.SAVE, policy_id, FanoutStatus.OK, revision, results,
                        skipped_reason=plan.skipped_reason,
                        rollout=rollout_note(start, plan.apply_to, groups))
        if report.failed or fan.pending:
            report.status = FanoutStatus.PARTIAL
        by_peers = spread.by_peers if spread is not None else 0
        log.info("policy %s revision %d saved (%s): %s%s%s", policy_id, revision, trigger,
                 summary(results),
                 f" ({by_peers} done by the other shard holders)" if spread else "",
                 _rollout_line(report.rollout),
                 extra={"policy": policy_id, "trigger": trigger,
                        "fanout_counts": counts(results), "fanout_by_peers": by_peers})
        return report

    async def _start(self, target: Target, trigger: str, allow_mass_removal: bool, *,
                     now: bool) -> Start | FanoutReport:
        """The save's rollout (`Store.start_rollout`), or its answer: refused (the strategy
        cannot be used), or the save of the newer revision stored meanwhile."""
        policy_id, revision = target.row.id, target.row.revision
        start = await self._store.start_rollout(
            policy_id, revision, by=f"save ({trigger})", now=now,
            already_delivered=any(r >= revision for r in target.delivered.values()))
        if start.refused is not None:
            return FanoutReport(Operation.SAVE, policy_id, FanoutStatus.INVALID, revision,
                                error=start.refused)
        if start.overtaken:  # a newer revision is stored: its save is the one to make
            return await self._save(policy_id, allow_mass_removal, trigger, now=now)
        return start

    async def deliver_due(
        self, policy_id: str, clusters: Collection[ClusterId] | None = None, *,
        trigger: str = "rollout",
    ) -> FanoutReport:
        """Write each of `clusters` (None: every cluster of the policy's scope) what the
        policy's rollout in force makes it due now, at once, and record it: after a transition
        (the next wave, the end of a Warn step, a revert, an abort; `core.rollout.newly_due`
        says which clusters). A revision older than the cluster's is written over it (no read
        first: going back is the point); a cluster due no copy has the one it holds removed
        (a new policy's rollout sent back). Written here under this replica's fence, never by
        the other shard holders (they write only the policy's newest revision). A cluster due
        a revision that cannot be delivered (its content not kept, or not a valid policy in
        its boundary now) is left as it is, reported `skipped` (reason `undeliverable`) and the
        report `partial`. `NOT_FOUND` when the policy has no rollout in force. Raises
        `DatabaseUnavailable`."""
        started = time.monotonic()
        await self._stop_late(policy_id)
        staged = await self._store.staged_rollout(policy_id)
        if staged is None:
            return FanoutReport(Operation.SAVE, policy_id, FanoutStatus.NOT_FOUND,
                                error="no rollout in force")
        dues, contents = staged.dues(), staged.policies()
        chosen = sorted(dues if clusters is None else [c for c in clusters if c in dues])
        env = self._env()
        by_revision: dict[int, list[ClusterResult]] = {}
        jobs: list[Job] = []
        # A cluster due a revision whose content cannot be delivered (not kept, or not a valid
        # policy in its boundary now) keeps what it holds: only one due no copy has it removed.
        undeliverable = [c for c in chosen if dues[c].revision is not None and contents[c] is None]
        writable = [c for c in chosen if contents[c] is not None or dues[c].revision is None]
        for due_policy, group in _grouped((c, contents[c]) for c in writable):
            if due_policy is None:
                jobs += [(c, SaveAction.REMOVE, functools.partial(_remove_from, c, policy_id,
                                                                  env)) for c in group]
            else:
                jobs += save_jobs(due_policy, [Work(c, SaveAction.APPLY) for c in group], env)
        results = (await _fan_out(jobs, env)).results
        revision_of = {c: p.revision for c, p in contents.items() if p is not None}
        for r in results:
            by_revision.setdefault(revision_of.get(r.cluster, staged.rollout.to_revision),
                                   []).append(r)
        for revision, done in by_revision.items():
            await self._record(policy_id, revision, done, env)
        left = [ClusterResult(c, SaveAction.APPLY, FanoutResult.SKIPPED, UNDELIVERABLE,
                              f"revision {dues[c].revision} cannot be delivered (not kept, or "
                              "not a valid policy in its boundary now): the cluster keeps what "
                              "it holds") for c in undeliverable]
        if left:
            log.warning("policy %s: rollout %d: %d cluster(s) due a revision that cannot be "
                        "delivered were left as they are: %s", policy_id, staged.rollout.id,
                        len(left), named_clusters([r.cluster for r in left], len(left)),
                        extra={"policy": policy_id})
        results = sorted([*results, *left], key=_key)
        report = FanoutReport(Operation.SAVE, policy_id, FanoutStatus.OK,
                              staged.rollout.to_revision, results,
                              rollout=rollout_note_of(staged, len(dues), len(chosen)))
        if report.failed or left:
            report.status = FanoutStatus.PARTIAL
        log.info("policy %s: rollout %d (%s, wave %d): due revisions written (%s): %s",
                 policy_id, staged.rollout.id, staged.rollout.state, staged.rollout.wave,
                 trigger, summary(results),
                 extra={"policy": policy_id, "trigger": trigger,
                        "fanout_counts": counts(results)})
        self._observe(report, trigger, started)
        return report

    def _finish_later(
        self, policy_id: str, revision: int, fan: FanOut, env: FanoutEnv, trigger: str
    ) -> None:
        """Record the pending clusters' results when their writes end (by the save's
        deadline): what they did is recorded as if the save had waited for them."""
        assert fan.rest is not None
        rest, pending = fan.rest, {_key(r) for r in fan.pending}

        async def finish() -> None:
            try:
                done = [r for r in await rest if _key(r) in pending]
            except asyncio.CancelledError:
                # A newer save or the deletion of the policy: it writes those clusters itself.
                rest.cancel()
                await asyncio.gather(rest, return_exceptions=True)
                log.info("policy %s revision %d: the writes to its %d pending cluster(s) "
                         "stopped: the policy is saved or deleted again", policy_id, revision,
                         len(pending), extra={"policy": policy_id})
                raise
            await self._record(policy_id, revision, done, env)
            log.info("policy %s revision %d (%s): the %d cluster(s) pending when it answered: "
                     "%s", policy_id, revision, trigger, len(done), summary(done),
                     extra={"policy": policy_id, "trigger": trigger,
                            "fanout_counts": counts(done)})

        task = asyncio.create_task(finish(), name=f"save {policy_id} pending clusters")
        self._late[policy_id] = task
        task.add_done_callback(
            lambda t: self._late.pop(policy_id, None) if self._late.get(policy_id) is t else None)

    async def _stop_late(self, policy_id: str) -> None:
        task = self._late.get(policy_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def drain(self) -> None:
        """Wait for the writes still going after their saves answered (each ends by its
        save's deadline, so a stopping daemon waits at most that)."""
        while self._late:
            await asyncio.gather(*self._late.values(), return_exceptions=True)

    async def _overtaken(self, policy_id: str, revision: int) -> bool:
        """Whether the database holds a newer revision than `revision` now. Every writer
        (a save on any replica, a round) writes a revision it read from the database, so when
        none is newer, no cluster can hold a newer one this save wrote over."""
        try:
            current = (await self._store.current([PolicyId(policy_id)])).get(PolicyId(policy_id))
        except DatabaseUnavailable as exc:
            # Written already; a round puts the newest revision back within an interval.
            log.warning("policy %s: could not check for a newer revision after its save (%s)",
                        policy_id, exc, extra={"policy": policy_id})
            return False
        return current is not None and not current.deleting and current.revision > revision

    async def delete(self, policy_id: str) -> FanoutReport:
        """Raises `DatabaseUnavailable` when the deletion cannot be marked or finished."""
        started = time.monotonic()
        report = await self._delete(policy_id)
        self._observe(report, "api", started)
        return report

    async def _delete(self, policy_id: str) -> FanoutReport:
        target = await self._store.begin_deletion(policy_id)
        await self._stop_late(policy_id)  # after the mark: no save of it starts any more
        if target is None:
            return FanoutReport(Operation.DELETE, policy_id, FanoutStatus.NOT_FOUND,
                                error="no such policy")
        env = self._env()
        clusters = sorted(delete_targets(target))
        # A deletion waits for every cluster: the row goes only when all removed it.
        results = (await _fan_out(
            [(c, SaveAction.REMOVE, functools.partial(_remove_from, c, policy_id, env))
             for c in clusters], env)).results
        report = FanoutReport(Operation.DELETE, policy_id, FanoutStatus.OK, target.row.revision,
                              results)
        if report.failed:
            report.status = FanoutStatus.REFUSED
            await self._record(policy_id, target.row.revision, results, env)
            log.warning("policy %s not deleted: %d cluster(s) still hold it: %s", policy_id,
                        len(report.failed), named_failures(report.failed),
                        extra={"policy": policy_id, "fanout_counts": counts(results)})
            return report
        try:
            await self._store.finish_deletion(policy_id, [r.cluster for r in results])
        except DatabaseRejected as exc:
            # A cluster was recorded as holding it after the deletion began: the database
            # keeps the row until that one is removed too (a retry removes it there). The
            # clusters that did remove it are forgotten still.
            log.warning("policy %s: removed from %d cluster(s), but the database keeps the row:"
                        " %s", policy_id, len(results), exc, extra={"policy": policy_id})
            await self._record(policy_id, target.row.revision, results, env)
            report.status = FanoutStatus.REFUSED
            report.error = str(exc)
            return report
        log.info("policy %s deleted from %d cluster(s) and from the database", policy_id,
                 len(results), extra={"policy": policy_id})
        return report

    async def _record(
        self, policy_id: str, revision: int, results: Sequence[ClusterResult], env: FanoutEnv
    ) -> None:
        try:
            await self._store.record_deliveries(
                deliveries_of(results, policy_id, revision, env.calls.wall()))
            removed = [r.cluster for r in results if r.result is FanoutResult.REMOVED]
            await self._store.forget_deliveries(policy_id, removed)
        except DatabaseUnavailable as exc:
            # The clusters were written; the next round records what they hold.
            log.warning("policy %s: could not record the fan-out (%s)", policy_id, exc,
                        extra={"policy": policy_id})

    def _observe(self, report: FanoutReport, trigger: str, started: float) -> None:
        if self._observer is not None:
            self._observer.fanout_done(report.operation, trigger, report.status.value,
                                       time.monotonic() - started)


def _grouped(pairs: Iterable[tuple[ClusterId, Policy | None]]
             ) -> list[tuple[Policy | None, list[ClusterId]]]:
    """Clusters by the Policy object they are due (one object per content: `Staged.policies`
    shares them; a Policy is not hashable)."""
    groups: dict[int, tuple[Policy | None, list[ClusterId]]] = {}
    for cluster, policy in pairs:
        groups.setdefault(id(policy), (policy, []))[1].append(cluster)
    return list(groups.values())


def due_groups(policy: Policy, clusters: Collection[ClusterId], staged: Staged | None
               ) -> list[tuple[Policy, list[ClusterId]]]:
    """What a save writes where: without a rollout, `policy` to every cluster of `clusters`;
    with one, only the clusters its rollout makes due the saved revision (in the Warn step, in
    Warn), grouped by content; the others keep what they have (rounds keep them there)."""
    if staged is None:
        return [(policy, sorted(clusters))]
    dues = staged.policies()
    revision = staged.rollout.to_revision
    return [(p, group) for p, group in _grouped(
                (c, dues.get(c)) for c in sorted(clusters))
            if p is not None and p.revision == revision]


def rollout_note_of(staged: Staged, scope: int, now: int, *, started: bool = False
                    ) -> dict[str, Any]:
    rollout = staged.rollout
    return {"id": rollout.id, "state": rollout.state.value, "wave": rollout.wave,
            "wave_name": rollout.strategy.waves[rollout.wave].name, "started": started,
            "strategy": rollout.strategy.id, "clusters_written": now,
            "clusters_in_scope": scope}


def rollout_note(start: Start, scope: Collection[ClusterId],
                 groups: Sequence[tuple[Policy, list[ClusterId]]]) -> dict[str, Any] | None:
    """What a save's answer says of its rollout (None: no rollout, every cluster at once)."""
    if start.staged is None:
        return None
    return rollout_note_of(start.staged, len(scope), sum(len(g) for _, g in groups),
                           started=start.started)


def _rollout_line(note: Mapping[str, Any] | None) -> str:
    if note is None:
        return ""
    return (f"; rollout {note['id']} ({note['strategy']}, {note['state']}, wave {note['wave']} "
            f"{note['wave_name']}): {note['clusters_written']} of {note['clusters_in_scope']} "
            "clusters due this revision, the others keep theirs")


def counts(results: Iterable[ClusterResult]) -> dict[str, int]:
    """Clusters by action and result, `{"apply created": 97, "apply failed": 3}` (in the order
    of `Result`, applies first)."""
    found = Counter((r.action, r.result) for r in results)
    return {f"{action} {result.value}": found[action, result]
            for action in SaveAction for result in FanoutResult if found[action, result]}


def named_failures(results: Iterable[ClusterResult]) -> str:
    """The failed clusters with their reasons, at most `MAX_NAMED_CLUSTERS` (core.report), the
    rest counted: `"c0001 apply (timeout), c0002 remove (forbidden) and 3 more"`."""
    failed = [r for r in results if r.result is FanoutResult.FAILED]
    return named_clusters((f"{r.cluster} {r.action} ({r.reason or 'unknown'})" for r in failed),
                          len(failed))


def summary(results: Sequence[ClusterResult]) -> str:
    """One line of bounded length whatever the fleet's size: `"100 clusters: apply created 97,
    apply failed 3; failed: c0001 apply (timeout), ..."` (see `counts`, `named_failures`)."""
    if not results:
        return "no clusters"
    line = f"{len(results)} clusters: " + ", ".join(
        f"{key} {n}" for key, n in counts(results).items())
    failures = named_failures(results)
    return f"{line}; failed: {failures}" if failures else line
