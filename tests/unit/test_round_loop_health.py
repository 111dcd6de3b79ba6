"""`/healthz` tells the truth about the round loop: a loop that leads and has started or ended
no round for two intervals is stuck, whatever kept it (here a kubeconfig reload that never
returns); one waiting for the Lease is not (that is the elector's health), nor one waiting on a
database that is locked (a restart would not unlock it; each call is bounded by the store's
timeouts). Fake loop time (looptime), the real `RoundLoop` with small in-memory fakes at its
Protocols."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from convergerd.config import RoundTuning, Tuning, load_settings
from convergerd.core.model import ClusterId, Fleet
from convergerd.core.report import Epoch, RoundReport
from convergerd.delivery.rounds import RoundLoop
from convergerd.kube.api import PolicyApi
from convergerd.leader.elector import NoElection
from convergerd.leader.shards import Shard
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.supervise import HealthCheck

STUCK_AFTER_INTERVALS = RoundTuning().stuck_after_intervals

pytestmark = pytest.mark.looptime

INTERVAL_S = 60.0
STUCK_S = STUCK_AFTER_INTERVALS * INTERVAL_S


class FleetStore:
    """The database: an empty fleet; `locked_s`: each call waits that long first (a lock)."""

    def __init__(self) -> None:
        self.locked_s = 0.0
        self.recorded: list[RoundReport] = []

    async def load_fleet(self) -> Fleet:
        await asyncio.sleep(self.locked_s)
        return Fleet(clusters=[], boundaries={}, policies=[], invalid=[])

    async def record_round(self, report: RoundReport, *, identity: str) -> int:
        await asyncio.sleep(self.locked_s)
        self.recorded.append(report)
        return len(self.recorded)


class NoClusters:
    """No cluster; `hang`: the kubeconfig reload never returns (a bug)."""

    def __init__(self) -> None:
        self.hang = False

    async def refresh(self) -> bool:
        if self.hang:
            await asyncio.Event().wait()
        return False

    def get(self, cluster: ClusterId) -> PolicyApi:
        raise AssertionError("the fleet is empty")


class NeverLeads(NoElection):
    """A standby behind a leader that never goes away."""

    async def wait_leading(self) -> Epoch:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def follow(*_: Any, **__: Any) -> None:
    return None


def round_loop(store: FleetStore, elector: NoElection,
               clusters: NoClusters | None = None, tuning: Tuning | None = None) -> RoundLoop:
    settings = load_settings({"Policies__ConvergeIntervalMinutes": str(INTERVAL_S / 60)})
    if tuning is not None:
        settings = dataclasses.replace(settings, tuning=tuning)
    shard = Shard(index=0, count=1, lease=settings.election.lease_name, elector=elector)
    return RoundLoop(
        settings=settings, store=store, clusters=clusters or NoClusters(), shard=shard,
        metrics=Metrics(state=(state := StatusState(identity="me", interval_s=INTERVAL_S))),
        state=state,
        stopping=asyncio.Event(), identity="me", follow=follow,
    )


def now() -> float:
    return asyncio.get_running_loop().time()


async def test_a_round_loop_stuck_in_a_round_fails_health_after_two_intervals() -> None:
    store = FleetStore()
    clusters = NoClusters()
    loop = round_loop(store, NoElection(identity="me"), clusters)
    health = HealthCheck(clock=now)
    health.check(loop.problem)
    beat = asyncio.create_task(health.heartbeat())
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(5.5 * INTERVAL_S)
    assert len(store.recorded) == 6  # one round per interval, at 0, 60, ... 300 s ...
    assert health.problems() == []  # ... and healthy all along
    clusters.hang = True  # the next round (at 360 s) never gets past the kubeconfig
    await asyncio.sleep(0.5 * INTERVAL_S + STUCK_S - 1)
    rounds = len(store.recorded)
    assert health.problems() == []
    await asyncio.sleep(2)
    [problem] = health.problems()
    assert "round loop stuck" in problem
    assert len(store.recorded) == rounds
    clusters.hang = False
    loop.stopping.set()
    task.cancel()
    beat.cancel()
    await asyncio.gather(task, beat, return_exceptions=True)
    assert loop.problem() is None  # not running: a task that ended is reported by its own


async def test_the_stuck_limit_is_the_daemons_tuning() -> None:
    """`Settings.tuning` governs the limit, not a constant of the module: allowed four
    intervals, a loop hung in its first round for three is healthy, for four and a half not."""
    clusters = NoClusters()
    clusters.hang = True
    loop = round_loop(FleetStore(), NoElection(identity="me"), clusters,
                      tuning=Tuning(rounds=RoundTuning(stuck_after_intervals=4.0)))
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(3 * INTERVAL_S)
    assert loop.problem() is None
    await asyncio.sleep(1.5 * INTERVAL_S)
    assert "round loop stuck" in (loop.problem() or "")
    clusters.hang = False
    loop.stopping.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_standby_round_loop_waiting_for_the_lease_is_not_stuck() -> None:
    loop = round_loop(FleetStore(), NeverLeads(identity="me"))
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(10 * STUCK_S)
    assert loop.problem() is None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_round_loop_waiting_on_a_locked_database_is_alive() -> None:
    """Every call waits three intervals (a lock the store's timeouts would end): rounds are
    slow, and /healthz stays 200; a restart would not unlock the database."""
    store = FleetStore()
    loop = round_loop(store, NoElection(identity="me"))
    health = HealthCheck(clock=now)
    health.check(loop.problem)
    beat = asyncio.create_task(health.heartbeat())
    task = asyncio.create_task(loop.run())
    await asyncio.sleep(1.5 * INTERVAL_S)
    store.locked_s = 3 * INTERVAL_S
    for _ in range(40):
        await asyncio.sleep(0.25 * INTERVAL_S)
        assert health.problems() == []
    store.locked_s = 0.0
    recorded = len(store.recorded)
    await asyncio.sleep(8 * INTERVAL_S)
    assert len(store.recorded) > recorded + 1  # rounds again
    loop.stopping.set()
    task.cancel()
    beat.cancel()
    await asyncio.gather(task, beat, return_exceptions=True)
