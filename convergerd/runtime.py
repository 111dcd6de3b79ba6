"""The one place that wires the components and supervises their tasks.

Tasks: the elector (Lease), the round loop, the reachability prober, the health heartbeat and
the HTTP server. A crash in any supervised task stops the process (Kubernetes restarts it);
SIGTERM/SIGINT only set a flag: no new round starts, the running one gets the grace period,
the Lease is released so a standby takes over at once, pools close, exit 0. A second signal
exits at once. The Lease is released on every way out (a crashed task, an unexpected error
too), within a bounded time.

No database error ends the process: "unavailable" is waited out and retried; a permanent
refusal (`DatabaseRejected`) drops that one write or read, is logged and counted
(`convergerd_record_failures_total`), and the loops go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import os
import random
import signal
from collections.abc import Awaitable, Callable, Collection, Iterable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

from aiohttp import web

from convergerd import __version__
from convergerd.config import SETTINGS_BY_KEY, Settings, in_cluster
from convergerd.converge import ClusterSource, Round, RoundLimits, run_round
from convergerd.errors import (
    ConfigError,
    DatabaseRejected,
    DatabaseUnavailable,
    Fenced,
    NoCredentials,
)
from convergerd.http import HealthCheck, make_app, server_options
from convergerd.kube.registry import HOME_IN_CLUSTER, ClusterRegistry
from convergerd.leader import Elector, Leadership, NoElection
from convergerd.lease import Fence
from convergerd.metrics import Metrics
from convergerd.model import Fleet, InvalidPolicy
from convergerd.probe import Prober
from convergerd.report import Epoch, RoundReport, RoundResult
from convergerd.retry import RetryObserver, call_with_retries
from convergerd.state import StatusState
from convergerd.statussync import StatusSync
from convergerd.store.store import Store

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_NOT_CONVERGED = 1
T = TypeVar("T")

# Waiting for the database: from one second up to half a minute between attempts.
_DB_BACKOFF_BASE_S = 1.0
_DB_BACKOFF_CAP_S = 30.0
# Reachability checks between rounds (convergerd.probe): one GET /version per cluster.
PROBE_PERIOD_S = 10.0
# The database sync of the live status (every replica): at most this long between passes.
STATUS_SYNC_PERIOD_S = 30.0


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def _first(*aws: Awaitable[Any]) -> None:
    """Wait until any of `aws` completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def invalid_to_log(
    invalid: Iterable[InvalidPolicy], seen: Collection[tuple[str, int]]
) -> tuple[list[InvalidPolicy], set[tuple[str, int]]]:
    """Invalid policies are logged once per revision while they stay invalid: which of this
    round's to log, and what to remember (this round's only, so a fixed or deleted policy is
    forgotten)."""
    current = {(bad.id, bad.revision): bad for bad in invalid}
    return [bad for key, bad in current.items() if key not in seen], set(current)


def round_env(
    settings: Settings,
    clusters: ClusterSource,
    fence: Fence,
    observer: RetryObserver,
    *,
    deadline_s: float,
) -> Round:
    """What a round of this daemon runs with: the settings' limits, the retry policy
    reporting to `observer`, the loop's clock. Pure wiring (tests build rounds with it too)."""
    return Round(
        clusters=clusters,
        retrier=functools.partial(call_with_retries, observer=observer),
        fence=fence,
        limits=RoundLimits(
            deadline_s=deadline_s,
            cluster_concurrency=settings.rounds.cluster_concurrency,
            apply_concurrency=settings.clusters.apply_concurrency,
            request_timeout_s=settings.clusters.request_timeout_s,
        ),
        clock=asyncio.get_running_loop().time,
        wall=_utcnow,
    )


class StopFence:
    """The leader's fence, also closed once the daemon is stopping: on SIGTERM the writes in
    flight finish, and no new write (nor retry) starts, so a standby can take over at once."""

    def __init__(self, fence: Fence, stopping: asyncio.Event) -> None:
        self._fence = fence
        self._stopping = stopping

    def remaining_s(self) -> float:
        if self._stopping.is_set():
            raise Fenced("shutting down: no new writes")
        return self._fence.remaining_s()


class Daemon:
    """`convergerd run` and `convergerd once`."""

    def __init__(self, settings: Settings, *, probe_period_s: float = PROBE_PERIOD_S) -> None:
        """`probe_period_s`: how often the reachability prober checks every cluster (tests
        shorten it; the default keeps "up 0 within 30 s" with the default timeouts)."""
        self.settings = settings
        self.probe_period_s = probe_period_s
        self.identity = settings.election.identity
        self.stopping = asyncio.Event()
        e = settings.election
        self.metrics = Metrics(
            interval_s=settings.rounds.interval_s,
            keep=[e.home_context or HOME_IN_CLUSTER] if e.enabled else [],
        )
        self.state = StatusState(
            identity=self.identity, interval_s=settings.rounds.interval_s
        )
        self.health = HealthCheck()
        self._signals = 0
        self._seen_invalid: set[tuple[str, int]] = set()
        self.registry: ClusterRegistry | None = None  # set by main()
        self.prober: Prober | None = None
        self._unrecorded: list[RoundReport] = []
        self._released = False
        self.last_report: RoundReport | None = None

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal (%s): exiting now", signal.Signals(signum).name)
            os._exit(128 + signum)
        log.info(
            "%s received: finishing current writes (grace %.0f s), then releasing the Lease",
            signal.Signals(signum).name, self.settings.grace_period_s,
        )
        self.stopping.set()

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    # -- setup -----------------------------------------------------------------------------

    def _check_setup(self) -> None:
        s = self.settings
        if s.database_url is None:
            raise ConfigError(SETTINGS_BY_KEY["database_url"].env, None,
                              "required: the PostgreSQL DSN of the policy database")
        if s.clusters.kubeconfig is None:
            raise ConfigError(SETTINGS_BY_KEY["kubeconfig"].env, None,
                              "required: a kubeconfig with one context per member cluster")
        if s.election.enabled and s.election.home_context is None and not in_cluster():
            raise ConfigError(
                SETTINGS_BY_KEY["home_context"].env, None,
                "leader election needs the home cluster holding the Lease, and this process "
                "is not running in a cluster: set CONVERGERD_HOME_CONTEXT to its kubeconfig "
                "context, or CONVERGERD_LEADER_ELECTION=false for a single replica",
            )

    async def _connect_store(self) -> Store | None:
        """Wait for the database (logging each failure once per attempt); None if stopped."""
        assert self.settings.database_url is not None
        attempt = 0
        while not self.stopping.is_set():
            try:
                return await Store.connect(self.settings.database_url, observer=self.metrics)
            except (DatabaseUnavailable, DatabaseRejected) as exc:
                # Refused (e.g. a privilege revoked on the schema): an operator fixes it; a
                # process that waits is fixed with it, one that exits crash-loops meanwhile.
                attempt += 1
                wait = min(_DB_BACKOFF_CAP_S, _DB_BACKOFF_BASE_S * 2**attempt)
                what = "unavailable" if isinstance(exc, DatabaseUnavailable) else "refused"
                log.warning("database %s (%s); retrying in %.0f s", what, exc, wait)
                await _first(asyncio.sleep(wait), self.stopping.wait())
        return None

    # -- the main job ----------------------------------------------------------------------

    async def main(self) -> int:
        self._check_setup()
        self._install_signals()
        s = self.settings
        async with AsyncExitStack() as stack:
            store = await self._connect_store()
            if store is None:
                return EXIT_OK
            stack.push_async_callback(store.close)

            registry = ClusterRegistry(
                kubeconfig=s.clusters.kubeconfig, access=s.clusters,
                identity=self.identity, observer=self.metrics,
                on_insecure=self.metrics.set_cluster_insecure,
            )
            stack.push_async_callback(registry.close)
            self.registry = registry
            elector = self._elector(registry)
            # Pushed after `registry.close`, so it runs before: the Lease is written through
            # the registry's home client. Runs on every way out of this block.
            stack.push_async_callback(self._release, elector)
            self.state.set_leader_source(elector)

            if not s.rounds.once:
                runner = await self._start_http(store)
                stack.push_async_callback(runner.cleanup)

            # The clusters the database knows and what was recorded (by whoever led): lag
            # survives restarts, standbys show the leader's results, a deleted cluster leaves.
            # A database that is down leaves what this replica knows (rounds wait for it).
            sync = StatusSync(store=store, state=self.state, metrics=self.metrics,
                              on_clusters=self._follow_database)
            await sync.once()
            prober = Prober(
                clusters=self._probe_targets(registry),
                metrics=self.metrics, state=self.state,
                period_s=self.probe_period_s, timeout_s=s.clusters.request_timeout_s,
            )
            self.prober = prober
            async with asyncio.TaskGroup() as tg:
                supervised = [
                    tg.create_task(elector.run(), name="elector"),
                    tg.create_task(self.health.heartbeat(), name="heartbeat"),
                ]
                if not s.rounds.once:
                    supervised.append(tg.create_task(prober.run(), name="prober"))
                    supervised.append(tg.create_task(
                        sync.run(self._status_sync_period_s(), wait_first=True),
                        name="status sync"))
                self.health.watch(supervised)
                await self._rounds(store, registry, elector)
                await self._release(elector)  # at once: a standby takes over sooner
                for task in supervised:
                    task.cancel()
        return self._exit_code()

    async def _release(self, elector: Leadership) -> None:
        """Release the Lease (if held), bounded in time: a wait for a renewal in flight and
        two requests. Once per process (the exit path calls it again). Never raises: the process
        is on its way out, and an unreleased Lease only costs the standby the lease duration."""
        if self._released:
            return
        self._released = True
        bound = 3 * self.settings.election.request_timeout_s + 1.0
        try:
            async with asyncio.timeout(bound):
                await elector.release()
        except Exception as exc:
            log.warning("could not release the Lease within %.1f s: %s (%s)", bound,
                        type(exc).__name__, exc)

    def _exit_code(self) -> int:
        if not self.settings.rounds.once:
            return EXIT_OK
        report = self.last_report
        if report is None:
            return EXIT_NOT_CONVERGED
        if report.result is not RoundResult.OK:
            for c in report.clusters:
                if not c.converged:
                    reason = c.error or f"{c.failed} of {c.desired} policies failed"
                    log.error("not converged: cluster %s: %s", c.cluster, reason)
            return EXIT_NOT_CONVERGED
        return EXIT_OK

    def _elector(self, registry: ClusterRegistry) -> Leadership:
        e = self.settings.election
        if not e.enabled:
            log.warning(
                "LEADER ELECTION IS OFF (CONVERGERD_LEADER_ELECTION=false): run exactly one "
                "replica, or two replicas will write at once"
            )
            return NoElection(identity=self.identity, on_change=self.metrics.set_leader)
        return Elector(
            registry.home_lease(e.home_context), e, on_change=self.metrics.set_leader,
        )

    def _probe_targets(self, registry: ClusterRegistry) -> Callable[[], Any]:
        def targets() -> dict[str, Any]:
            result: dict[str, Any] = {}
            for cluster in self.state.cluster_ids():
                with contextlib.suppress(NoCredentials):  # no context: reported by rounds
                    result[cluster] = registry.get(cluster)
            return result

        return targets

    async def _start_http(self, store: Store) -> web.AppRunner:
        s = self.settings
        app = make_app(
            metrics=self.metrics, state=self.state, store=store, settings=s, health=self.health
        )
        runner = web.AppRunner(app, **server_options())
        await runner.setup()
        await web.TCPSite(runner, s.http_host, s.http_port).start()
        log.info(
            "convergerd %s (%s) serving health, metrics and status on %s:%d",
            __version__, self.identity, s.http_host, s.http_port,
        )
        return runner

    def _status_sync_period_s(self) -> float:
        return min(self.settings.rounds.interval_s, STATUS_SYNC_PERIOD_S)

    # -- rounds ----------------------------------------------------------------------------

    async def _rounds(
        self, store: Store, registry: ClusterRegistry, elector: Leadership
    ) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            leading = asyncio.ensure_future(elector.wait_leading())
            waits: list[Awaitable[Any]] = [leading, self.stopping.wait()]
            if s.rounds.once:
                # A `once` Job must not wait forever behind a running daemon: a dead holder's
                # lease is taken within lease duration + retry period (< this bound).
                e = s.election
                waits.append(asyncio.sleep(e.lease_duration_s + e.renew_deadline_s))
            await _first(*waits)
            if self.stopping.is_set():
                break
            if leading.cancelled():
                log.error(
                    "not converged: did not get the Lease within %g s: %s leads; "
                    "a round runs under one leader at a time",
                    s.election.lease_duration_s + s.election.renew_deadline_s,
                    elector.leader or "another replica",
                )
                break
            epoch = leading.result()
            started = loop.time()
            # Known from the start: the next round starts one interval after this one did
            # (at once if this one overruns), so status never shows none while a round runs.
            self.state.set_next_round(_utcnow() + dt.timedelta(seconds=s.rounds.interval_s))
            report = await self._guarded_round(store, registry, elector, epoch)
            self.last_report = report
            self._observe(report)
            await self._record(store, report)
            if s.rounds.once:
                return
            next_at = started + s.rounds.interval_s
            self.state.set_next_round(_utcnow() + dt.timedelta(seconds=next_at - loop.time()))
            await _first(asyncio.sleep(max(0.0, next_at - loop.time())), self.stopping.wait())

    async def _guarded_round(
        self, store: Store, registry: ClusterRegistry, elector: Leadership, epoch: Epoch
    ) -> RoundReport:
        """Run one round; cancel it the moment leadership is lost; on SIGTERM let it finish
        within the grace period."""
        # Filled in as the round goes: a cancelled round still records what it did.
        progress = RoundReport(started_at=_utcnow(), epoch=epoch)
        round_task = asyncio.create_task(
            self._one_round(store, registry, elector, epoch, progress))
        lost = asyncio.ensure_future(elector.wait_lost(epoch))
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

    async def _one_round(
        self, store: Store, registry: ClusterRegistry, elector: Leadership, epoch: Epoch,
        progress: RoundReport,
    ) -> RoundReport:
        s = self.settings
        loop = asyncio.get_running_loop()
        started = progress.started_at
        deadline = loop.time() + s.rounds.deadline_s
        try:
            fleet = await self._load_fleet(store, deadline)
        except DatabaseUnavailable as exc:
            return RoundReport(started_at=started, finished_at=_utcnow(), epoch=epoch,
                               error=f"database unavailable: {exc}")
        except DatabaseRejected as exc:
            log.error("round not run: could not read the fleet (%s)", exc,  # noqa: TRY400
                      extra={"reason": exc.reason})
            return RoundReport(started_at=started, finished_at=_utcnow(), epoch=epoch,
                               error=f"database refused: {exc}")
        self._note_invalid(fleet)
        await self._reload_kubeconfig(registry)
        await self._follow_database(
            [c.id for c in fleet.clusters],
            policies=[p.id for p in fleet.policies] + [p.id for p in fleet.invalid],
        )
        env = round_env(
            s, registry, StopFence(elector.fence(epoch), self.stopping), self.metrics,
            deadline_s=max(0.0, deadline - loop.time()),
        )
        try:
            report = await run_round(fleet, env, epoch=epoch, report=progress)
        except Fenced as exc:
            log.warning("round stopped: this replica may no longer write (%s)", exc)
            return _cut(progress, f"fenced: {exc}")
        report.started_at = started
        return report

    async def _follow_database(
        self, clusters: Collection[str], *, policies: Collection[str] | None = None
    ) -> None:
        """The one place where what this replica keeps per cluster and per policy follows the
        database: status, metrics and cluster clients keep the clusters it lists and drop the
        rest; given the round's fleet, status drops the records of deleted policies too. (The
        prober forgets the clusters it no longer probes by itself, each pass.)"""
        self.state.set_clusters(clusters)
        self.metrics.set_clusters(clusters)
        if self.registry is not None:
            await self.registry.retain(clusters)
        if policies is not None:
            self.state.retain_policies(policies)

    def sizes(self) -> dict[str, int]:
        """How much per-cluster, per-policy and per-client state this replica holds: the soak
        benchmark checks these stay flat over rounds."""
        sizes = {
            "status_clusters": len(self.state.clusters),
            "status_policy_records": sum(len(c.policies) for c in self.state.clusters.values()),
            "seen_invalid": len(self._seen_invalid),
            "unrecorded_rounds": len(self._unrecorded),
            "prober_clusters": len(self.prober) if self.prober is not None else 0,
            **{f"metrics_{k}": v for k, v in self.metrics.sizes().items()},
        }
        if self.registry is not None:
            sizes.update({f"registry_{k}": v for k, v in self.registry.sizes().items()})
        return sizes

    async def _reload_kubeconfig(self, registry: ClusterRegistry) -> None:
        """Rotated credentials (the kubeconfig Secret updated in place) count from the next
        round on; a file that cannot be read keeps the last good one."""
        try:
            await registry.refresh()
        except ConfigError as exc:
            log.warning("kubeconfig not reloaded, keeping the last good one: %s", exc)

    async def _load_fleet(self, store: Store, deadline: float) -> Fleet:
        """A database that is down makes the round wait and retry, up to its deadline."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                return await store.load_fleet()
            except DatabaseUnavailable as exc:
                attempt += 1
                wait = random.uniform(0, min(_DB_BACKOFF_CAP_S, _DB_BACKOFF_BASE_S * 2**attempt))
                if loop.time() + wait >= deadline:
                    raise
                log.warning("database unavailable (%s); retrying in %.1f s", exc, wait)
                await asyncio.sleep(wait)

    def _note_invalid(self, fleet: Fleet) -> None:
        """Invalid policies are logged once per revision, not every round."""
        new, self._seen_invalid = invalid_to_log(fleet.invalid, self._seen_invalid)
        for bad in new:
            log.warning("policy %r (revision %d) is invalid and will not be delivered: %s",
                        bad.id, bad.revision, bad.reason)

    def _observe(self, report: RoundReport) -> None:
        self.metrics.observe_round(report)
        self.state.observe_round(report)
        counts = report.counts()
        duration = (
            (report.finished_at - report.started_at).total_seconds() if report.finished_at else 0
        )
        log.info(
            "round %s in %.1f s: %d clusters, %d converged, %d unreached; applied %d created, "
            "%d updated, %d failed; %d invalid policies%s",
            report.result.value, duration, counts["clusters"], counts["converged"],
            counts["unreached"], counts["created"], counts["updated"], counts["failed"],
            counts["invalid"], f"; {report.error}" if report.error else "",
            extra={"round_result": report.result.value, "round_counts": counts},
        )

    async def _record(self, store: Store, report: RoundReport) -> None:
        """Record this round and any earlier one the database missed; keep what fails."""
        self._unrecorded.append(report)
        while self._unrecorded:
            pending = self._unrecorded[0]
            try:
                await store.record_round(pending, identity=self.identity)
            except DatabaseUnavailable as exc:
                # Keep a bounded backlog: the newest rounds matter most for status.
                del self._unrecorded[:-10]
                log.warning("could not record round (database unavailable: %s); "
                            "%d round(s) kept to record later", exc, len(self._unrecorded))
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
            self._unrecorded.pop(0)


def _cut(progress: RoundReport, why: str) -> RoundReport:
    """A round cancelled mid-way (`why`): what it finished, and what it did on the clusters it
    did not (`cut_short`), both still recorded."""
    progress.cancelled = True
    progress.error = why
    progress.finished_at = progress.finished_at or _utcnow()
    return progress


async def run_daemon(settings: Settings) -> int:
    return await Daemon(settings).main()
