"""The reachability prober: between rounds, every `period_s` (default 10 s) one cheap
`GET /version` per cluster, so a cluster that stops answering shows `convergerd_cluster_up 0`
within `period_s + timeout_s` (well under 30 s with the defaults), not only at the next round.

Cost: one small request per cluster per period, on every replica (standbys too, so their
`/status` and metrics are live): 1000 clusters at 10 s is 100 requests per second per replica.
At most `concurrency` probes are in flight at once; a probe that gets no answer within
`timeout_s` counts as unreached, so a dead cluster costs one timeout per period, never more.

"Reached" is `ClusterError.answered`, the rule rounds use too: any answer with an HTTP status
(401, 403, 429, 503...) or an unusable one means the API server was reached (the rounds report
what is wrong); no answer, a connect error, a timeout or no credentials means it was not.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from convergerd.errors import (
    ClusterError,
)
from convergerd.kube.api import PolicyApi
from convergerd.report import utc_now
from convergerd.state import Clock

log = logging.getLogger(__name__)

Targets = Callable[[], Mapping[str, PolicyApi]]


class UpSink(Protocol):
    def set_cluster_up(self, cluster: str, up: bool, server_version: str | None = None) -> None:
        ...


class ProbeSink(Protocol):
    def observe_probe(
        self, cluster: str, *, reachable: bool, error: str | None = None,
        server_version: str | None = None, at: dt.datetime | None = None,
    ) -> None: ...


class Prober:
    def __init__(
        self,
        *,
        clusters: Targets,
        metrics: UpSink,
        state: ProbeSink,
        period_s: float = 10.0,
        timeout_s: float = 5.0,
        concurrency: int = 32,
        clock: Clock = utc_now,
    ) -> None:
        self.clusters = clusters
        self.metrics = metrics
        self.state = state
        self.period_s = period_s
        self.timeout_s = min(timeout_s, period_s)
        self.concurrency = concurrency
        self.clock = clock
        self._was_up: dict[str, bool] = {}

    async def run(self) -> None:
        """Forever: probe every cluster, then wait out the rest of the period."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.probe_once()
            await asyncio.sleep(max(0.0, started + self.period_s - loop.time()))

    async def probe_once(self) -> dict[str, bool]:
        """One pass over the current clusters; returns cluster -> reached."""
        targets = dict(self.clusters())
        # Remember only the clusters still probed: a removed one is forgotten with this pass.
        self._was_up = {c: up for c, up in self._was_up.items() if c in targets}
        gate = asyncio.Semaphore(self.concurrency)

        async def one(cluster: str, api: PolicyApi) -> bool:
            async with gate:
                return await self._probe(cluster, api)

        results = await asyncio.gather(*(one(c, a) for c, a in sorted(targets.items())))
        return dict(zip(sorted(targets), results, strict=True))

    def __len__(self) -> int:
        """How many clusters' last state is remembered (the clusters of the last pass)."""
        return len(self._was_up)

    async def _probe(self, cluster: str, api: PolicyApi) -> bool:
        version: str | None = None
        error: str | None = None
        try:
            # The client honours timeout_s; the outer bound only guards against one that hangs.
            version = await asyncio.wait_for(
                api.server_version(timeout_s=self.timeout_s), self.timeout_s + 1.0)
            up = True
        except TimeoutError:
            up, error = False, f"no answer within {self.timeout_s:g} s"
        except ClusterError as exc:
            up, error = exc.answered, str(exc)
        except Exception as exc:
            log.exception("reachability check of cluster %s failed unexpectedly", cluster)
            up, error = False, f"reachability check failed: {type(exc).__name__}"
        self.metrics.set_cluster_up(cluster, up, version)
        self.state.observe_probe(cluster, reachable=up, error=error, server_version=version,
                                 at=self.clock())
        if self._was_up.get(cluster, True) != up:
            if up:
                log.info("cluster %s answers again", cluster, extra={"cluster": cluster})
            else:
                log.warning("cluster %s stopped answering: %s", cluster, error,
                            extra={"cluster": cluster})
        self._was_up[cluster] = up
        return up
