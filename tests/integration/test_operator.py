"""`convergerd operator` against the simulator: Policies become admission objects and status."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from convergerd.config import OperatorSettings, load_operator_settings
from convergerd.operator.main import OperatorProcess
from convergerd.sim import status as sim_status
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import (
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
)
from convergerd.sim.store import AdmissionRequest
from tests.fixtures.fleet import kube_http
from tests.integration.process_helpers import CONVERGERD, clean_env

CLUSTER = "c0001"
POLICIES = "/apis/platform.stackship.se/v1alpha1/policies"
WRITE_VERBS = {"create", "update", "patch", "delete"}


def operator_settings(fleet: Fleet, identity: str = "op-a", **env: str) -> OperatorSettings:
    return load_operator_settings({
        "CONVERGERD_KUBECONFIG": str(fleet.kubeconfig_path),
        "CONVERGERD_OPERATOR_CONTEXT": CLUSTER,
        "CONVERGERD_OPERATOR_HTTP_ADDR": "127.0.0.1:0",
        "CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "0.2",
        "CONVERGERD_IDENTITY": identity,
        **env,
    })


@contextlib.asynccontextmanager
async def running(settings: OperatorSettings) -> AsyncIterator[OperatorProcess]:
    proc = OperatorProcess(settings)
    task = asyncio.create_task(proc.main(signals=False))
    try:
        yield proc
    finally:
        proc.stopping.set()
        await asyncio.wait_for(task, 30)


async def wait_for(check: Callable[[], Any], timeout_s: float = 20.0) -> Any:
    """Poll `check` (sync or async) until it returns something truthy; bounded."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.05)


async def put_namespace(fleet: Fleet, name: str, boundary: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"platform.stackship.se/boundary": boundary}}}
    resp = await kube_http(fleet, CLUSTER, "POST", "/api/v1/namespaces", body=body)
    assert resp.status == 201, resp.body


async def put_policy(fleet: Fleet, pid: str, *, enabled: bool = True, boundary: str = "b1",
                     rule: dict[str, Any] | None = None, revision: int = 1,
                     enforcement: str | None = None) -> None:
    """Apply a Policy as the daemon's save does (`enforcement`: its mode, absent for Deny)."""
    spec: dict[str, Any] = {"policyId": pid, "boundary": boundary, "enabled": enabled,
                            "revision": revision, "rule": rule or {"type": "ForbidLatestTag"}}
    if enforcement is not None:
        spec["enforcement"] = enforcement
    body = {
        "apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": f"policy-{pid}", "labels": {
            "platform.stackship.se/boundary": boundary,
            "app.kubernetes.io/managed-by": "convergerd"}},
        "spec": spec,
    }
    resp = await kube_http(
        fleet, CLUSTER, "PATCH",
        f"{POLICIES}/policy-{pid}?fieldManager=stackship-platform&force=true",
        body=body, content_type="application/apply-patch+yaml")
    assert resp.status in (200, 201), resp.body


async def get(fleet: Fleet, path: str) -> dict[str, Any] | None:
    resp = await kube_http(fleet, CLUSTER, "GET", path)
    return resp.json() if resp.status == 200 else None


def vap_path(pid: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/stackship-{pid}"


def binding_path(pid: str) -> str:
    return ("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/"
            f"stackship-{pid}")


def condition(policy: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    if policy is None:
        return None
    conditions = (policy.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


async def phase_is(fleet: Fleet, pid: str, phase: str) -> dict[str, Any] | None:
    policy = await get(fleet, f"{POLICIES}/policy-{pid}")
    if policy is not None and (policy.get("status") or {}).get("phase") == phase:
        return policy
    return None


async def verified_when(
    fleet: Fleet, pid: str, accept: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    """The Verified condition of a Policy once `accept` holds for it, else None (`wait_for`)."""
    found = condition(await get(fleet, f"{POLICIES}/policy-{pid}"), "Verified")
    return found if found is not None and accept(found) else None


async def verified_of(fleet: Fleet, pid: str) -> dict[str, Any] | None:
    """The Verified condition of a Policy once a probe has answered (not Unknown Pending)."""
    return await verified_when(fleet, pid, lambda v: v["reason"] != "Pending")


def writes(fleet: Fleet, after: int = 0) -> list[Any]:
    """Writes to the operated cluster, Lease traffic left out."""
    return [r for r in fleet.accounting.requests(cluster=CLUSTER, after=after)
            if r.verb in WRITE_VERBS and "/leases" not in r.path and "dryRun" not in r.path]


async def test_policy_lifecycle_enforcing_inert_deleted(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "p1")
        policy = await wait_for(lambda: phase_is(fleet, "p1", "Enforcing"))
        ready = condition(policy, "Ready")
        assert ready is not None
        assert ready["status"] == "True"
        assert ready["reason"] == "Enforcing"
        assert policy["status"]["observedGeneration"] == policy["metadata"]["generation"]
        vap = await get(fleet, vap_path("p1"))
        binding = await get(fleet, binding_path("p1"))
        assert vap is not None
        assert binding is not None
        owner = vap["metadata"]["ownerReferences"][0]
        assert owner["uid"] == policy["metadata"]["uid"]
        assert owner["controller"] is True
        assert binding["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
        assert vap["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "convergerd"
        transition = ready["lastTransitionTime"]

        await put_policy(fleet, "p1", enabled=False)
        policy = await wait_for(lambda: phase_is(fleet, "p1", "Inert"))
        assert await get(fleet, binding_path("p1")) is None
        assert await get(fleet, vap_path("p1")) is not None
        assert policy["status"]["observedGeneration"] == policy["metadata"]["generation"]
        assert condition(policy, "Verified")["reason"] == "NotEnforcing"  # type: ignore[index]

        await put_policy(fleet, "p1", enabled=True)
        await wait_for(lambda: phase_is(fleet, "p1", "Enforcing"))
        assert await get(fleet, binding_path("p1")) is not None

        resp = await kube_http(fleet, CLUSTER, "DELETE", f"{POLICIES}/policy-p1")
        assert resp.status == 200

        async def both_gone() -> bool:
            return (await get(fleet, vap_path("p1")) is None
                    and await get(fleet, binding_path("p1")) is None)

        await wait_for(both_gone)
        assert proc.metrics.phases == {}
    assert transition  # Ready was True with a transition time


async def test_old_cluster_is_unsupported_until_upgraded(fleet: Fleet) -> None:
    fleet.set_faults(CLUSTER, Faults(version="v1.29.4"))
    settings = operator_settings(fleet, CONVERGERD_OPERATOR_RECHECK_SECONDS="0.5")
    async with running(settings):
        await put_policy(fleet, "p1")
        policy = await wait_for(lambda: phase_is(fleet, "p1", "Unsupported"))
        ready = condition(policy, "Ready")
        assert ready is not None
        assert ready["status"] == "False"
        assert ready["reason"] == "ValidatingAdmissionPolicyUnsupported"
        assert "1.30" in ready["message"]
        fleet.clear_faults(CLUSTER)  # the upgrade
        await wait_for(lambda: phase_is(fleet, "p1", "Enforcing"))
        assert await get(fleet, binding_path("p1")) is not None


async def test_rule_that_cannot_be_rendered_is_error_with_reason(fleet: Fleet) -> None:
    async with running(operator_settings(fleet)):
        await put_policy(fleet, "bad", rule={"type": "NoSuchRule"})
        policy = await wait_for(lambda: phase_is(fleet, "bad", "Error"))
        ready = condition(policy, "Ready")
        assert ready is not None
        assert ready["status"] == "False"
        assert ready["reason"] == "InvalidRule"
        assert "unknown type 'NoSuchRule'" in ready["message"]
        assert await get(fleet, vap_path("bad")) is None


async def test_two_replicas_only_the_leader_writes(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    mark = fleet.accounting.requests()[-1].seq
    async with running(operator_settings(fleet, identity="op-a")) as a, \
            running(operator_settings(fleet, identity="op-b")) as b:
        await wait_for(lambda: a.metrics.is_leader or b.metrics.is_leader)
        for pid in ("p1", "p2", "p3"):
            await put_policy(fleet, pid)
        for pid in ("p1", "p2", "p3"):
            await wait_for(lambda pid=pid: phase_is(fleet, pid, "Enforcing"))  # type: ignore[misc]
        leader = "op-a" if a.metrics.is_leader else "op-b"
        assert a.metrics.is_leader != b.metrics.is_leader
    agents = {r.user_agent for r in writes(fleet, mark) if "/policies" not in r.path
              or "/status" in r.path}
    assert agents
    assert all(f"({leader})" in agent for agent in agents), agents


def _deny_probe_pods(request: AdmissionRequest) -> None:
    """A stand-in for kube-apiserver's VAP evaluation: deny pods as `stackship-p1` would."""
    if request.rt.plural == "pods" and request.operation == "CREATE":
        message = (f'pods "{request.name}" is forbidden: ValidatingAdmissionPolicy '
                   "'stackship-p1' with binding 'stackship-p1' denied request: no latest tag")
        raise sim_status.ApiError(sim_status.status_object(
            422, "Invalid", message, {"name": request.name, "kind": "pods",
                                       "causes": [{"message": message}]}))


async def test_probe_denied_by_our_policy_is_verified(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    fleet.store(CLUSTER).admission = _deny_probe_pods
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "p1")
        found = await wait_for(
            lambda: verified_when(fleet, "p1", lambda v: v["status"] != "Unknown"))
        assert (found["status"], found["reason"]) == ("True", "Denied"), found
        assert found["lastProbeTime"]
        assert proc.metrics.probes["Denied"] == 1
    probes = [r for r in fleet.accounting.requests(cluster=CLUSTER) if "dryRun=All" in r.path]
    assert len(probes) == 1
    assert probes[0].path.startswith("/api/v1/namespaces/team-a/pods")


async def test_probe_admitted_and_no_namespace_are_reported(fleet: Fleet) -> None:
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "p1")
        found = await wait_for(
            lambda: verified_when(fleet, "p1", lambda v: v["status"] == "False"))
        assert found["reason"] == "NoBoundaryNamespace"
        # The API is served but the apiserver enforces nothing (its admission plugin is off):
        # the objects exist (Enforcing), the probe's violating Pod is admitted.
        fleet.set_faults(CLUSTER, Faults(admission=False))
        await put_namespace(fleet, "team-a", "b1")
        # A new generation makes the probe due again soon.
        await put_policy(fleet, "p1", rule={"type": "AllowedRegistries",
                                            "registries": ["registry.example.com"]})
        found = await wait_for(
            lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "Admitted"))
        assert found["status"] == "False"
        assert "ADMITTED" in found["message"]
        assert len(proc.metrics.admitted) == 1
        text = proc.metrics.render().decode()
        assert "convergerd_operator_probe_admitted 1.0" in text


async def test_probe_against_simulator_admission_is_verified(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)):
        await put_policy(fleet, "p1")
        found = await wait_for(
            lambda: verified_when(fleet, "p1", lambda v: v["status"] != "Unknown"))
        assert (found["status"], found["reason"]) == ("True", "Denied"), found


async def test_orphans_of_deleted_policies_are_removed_at_start(fleet: Fleet) -> None:
    """A Policy deleted while no operator ran: its admission objects go (no GC here)."""
    store = fleet.store(CLUSTER)
    labels = {"app.kubernetes.io/managed-by": "convergerd"}
    # (a binding needs its validationActions: the API refuses one without)
    specs = {VALIDATING_ADMISSION_POLICIES: {},
             VALIDATING_ADMISSION_POLICY_BINDINGS: {"policyName": "stackship-gone",
                                                    "validationActions": ["Deny"]}}
    for rt, spec in specs.items():
        store.create(rt, None, {"apiVersion": rt.api_version, "kind": rt.kind,
                                "metadata": {"name": "stackship-gone", "labels": labels},
                                "spec": spec}, manager="stackship-operator")
    store.create(VALIDATING_ADMISSION_POLICIES, None, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "someone-elses"}, "spec": {}}, manager="kubectl")
    async with running(operator_settings(fleet)):
        async def gone() -> bool:
            return (await get(fleet, vap_path("gone")) is None
                    and await get(fleet, binding_path("gone")) is None)

        await wait_for(gone)
    assert await get(fleet, "/apis/admissionregistration.k8s.io/v1/"
                            "validatingadmissionpolicies/someone-elses") is not None


async def test_operator_metrics_and_health(fleet: Fleet) -> None:
    import aiohttp

    async with running(operator_settings(fleet)) as proc:
        await wait_for(lambda: proc.port is not None and proc.operator is not None
                       and proc.operator.ready)
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{proc.port}"
            async with session.get(base + "/healthz") as resp:
                assert resp.status == 200
            async with session.get(base + "/readyz") as resp:
                assert resp.status == 200
            async with session.get(base + "/metrics") as resp:
                text = await resp.text()
        assert "convergerd_operator_is_leader 1.0" in text
        assert 'convergerd_operator_policies{phase="Enforcing"} 0.0' in text
        assert "convergerd_operator_vap_supported 1.0" in text


async def test_two_policies_in_one_boundary_are_each_verified_by_their_own_denial(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """As the demo's team-a: an AllowedRegistries and a RequiredLabels policy. Each probe pod
    satisfies the other policy, so each is denied by its own (not ProbeFailed)."""
    caplog.set_level(logging.INFO, logger="convergerd.operator")
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "regs", rule={
            "type": "AllowedRegistries",
            "registries": ["registry.team-a.example.com", "mirror.example.com/team-a"]})
        await put_policy(fleet, "labels", rule={
            "type": "RequiredLabels", "labels": ["app.kubernetes.io/name", "team"]})
        for pid in ("regs", "labels"):
            found = await wait_for(lambda pid=pid: verified_of(fleet, pid))  # type: ignore[misc]
            assert (found["status"], found["reason"]) == ("True", "Denied"), found
            assert f"stackship-{pid}" in found["message"]
        assert proc.metrics.probes["ProbeFailed"] == 0
    named = [r for r in caplog.records if r.name == "convergerd.operator.controller"]
    assert named
    assert all(getattr(r, "cluster", None) == CLUSTER and f"cluster {CLUSTER}" in r.getMessage()
               for r in named)


async def test_a_policy_no_pod_can_violate_alone_is_unknown_inconclusive(fleet: Fleet) -> None:
    """Two ForbidLatestTag policies in one boundary: a pod with tag latest is denied by both,
    so neither probe proves anything: Verified Unknown ProbeInconclusive naming the other,
    not a failure and not Admitted."""
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "p1")
        await put_policy(fleet, "p2")
        for pid, other in (("p1", "p2"), ("p2", "p1")):
            found = await wait_for(lambda pid=pid: verified_of(fleet, pid))  # type: ignore[misc]
            assert (found["status"], found["reason"]) == ("Unknown", "ProbeInconclusive"), found
            assert other in found["message"]
            assert found["lastProbeTime"]
        assert proc.metrics.probes["ProbeInconclusive"] >= 2
        assert not proc.metrics.admitted
        # The conflict goes away: p1 is probed again soon (not after the 10 minute period)
        # because a Policy of its boundary changed, and is Denied.
        await put_policy(fleet, "p2", enabled=False)

        async def denied() -> dict[str, Any] | None:
            found = await verified_of(fleet, "p1")
            return found if found is not None and found["reason"] == "Denied" else None

        assert (await wait_for(denied))["status"] == "True"
    probes = [r for r in fleet.accounting.requests(cluster=CLUSTER) if "dryRun=All" in r.path]
    assert len(probes) == 1  # the inconclusive ones never reached the apiserver


async def test_a_taken_health_port_is_a_one_line_setting_error(fleet: Fleet) -> None:
    """`convergerd operator` on a port something else holds: one line naming the setting and
    the address, exit 2 (a setting to change), no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = await asyncio.create_subprocess_exec(
            *CONVERGERD, "operator", "--context", CLUSTER,
            env=clean_env(CONVERGERD_KUBECONFIG=str(fleet.kubeconfig_path),
                          CONVERGERD_OPERATOR_HTTP_ADDR=addr),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    text = err.decode()
    assert "Traceback" not in text
    last = text.strip().splitlines()[-1]
    assert last == (f"convergerd: setting error: CONVERGERD_OPERATOR_HTTP_ADDR='{addr}': cannot "
                    "listen there: Address already in use; "
                    "choose another address (--operator-http-addr)"), text


async def put_raw_policy(fleet: Fleet, name: str, spec: dict[str, Any]) -> None:
    """A Policy as a cluster may hold it: the CRD's schema is not the operator's guarantee."""
    body = {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
            "metadata": {"name": name}, "spec": spec}
    resp = await kube_http(fleet, CLUSTER, "POST", POLICIES, body=body)
    assert resp.status == 201, resp.body


async def test_a_policy_id_that_is_not_an_id_makes_no_request_and_says_so(fleet: Fleet) -> None:
    """A policyId that would steer the request path elsewhere (here: a watch on the cluster's
    Secrets) is refused before any request: the Policy is Error InvalidPolicyId, nothing is
    read or written for it but its status, and it is not retried."""
    await put_namespace(fleet, "team-a", "b1")
    hostile = "x/../../api/v1/namespaces/kube-system/secrets?watch=1&x="
    mark = fleet.accounting.requests()[-1].seq
    async with running(operator_settings(fleet)) as proc:
        await put_raw_policy(fleet, "policy-evil", {
            "policyId": hostile, "boundary": "b1", "enabled": True, "revision": 1,
            "rule": {"type": "ForbidLatestTag"}})
        await put_policy(fleet, "p1")  # a good one next to it is enforced as usual
        policy = await wait_for(lambda: phase_is(fleet, "evil", "Error"))
        await wait_for(lambda: phase_is(fleet, "p1", "Enforcing"))
        ready = condition(policy, "Ready")
        assert ready is not None
        assert (ready["status"], ready["reason"]) == ("False", "InvalidPolicyId")
        assert "spec.policyId" in ready["message"]
        verified = condition(policy, "Verified")
        assert verified is not None
        assert (verified["status"], verified["reason"]) == ("False", "NotEnforcing")
        errors = proc.metrics.reconciles["error"]
        await wait_for(lambda: proc.metrics.reconciles["unchanged"] >= 1)
    paths = [r.path for r in fleet.accounting.requests(cluster=CLUSTER, after=mark)
             if "(op-a)" in r.user_agent]  # the operator's, not this test's
    assert not [p for p in paths if "secrets" in p or "/api/v1/namespaces/kube-system" in p]
    evil = [p for p in paths if "evil" in p or "x/.." in p]
    assert evil
    assert all(p.startswith(f"{POLICIES}/policy-evil/status?") for p in evil), evil
    assert errors == 0  # refused, not failed: no retry loop


async def forge_verified(fleet: Fleet, pid: str, probe_time: str) -> None:
    """Someone with access to the status writes `Verified True` with a probe time of their
    choosing (a merge patch replaces the conditions list)."""
    policy = await get(fleet, f"{POLICIES}/policy-{pid}")
    assert policy is not None
    conditions = [c for c in policy["status"]["conditions"] if c["type"] != "Verified"]
    conditions.append({"type": "Verified", "status": "True", "reason": "Denied",
                       "message": "a pod violating the policy was denied (forged)",
                       "lastProbeTime": probe_time, "lastTransitionTime": probe_time,
                       "observedGeneration": policy["metadata"]["generation"]})
    resp = await kube_http(fleet, CLUSTER, "PATCH", f"{POLICIES}/policy-{pid}/status",
                           body={"status": {"conditions": conditions}},
                           content_type="application/merge-patch+json")
    assert resp.status == 200, resp.body


async def test_a_forged_verified_does_not_survive_a_new_leader(fleet: Fleet) -> None:
    """Issue 17, item 9: Verified True with lastProbeTime 9999-... written while the policy
    does not work (the apiserver enforces nothing) is not kept by the next leader: it probes
    at once and reports the admitted pod."""
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet, identity="op-a")):
        await put_policy(fleet, "p1")
        await wait_for(lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "Denied"))
    fleet.set_faults(CLUSTER, Faults(admission=False))  # nothing is enforced any more
    await forge_verified(fleet, "p1", "9999-12-31T23:59:59Z")
    async with running(operator_settings(fleet, identity="op-b")) as proc:
        found = await wait_for(
            lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "Admitted"))
        assert found["status"] == "False"
        assert found["lastProbeTime"] < "9999"
        assert proc.metrics.probes["Admitted"] == 1


async def test_a_verified_forged_during_the_term_is_probed_again_at_once(fleet: Fleet) -> None:
    """The leader keeps only the Verified it wrote itself: one written by anyone else during
    its term makes it probe now, not at the next probe period (10 minutes here)."""
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "p1")
        await wait_for(lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "Denied"))
        fleet.set_faults(CLUSTER, Faults(admission=False))
        await forge_verified(fleet, "p1", "9999-12-31T23:59:59Z")
        found = await wait_for(
            lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "Admitted"))
        assert found["lastProbeTime"] < "9999"
        assert proc.metrics.probes["Denied"] == 1
