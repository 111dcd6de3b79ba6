"""`convergerd operator` against the simulator: the API server's check_total counter, read from
/metrics, in each Policy's `status.admission` — Deny, Warn and Audit traffic counted exactly,
its own probes left out, restarts and two API servers never making a count negative or
doubled."""

from __future__ import annotations

from typing import Any

from convergerd.sim.fleet import Fleet
from tests.fixtures.fleet import kube_http
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    binding_path,
    get,
    operator_settings,
    put_namespace,
    put_policy,
    running,
    verified_when,
    wait_for,
)

CHECK = "apiserver_validating_admission_policy_check_total"


async def admission_when(fleet: Fleet, accept: Any) -> dict[str, Any] | None:
    policy = await get(fleet, f"{POLICIES}/policy-p1")
    found = ((policy or {}).get("status") or {}).get("admission")
    return found if found is not None and accept(found) else None


def figures(found: dict[str, Any]) -> tuple[int, int, int]:
    return found["denied"], found["warned"], found["audited"]


async def set_actions(fleet: Fleet, actions: list[str]) -> None:
    body = {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "stackship-p1"},
            "spec": {"validationActions": actions}}
    resp = await kube_http(fleet, CLUSTER, "PATCH",
                           f"{binding_path('p1')}?fieldManager=by-hand&force=true", body=body,
                           content_type="application/apply-patch+yaml")
    assert resp.status == 200, resp.body


async def violate(fleet: Fleet, name: str) -> Any:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "c", "image": "nginx:latest"}]}}
    return await kube_http(fleet, CLUSTER, "POST", "/api/v1/namespaces/team-a/pods", body=pod)


def metrics_reads(fleet: Fleet) -> int:
    return sum(1 for r in fleet.accounting.requests(cluster=CLUSTER) if r.path == "/metrics")


async def test_deny_warn_and_audit_are_counted_on_the_policy(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    settings = operator_settings(fleet, CONVERGERD_OPERATOR_ADMISSION_READ_SECONDS="0.2")
    async with running(settings):
        await put_policy(fleet, "p1")
        await wait_for(lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "Denied"))
        # The probe's own denial is counted by the API server, not reported as a tenant's
        # (here it came before the revision's first read, which takes it as the baseline).
        found = await wait_for(lambda: admission_when(fleet, lambda a: True))
        assert figures(found) == (0, 0, 0)
        assert found["revision"] == 1
        raw = (await kube_http(fleet, CLUSTER, "GET", "/metrics")).body.decode()
        assert f'{CHECK}{{enforcement_action="deny",error_type="invalid_error",' \
               'policy="stackship-p1",policy_binding="stackship-p1"} 1' in raw

        assert (await violate(fleet, "denied")).status == 422
        await wait_for(lambda: admission_when(fleet, lambda a: figures(a) == (1, 0, 0)))

        await set_actions(fleet, ["Warn"])
        resp = await violate(fleet, "warned")
        assert resp.status == 201
        assert resp.headers["Warning"].startswith(
            "299 - \"Validation failed for ValidatingAdmissionPolicy 'stackship-p1' with "
            "binding 'stackship-p1': image(s) 'nginx:latest' use the tag 'latest'")
        raw = (await kube_http(fleet, CLUSTER, "GET", "/metrics")).body.decode()
        assert f'{CHECK}{{enforcement_action="warn",error_type="invalid_error",' \
               'policy="stackship-p1",policy_binding="stackship-p1"} 1' in raw
        assert f'{CHECK}{{enforcement_action="deny",error_type="invalid_error",' \
               'policy="stackship-p1",policy_binding="stackship-p1"} 2' in raw  # probe + pod
        await wait_for(lambda: admission_when(fleet, lambda a: figures(a) == (1, 1, 0)))

        await set_actions(fleet, ["Audit"])
        resp = await violate(fleet, "audited")
        assert resp.status == 201
        assert "Warning" not in resp.headers
        found = await wait_for(lambda: admission_when(fleet, lambda a: figures(a) == (1, 1, 1)))
        assert found["lastHour"] | {"since": None} == {"denied": 1, "warned": 1, "audited": 1,
                                                       "since": None}
        assert found["resets"] == 0

        # The API server restarts: its counters start from zero; nothing goes negative.
        fleet.cluster(CLUSTER).apiservers.restart()
        assert (await violate(fleet, "after-restart")).status == 201
        found = await wait_for(lambda: admission_when(fleet, lambda a: figures(a) == (1, 1, 2)))
        assert found["resets"] == 1
        assert "restart" in found["note"]

        # Two API servers behind the Service, answering in turn: each counted once.
        fleet.cluster(CLUSTER).apiservers.restart(replicas=2)
        for name in ("two-a", "two-b"):
            assert (await violate(fleet, name)).status == 201
        await wait_for(lambda: admission_when(fleet, lambda a: figures(a) == (1, 1, 4)))
        reads = metrics_reads(fleet)
        await wait_for(lambda: metrics_reads(fleet) >= reads + 4)  # both read twice more
        found = await wait_for(lambda: admission_when(fleet, lambda a: True))
        assert figures(found) == (1, 1, 4)
