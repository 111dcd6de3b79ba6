"""`convergerd operator` against the simulator: the API server's check_total counter, read from
/metrics, in each Policy's `status.admission` — Deny, Warn and Audit traffic counted exactly,
its own probes left out in every mode, restarts and two API servers never making a count
negative or doubled.

A count is written at once when it enters another reporting step (1, 2-3, 4-7, ...) and
otherwise at the heartbeat (2.5 probe periods): the tests run the operator with a short probe
period (1.2 s), so every count shows within a few seconds, and every write seen must be exact
— never above what the tenants did, whatever the operator's own probes (every 1.2 s, in each
mode) added to the API server's counter."""

from __future__ import annotations

from typing import Any

from convergerd.sim.fleet import Fleet
from tests.fixtures.fleet import kube_http
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    get,
    operator_settings,
    put_namespace,
    put_policy,
    running,
    verified_when,
    wait_for,
)

CHECK = "apiserver_validating_admission_policy_check_total"


def figures(found: dict[str, Any]) -> tuple[int, int, int]:
    return found["denied"], found["warned"], found["audited"]


async def exactly(fleet: Fleet, revision: int, expected: tuple[int, int, int], *,
                  hour: tuple[int, int, int] | None = None,
                  after: str | None = None) -> dict[str, Any]:
    """`status.admission` of policy-p1 once it says `expected` for `revision` (and `hour` over
    the last hour; in a write whose readAt is later than `after`). Every write of `revision`
    seen on the way is at most `expected`: a count no tenant made fails at once."""
    async def check() -> dict[str, Any] | None:
        policy = await get(fleet, f"{POLICIES}/policy-p1")
        found = ((policy or {}).get("status") or {}).get("admission")
        if found is None or found.get("revision") != revision:
            return None
        assert all(f <= e for f, e in zip(figures(found), expected, strict=True)), \
            (found, expected)
        if figures(found) != expected or (after is not None and found["readAt"] <= after):
            return None
        return found if hour is None or figures(found["lastHour"]) == hour else None

    found: dict[str, Any] = await wait_for(check)
    return found


async def verified(fleet: Fleet, reason: str) -> None:
    await wait_for(lambda: verified_when(fleet, "p1", lambda v: (v["status"], v["reason"]) == (
        "True", reason)))


async def violate(fleet: Fleet, name: str) -> Any:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "c", "image": "nginx:latest"}]}}
    return await kube_http(fleet, CLUSTER, "POST", "/api/v1/namespaces/team-a/pods", body=pod)


def metrics_reads(fleet: Fleet) -> int:
    return sum(1 for r in fleet.accounting.requests(cluster=CLUSTER) if r.path == "/metrics")


def probe_taken_in(fleet: Fleet) -> bool:
    """The operator's last probe (a dry-run create, counted by the API server) was taken out
    by a read of /metrics: three reads logged after it (a read a probe overlapped is not used,
    so the second was sent once the probe's verdict was known, the third once the second was
    taken in). An API server restarted now loses no probe the operator awaits: one lost would
    take a tenant's count in its place, a lower bound this test does not look at."""
    log = [r for r in fleet.accounting.requests(cluster=CLUSTER)
           if r.path == "/metrics" or "dryRun" in r.path]
    last = max((i for i, r in enumerate(log) if "dryRun" in r.path), default=-1)
    return len(log) - last - 1 >= 3


async def test_deny_warn_and_audit_are_counted_on_the_policy(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    settings = operator_settings(fleet, CONVERGERD_OPERATOR_ADMISSION_READ_SECONDS="0.2",
                                 CONVERGERD_OPERATOR_PROBE_MINUTES="0.02")
    async with running(settings) as proc:
        await put_policy(fleet, "p1")
        await verified(fleet, "Denied")
        # The probes' denials are counted by the API server, not reported as a tenant's.
        await exactly(fleet, 1, (0, 0, 0))
        assert (await violate(fleet, "denied")).status == 422
        await exactly(fleet, 1, (1, 0, 0))

        # A save to Warn: a new revision, counted from its install. Warn's binding is
        # [Warn, Audit]: a pod failing it is counted under both (as its probes are).
        await put_policy(fleet, "p1", revision=2, enforcement="Warn")
        await verified(fleet, "Warned")
        await exactly(fleet, 2, (0, 0, 0))
        resp = await violate(fleet, "warned")
        assert resp.status == 201
        assert resp.headers["Warning"].startswith(
            "299 - \"Validation failed for ValidatingAdmissionPolicy 'stackship-p1' with "
            "binding 'stackship-p1': image(s) 'nginx:latest' use the tag 'latest'")
        await exactly(fleet, 2, (0, 1, 1), hour=(1, 1, 1))  # the hour spans revisions

        await put_policy(fleet, "p1", revision=3, enforcement="Audit")
        await verified(fleet, "AuditOnly")
        await exactly(fleet, 3, (0, 0, 0))
        resp = await violate(fleet, "audited")
        assert resp.status == 201
        assert "Warning" not in resp.headers
        found = await exactly(fleet, 3, (0, 0, 1), hour=(1, 1, 2))
        assert found["resets"] == 0

        # The API server restarts: its counters start from zero; nothing goes negative.
        await wait_for(lambda: probe_taken_in(fleet))
        fleet.cluster(CLUSTER).apiservers.restart()
        assert (await violate(fleet, "after-restart")).status == 201
        found = await exactly(fleet, 3, (0, 0, 2))
        assert found["resets"] == 1
        assert "restart" in found["note"]

        # Two API servers behind the Service, answering in turn: each counted once.
        await wait_for(lambda: probe_taken_in(fleet))
        fleet.cluster(CLUSTER).apiservers.restart(replicas=2)
        for name in ("two-a", "two-b"):
            assert (await violate(fleet, name)).status == 201
        found = await exactly(fleet, 3, (0, 0, 4))
        # The heartbeat writes the figures as they are then: both servers read again and
        # again, the probes of every period taken out, still exactly the tenants' four.
        found = await exactly(fleet, 3, (0, 0, 4), after=found["readAt"])
        found = await exactly(fleet, 3, (0, 0, 4), hour=(1, 1, 5), after=found["readAt"])
        assert found["probesExcluded"] >= 1
        assert proc.metrics.probes["AuditOnly"] >= 3
