"""The shard set against the fleet simulator's `home` cluster through the real `ClusterClient`:
fair shares from the Leases, a hand-back that waits for the shard's round, a crashed replica's
shards taken over, and never two leaders of a shard. Real time, short settings."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from convergerd.core.shards import member_lease_name, shard_lease_name
from convergerd.leader.lease import (
    MAX_HOLDER_CHARS,
    MAX_PEER_DURATION_FACTOR,
    STALLED_AFTER_DURATIONS,
)
from convergerd.leader.shards import ShardSet
from convergerd.sim.fleet import HOME, Fleet
from convergerd.sim.resources import LEASES
from tests.integration.test_leader_sim import DURATION, NS, RETRY, election, home_client, until

SHARDS = 6


@asynccontextmanager
async def replica(fleet: Fleet, identity: str) -> AsyncIterator[ShardSet]:
    async with home_client(fleet, identity) as api:
        settings = dataclasses.replace(election(identity), shards=SHARDS)
        shards = ShardSet(api, settings)  # type: ignore[arg-type]  # the handle lists too
        task = asyncio.create_task(shards.run())
        try:
            yield shards
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def held(*sets: ShardSet) -> dict[str, int]:
    return {s.identity: len(s.held()) for s in sets}


def never_two(*sets: ShardSet) -> bool:
    """No shard led by two replicas now (checked at every poll)."""
    leaders = Counter(k for s in sets for k in s.held())
    assert all(n == 1 for n in leaders.values()), leaders
    return True


async def test_fair_share_and_a_hand_back_after_the_round(fleet: Fleet) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = [await stack.enter_async_context(replica(fleet, x)) for x in "abc"]
        await until(lambda: never_two(a, b, c) and held(a, b, c) == {"a": 2, "b": 2, "c": 2},
                    within_s=6 * DURATION)
        # c must hand one back when d joins (shares 2/2/1/1: the remainder to a and b, by
        # identity); a round is running on that shard: the Lease stays until it ends.
        top = max(c.held())
        await c.round_locks[top].acquire()
        d = await stack.enter_async_context(replica(fleet, "d"))
        await until(lambda: d.member is not None and d.member.is_leader(), within_s=DURATION)
        for _ in range(int(4 * RETRY / 0.01)):
            never_two(a, b, c, d)
            assert c.electors[top].is_leader()
            await asyncio.sleep(0.01)
        assert held(d) == {"d": 0}
        c.round_locks[top].release()
        await until(lambda: never_two(a, b, c, d)
                    and held(a, b, c, d) == {"a": 2, "b": 2, "c": 1, "d": 1},
                    within_s=4 * RETRY + 1)
        assert d.held() == {top}


async def test_a_crashed_replicas_shards_are_taken_within_the_lease_duration(
        fleet: Fleet) -> None:
    async with AsyncExitStack() as stack:
        a, b = [await stack.enter_async_context(replica(fleet, x)) for x in "ab"]
        async with replica(fleet, "c") as c:
            await until(lambda: never_two(a, b, c)
                        and held(a, b, c) == {"a": 2, "b": 2, "c": 2}, within_s=6 * DURATION)
            lost = c.held()
        # c is gone without releasing anything (its tasks cancelled, as a crash would).
        loop = asyncio.get_running_loop()
        gone = loop.time()
        await until(lambda: never_two(a, b) and held(a, b) == {"a": 3, "b": 3},
                    within_s=DURATION + 4 * RETRY + 1)
        took = loop.time() - gone
        assert took >= DURATION - 4 * RETRY  # not before its Leases could expire
        assert lost <= a.held() | b.held()


async def test_garbage_shard_and_member_leases_are_bounded_and_stop_counting_at_the_cap(
        fleet: Fleet) -> None:
    """A shard Lease and a membership Lease written with a 68-year duration and a 1 MB
    identity, never renewed: the shard's round stalls (readiness, never liveness) until the
    claim, capped at ten lease durations, runs out; the ghost member stops taking a share then;
    no view carries more than 128 characters of either identity."""
    store = fleet.store(HOME)
    cap = MAX_PEER_DURATION_FACTOR * DURATION
    async with AsyncExitStack() as stack:
        a, b = [await stack.enter_async_context(replica(fleet, x)) for x in "ab"]
        await until(lambda: never_two(a, b) and held(a, b) == {"a": 3, "b": 3},
                    within_s=6 * DURATION)
        k = min(a.held())
        lease = store.get(LEASES, NS, shard_lease_name(k))
        lease["spec"].update(holderIdentity="mallory\x1b[2J" + "m" * 2**20,
                             leaseDurationSeconds=2**31 - 1)
        store.update(LEASES, NS, shard_lease_name(k), lease, manager="kubectl-edit")
        store.create(LEASES, NS, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": member_lease_name("ghost"), "namespace": NS},
            "spec": {"holderIdentity": "ghost" + "g" * 2**20, "leaseDurationSeconds": 2**31 - 1,
                     "renewTime": "2026-01-01T00:00:00.000000Z"}}, manager="kubectl-create")
        loop = asyncio.get_running_loop()
        edited = loop.time()
        await until(lambda: a.stalled() is not None and b.stalled() is not None,
                    within_s=STALLED_AFTER_DURATIONS * DURATION + 2)
        assert loop.time() - edited >= STALLED_AFTER_DURATIONS * DURATION - RETRY
        assert "leadership stalled" in (a.stalled() or "")
        assert (a.problem(), b.problem()) == (None, None)
        for view in (a.view(), b.view()):
            assert all(len(who) <= MAX_HOLDER_CHARS for who in (*view.holders, *view.members))
            assert view.holders[k].startswith("mallory")
        await until(lambda: never_two(a, b) and held(a, b) == {"a": 3, "b": 3}
                    and a.view().members == ("a", "b") and k in a.held() | b.held(),
                    within_s=cap + 4 * RETRY + 2)
        assert loop.time() - edited >= cap - 2 * RETRY  # the capped claim was honoured
        assert (a.stalled(), b.stalled()) == (None, None)
