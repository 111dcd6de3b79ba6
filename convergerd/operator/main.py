"""`convergerd operator`: wires the operator's parts and supervises them.

The cluster is reached through the same registry, client and error classes as the daemon's
(in-cluster config, or `--context` in CONVERGERD_KUBECONFIG); the Lease elector is the daemon's
`Elector` on the operator's own Lease; health and metrics are served on their own port
(`/healthz`: the loop turns, no task ended, the elector's loop is not stuck; `/readyz`:
Policies listed and discovery answered, on standbys too, and the election not blocked nor
stalled (`supervise`: what a restart would not fix); `/metrics`). SIGTERM/SIGINT: stop reconciling,
release the Lease so a standby takes over at once, exit 0. A crashed task ends the process
(Kubernetes restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from contextlib import AsyncExitStack

from aiohttp import web

from convergerd import __version__
from convergerd.api.server import bound_port, error_response, serve
from convergerd.config import OperatorSettings
from convergerd.core.errors import NoCredentials
from convergerd.kube.objects import ObjectClient
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import Elector, Leadership, NoElection
from convergerd.operator.controller import Operator, Timing
from convergerd.operator.metrics import OperatorMetrics
from convergerd.status.metrics import CONTENT_TYPE
from convergerd.supervise import HealthCheck

log = logging.getLogger(__name__)

EXIT_OK = 0


def make_app(operator: Operator, metrics: OperatorMetrics, health: HealthCheck) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        problems = health.problems()
        if problems:
            return error_response(500, "; ".join(problems), problems=problems)
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        failing = health.not_ready()
        if failing:
            return error_response(503, "; ".join(problem for _, problem in failing))
        if not operator.ready:
            return error_response(503, "Policies not listed yet, or discovery not answered")
        return web.json_response({"ready": True, "leader": metrics.is_leader})

    async def metrics_text(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz),
                    web.get("/metrics", metrics_text)])
    return app


class OperatorProcess:
    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.metrics = OperatorMetrics()
        self.health = HealthCheck()
        self.stopping = asyncio.Event()
        self.operator: Operator | None = None
        self.port: int | None = None  # the HTTP port bound (the setting may say 0)

    def _elector(self, registry: ClusterRegistry) -> Leadership:
        e = self.settings.election
        if not e.enabled:
            log.warning("LEADER ELECTION IS OFF (CONVERGERD_LEADER_ELECTION=false): run exactly "
                        "one operator replica, or two will write at once")
            return NoElection(identity=e.identity, on_change=self.metrics.set_leader)
        return Elector(registry.home_lease(e.home_context), e, on_change=self.metrics.set_leader)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        log.info("%s received: stopping, releasing the Lease", signal.Signals(signum).name)
        self.stopping.set()

    async def main(self, *, signals: bool = True) -> int:
        s = self.settings
        if signals:
            self._install_signals()
        async with AsyncExitStack() as stack:
            registry = ClusterRegistry(kubeconfig=s.clusters.kubeconfig, access=s.clusters,
                                       identity=s.election.identity)
            stack.push_async_callback(registry.close)
            try:
                home = registry.home(s.context)
            except NoCredentials as exc:
                if s.context is not None:
                    raise
                raise NoCredentials("not running in a cluster (no in-cluster service account): "
                                    "give --context NAME (CONVERGERD_OPERATOR_CONTEXT) with "
                                    "CONVERGERD_KUBECONFIG") from exc
            api = ObjectClient(registry.client(home.cluster))
            elector = self._elector(registry)
            operator = self.operator = Operator(
                api, leadership=elector, metrics=self.metrics, cluster=home.cluster,
                timing=Timing(request_timeout_s=s.clusters.request_timeout_s,
                              recheck_s=s.recheck_s, probe_interval_s=s.probe_interval_s,
                              probe_delay_s=s.probe_delay_s,
                              admission_read_s=s.admission_read_s),
                cache_max_bytes=s.cache_max_bytes)
            runner = await serve(make_app(operator, self.metrics, self.health),
                                 s.http_host, s.http_port, s.http,
                                 address_setting="operator_http_addr", observer=self.metrics)
            stack.push_async_callback(runner.cleanup)
            self.port = bound_port(runner)
            log.info("convergerd operator %s (%s) on cluster %s; health and metrics on %s:%d",
                     __version__, s.election.identity, home.cluster, s.http_host, self.port)
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(elector.run(), name="elector"),
                         tg.create_task(operator.run(), name="operator"),
                         tg.create_task(self.health.heartbeat(), name="heartbeat")]
                self.health.watch(tasks)
                self.health.check(elector.problem)  # running is not leading: see `supervise`
                self.health.ready_check("lease_unreachable", elector.unreachable)
                self.health.ready_check("lease_stalled", elector.stalled)
                stop = tg.create_task(self.stopping.wait())
                await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
                for task in tasks[1:]:
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks[1:], return_exceptions=True)
                await elector.release()
                tasks[0].cancel()
                stop.cancel()
        return EXIT_OK


async def run_operator(settings: OperatorSettings) -> int:
    return await OperatorProcess(settings).main()
