"""The daemon under leader election on the simulator's home cluster, as an admin sees it:
a Lease edited by hand to a far-future time does not end its leadership, and `/healthz` fails
while the elector is stuck and recovers with it. Real time, short settings (lease 2 s, rounds
every 1.2 s). And what a client of the simulator sees for Lease values kube-apiserver refuses."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager

from convergerd.sim.faults import Faults
from convergerd.sim.fleet import HOME, Fleet
from convergerd.sim.resources import LEASES
from tests.fixtures.fleet import kube_http
from tests.integration.test_observability import (
    Running,
    first_round,
    import_tenants,
    running,
    wait_for,
)

NS, NAME = "stackship-system", "convergerd"
IDENTITY = "lease-health-test"
DURATION_S = 2.0
STUCK_AFTER_S = 2 * DURATION_S


def electing(fleet: Fleet, database_url: str) -> AbstractAsyncContextManager[Running]:
    """`convergerd run` with leader election on the home cluster's Lease."""
    return running(
        fleet, database_url,
        CONVERGERD_LEADER_ELECTION="true",
        CONVERGERD_HOME_CONTEXT=HOME,
        CONVERGERD_IDENTITY=IDENTITY,
        CONVERGERD_LEASE_DURATION_SECONDS=str(DURATION_S),
        CONVERGERD_RENEW_DEADLINE_SECONDS="1",
        CONVERGERD_RETRY_PERIOD_SECONDS="0.25",
        CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS="0.5",
    )


async def rounds_run(run: Running) -> int:
    return int(await run.rounds())


async def test_a_far_future_renew_time_edited_into_the_lease_does_not_end_leadership(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    async with electing(fleet, database_url) as run:
        await first_round(run)
        store = fleet.store(HOME)
        lease = store.get(LEASES, NS, NAME)
        assert lease["spec"]["holderIdentity"] == IDENTITY
        lease["spec"]["renewTime"] = "9999-12-31T23:59:59.999999Z"  # kubectl edit
        store.update(LEASES, NS, NAME, lease, manager="kubectl-edit")
        before = await rounds_run(run)

        async def more_rounds() -> bool:
            return await rounds_run(run) >= before + 3

        # Before: OverflowError on every renewal, leadership lost after the renew deadline, and
        # no round ever again (with /healthz 200).
        await wait_for(more_rounds, timeout_s=10 * DURATION_S,
                       what="three more rounds after the edit")
        leader = (await run.json("/status"))["leader"]
        assert leader["is_leader"] is True, json.dumps(leader)
        assert leader["holder"] == IDENTITY
        assert (await run.request("GET", "/healthz"))[0] == 200
        renew = store.get(LEASES, NS, NAME)["spec"]["renewTime"]
        assert not renew.startswith("9999"), renew


async def test_healthz_fails_while_the_elector_is_stuck_and_recovers_with_it(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    async with electing(fleet, database_url) as run:
        await first_round(run)
        fleet.set_faults(HOME, Faults(hang=True))  # the Lease cannot be read nor written

        async def unhealthy() -> bool:
            return (await run.request("GET", "/healthz"))[0] == 500

        took = await wait_for(unhealthy, timeout_s=STUCK_AFTER_S + 5,
                              what="/healthz 500 with the home cluster hanging")
        assert took >= STUCK_AFTER_S - DURATION_S  # not before the elector could be stuck
        status, body = await run.request("GET", "/healthz")
        assert status == 500
        assert "leader election stuck" in body, body

        fleet.set_faults(HOME, Faults())

        async def healthy() -> bool:
            return (await run.request("GET", "/healthz"))[0] == 200

        await wait_for(healthy, timeout_s=5 * DURATION_S, what="/healthz 200 again")
        before = await rounds_run(run)

        async def rounds_again() -> bool:
            return await rounds_run(run) > before

        await wait_for(rounds_again, timeout_s=5 * DURATION_S, what="a round after recovery")


async def test_the_simulator_refuses_lease_values_kube_apiserver_refuses(fleet: Fleet) -> None:
    """Before: a time whose offset crosses year 0 answered 500; a duration above int32 was
    stored."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "edge", "namespace": NS},
            "spec": {"holderIdentity": "a", "renewTime": "0001-01-01T00:30:00.000000+01:00"}}
    crossing = await kube_http(fleet, HOME, "POST", path, body=body)
    assert crossing.status == 400, crossing.body
    assert crossing.json()["reason"] == "BadRequest"
    body["spec"] = {"holderIdentity": "a", "leaseDurationSeconds": 2**31}
    too_big = await kube_http(fleet, HOME, "POST", path, body=body)
    assert too_big.status == 400, too_big.body
    assert "of type int32" in too_big.json()["message"]
    body["spec"] = {"holderIdentity": "a", "leaseDurationSeconds": 0}
    zero = await kube_http(fleet, HOME, "POST", path, body=body)
    assert (zero.status, zero.json()["reason"]) == (422, "Invalid")
