"""`convergerd operator` with its Lease edited by hand to a far-future renewTime: it keeps
leading, so a binding deleted by hand is still repaired (before: OverflowError on every renewal,
leadership lost for good, the binding never repaired). Real time, a 2 s lease."""

from __future__ import annotations

from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import LEASES
from tests.fixtures.fleet import kube_http
from tests.integration.test_operator import (
    CLUSTER,
    binding_path,
    get,
    operator_settings,
    put_namespace,
    put_policy,
    running,
    wait_for,
)

FAR = "9999-12-31T23:59:59.999999Z"


async def test_a_far_future_renew_time_in_the_operators_lease_does_not_stop_repairs(
    fleet: Fleet,
) -> None:
    await put_namespace(fleet, "team-a", "b1")
    settings = operator_settings(
        fleet, CONVERGERD_OPERATOR_PROBE_MINUTES="0.02",
        CONVERGERD_LEASE_DURATION_SECONDS="2", CONVERGERD_RENEW_DEADLINE_SECONDS="1",
        CONVERGERD_RETRY_PERIOD_SECONDS="0.25", CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS="0.5")
    e = settings.election
    async with running(settings) as proc:
        await put_policy(fleet, "p1")
        await wait_for(lambda: get(fleet, binding_path("p1")))
        store = fleet.store(CLUSTER)
        lease = store.get(LEASES, e.lease_namespace, e.lease_name)
        assert lease["spec"]["holderIdentity"] == e.identity
        lease["spec"]["renewTime"] = lease["spec"]["acquireTime"] = FAR  # kubectl edit
        store.update(LEASES, e.lease_namespace, e.lease_name, lease, manager="kubectl-edit")

        def renewed_since() -> bool:
            spec = store.get(LEASES, e.lease_namespace, e.lease_name)["spec"]
            return bool(spec["holderIdentity"] == e.identity and spec["renewTime"] != FAR)

        # Renewed over the edit within a retry period or two, not lost at the renew deadline.
        await wait_for(renewed_since, timeout_s=4 * e.lease_duration_s)
        resp = await kube_http(fleet, CLUSTER, "DELETE", binding_path("p1"))
        assert resp.status == 200, resp.body
        assert await wait_for(lambda: get(fleet, binding_path("p1"))) is not None
        assert proc.metrics.is_leader
        assert proc.health.problems() == []
