"""The reachability prober: between rounds, every `period_s` (default 10 s) one cheap
`GET /version` per cluster, so a cluster that stops answering shows `convergerd_cluster_up 0`
within `1.5 * period_s + timeout_s` (15 s plus the time to fail with the defaults), not only at
the next round.

Cost: at most one small request per cluster per period, on every replica (standbys too, so their
`/status` and metrics are live): 1000 clusters at 10 s is up to 100 requests per second per
replica. A cluster that answered any other request (a round's list or apply, a save) within the
last half period (`ProberTuning.skip_within_periods`) is not probed: that answer already proves
it reached. Half, not a whole period: a cluster that went down just after answering is probed by
the first pass at least half a period later, so the bound is 1.5 periods; skipping within a
whole period made it two (a cluster that answered just before a pass waited out that pass and
the whole next period). Whether an answer spares a probe is judged when that cluster's probe is
due, not when the pass starts. A cluster a save's fan-out is about to reach
(`Answers.expecting`, for at most a period from the fan-out's start) is left to that save: its
answer tells what the probe would, and at 10,000 clusters a pass overlapping a save's fan-out
made that save take up to twice its CPU (bench/RESULTS.md, "Figures once quoted in the code"). A
cluster last seen unreachable is probed still: no answer is no proof.

A pass starts its probes at an even pace over `ProberTuning.spread_periods` of the period, in small
batches: at 10,000 clusters a burst of all of them at once would queue 10,000 requests' work
ahead of the rounds' and the HTTP server's. A probe that gets no answer within `timeout_s`
counts as unreached, so a dead cluster costs one timeout per period, never more. Clusters the
last pass found unreachable are probed beside the others, not among them (`concurrency` for
the answering ones, `max_silent_in_flight` for those): a tenth of 10,000 clusters hung, all in
32 shared slots, made a pass take minutes, and the clusters behind them went unprobed that
long (bench/RESULTS.md, "Figures once quoted in the code"). A cluster that hung since the last
pass holds an answering slot only for the patience (`convergerd.slots`), then waits aside; one
silent pass after pass is probed less and less often (`ProberTuning.silent_max_passes`), so a
long-dead cluster's recovery is seen by the prober within six periods, or at the next pass after any
round's request to it answered.

"Reached" is `ClusterError.answered`, the rule rounds use too: any answer with an HTTP status
(401, 403, 429, 503...) or an unusable one means the API server was reached (the rounds report
what is wrong); no answer, a connect error, a timeout or no credentials means it was not.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Protocol

from convergerd.config import Tuning, default_of
from convergerd.core.errors import (
    ClusterError,
)
from convergerd.core.report import utc_now
from convergerd.kube.api import PolicyApi, RequestObserver
from convergerd.slots import Aside, Held, Patience
from convergerd.status.reader import Clock

log = logging.getLogger(__name__)

Targets = Callable[[], Mapping[str, PolicyApi]]


class ProbeSink(Protocol):
    def observe_probe(
        self, cluster: str, *, reachable: bool, error: str | None = None,
        server_version: str | None = None, at: dt.datetime | None = None,
    ) -> None: ...


DEFAULT_TUNING = Tuning()  # what a prober built without its tuning gets

# The prober's own request: its answers must not excuse the next probe. A watch reports its
# status when the stream ends, possibly long after the answer (or cut by a reset): not proof.
_NOT_PROOF = frozenset({"version", "watch"})


class Answers:
    """A `RequestObserver` in front of another: passes every report on and remembers when each
    cluster last answered a request (any HTTP status), for the prober."""

    def __init__(
        self, inner: RequestObserver, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.inner = inner
        self.monotonic = monotonic
        self._started: dict[str, float] = {}  # cluster -> start of its latest answered request
        # cluster -> (fan-outs about to reach it, when the first of them began)
        self._expected: dict[str, tuple[int, float]] = {}

    def request_done(
        self, cluster: str, verb: str, status: int | None, duration_s: float
    ) -> None:
        self.inner.request_done(cluster, verb, status, duration_s)
        if status is not None and verb not in _NOT_PROOF:
            # The start, not the end: the answer proves the cluster reached from then on.
            self._started[cluster] = self.monotonic() - duration_s

    def retry(self, cluster: str, reason: str) -> None:
        self.inner.retry(cluster, reason)

    def answered_within(self, cluster: str, seconds: float) -> bool:
        at = self._started.get(cluster)
        return at is not None and self.monotonic() - at < seconds

    def expected_within(self, cluster: str, seconds: float) -> bool:
        """Whether a fan-out about to reach `cluster` (`expecting`) began within `seconds`."""
        mark = self._expected.get(cluster)
        return mark is not None and self.monotonic() - mark[1] < seconds

    @contextlib.contextmanager
    def expecting(self, clusters: Collection[str]) -> Iterator[None]:
        """While the block runs, a fan-out (a save) is about to send each of `clusters` a
        request, whose answer tells what a probe would: the prober leaves them to it."""
        now = self.monotonic()
        for cluster in clusters:
            count, since = self._expected.get(cluster, (0, now))
            self._expected[cluster] = (count + 1, since)
        try:
            yield
        finally:
            for cluster in clusters:
                count, since = self._expected.pop(cluster, (0, now))
                if count > 1:
                    self._expected[cluster] = (count - 1, since)

    def keep(self, clusters: set[str]) -> None:
        """Forget the clusters not in `clusters`."""
        self._started = {c: t for c, t in self._started.items() if c in clusters}

    def __len__(self) -> int:
        return len(self._started)


class Prober:
    def __init__(
        self,
        *,
        clusters: Targets,
        state: ProbeSink,
        period_s: float = default_of("probe_period_s"),
        timeout_s: float = default_of("request_timeout_s"),
        clock: Clock = utc_now,
        answers: Answers | None = None,
        tuning: Tuning = DEFAULT_TUNING,
    ) -> None:
        """`state`: where each result goes (`StatusState.observe_probe`; the metrics read it
        there). `answers`: the requests' observer; a cluster it saw answer within the last half
        period is reported reached without a probe. `tuning`: its pace (`ProberTuning`) and its
        patience (`SlotTuning`)."""
        self.clusters = clusters
        self.state = state
        self.period_s = period_s
        self.timeout_s = min(timeout_s, period_s)
        self.tuning = tuning.prober
        self.concurrency = tuning.prober.concurrency
        self.max_silent_in_flight = tuning.prober.max_silent_in_flight
        self.clock = clock
        self.answers = answers
        # A probe to a cluster that answered the last pass gives its answering slot back and
        # waits aside when it has no answer within its patience: a tenth of 10,000 clusters
        # hanging at once held the 64 slots for a timeout each, so the pass that should have
        # found them took over a minute, and rounds ran into them meanwhile (bench/RESULTS.md,
        # "Figures once quoted in the code").
        self._patience = Patience(ceiling_s=self.timeout_s, tuning=tuning.slots)
        self.skipped = 0  # probes saved by other requests' answers, since start
        self._was_up: dict[str, bool] = {}
        self._passes = 0
        # cluster -> (probes in a row it was silent on, the pass it is probed again)
        self._silent: dict[str, tuple[int, int]] = {}

    async def run(self) -> None:
        """Forever: probe every cluster, then wait out the rest of the period."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.probe_once(spread_s=self.period_s * self.tuning.spread_periods)
            await asyncio.sleep(max(0.0, started + self.period_s - loop.time()))

    async def probe_once(self, *, spread_s: float = 0.0) -> dict[str, bool]:
        """One pass over the current clusters, their probes started evenly over `spread_s`;
        returns cluster -> reached."""
        loop = asyncio.get_running_loop()
        targets = dict(self.clusters())
        # Remember only the clusters still probed: a removed one is forgotten with this pass.
        self._was_up = {c: up for c, up in self._was_up.items() if c in targets}
        self._silent = {c: s for c, s in self._silent.items() if c in targets}
        self._passes += 1
        if self.answers is not None:
            self.answers.keep(set(targets))
        order = sorted(targets)
        # Cluster k's probe is due at k * step; those due within one `batch_s` start together.
        step = spread_s / len(order) if order else 0.0
        per_batch = (max(1, math.ceil(self.tuning.batch_s / step)) if step > 0
                     else max(1, len(order)))
        reached: dict[str, bool] = {}
        answering = asyncio.Semaphore(self.concurrency)
        silent = asyncio.Semaphore(self.max_silent_in_flight)
        aside = Aside(self.max_silent_in_flight)
        probes: dict[str, asyncio.Task[bool]] = {}
        started = loop.time()
        try:
            for k in range(0, len(order), per_batch):
                if k:
                    await asyncio.sleep(max(0.0, started + k * step - loop.time()))
                for cluster in order[k:k + per_batch]:
                    excused = self._excused(cluster)
                    if excused is not None:
                        reached[cluster] = excused
                        continue
                    slot: Held | asyncio.Semaphore
                    if self._was_up.get(cluster) is False:
                        await silent.acquire()
                        slot = silent  # expected silent: held for its timeout
                    else:
                        await answering.acquire()
                        slot = Held([answering], patience=self._patience, aside=aside)
                    probes[cluster] = asyncio.create_task(
                        self._probe_in(slot, cluster, targets[cluster]), name=f"probe {cluster}")
            for cluster, task in probes.items():
                reached[cluster] = await task
        finally:
            for task in probes.values():
                task.cancel()
        return dict(sorted(reached.items()))

    def _excused(self, cluster: str) -> bool | None:
        """Whether `cluster` counts as reached without a probe this pass; None: probe it."""
        if self.answers is not None and self.answers.answered_within(
                cluster, self.period_s * self.tuning.skip_within_periods):
            self.skipped += 1
            self._report(cluster, True, None, None)
            return True
        if self._left_to_fan_out(cluster):
            # Unchanged until the fan-out's answer (or the next pass) tells.
            self.skipped += 1
            return True
        if self._resting(cluster):
            return False  # as last probed
        return None

    async def _probe_in(self, slot: Held | asyncio.Semaphore, cluster: str,
                        api: PolicyApi) -> bool:
        up = False
        try:
            up = await self._probe(cluster, api)
            return up
        finally:
            if up and isinstance(slot, Held):
                slot.heard()  # the answer's time is what the patience learns from
            slot.release()

    def __len__(self) -> int:
        """How many clusters' last state is remembered (the clusters of the last pass)."""
        return len(self._was_up)

    def _resting(self, cluster: str) -> bool:
        """Silent on its last probes, and not yet due again (`ProberTuning.silent_max_passes`)."""
        silent = self._silent.get(cluster)
        return silent is not None and self._passes < silent[1]

    def _left_to_fan_out(self, cluster: str) -> bool:
        """A save is about to reach `cluster`, which answered when last probed: its answer
        will tell. One last seen unreachable is probed still (no answer is no proof)."""
        return (self.answers is not None and self._was_up.get(cluster) is not False
                and self.answers.expected_within(
                    cluster, self.period_s * self.tuning.expected_within_periods))

    async def _probe(self, cluster: str, api: PolicyApi) -> bool:
        version: str | None = None
        error: str | None = None
        try:
            # The client honours timeout_s; the outer bound only guards against one that hangs
            # (a timeout scope, not wait_for: no extra task per probe).
            async with asyncio.timeout(self.timeout_s + 1.0):
                version = await api.server_version(timeout_s=self.timeout_s)
            up = True
        except TimeoutError:
            up, error = False, f"no answer within {self.timeout_s:g} s"
        except ClusterError as exc:
            up, error = exc.answered, str(exc)
        except Exception as exc:
            log.exception("reachability check of cluster %s failed unexpectedly", cluster)
            up, error = False, f"reachability check failed: {type(exc).__name__}"
        self._report(cluster, up, version, error)
        return up

    def _report(self, cluster: str, up: bool, version: str | None, error: str | None) -> None:
        self.state.observe_probe(cluster, reachable=up, error=error, server_version=version,
                                 at=self.clock())
        if self._was_up.get(cluster, True) != up:
            if up:
                log.info("cluster %s answers again", cluster, extra={"cluster": cluster})
            else:
                log.warning("cluster %s stopped answering: %s", cluster, error,
                            extra={"cluster": cluster})
        self._was_up[cluster] = up
        if up:
            self._silent.pop(cluster, None)
        else:
            times = self._silent.get(cluster, (0, 0))[0] + 1
            self._silent[cluster] = (times, self._passes + min(2 ** (times - 1),
                                                               self.tuning.silent_max_passes))
