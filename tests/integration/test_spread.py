"""A save spread over the shard holders, against the simulator and a real PostgreSQL: two
replicas in one process, each with its own clients (the simulator's request log names who
wrote), its own listening connection and `Peers`, and the shards they hold given (the Leases
themselves are `test_shards_sim`'s). With 5 shards the fleet's clusters fall in shards 2
(c0001), 1 (c0002) and 4 (c0003)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from convergerd.config import Settings
from convergerd.core.errors import Fenced
from convergerd.core.report import FanoutReport, FanoutResult, FanoutStatus
from convergerd.core.shards import shard_of
from convergerd.delivery.apply import Unfenced
from convergerd.delivery.fanout import FanoutEnv, Saver, fanout_env
from convergerd.delivery.spread import Peers
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.lease import Fence
from convergerd.leader.shards import ShardView
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.notify import PgNotifications
from convergerd.store.store import Store
from tests.integration.rounds_helpers import objects, settings_for, sql

SHARDS = 5
C1, C2, C3 = "c0001", "c0002", "c0003"
REGS = "policy-p-regs"  # team-a: c0001, c0002, c0003
DEADLINE_S = 4.0  # the save deadline: peers get half of it


class Closed:
    def remaining_s(self) -> float:
        raise Fenced("not the holder")


@dataclass
class Holding:
    """The shards as one replica sees them: who holds what, and whether its fences are open."""

    identity: str
    holders: tuple[str, ...]
    fenced: bool = False  # its own shards' fences closed (it lost the Leases unawares)
    shards: int = SHARDS

    def view(self) -> ShardView:
        held = frozenset(k for k, h in enumerate(self.holders) if h == self.identity)
        members = tuple(sorted({h for h in self.holders if h} | {self.identity}))
        return ShardView(self.identity, self.holders, held, members, share=None)

    def fence(self, k: int) -> Fence:
        return Unfenced() if self.holders[k] == self.identity and not self.fenced else Closed()


@dataclass
class Replica:
    saver: Saver
    peers: Peers
    registry: ClusterRegistry
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def replica(settings: Settings, store: Store, database_url: str, holding: Holding, *,
                  serving: bool = True) -> AsyncIterator[Replica]:
    """A replica's saves; `serving`: it claims and writes the parts asked of it."""
    metrics = Metrics(state=StatusState(identity=holding.identity, interval_s=60))
    registry = ClusterRegistry(kubeconfig=settings.clusters.kubeconfig, access=settings.clusters,
                               identity=holding.identity)

    def env() -> FanoutEnv:
        return fanout_env(settings, registry, Unfenced(), metrics)

    peers = Peers(store=store, holding=holding, env=env, source=PgNotifications(database_url),
                  stopping=asyncio.Event())
    saver = Saver(store=store, env=env, guard_share=0.5, peers=peers)
    r = Replica(saver, peers, registry)
    if serving:
        r.tasks.append(asyncio.create_task(peers.run()))
    try:
        yield r
    finally:
        for task in r.tasks:
            task.cancel()
        await asyncio.gather(*r.tasks, return_exceptions=True)
        await registry.close()


def writers(fleet: Fleet) -> dict[str, set[str]]:
    """Per cluster, the identities whose clients wrote to it (from the user agent)."""
    found: dict[str, set[str]] = {}
    for r in fleet.accounting.requests(verb="patch"):
        found.setdefault(r.cluster, set()).add(r.user_agent.rsplit("(", 1)[-1].rstrip(")"))
    return found


def results(report: FanoutReport) -> dict[tuple[str, str], FanoutResult]:
    return {(r.cluster, r.action): r.result for r in report.results}


@pytest.fixture
def settings(fleet: Fleet, database_url: str) -> Settings:
    return settings_for(fleet.kubeconfig_path, database_url,
                        CONVERGERD_SAVE_DEADLINE_SECONDS=str(DEADLINE_S))


# a holds shards 0 and 1 (c0002), b holds 2 and 3 (c0001); nobody holds 4 (c0003).
HOLDERS = ("a", "a", "b", "b", "")


def test_the_fleet_falls_in_three_shards() -> None:
    assert [shard_of(c, SHARDS) for c in (C1, C2, C3)] == [2, 1, 4]


async def test_each_cluster_is_written_by_its_shards_holder(  # noqa: PLR0917
    fleet: Fleet, rounds: object, store: Store, database_url: str, settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (replica(settings, store, database_url, Holding("a", HOLDERS)) as a,
                replica(settings, store, database_url, Holding("b", HOLDERS))):
        fleet.accounting.reset()
        caplog.set_level("INFO")
        report = await a.saver.save("p-regs")
    assert report.status is FanoutStatus.OK
    assert results(report) == {(c, "apply"): FanoutResult.CREATED for c in (C1, C2, C3)}
    assert all(REGS in objects(fleet, c) for c in (C1, C2, C3))
    # c0001 by its shard's holder; c0002 by a (its shard); c0003's shard is nobody's: a.
    assert writers(fleet) == {C1: {"b"}, C2: {"a"}, C3: {"a"}}
    rows = await sql(database_url, "SELECT cluster_id, delivered_revision, last_result "
                     "FROM deliveries WHERE policy_id = 'p-regs' ORDER BY cluster_id")
    assert [tuple(r) for r in rows] == [(c, 1, "created") for c in (C1, C2, C3)]
    assert await sql(database_url, "SELECT id FROM save_requests") == []  # cleaned up
    assert any("1 done by the other shard holders" in m for m in caplog.messages)


async def test_a_peer_that_never_answers_leaves_its_part_to_the_requester(
    fleet: Fleet, rounds: object, store: Store, database_url: str, settings: Settings,
) -> None:
    loop = asyncio.get_running_loop()
    async with (replica(settings, store, database_url, Holding("a", HOLDERS)) as a,
                replica(settings, store, database_url, Holding("b", HOLDERS), serving=False)):
        fleet.accounting.reset()
        started = loop.time()
        report = await a.saver.save("p-regs")
        took = loop.time() - started
    assert results(report) == {(c, "apply"): FanoutResult.CREATED for c in (C1, C2, C3)}
    assert writers(fleet) == {C1: {"a"}, C2: {"a"}, C3: {"a"}}
    assert DEADLINE_S / 2 <= took < DEADLINE_S  # waited its peer's share, then wrote it


async def test_a_holder_that_lost_the_shard_declines_and_the_requester_does_not_wait(
    fleet: Fleet, rounds: object, store: Store, database_url: str, settings: Settings,
) -> None:
    loop = asyncio.get_running_loop()
    # a still sees b holding shard 2; b does not hold it any more.
    async with (replica(settings, store, database_url, Holding("a", HOLDERS)) as a,
                replica(settings, store, database_url, Holding("b", ("a", "a", "", "", "")))):
        fleet.accounting.reset()
        started = loop.time()
        report = await a.saver.save("p-regs")
        took = loop.time() - started
    assert results(report) == {(c, "apply"): FanoutResult.CREATED for c in (C1, C2, C3)}
    assert writers(fleet) == {C1: {"a"}, C2: {"a"}, C3: {"a"}}
    assert took < DEADLINE_S / 2


async def test_a_holder_whose_fence_closed_writes_nothing_and_the_requester_writes_it(
    fleet: Fleet, rounds: object, store: Store, database_url: str, settings: Settings,
) -> None:
    async with (replica(settings, store, database_url, Holding("a", HOLDERS)) as a,
                replica(settings, store, database_url, Holding("b", HOLDERS, fenced=True))):
        fleet.accounting.reset()
        report = await a.saver.save("p-regs")
    assert results(report) == {(c, "apply"): FanoutResult.CREATED for c in (C1, C2, C3)}
    assert writers(fleet) == {C1: {"a"}, C2: {"a"}, C3: {"a"}}


async def test_a_newer_revision_saved_meanwhile_is_declined_then_saved_by_the_requester(
    fleet: Fleet, rounds: object, store: Store, database_url: str, settings: Settings,
) -> None:
    async with (replica(settings, store, database_url, Holding("a", HOLDERS)) as a,
                replica(settings, store, database_url, Holding("b", HOLDERS), serving=False)
                as b):
        assert (await a.saver.save("p-regs")).status is FanoutStatus.OK  # revision 1
        # Revision 2 asked of b, which sees revision 3 when it gets to it.
        await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")
        save = asyncio.create_task(a.saver.save("p-regs"))
        await until_asked(database_url)
        await sql(database_url, "UPDATE policies SET enabled = true WHERE id = 'p-regs'")
        assert await b.peers.claim_once() == 1
        report = await save
    assert report.revision == 3  # the check after the fan-out saved the newest
    for c in (C1, C2, C3):
        assert objects(fleet, c)[REGS]["spec"]["revision"] == 3
    rows = await sql(database_url, "SELECT cluster_id, delivered_revision FROM deliveries "
                     "WHERE policy_id = 'p-regs' ORDER BY cluster_id")
    assert [tuple(r) for r in rows] == [(c, 3) for c in (C1, C2, C3)]


async def until_asked(database_url: str) -> None:
    while not await sql(database_url, "SELECT 1 FROM save_parts WHERE claimed_by IS NULL"):
        await asyncio.sleep(0.01)
