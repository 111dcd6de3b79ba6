"""The Elector against the fleet simulator's `home` cluster through the real `ClusterClient`:
the Lease wire format, contention, and fencing when home hangs. Real time, short settings."""

from __future__ import annotations

import asyncio
import copy
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

import convergerd
from convergerd.config import ClusterAccess, Election
from convergerd.core.errors import Fenced, ObjectRejected
from convergerd.kube.api import KubeObject, LeaseApi
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import Elector
from convergerd.sim.accounting import RequestRecord
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import HOME, Fleet

NS, NAME = "stackship-system", "convergerd"
# Scaled down from 15/10/2/2 s, keeping duration > deadline + retry + request timeout.
DURATION, DEADLINE, RETRY, TIMEOUT = 3.0, 1.5, 0.25, 0.5
MICROTIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
SLACK = 0.05  # scheduling, on one machine


def election(identity: str) -> Election:
    return Election(
        enabled=True, home_context=HOME, lease_name=NAME, lease_namespace=NS, identity=identity,
        lease_duration_s=DURATION, renew_deadline_s=DEADLINE, retry_period_s=RETRY,
        request_timeout_s=TIMEOUT,
    )


def agent(identity: str) -> str:
    return f"convergerd/{convergerd.__version__} ({identity})"


@asynccontextmanager
async def home_client(fleet: Fleet, identity: str) -> AsyncIterator[LeaseApi]:
    registry = ClusterRegistry(
        kubeconfig=fleet.kubeconfig_path,
        access=ClusterAccess(kubeconfig=fleet.kubeconfig_path, request_timeout_s=TIMEOUT,
                             connect_timeout_s=TIMEOUT, qps=1000, burst=1000,
                             apply_concurrency=1),
        identity=identity,
    )
    try:
        yield registry.home(HOME)
    finally:
        await registry.close()


class Partition:
    """A replica's own link to home, which a test can cut (requests then never answer)."""

    def __init__(self, api: LeaseApi) -> None:
        self.api = api
        self.cut = False

    async def _gate(self) -> None:
        if self.cut:
            await asyncio.Event().wait()

    async def get_lease(self, namespace: str, name: str, *, timeout_s: float) -> KubeObject | None:
        await self._gate()
        return await self.api.get_lease(namespace, name, timeout_s=timeout_s)

    async def create_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        await self._gate()
        return await self.api.create_lease(body, timeout_s=timeout_s)

    async def replace_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        await self._gate()
        return await self.api.replace_lease(body, timeout_s=timeout_s)


def lease_writes(fleet: Fleet, identity: str) -> list[RequestRecord]:
    """Lease writes by `identity` the simulator answered with success (wall-clock arrival)."""
    return [
        r for r in fleet.accounting.requests(cluster=HOME)
        if r.user_agent == agent(identity) and "/leases" in r.path
        and r.method in ("POST", "PUT") and r.status in (200, 201)
    ]


async def until(condition: Callable[[], bool], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s} s")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def running(elector: Elector) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(elector.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def assert_not_both(a: Elector, b: Elector) -> None:
    assert not (a.is_leader() and b.is_leader())


async def test_two_electors_one_leads_and_microtime_is_accepted(fleet: Fleet) -> None:
    async with home_client(fleet, "a") as api_a, home_client(fleet, "b") as api_b:
        a, b = Elector(api_a, election("a")), Elector(api_b, election("b"))
        async with running(a), running(b):
            await until(lambda: a.is_leader() or b.is_leader(), within_s=2)
            for _ in range(200):  # 2 s
                assert_not_both(a, b)
                await asyncio.sleep(0.01)
            leader, standby = (a, b) if a.is_leader() else (b, a)
            assert leader.epoch is not None
            assert leader.epoch.holder == leader.identity
            assert standby.leader == leader.identity
            lease = await api_a.get_lease(NS, NAME, timeout_s=TIMEOUT)
        assert lease is not None
        spec = lease["spec"]
        assert spec["holderIdentity"] == leader.identity
        assert spec["leaseDurationSeconds"] == 3
        assert MICROTIME.match(spec["renewTime"])
        assert MICROTIME.match(spec["acquireTime"])
        assert len(lease_writes(fleet, leader.identity)) >= 5  # renewed every 0.25 s
        assert lease_writes(fleet, standby.identity) == []

        # The simulator really checks the format: three fractional digits are a 400.
        bad = copy.deepcopy(lease)
        bad["spec"]["renewTime"] = spec["renewTime"][:23] + "Z"
        with pytest.raises(ObjectRejected) as info:
            await api_a.replace_lease(bad, timeout_s=TIMEOUT)
        assert info.value.status == 400


async def test_hung_home_fences_the_leader_before_its_lease_can_be_taken(fleet: Fleet) -> None:
    async with home_client(fleet, "a") as api_a, home_client(fleet, "b") as api_b:
        a, b = Elector(api_a, election("a")), Elector(api_b, election("b"))
        async with running(a) as a_task:
            epoch = await asyncio.wait_for(a.wait_leading(), timeout=2)
            fence = a.fence()
            async with running(b):
                await asyncio.sleep(1.0)
                assert not b.is_leader()
                fleet.set_faults(HOME, Faults(hang=True))
                await asyncio.wait_for(a.wait_lost(epoch), timeout=DEADLINE + 1)
                lost_at = time.time()
                with pytest.raises(Fenced):
                    fence.remaining_s()
                last_a = lease_writes(fleet, "a")[-1]
                # a stopped within the renew deadline of its last renewal, well before the lease
                # could expire.
                assert lost_at <= last_a.time + DEADLINE + SLACK
                # a stays cut off (dead, or partitioned); home answers again.
                a_task.cancel()
                await asyncio.gather(a_task, return_exceptions=True)
                fleet.clear_faults(HOME)
                await until(b.is_leader, within_s=DURATION + 2)
                b_epoch = b.epoch
        b_first = lease_writes(fleet, "b")[0]
        assert b_first.time > lost_at
        assert b_first.time >= last_a.time + DURATION - SLACK
        assert b_epoch is not None
        assert b_epoch.holder == "b"
        assert b_epoch.transitions == epoch.transitions + 1


async def test_a_partitioned_leader_is_replaced_only_after_expiry(fleet: Fleet) -> None:
    async with home_client(fleet, "a") as api_a, home_client(fleet, "b") as api_b:
        link = Partition(api_a)
        a, b = Elector(link, election("a")), Elector(api_b, election("b"))
        async with running(a):
            epoch = await asyncio.wait_for(a.wait_leading(), timeout=2)
            async with running(b):
                await asyncio.sleep(0.5)
                link.cut = True  # a alone loses home; b keeps watching the Lease
                cut_at = time.time()
                lost = asyncio.ensure_future(a.wait_lost(epoch))
                while not b.is_leader():
                    assert_not_both(a, b)
                    await asyncio.sleep(0.005)
                b_leads_at = time.time()
                assert lost.done()
                last_a = lease_writes(fleet, "a")[-1]
                assert last_a.time <= cut_at + TIMEOUT  # at most one renewal was in flight
                assert b_leads_at >= last_a.time + DURATION - SLACK
                # a's link comes back: it sees b's Lease and stays a standby.
                link.cut = False
                for _ in range(100):  # 1 s
                    assert not a.is_leader()
                    await asyncio.sleep(0.01)
                assert a.leader == "b"
