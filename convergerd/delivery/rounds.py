"""The round loop: rounds under the Lease, one interval apart, each bounded by its deadline and
recorded in the database (see docs/design.md, "A round, from the database to a server-side
apply").

Per round: wait to lead (`once`: a bounded wait behind another leader), read the fleet (waiting
out a database that is down, up to the round's deadline), reload the kubeconfig, let the
replica's per-cluster state follow the fleet, run `converge.run_round` under the term's fence,
observe the report (metrics, status, one log line), record it. Leadership lost cancels the round
at once; SIGTERM gives it the grace period; a cancelled round still records what it did. No
database error ends the loop: "unavailable" is waited out (rounds kept to record later, a
bounded backlog), a permanent refusal drops that one record and is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import tenacity

from convergerd.config import RoundTuning, Settings
from convergerd.core.errors import ConfigError, DatabaseRejected, DatabaseUnavailable, Fenced
from convergerd.core.model import ClusterId, Fleet, InvalidPolicy
from convergerd.core.report import Epoch, RoundReport, utc_now
from convergerd.core.shards import shard_of
from convergerd.delivery.apply import ClusterSource, StopFence, cluster_calls
from convergerd.delivery.converge import Round, RoundLimits, WriteGuard, run_round
from convergerd.eventloop import SLICE_S, Pacer
from convergerd.leader.lease import Fence
from convergerd.leader.shards import Shard
from convergerd.retry import BackoffWait, RetryObserver, StopBefore
from convergerd.status.metrics import Metrics
from convergerd.supervise import first

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ROUNDS = RoundTuning()  # what a caller without its tuning gets


class RoundStore(Protocol):
    """What the loop reads and writes (`convergerd.store.store.Store`)."""

    async def load_fleet(self) -> Fleet: ...
    async def record_round(self, report: RoundReport, *, identity: str) -> int: ...


class RoundStatus(Protocol):
    """What the loop asks and tells the status state (`convergerd.status.state.StatusState`):
    which clusters to try last or may start last, and what each round found."""

    def suspects(self) -> list[ClusterId]: ...
    def caught_up(self) -> list[ClusterId]: ...
    def unreachable(self, cluster: ClusterId) -> bool: ...
    def set_next_round(self, at: dt.datetime | None) -> None: ...
    def observing(self, report: RoundReport) -> Iterator[None]: ...


class Clients(ClusterSource, Protocol):
    """The cluster clients (`convergerd.kube.registry.ClusterRegistry`)."""

    async def refresh(self) -> bool: ...


def invalid_to_log(
    invalid: Iterable[InvalidPolicy], seen: Collection[tuple[str, int]]
) -> tuple[list[InvalidPolicy], set[tuple[str, int]]]:
    """Invalid policies are logged once per revision while they stay invalid: which of this
    round's to log, and what to remember (this round's only, so a fixed or deleted policy is
    forgotten)."""
    current = {(bad.id, bad.revision): bad for bad in invalid}
    return [bad for key, bad in current.items() if key not in seen], set(current)


def shard_fleet(fleet: Fleet, *, shard: int, shards: int) -> Fleet:
    """The part of `fleet` one shard's round works on: its clusters (`core.shards.shard_of`),
    with every policy and boundary (a boundary's other clusters are simply not in it). The
    one shard of one is the whole fleet, as it is."""
    if shards == 1:
        return fleet
    return dataclasses.replace(
        fleet, clusters=[c for c in fleet.clusters if shard_of(c.id, shards) == shard])


def details(report: RoundReport) -> int:
    """How many deliveries and phase readings `report` holds."""
    return sum(len(c.deliveries) + len(c.phases) for c in (*report.clusters, *report.cut_short))


def backlog_kept(sizes: Sequence[int], *, rounds: int = DEFAULT_ROUNDS.unrecorded_backlog,
                 details_cap: int = DEFAULT_ROUNDS.unrecorded_details) -> int:
    """How many of the newest unrecorded rounds to keep, given each one's `details` (oldest
    first): at most `rounds`, and no more than `details_cap` together, but always the newest."""
    kept, total = 0, 0
    for size in reversed(sizes[-rounds:] if rounds > 0 else ()):
        if kept and total + size > details_cap:
            break
        kept += 1
        total += size
    return max(kept, 1) if sizes else 0


def round_env(
    settings: Settings,
    clusters: ClusterSource,
    fence: Fence,
    observer: RetryObserver,
    *,
    deadline_s: float,
    guard: WriteGuard | None = None,
    suspects: Iterable[ClusterId] = (),
    caught_up: Iterable[ClusterId] = (),
    suspected: Callable[[ClusterId], bool] | None = None,
    slots: asyncio.Semaphore | None = None,
) -> Round:
    """What a round of this daemon runs with: the settings' limits and `cluster_calls`. Pure
    wiring (tests build rounds with it too)."""
    return Round(
        clusters=clusters,
        calls=cluster_calls(settings, observer),
        fence=fence,
        limits=RoundLimits(
            deadline_s=deadline_s,
            cluster_concurrency=settings.rounds.cluster_concurrency,
            apply_concurrency=settings.clusters.apply_concurrency,
        ),
        guard=guard,
        suspects=frozenset(suspects),
        caught_up=frozenset(caught_up),
        suspected=suspected,
        slots=slots,
        tuning=settings.tuning.slots,
    )


class RoundLoop:
    """`run()` until `stopping` is set (or, with `settings.rounds.once`, after one round), on
    one shard (`convergerd.leader.shards.Shard`): rounds under its Lease, on its clusters.

    `follow(clusters, policies=...)` is told each round's fleet before it runs, so everything
    the replica keeps per cluster and per policy follows the database."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: RoundStore,
        clusters: Clients,
        shard: Shard,
        metrics: Metrics,
        state: RoundStatus,
        stopping: asyncio.Event,
        identity: str,
        follow: Callable[..., Awaitable[None]],
        guard: WriteGuard | None = None,
    ) -> None:
        """`guard`: the database, asked at write time so a round never writes over a newer save
        nor re-creates a policy whose deletion began (see `converge`).

        `shard`: a round waits for its elector's term and writes under its fence, works on
        its clusters of the fleet (`follow` still gets the whole fleet), holds its round lock
        while it runs (a hand-back lets it finish first) and takes its `slots`."""
        self.settings = settings
        self.tuning = settings.tuning.rounds
        self.store = store
        self.clusters = clusters
        self.shard = shard
        self.metrics = metrics
        self.state = state
        self.stopping = stopping
        self.identity = identity
        self.follow = follow
        self.guard = guard
        # `once`: whether the Lease was had (a round ran); False: it was not.
        self.got_lease: bool | None = None
        # The last round observed, without its per-policy details (`RoundReport.summary`).
        self.last_report: RoundReport | None = None
        self.seen_invalid: set[tuple[str, int]] = set()
        self.unrecorded: list[RoundReport] = []
        # Health: loop time of the last step (None: not running, or waiting for the Lease,
        # which is the elector's health, not this loop's), and the database calls in flight.
        self._busy_since: float | None = None
        self._in_database = 0

    def problem(self) -> str | None:
        """Why the round loop is stuck, for `/healthz`; None while it works, waits to lead or
        waits on the database."""
        since = self._busy_since
        if since is None or self._in_database:
            return None
        stuck_s = asyncio.get_running_loop().time() - since
        limit_s = self.tuning.stuck_after_intervals * self.settings.rounds.interval_s
        if stuck_s <= limit_s:
            return None
        return (f"round loop stuck: no round started or ended for {stuck_s:.0f} s "
                f"(limit {limit_s:g} s) while leading")

    def _step(self, *, waiting: bool = False) -> None:
        self._busy_since = None if waiting else asyncio.get_running_loop().time()

    async def _database(self, call: Callable[[], Awaitable[T]]) -> T:
        """A call to the database: waiting on it is not the loop being stuck, and its end is
        a step."""
        self._in_database += 1
        try:
            return await call()
        finally:
            self._in_database -= 1
            if self._busy_since is not None:
                self._step()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self._busy_since = None

    async def _run(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            self._step(waiting=True)
            leading = asyncio.ensure_future(self.shard.elector.wait_leading())
            waits: list[Awaitable[Any]] = [leading, self.stopping.wait()]
            if s.rounds.once:
                # A `once` Job must not wait forever behind a running daemon: a dead holder's
                # lease is taken within lease duration + retry period (< this bound).
                e = s.election
                waits.append(asyncio.sleep(e.lease_duration_s + e.renew_deadline_s))
            await first(*waits)
            if self.stopping.is_set():
                break
            if leading.cancelled():
                log.error(
                    "not converged: did not get the Lease %s within %g s: %s leads; "
                    "a round runs under one leader at a time",
                    self.shard.lease, s.election.lease_duration_s + s.election.renew_deadline_s,
                    self.shard.elector.leader or "another replica",
                )
                self.got_lease = False
                break
            epoch = leading.result()
            async with self.shard.round_lock:
                if self.shard.elector.epoch != epoch:
                    continue  # handed back (or lost) while waiting for the lock
                self.got_lease = True
                self._step()
                started = loop.time()
                # Known from the start: the next round starts one interval after this one
                # did (at once if it overruns), so status never shows none while one runs.
                self.state.set_next_round(
                    utc_now() + dt.timedelta(seconds=s.rounds.interval_s))
                report = await self._guarded(epoch)
                await self._observe(report)
                # A round outlives its record only as its summary: while the next one is
                # built, its details (the status state keeps them compactly) are not held twice.
                self.last_report = report.summary()
                await self._record(report)
                del report
                self._step()
            if s.rounds.once:
                return
            next_at = started + s.rounds.interval_s
            self.state.set_next_round(utc_now() + dt.timedelta(seconds=next_at - loop.time()))
            await first(asyncio.sleep(max(0.0, next_at - loop.time())), self.stopping.wait())

    async def _guarded(self, epoch: Epoch) -> RoundReport:
        """Run one round; cancel it the moment leadership is lost; on SIGTERM let it finish
        within the grace period."""
        # Filled in as the round goes: a cancelled round still records what it did.
        progress = RoundReport(started_at=utc_now(), epoch=epoch)
        round_task = asyncio.create_task(self._one(epoch, progress))
        lost = asyncio.ensure_future(self.shard.elector.wait_lost(epoch))
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({round_task, lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done() and not round_task.done():
                await asyncio.wait({round_task, lost}, timeout=self.settings.grace_period_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            if not round_task.done():
                why = "leadership lost" if lost.done() else "grace period over"
                log.warning("cancelling the running round: %s", why)
                round_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await round_task
                return _cut(progress, why)
            return round_task.result()
        finally:
            lost.cancel()
            stopping.cancel()

    async def _one(self, epoch: Epoch, progress: RoundReport) -> RoundReport:
        s = self.settings
        loop = asyncio.get_running_loop()
        started = progress.started_at
        deadline = loop.time() + s.rounds.deadline_s
        try:
            fleet = await self._load_fleet(deadline)
        except DatabaseUnavailable as exc:
            return RoundReport(started_at=started, finished_at=utc_now(), epoch=epoch,
                               error=f"database unavailable: {exc}")
        except DatabaseRejected as exc:
            log.error("round not run: could not read the fleet (%s)", exc,  # noqa: TRY400
                      extra={"reason": exc.reason})
            return RoundReport(started_at=started, finished_at=utc_now(), epoch=epoch,
                               error=f"database refused: {exc}")
        self._note_invalid(fleet)
        await self._reload_kubeconfig()
        await self.follow(
            [c.id for c in fleet.clusters],
            policies=[p.id for p in fleet.policies] + [p.id for p in fleet.invalid],
        )
        fleet = shard_fleet(fleet, shard=self.shard.index, shards=self.shard.count)
        env = round_env(
            s, self.clusters, StopFence(self.shard.elector.fence(epoch), self.stopping),
            self.metrics,
            deadline_s=max(0.0, deadline - loop.time()), guard=self.guard,
            suspects=self.state.suspects(),
            caught_up=self.state.caught_up(),
            suspected=self._unreachable_now,
            slots=self.shard.slots,
        )
        try:
            report = await run_round(fleet, env, epoch=epoch, report=progress)
        except Fenced as exc:
            log.warning("round stopped: this replica may no longer write (%s)", exc)
            return _cut(progress, f"fenced: {exc}")
        report.started_at = started
        return report

    def _unreachable_now(self, cluster: ClusterId) -> bool:
        return self.state.unreachable(cluster)

    async def _reload_kubeconfig(self) -> None:
        """Rotated credentials (the kubeconfig Secret updated in place) count from the next
        round on; a file that cannot be read keeps the last good one."""
        try:
            await self.clusters.refresh()
        except ConfigError as exc:
            log.warning("kubeconfig not reloaded, keeping the last good one: %s", exc)

    async def _load_fleet(self, deadline: float) -> Fleet:
        """A database that is down makes the round wait and retry, up to its deadline."""
        async for attempt in database_retrying(
                DatabaseUnavailable, stop=StopBefore(deadline, asyncio.get_running_loop().time),
                tuning=self.tuning):
            with attempt:
                return await self._database(self.store.load_fleet)
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    def _note_invalid(self, fleet: Fleet) -> None:
        """Invalid policies are logged once per revision, not every round."""
        new, self.seen_invalid = invalid_to_log(fleet.invalid, self.seen_invalid)
        for bad in new:
            log.warning("policy %r (revision %d) is invalid and will not be delivered: %s",
                        bad.id, bad.revision, bad.reason)

    async def _observe(self, report: RoundReport) -> None:
        await observe_round(report, metrics=self.metrics, state=self.state)
        counts = report.counts()
        duration = (
            (report.finished_at - report.started_at).total_seconds() if report.finished_at else 0
        )
        # Clusters the deadline came before are not "unreached": nothing is known of them
        # (`/status` and `convergerd_cluster_up` keep what the prober last heard).
        cut = sum(c.cut_unanswered for c in report.clusters)
        log.info(
            "round%s %s in %.1f s: %d clusters, %d converged, %d unreached, %d not reached "
            "before the deadline; applied %d created, %d updated, %d failed; %d invalid "
            "policies%s",
            "" if self.shard.number is None else f" of shard {self.shard.number}",
            report.result.value, duration, counts["clusters"], counts["converged"],
            counts["unreached"] - cut, cut, counts["created"], counts["updated"],
            counts["failed"], counts["invalid"], f"; {report.error}" if report.error else "",
            extra={"round_result": report.result.value, "round_counts": counts,
                   "round_cut_unanswered": cut, "shard": self.shard.number},
        )

    async def _record(self, report: RoundReport) -> None:
        """Record this round and any earlier one the database missed; keep what fails."""
        self.unrecorded.append(report)
        while self.unrecorded:
            pending = self.unrecorded[0]
            try:
                await self._database(
                    functools.partial(self.store.record_round, pending, identity=self.identity))
            except DatabaseUnavailable as exc:
                kept = backlog_kept([details(r) for r in self.unrecorded],
                                    rounds=self.tuning.unrecorded_backlog,
                                    details_cap=self.tuning.unrecorded_details)
                del self.unrecorded[:len(self.unrecorded) - kept]
                log.warning("could not record round (database unavailable: %s); "
                            "%d round(s) kept to record later", exc, len(self.unrecorded))
                return
            except DatabaseRejected as exc:
                # It would be refused again: dropped, so later rounds are not held behind it.
                log.error(  # noqa: TRY400 - a refusal, not a bug: the reason is the story
                    "round of %s not recorded, dropped: %s", pending.started_at.isoformat(),
                    exc, extra={"reason": exc.reason})
                self.metrics.record_refused(exc.reason)
            except Exception:
                # Not the database's doing (a bug): the same, with the traceback.
                log.exception("round of %s not recorded, dropped: unexpected error",
                              pending.started_at.isoformat())
                self.metrics.record_refused("internal")
            self.unrecorded.pop(0)


async def observe_round(report: RoundReport, *, metrics: Metrics, state: RoundStatus,
                        slice_s: float = SLICE_S) -> None:
    """Feed `report` to the metrics and the status a cluster at a time, giving the loop back
    whenever `slice_s` passed (`Metrics.observing`, `StatusState.observing` say what a reader
    sees in between)."""
    pacer = Pacer(slice_s)
    for _ in itertools.chain(metrics.observing(report), state.observing(report)):
        await pacer.pause()


def database_retrying(
    errors: type[Exception] | tuple[type[Exception], ...], *,
    stop: tenacity.stop.stop_base = tenacity.stop_never,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    tuning: RoundTuning = DEFAULT_ROUNDS,
) -> tenacity.AsyncRetrying:
    """Waiting out a database that is down (startup and rounds alike): tenacity retries on
    `errors`, waits from `RoundTuning.db_backoff_base_s` up to `db_backoff_cap_s` (full
    jitter, `retry.backoff_s`) and logs each wait; the last error is raised as is."""
    wait = BackoffWait(base=tuning.db_backoff_base_s, cap=tuning.db_backoff_cap_s)
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(errors), wait=wait, stop=stop,
        sleep=sleep, before_sleep=_log_database_wait, reraise=True)


def _log_database_wait(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    what = "refused" if isinstance(exc, DatabaseRejected) else "unavailable"
    log.warning("database %s (%s); retrying in %.1f s", what, exc, state.upcoming_sleep)


def _cut(progress: RoundReport, why: str) -> RoundReport:
    """A round cancelled mid-way (`why`): what it finished, and what it did on the clusters it
    did not (`cut_short`), both still recorded."""
    progress.cancelled = True
    progress.error = why
    progress.finished_at = progress.finished_at or utc_now()
    return progress
