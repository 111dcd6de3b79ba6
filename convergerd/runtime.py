"""The one place that wires the components and supervises their tasks.

Tasks: the shard set (the Leases; one, the configured Lease, by default), a round loop per
shard, the reachability prober, the health heartbeat, the HTTP server, the database
notification listener, and on the leader the revision retention and the rollouts' gate job. A
crash in any supervised task stops the process (Kubernetes restarts it); SIGTERM/SIGINT only
set a flag: no new round starts, the running one gets the grace period, the Lease is released
so a standby takes over at once, pools close, exit 0. A second signal exits at once. The Lease
is released on every way out (a crashed task, an unexpected error too), within a bounded time.

No database error ends the process: "unavailable" is waited out and retried; a permanent
refusal (`DatabaseRejected`) drops that one write or read, is logged and counted
(`convergerd_record_failures_total`), and the loops go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Collection
from contextlib import AsyncExitStack
from typing import Any

from aiohttp import web

from convergerd import __version__
from convergerd.api.app import make_app
from convergerd.api.auth import TokenBook
from convergerd.api.server import serve
from convergerd.config import SETTINGS_BY_KEY, Settings, in_cluster
from convergerd.core.errors import (
    ConfigError,
    DatabaseRejected,
    DatabaseUnavailable,
    NoCredentials,
)
from convergerd.core.model import ClusterId
from convergerd.core.report import RoundReport, RoundResult
from convergerd.core.shown import describe
from convergerd.delivery.apply import StopFence, Unfenced
from convergerd.delivery.fanout import FanoutEnv, Saver, fanout_env
from convergerd.delivery.lapse import Lapses
from convergerd.delivery.listener import Listener
from convergerd.delivery.rollouts import RolloutGates
from convergerd.delivery.rounds import RoundLoop, database_retrying
from convergerd.delivery.spread import Peers
from convergerd.kube.registry import HOME_IN_CLUSTER, ClusterRegistry
from convergerd.leader.lease import Fence
from convergerd.leader.shards import Shard, ShardSet, ShardView
from convergerd.status.metrics import FanoutMetrics, Metrics, ReadinessMetrics
from convergerd.status.probe import Answers, Prober
from convergerd.status.state import StatusState
from convergerd.status.sync import StatusSync
from convergerd.store.notify import PgNotifications
from convergerd.store.revisions import Pruner
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck, first

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_NOT_CONVERGED = 1


class Daemon:
    """`convergerd run` and `convergerd once`."""

    def __init__(self, settings: Settings, *, probe_period_s: float | None = None) -> None:
        """`probe_period_s`: how often the reachability prober checks every cluster (default
        `CONVERGERD_PROBE_PERIOD_SECONDS`, 10 s, which keeps "up 0 within 30 s" with the default
        timeouts; tests shorten it)."""
        self.settings = settings
        self.probe_period_s = probe_period_s or settings.probe_period_s
        self.identity = settings.election.identity
        self.stopping = asyncio.Event()
        e = settings.election
        # The home cluster is no fleet member, but its Lease requests are counted.
        self.state = StatusState(
            identity=self.identity, interval_s=settings.rounds.interval_s,
            probe_period_s=settings.operator_probe_period_s, shards=e.shards,
            keep=[e.home_context or HOME_IN_CLUSTER] if e.enabled else [],
        )
        # Counters and histograms; every gauge is read from the state when scraped.
        self.metrics = Metrics(state=self.state,
                               approval_alert_s=settings.rollouts.approval_alert_s)
        self.health = HealthCheck(on_lag=self.metrics.set_loop_lag)
        self.fanout_metrics = FanoutMetrics()
        self.metrics.register(self.fanout_metrics)
        self.metrics.register(ReadinessMetrics(self.health.not_ready, self.state))
        # The last round's policies: a notification naming another one has a small budget
        # (`delivery.listener`), so made-up ids cannot crowd out real ones.
        self.known_policies: frozenset[str] = frozenset()
        self._signals = 0
        self.registry: ClusterRegistry | None = None  # set by main()
        self.prober: Prober | None = None
        self.answers: Answers | None = None  # set by main(): requests answered, saves expected
        self._released = False
        self.rounds: RoundLoop | None = None  # set by main(): the loop of the leader's shard
        self.loops: list[RoundLoop] = []  # one per shard

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
        # Refused too (e.g. a privilege revoked on the schema): an operator fixes it; a
        # process that waits is fixed with it, one that exits crash-loops meanwhile.
        async for attempt in database_retrying(
                (DatabaseUnavailable, DatabaseRejected), tuning=self.settings.tuning.rounds,
                sleep=lambda wait_s: first(asyncio.sleep(wait_s), self.stopping.wait())):
            with attempt:
                if self.stopping.is_set():
                    return None
                return await Store.connect(self.settings.database_url, observer=self.metrics)
        return None  # pragma: no cover - tenacity returns or raises

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

            # Every request's answer also tells the prober the cluster was reached.
            answers = self.answers = Answers(self.metrics)
            registry = ClusterRegistry(
                kubeconfig=s.clusters.kubeconfig, access=s.clusters,
                identity=self.identity, observer=answers,
                on_insecure=self.state.set_insecure,
            )
            stack.push_async_callback(registry.close)
            self.registry = registry
            shardset = self._shardset(registry)
            # Pushed after `registry.close`, so it runs before: the Leases are written through
            # the registry's home client. Runs on every way out of this block.
            stack.push_async_callback(self._release, shardset)

            peers = self._peers(store, registry, shardset)
            saver = self._saver(store, registry, shardset, peers)
            # The writes to hung clusters a save answered without end by its deadline (and
            # at once once stopping: the fence refuses them): recorded before the exit.
            stack.push_async_callback(saver.drain)
            # The live read tokens, kept in memory for every request (`auth.TokenBook`).
            book = TokenBook(store)
            if not s.rounds.once:
                runner = await self._start_http(store, saver, book)
                stack.push_async_callback(runner.cleanup)

            # The clusters the database knows and what was recorded (by whoever led): lag
            # survives restarts, standbys show the leader's results, a deleted cluster leaves.
            # A database that is down leaves what this replica knows (rounds wait for it).
            sync = StatusSync(store=store, state=self.state, on_clusters=self._follow_database)
            await sync.once()
            prober = Prober(
                clusters=self._probe_targets(registry), state=self.state,
                period_s=self.probe_period_s, timeout_s=s.clusters.request_timeout_s,
                answers=answers, tuning=s.tuning,
            )
            self.prober = prober
            async with asyncio.TaskGroup() as tg:
                supervised = [
                    tg.create_task(shardset.run(), name="elector"),
                    tg.create_task(self.health.heartbeat(), name="heartbeat"),
                ]
                if not s.rounds.once:
                    supervised.append(tg.create_task(prober.run(), name="prober"))
                    supervised.append(tg.create_task(
                        sync.run(self._status_sync_period_s(), wait_first=True),
                        name="status sync"))
                    supervised.append(tg.create_task(
                        self._listener(saver, shardset).run(), name="notify listener"))
                    supervised.append(tg.create_task(
                        book.run(self._notifications()), name="read tokens"))
                    supervised.append(tg.create_task(Pruner(
                        store, s.revisions, leading=shardset.leader.elector.is_leader,
                        observer=self.metrics).run(), name="revision retention"))
                    supervised.append(tg.create_task(
                        Lapses(store, self.state).run(), name="exception lapses"))
                    supervised.append(tg.create_task(RolloutGates(
                        store=store, state=self.state, saver=saver,
                        leader=shardset.leader.elector, period_s=s.rollouts.gate_period_s,
                        identity=self.identity, observer=self.metrics).run(),
                        name="rollout gates"))
                    if peers is not None:
                        supervised.append(tg.create_task(peers.run(), name="save parts"))
                self.health.watch(supervised)
                self.loops = [self._round_loop(store, registry, shard) for shard in shardset.each]
                self.rounds = self.loops[shardset.leader.index]
                # Alive is not working: a loop can run and be stuck (see `supervise`). What a
                # restart cannot fix takes the replica out of service instead (readiness).
                self.health.check(shardset.problem, *(loop.problem for loop in self.loops))
                self.health.ready_check("lease_unreachable", shardset.unreachable)
                self.health.ready_check("lease_stalled", shardset.stalled)
                await asyncio.gather(*(loop.run() for loop in self.loops))
                await self._release(shardset)  # at once: a standby takes over sooner
                for task in supervised:
                    task.cancel()
        return self._exit_code()

    def _shardset(self, registry: ClusterRegistry) -> ShardSet:
        """The shards' Leases (`CONVERGERD_SHARDS`; one, the configured Lease, by default)."""
        s = self.settings
        e = s.election
        if not e.enabled:
            log.warning(
                "LEADER ELECTION IS OFF (CONVERGERD_LEADER_ELECTION=false): run exactly one "
                "replica, or two replicas will write at once"
            )
        # One cluster concurrency for the process, whatever number of shards it holds (one
        # shard runs one round at a time: the round's own slots are the process's).
        slots = asyncio.Semaphore(s.rounds.cluster_concurrency) if e.shards > 1 else None
        return ShardSet(registry.home_lease(e.home_context) if e.enabled else None, e,
                        once=s.rounds.once, on_change=self._shards_changed, slots=slots)

    def _round_loop(self, store: Store, registry: ClusterRegistry, shard: Shard) -> RoundLoop:
        """A shard's round loop: under its Lease, on its clusters."""
        return RoundLoop(
            settings=self.settings, store=store, clusters=registry, shard=shard,
            metrics=self.metrics, state=self.state, stopping=self.stopping,
            identity=self.identity, follow=self._follow_database, guard=store)

    def _shards_changed(self, view: ShardView) -> None:
        """The shard set tells; status is written here (the metrics read it), never on a
        read."""
        self.state.set_shards(holders=view.holders, held=view.held, members=view.members,
                              share=view.share)
        self.state.set_leader(view.leading, view.leader)

    async def _release(self, shardset: ShardSet) -> None:
        """Release the Lease (if held), bounded in time: a wait for a renewal in flight and
        two requests. Once per process (the exit path calls it again). Never raises: the process
        is on its way out, and an unreleased Lease only costs the standby the lease duration."""
        if self._released:
            return
        self._released = True
        bound = 3 * self.settings.election.request_timeout_s + 1.0
        try:
            async with asyncio.timeout(bound):
                await shardset.release()
        except Exception as exc:
            log.warning("could not release the Lease within %.1f s: %s", bound, describe(exc))

    @property
    def last_report(self) -> RoundReport | None:
        return self.rounds.last_report if self.rounds is not None else None

    def _exit_code(self) -> int:
        if not self.settings.rounds.once:
            return EXIT_OK
        converged = True
        for loop in self.loops:
            report = loop.last_report
            if report is None:
                converged = False
                continue
            if report.result is not RoundResult.OK:
                for c in report.clusters:
                    if not c.converged:
                        reason = c.error or f"{c.failed} of {c.desired} policies failed"
                        log.error("not converged: cluster %s: %s", c.cluster, reason)
                converged = False
        if len(self.loops) > 1:
            ran = [loop.shard.index for loop in self.loops if loop.got_lease]
            missed = [loop.shard.index for loop in self.loops if not loop.got_lease]
            log.log(logging.ERROR if missed else logging.INFO,
                    "once: a round ran on shards %s; could not acquire shards %s (their "
                    "holders converge them)", ran or "none", missed or "none",
                    extra={"shards_run": ran, "shards_missed": missed})
        return EXIT_OK if converged else EXIT_NOT_CONVERGED

    def _probe_targets(self, registry: ClusterRegistry) -> Callable[[], Any]:
        def targets() -> dict[str, Any]:
            result: dict[str, Any] = {}
            for cluster in self.state.cluster_ids():
                with contextlib.suppress(NoCredentials):  # no context: reported by rounds
                    result[cluster] = registry.get(cluster)
            return result

        return targets

    def _save_env(self, registry: ClusterRegistry, shardset: ShardSet) -> Callable[[], FanoutEnv]:
        """On the leader saves are fenced like rounds (its Lease bounds every write); a
        standby's are kept safe by the resourceVersion preconditions (never over a newer
        revision). Neither writes once the daemon is stopping."""
        leader = shardset.leader.elector

        def env() -> FanoutEnv:
            fence: Fence = leader.fence() if leader.is_leader() else Unfenced()
            return fanout_env(self.settings, registry, StopFence(fence, self.stopping),
                              self.metrics, expected=self.answers,
                              suspected=self._unreachable_now)

        return env

    def _unreachable_now(self, cluster: ClusterId) -> bool:
        """Seen unreachable by the last round or probe: a save's suspect (`slots.Lanes`)."""
        return self.state.unreachable(cluster)

    def _peers(self, store: Store, registry: ClusterRegistry,
               shardset: ShardSet) -> Peers | None:
        """With more than one shard (not in `once`): a save's clusters are written by their
        shards' holders, each under its shard's Lease (`delivery.spread`)."""
        if shardset.shards == 1 or self.settings.rounds.once:
            return None
        assert self.settings.database_url is not None
        return Peers(store=store, holding=shardset, env=self._save_env(registry, shardset),
                     source=PgNotifications(self.settings.database_url), stopping=self.stopping,
                     tuning=self.settings.tuning.spread)

    def _saver(self, store: Store, registry: ClusterRegistry, shardset: ShardSet,
               peers: Peers | None) -> Saver:
        """Saves run on any replica (see `_save_env`); with shards, spread over the holders."""
        return Saver(store=store, env=self._save_env(registry, shardset),
                     observer=self.fanout_metrics, peers=peers,
                     guard_share=self.settings.saves.removal_guard_share)

    def _notifications(self) -> PgNotifications:
        assert self.settings.database_url is not None
        return PgNotifications(self.settings.database_url)

    def _listener(self, saver: Saver, shardset: ShardSet) -> Listener:
        """Every replica listens; only the leader fans a notification out (once per change)."""
        assert self.settings.database_url is not None
        return Listener(source=PgNotifications(self.settings.database_url), saver=saver,
                        leading=shardset.leader.elector.is_leader, observer=self.fanout_metrics,
                        known=lambda policy: policy in self.known_policies)

    async def _start_http(self, store: Store, saver: Saver, book: TokenBook) -> web.AppRunner:
        s = self.settings
        app = make_app(metrics=self.metrics, state=self.state, store=store, settings=s,
                       health=self.health, saver=saver, tenants=store, book=book,
                       modes=store, revisions=store,
                       exceptions=store, rollouts=store)
        runner = await serve(app, s.http_host, s.http_port, s.http, observer=self.metrics)
        log.info(
            "convergerd %s (%s) serving health, metrics and status on %s:%d",
            __version__, self.identity, s.http_host, s.http_port,
        )
        return runner

    def _status_sync_period_s(self) -> float:
        return min(self.settings.rounds.interval_s,
                   self.settings.tuning.rounds.status_sync_period_s)

    async def _follow_database(
        self, clusters: Collection[str], *, policies: Collection[str] | None = None
    ) -> None:
        """The one place where what this replica keeps per cluster and per policy follows the
        database: status keeps the clusters it lists and drops the rest, then the metrics'
        counters and the cluster clients follow; given the round's fleet, status drops the
        records of deleted policies too. (The prober forgets the clusters it no longer probes
        by itself, each pass.)"""
        self.state.set_clusters(clusters)
        self.metrics.follow_clusters()
        if self.registry is not None:
            await self.registry.retain(clusters)
        if policies is not None:
            self.state.retain_policies(policies)
            self.known_policies = frozenset(policies)

    def sizes(self) -> dict[str, int]:
        """How much per-cluster, per-policy and per-client state this replica holds: the soak
        benchmark checks these stay flat over rounds."""
        sizes = {
            "status_clusters": len(self.state.clusters),
            "status_policy_records": self.state.record_count(),
            "seen_invalid": len(self.rounds.seen_invalid) if self.rounds is not None else 0,
            "unrecorded_rounds": len(self.rounds.unrecorded) if self.rounds is not None else 0,
            "prober_clusters": len(self.prober) if self.prober is not None else 0,
            **{f"metrics_{k}": v for k, v in self.metrics.sizes().items()},
        }
        if self.registry is not None:
            sizes.update({f"registry_{k}": v for k, v in self.registry.sizes().items()})
        return sizes


async def run_daemon(settings: Settings) -> int:
    return await Daemon(settings).main()
