"""An exception's expiry reaches the clusters with no write to the database: the next round
delivers the Policy without it (its plan compares the whole spec); then the daemon's lapse
makes it a new revision and shows it in the tally the metrics read."""

from __future__ import annotations

import asyncio
import datetime as dt

from convergerd.core.exceptions import parse_exception
from convergerd.core.report import ApplyResult
from convergerd.delivery.lapse import Lapses
from convergerd.sim.fleet import Fleet
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from tests.integration.rounds_helpers import Rounds, objects

EXPIRES_IN_S = 2.0


def carried(fleet: Fleet) -> dict[str, tuple[int, tuple[str, ...]]]:
    """Per cluster, the revision of policy-p-latest there and its exceptions' ids."""
    found = {}
    for cluster in fleet.member_ids:
        spec = objects(fleet, cluster)["policy-p-latest"]["spec"]
        found[cluster] = (spec["revision"], tuple(e["id"] for e in spec.get("exceptions", [])))
    return found


async def test_a_round_after_expiry_delivers_without_it_then_it_lapses(
        rounds: Rounds, fleet: Fleet, store: Store) -> None:
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=EXPIRES_IN_S)
    revision = await store.grant_exception("p-latest", parse_exception({
        "id": "short", "namespace": "team-a-web", "reason": "r", "requestedBy": "a",
        "approvedBy": "b", "expiresAt": expires.isoformat()}))
    await rounds.run()
    assert set(carried(fleet).values()) == {(revision, ("short",))}

    async def expired() -> bool:
        fleet_now = await store.load_fleet()
        return all(not p.exceptions for p in fleet_now.policies if p.id == "p-latest")

    deadline = asyncio.get_running_loop().time() + EXPIRES_IN_S + 10
    while not await expired():
        assert asyncio.get_running_loop().time() < deadline, "the exception never expired"
        await asyncio.sleep(0.1)
    report = await rounds.run()
    assert set(carried(fleet).values()) == {(revision, ())}  # no revision moved: a drift
    assert {d.result for c in report.clusters for d in c.deliveries
            if d.policy == "p-latest"} == {ApplyResult.UPDATED}

    state = StatusState(identity="t", interval_s=300)
    wait = await Lapses(store, state).once()
    assert 0 < wait <= 30
    [tally] = state.exception_tally
    assert (tally.policy, tally.in_force, tally.expired_delivered) == ("p-latest", 0, 1)
    await rounds.run()
    assert set(carried(fleet).values()) == {(revision + 1, ())}
    await Lapses(store, state).once()
    assert state.exception_tally[0].expired_delivered == 0  # every cluster has the new one
