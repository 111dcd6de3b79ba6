"""A save with hung clusters (issue 34): it runs on the rounds' scheduler (`slots.Lanes`) and
answers when every cluster but the hung ones is done, listing those as pending; their writes
go on until the save's deadline and what they did is recorded. Fake time (looptime): a hang
costs no real time. Driven through `Saver` with small fakes at its Protocol boundaries."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from convergerd.config import SlotTuning
from convergerd.core.errors import ClusterUnreachable
from convergerd.core.model import ClusterId, PolicyId, PolicyRow
from convergerd.core.removal import Current, Target
from convergerd.core.report import ApplyResult, Delivery, FanoutResult, FanoutStatus
from convergerd.core.rollout import Staged, Start
from convergerd.delivery.apply import ClusterCalls, Unfenced
from convergerd.delivery.fanout import FanoutEnv, Saver
from convergerd.kube.api import Applied, KubeObject, ObjectList

PATIENCE_FLOOR_S = SlotTuning().patience_floor_s

pytestmark = pytest.mark.looptime

T = TypeVar("T")
REQUEST_TIMEOUT_S = 5.0
DEADLINE_S = 10.0
LATENCY_S = 0.1
CONCURRENCY = 8


@dataclass
class FakeCluster:
    """A cluster holding nothing: every apply creates after `latency_s`; a hung one holds
    every request until its timeout, then fails as unreachable."""

    cluster: ClusterId
    latency_s: float
    hang: bool
    applied_at: list[float]

    async def get_policy(self, name: str, *, timeout_s: float) -> KubeObject | None:
        await self._reach(timeout_s)
        return None

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        await self._reach(timeout_s)
        return ObjectList(items=[], resource_version="1", requests=1)

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        await self._reach(timeout_s)
        self.applied_at.append(asyncio.get_running_loop().time())
        return Applied(object=body, created=True)

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        await self._reach(timeout_s)
        return True

    async def server_version(self, *, timeout_s: float) -> str:
        await self._reach(timeout_s)
        return "v1.32.0"

    async def _reach(self, timeout_s: float) -> None:
        if self.hang:
            await asyncio.sleep(timeout_s)
            raise ClusterUnreachable(f"no answer within {timeout_s:g} s", reason="timeout")
        await asyncio.sleep(self.latency_s)


@dataclass
class FakeClusters:
    hung: frozenset[ClusterId]
    slow: dict[ClusterId, float] = field(default_factory=dict)
    applied_at: dict[ClusterId, list[float]] = field(default_factory=dict)

    def get(self, cluster: ClusterId) -> FakeCluster:
        return FakeCluster(cluster, self.slow.get(cluster, LATENCY_S), cluster in self.hung,
                           self.applied_at.setdefault(cluster, []))


@dataclass
class FakeStore:
    """One policy covering `scope`; what is recorded is kept, with the loop time it was."""

    scope: frozenset[ClusterId]
    recorded: dict[ClusterId, tuple[ApplyResult, float]] = field(default_factory=dict)
    times: Counter[ClusterId] = field(default_factory=Counter)  # recorded how many times

    async def save_target(self, policy_id: str, /) -> Target | None:
        row = PolicyRow("p-latest", "b", {"type": "ForbidLatestTag"}, enabled=True, revision=1)
        return Target(row=row, deleting=False, boundary_exists=True, scope=self.scope,
                      holders=frozenset())

    async def begin_deletion(self, policy_id: str, /) -> Target | None:
        return None

    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str], /) -> bool:
        return True

    async def record_deliveries(self, deliveries: Sequence[Delivery], /) -> None:
        now = asyncio.get_running_loop().time()
        for d in deliveries:
            self.recorded[d.cluster] = (d.result, now)
            self.times[d.cluster] += 1

    async def forget_deliveries(self, policy_id: str, clusters: Sequence[str], /) -> None:
        pass

    async def current(self, policy_ids: Sequence[PolicyId], /) -> dict[PolicyId, Current]:
        return {}

    async def start_rollout(self, policy_id: str, revision: int, *, by: str,
                            already_delivered: bool, now: bool = False) -> Start:
        return Start()  # no rollout strategies here: every save goes everywhere at once

    async def staged_rollout(self, policy_id: str, /) -> Staged | None:
        return None


async def once(fn: Callable[[], Awaitable[T]], *, cluster: str, deadline: float) -> T:
    return await fn()


def fleet(*, hung: Sequence[str], healthy: Sequence[str], slow: Sequence[str] = (),
          suspected: Callable[[ClusterId], bool] | None = None,
          ) -> tuple[Saver, FakeStore, FakeClusters]:
    ids = [ClusterId(c) for c in (*hung, *slow, *healthy)]
    clusters = FakeClusters(frozenset(ClusterId(c) for c in hung),
                            {ClusterId(c): 3.0 for c in slow})
    loop = asyncio.get_running_loop()
    calls = ClusterCalls(retrier=once, request_timeout_s=REQUEST_TIMEOUT_S, clock=loop.time,
                         wall=lambda: dt.datetime.now(dt.UTC))
    env = FanoutEnv(clusters=clusters, calls=calls, fence=Unfenced(), deadline_s=DEADLINE_S,
                    concurrency=CONCURRENCY, suspected=suspected)
    store = FakeStore(frozenset(ids))
    return Saver(store=store, env=lambda: env, guard_share=0.5), store, clusters


def by_result(results: Sequence[object]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in results:
        out.setdefault(r.result.value, set()).add(r.cluster)  # type: ignore[attr-defined]
    return out


async def test_hung_clusters_do_not_hold_the_answer_and_their_writes_are_recorded_later() -> None:
    """8 slots; 10 hung clusters and 2 slow ones (3 s) first in the fleet, 60 healthy ones
    after them. Before, the hung ones took every slot for their whole timeout, then the
    healthy ones ran: the answer came after the timeout (5 s) and more. Now each gives its
    slot back after the patience, and the answer comes when the healthy ones are done, the
    hung and slow ones listed as pending; the slow ones' writes land later and are recorded
    as created, the hung ones' as failed, once their timeout ends."""
    hung = [f"a-hung-{i}" for i in range(10)]
    slow = ["b-slow-0", "b-slow-1"]
    healthy = [f"c{i:02d}" for i in range(60)]
    saver, store, clusters = fleet(hung=hung, slow=slow, healthy=healthy)
    loop = asyncio.get_running_loop()
    start = loop.time()

    report = await saver.save("p-latest")

    answered = loop.time() - start
    healthy_done = max(clusters.applied_at[ClusterId(c)][0] for c in healthy) - start
    assert answered == pytest.approx(healthy_done, abs=0.01)  # not a moment more
    assert answered < REQUEST_TIMEOUT_S - 1
    assert report.status is FanoutStatus.PARTIAL
    assert by_result(report.results) == {"created": set(healthy), "pending": {*hung, *slow}}
    assert all(r.error for r in report.results if r.result is FanoutResult.PENDING)
    assert set(store.recorded) == set(healthy)  # the answered ones, recorded at once

    await saver.drain()

    assert set(store.times.values()) == {1}  # each cluster recorded once
    assert {c: result for c, (result, _) in store.recorded.items() if c not in healthy} == {
        **dict.fromkeys(slow, ApplyResult.CREATED), **dict.fromkeys(hung, ApplyResult.FAILED)}
    # The hung ones were written until their request timed out, then recorded.
    assert loop.time() - start == pytest.approx(REQUEST_TIMEOUT_S + PATIENCE_FLOOR_S, abs=1.5)
    assert all(at - start >= REQUEST_TIMEOUT_S for c in hung
               for _, at in [store.recorded[ClusterId(c)]])


async def test_clusters_seen_unreachable_go_to_their_lane_and_never_hold_the_answer() -> None:
    """The same hung clusters, seen unreachable by the prober before the save: they run in the
    suspects' lane (one slot of 8) and behind the healthy ones, and the answer does not wait
    even for the patience: it comes as the healthy part is done."""
    hung = [f"a-hung-{i}" for i in range(10)]
    healthy = [f"c{i:02d}" for i in range(60)]
    down = {ClusterId(c) for c in hung}
    saver, store, _ = fleet(hung=hung, healthy=healthy, suspected=down.__contains__)
    loop = asyncio.get_running_loop()
    start = loop.time()

    report = await saver.save("p-latest")

    # 60 healthy clusters in 7 slots at 0.1 s a wave: 9 waves.
    assert loop.time() - start < 9 * LATENCY_S + 0.05
    assert by_result(report.results) == {"created": set(healthy), "pending": set(hung)}
    await saver.drain()
    assert {store.recorded[ClusterId(c)][0] for c in hung} == {ApplyResult.FAILED}


async def test_a_save_with_none_hung_answers_with_every_result() -> None:
    saver, store, _ = fleet(hung=[], healthy=[f"c{i:02d}" for i in range(20)])
    report = await saver.save("p-latest")
    assert report.status is FanoutStatus.OK
    assert set(by_result(report.results)) == {"created"}
    assert len(store.recorded) == 20


async def test_a_new_save_of_the_policy_stops_the_last_ones_pending_writes() -> None:
    """A save's pending writes are of its revision: the policy's next save (or deletion) here
    stops them before it starts, so an older revision never lands after the newer one."""
    hung = ["a-hung-0", "a-hung-1"]
    healthy = [f"c{i:02d}" for i in range(10)]
    saver, store, _ = fleet(hung=hung, healthy=healthy)
    loop = asyncio.get_running_loop()
    first = await saver.save("p-latest")
    assert by_result(first.results)["pending"] == set(hung)
    again_at = loop.time()

    second = await saver.save("p-latest")

    assert by_result(second.results)["pending"] == set(hung)
    await saver.drain()
    # Recorded once, by the second save, one timeout after it began (the first's stopped).
    assert {store.times[ClusterId(c)] for c in hung} == {1}
    assert [store.recorded[ClusterId(c)][1] - again_at for c in hung] == [
        pytest.approx(REQUEST_TIMEOUT_S, abs=0.2)] * len(hung)
