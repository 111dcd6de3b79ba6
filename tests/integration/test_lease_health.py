"""The daemon under leader election on the simulator's home cluster, as an admin sees it:
a Lease edited by hand to a far-future time does not end its leadership; a home cluster that is
down fails readiness, never liveness, and recovers with it; a Lease someone wrote a 68-year
duration and a 1 MB identity into fails readiness until its capped claim runs out, then is taken
over, and nothing shows more than 128 characters of that identity. Real time, short settings
(lease 2 s, rounds every 1.2 s). And what a client of the simulator sees for Lease values
kube-apiserver refuses. And the default one shard is the configured Lease alone: no list, no
membership Lease."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AbstractAsyncContextManager

from convergerd.leader.lease import (
    MAX_HOLDER_CHARS,
    MAX_PEER_DURATION_FACTOR,
    STALLED_AFTER_DURATIONS,
)
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
RETRY_S = 0.25
STUCK_AFTER_S = 2 * DURATION_S
STALLED_AFTER_S = STALLED_AFTER_DURATIONS * DURATION_S
CAP_S = MAX_PEER_DURATION_FACTOR * DURATION_S


def electing(fleet: Fleet, database_url: str) -> AbstractAsyncContextManager[Running]:
    """`convergerd run` with leader election on the home cluster's Lease."""
    return running(
        fleet, database_url,
        CONVERGERD_LEADER_ELECTION="true",
        CONVERGERD_HOME_CONTEXT=HOME,
        CONVERGERD_IDENTITY=IDENTITY,
        CONVERGERD_LEASE_DURATION_SECONDS=str(DURATION_S),
        CONVERGERD_RENEW_DEADLINE_SECONDS="1",
        CONVERGERD_RETRY_PERIOD_SECONDS=str(RETRY_S),
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


async def probes(run: Running) -> tuple[int, int]:
    """(/healthz status, /readyz status)."""
    return (await run.request("GET", "/healthz"))[0], (await run.request("GET", "/readyz"))[0]


async def test_a_home_partition_fails_readiness_not_liveness_and_recovers(
    fleet: Fleet, database_url: str
) -> None:
    """Before: /healthz 500 and /readyz 200 on every replica during a 30 s partition, so a
    liveness probe restarted the whole Deployment, which cannot bring home back."""
    await import_tenants(database_url)
    async with electing(fleet, database_url) as run:
        await first_round(run)
        fleet.set_faults(HOME, Faults(down=True))  # the Lease cannot be read nor written
        seen: list[tuple[int, int]] = []

        async def unready() -> bool:
            seen.append(await probes(run))
            return seen[-1][1] == 503

        took = await wait_for(unready, timeout_s=STUCK_AFTER_S + 5,
                              what="/readyz 503 with the home cluster down")
        assert took >= STUCK_AFTER_S - DURATION_S  # not before the election could be blocked
        assert {healthz for healthz, _ in seen} == {200}, seen
        status, body = await run.request("GET", "/readyz")
        assert status == 503
        assert json.loads(body)["reason"] == "lease_unreachable", body
        assert "leader election blocked" in body, body
        assert (await run.scrape()).value("convergerd_unready", reason="lease_unreachable") == 1
        await asyncio.sleep(DURATION_S)  # and it stays alive: nothing a restart would fix
        assert await probes(run) == (200, 503)

        fleet.set_faults(HOME, Faults())

        async def ready() -> bool:
            return await probes(run) == (200, 200)

        await wait_for(ready, timeout_s=5 * DURATION_S, what="/readyz 200 again")
        before = await rounds_run(run)

        async def rounds_again() -> bool:
            return await rounds_run(run) > before

        await wait_for(rounds_again, timeout_s=5 * DURATION_S, what="a round after recovery")


async def test_a_garbage_lease_stalls_readiness_then_is_taken_over_with_its_identity_bounded(
    fleet: Fleet, database_url: str
) -> None:
    """Someone with write access to the Lease writes a 68-year duration, a 1 MB identity with
    terminal escapes, and never renews. Before: no round for 68 years with /healthz and
    /readyz 200, and the identity copied into every cluster's entry of /status and a label."""
    await import_tenants(database_url)
    async with electing(fleet, database_url) as run:
        await first_round(run)
        store = fleet.store(HOME)
        lease = store.get(LEASES, NS, NAME)
        lease["spec"].update(holderIdentity="\x1b[2J\nmallory" + "m" * 2**20,
                             leaseDurationSeconds=2**31 - 1,
                             renewTime="2026-01-01T00:00:00.000000Z")
        store.update(LEASES, NS, NAME, lease, manager="kubectl-edit")
        edited = time.monotonic()
        seen: list[tuple[int, int]] = []

        async def unready() -> bool:
            seen.append(await probes(run))
            return seen[-1][1] == 503

        took = await wait_for(unready, timeout_s=STALLED_AFTER_S + 5,
                              what="/readyz 503 with the Lease held by a holder that never renews")
        assert STALLED_AFTER_S - 0.5 <= took < CAP_S
        assert {healthz for healthz, _ in seen} == {200}, seen
        status, body = await run.request("GET", "/readyz")
        assert status == 503
        assert json.loads(body)["reason"] == "lease_stalled", body
        assert len(body) < 2000, len(body)

        doc = await run.status()
        holder = doc["leader"]["holder"]
        assert doc["leader"]["is_leader"] is False
        assert len(holder) == MAX_HOLDER_CHARS, holder[:20]
        assert holder.isprintable(), holder[:20]
        assert {c["holder"] for c in doc["clusters"]} == {holder}
        scrape = await run.scrape()
        [label] = [labels["holder"] for name, labels, _ in scrape.samples
                   if name == "convergerd_shard_holder"]
        assert label == holder
        assert scrape.value("convergerd_unready", reason="lease_stalled") == 1
        assert len(scrape.text) < 2**16

        async def leading() -> bool:
            return bool((await run.status())["leader"]["is_leader"])

        await wait_for(leading, timeout_s=CAP_S + 5, what="the Lease taken over")
        # Not before the capped claim ran out (10 x 2 s from when the edit was first seen).
        assert time.monotonic() - edited >= CAP_S - 2 * RETRY_S
        assert await probes(run) == (200, 200)
        assert store.get(LEASES, NS, NAME)["spec"]["holderIdentity"] == IDENTITY
        before = await rounds_run(run)

        async def rounds_again() -> bool:
            return await rounds_run(run) > before

        await wait_for(rounds_again, timeout_s=5 * DURATION_S, what="a round after takeover")


async def test_one_shard_is_the_configured_lease_alone(fleet: Fleet, database_url: str) -> None:
    """`CONVERGERD_SHARDS=1` (the default) runs the shard set with one shard: it must be the
    single Lease users configure, as before shards existed. Read from the simulator's request
    log: the home cluster sees reads and writes of that one Lease only (no list of the
    namespace, no membership Lease, no `convergerd-shard-0`), and SIGTERM frees it."""
    await import_tenants(database_url)
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    async with electing(fleet, database_url) as run:
        await first_round(run)

        def renewals() -> int:
            return len(fleet.accounting.requests(cluster=HOME, verb="update"))

        renewed = renewals()

        async def renewed_thrice() -> bool:
            return renewals() >= renewed + 3

        await wait_for(renewed_thrice, timeout_s=10 * DURATION_S, what="three renewals")
        doc = await run.status()
        assert doc["leader"]["is_leader"] is True
        assert doc["leader"]["holder"] == IDENTITY
        shards = doc["shards"]
        assert (shards["count"], shards["held_here"], shards["members"], shards["share"]) == (
            1, [0], [IDENTITY], None)
        assert [k["holder"] for k in shards["shards"]] == [IDENTITY]
        assert (await run.scrape()).value("convergerd_is_leader") == 1
    asked = {(r.verb, r.path.split("?")[0]) for r in fleet.accounting.requests(cluster=HOME)
             if "coordination.k8s.io" in r.path}
    assert asked == {("get", f"{leases}/{NAME}"), ("create", leases),
                     ("update", f"{leases}/{NAME}")}, asked
    assert [lease["metadata"]["name"] for lease in fleet.store(HOME).list(LEASES, NS)["items"]] == [
        NAME]
    assert fleet.store(HOME).get(LEASES, NS, NAME)["spec"].get("holderIdentity") in (None, "")


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
