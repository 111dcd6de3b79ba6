"""The simulator's admission under `Warn` and `Audit` bindings, and its API servers' counter
`apiserver_validating_admission_policy_check_total` on `/metrics`, as kube-apiserver has them
(dispatcher.go, metrics.go in k8s.io/apiserver/pkg/admission/plugin/policy/validating)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from convergerd.admission.render import render_admission
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from tests.fixtures.fleet import SimProcess, kube_http, running_sim_process

BOUNDARY_LABEL = "platform.stackship.se/boundary"
NS = "team-a-apps"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
CHECK = "apiserver_validating_admission_policy_check_total"
MESSAGE = ("image(s) 'nginx' have no tag or digest, which means tag 'latest': pin a version "
           "tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)")
WARNING = f"Validation failed for ValidatingAdmissionPolicy 'stackship-p1' with binding " \
          f"'stackship-p1': {MESSAGE}"


def admission(actions: list[str], policy_id: str = "p1") -> list[dict[str, Any]]:
    adm = render_admission({"policyId": policy_id, "boundary": "team-a", "enabled": True,
                            "revision": 1, "rule": {"type": "ForbidLatestTag"}})
    adm.binding["spec"]["validationActions"] = actions
    return [adm.policy, adm.binding]


async def install(fleet: Fleet, actions: list[str]) -> None:
    policy, binding = admission(actions)
    for plural, body in (("validatingadmissionpolicies", policy),
                         ("validatingadmissionpolicybindings", binding)):
        resp = await kube_http(fleet, "c0001", "PATCH",
                               f"{ADMISSION}/{plural}/stackship-p1?fieldManager=t&force=true",
                               body=body, content_type="application/apply-patch+yaml")
        assert resp.status in (200, 201), resp.body
    resp = await kube_http(fleet, "c0001", "POST", "/api/v1/namespaces", body={
        "metadata": {"name": NS, "labels": {BOUNDARY_LABEL: "team-a"}}})
    assert resp.status in (201, 409)


def pod(name: str, image: str = "nginx") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}]}}


async def create(fleet: Fleet, name: str, query: str = "", image: str = "nginx") -> Any:
    return await kube_http(fleet, "c0001", "POST", f"/api/v1/namespaces/{NS}/pods{query}",
                           body=pod(name, image))


def warnings(resp: Any) -> list[str]:
    return [v for k, v in resp.headers_all if k.lower() == "warning"]


def checks(text: str) -> dict[tuple[str, ...], float]:
    """The counter's series: (policy, binding, error_type, enforcement_action) -> value."""
    out = {}
    for labels, value in re.findall(rf"^{CHECK}{{([^}}]*)}} (\S+)$", text, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = tuple(found[k] for k in ("policy", "policy_binding", "error_type",
                                       "enforcement_action"))
        out[key] = float(value)
    return out


async def metrics(fleet: Fleet) -> str:
    resp = await kube_http(fleet, "c0001", "GET", "/metrics")
    assert resp.status == 200, resp.body
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return resp.body.decode()


def series(action: str, n: float) -> dict[tuple[str, ...], float]:
    return {("stackship-p1", "stackship-p1", "invalid_error", action): n}


async def test_warn_admits_with_the_policys_warning_and_counts_warn(fleet: Fleet) -> None:
    await install(fleet, ["Warn"])
    for query in ("?dryRun=All", ""):
        resp = await create(fleet, "web", query)
        assert resp.status == 201, resp.body
        assert warnings(resp) == [f'299 - "{WARNING}"']
    assert warnings(await create(fleet, "ok", image="nginx:1.27")) == []
    # Counted per failed validation, dry-runs too; a passing one is not counted.
    assert checks(await metrics(fleet)) == series("warn", 2)


async def test_deny_counts_deny_and_audit_admits_silently(fleet: Fleet) -> None:
    await install(fleet, ["Deny"])
    resp = await create(fleet, "web")
    assert resp.status == 422
    assert warnings(resp) == []
    assert checks(await metrics(fleet)) == series("deny", 1)

    await install(fleet, ["Audit"])
    resp = await create(fleet, "web")
    assert resp.status == 201
    assert warnings(resp) == []
    logged = fleet.accounting.requests(cluster="c0001", verb="create")[-1].to_json()
    annotation = json.loads(logged["auditAnnotations"][
        "validation.policy.admission.k8s.io/validation_failure"])
    assert annotation == [{"message": MESSAGE, "policy": "stackship-p1",
                           "binding": "stackship-p1", "expressionIndex": 1,
                           "validationActions": ["Audit"]}]
    assert checks(await metrics(fleet)) == series("deny", 1) | series("audit", 1)


async def test_a_binding_with_deny_and_warn_is_refused(fleet: Fleet) -> None:
    _, binding = admission(["Deny", "Warn"])
    resp = await kube_http(fleet, "c0001", "POST",
                           f"{ADMISSION}/validatingadmissionpolicybindings", body=binding)
    assert resp.status == 422
    detail = ("must not contain both Deny and Warn (repeating the same validation failure "
              "information in the API response and headers serves no purpose)")
    value = '[]admissionregistration.ValidationAction{"Deny", "Warn"}'
    assert resp.json()["message"] == (
        'ValidatingAdmissionPolicyBinding.admissionregistration.k8s.io "stackship-p1" is '
        f"invalid: spec.validationActions: Invalid value: {value}: {detail}")
    assert resp.json()["details"]["causes"] == [{
        "reason": "FieldValueInvalid", "field": "spec.validationActions",
        "message": f"Invalid value: {value}: {detail}"}]
    _, twice = admission(["Audit", "Audit"])
    resp = await kube_http(fleet, "c0001", "POST",
                           f"{ADMISSION}/validatingadmissionpolicybindings", body=twice)
    assert resp.json()["details"]["causes"][0]["message"] == 'Duplicate value: "Audit"'


async def test_metrics_needs_the_right_and_restarts_reset_it(fleet: Fleet) -> None:
    anonymous = await kube_http(fleet, "c0001", "GET", "/metrics", token=None)
    assert anonymous.status == 403
    assert anonymous.json() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'forbidden: User "system:anonymous" cannot get path "/metrics"',
        "reason": "Forbidden", "details": {}, "code": 403}
    fleet.set_faults("c0001", Faults(metrics=False))
    assert (await kube_http(fleet, "c0001", "GET", "/metrics")).status == 403
    fleet.clear_faults("c0001")

    await install(fleet, ["Warn", "Audit"])
    await create(fleet, "web", "?dryRun=All")
    text = await metrics(fleet)
    assert checks(text) == series("warn", 1) | series("audit", 1)
    started = re.search(r"^process_start_time_seconds (\S+)$", text, re.M)
    assert started is not None

    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fleet.admin_url}/_sim/clusters/c0001/apiservers/restart",
                     json={"replicas": 2}) as resp,
    ):
        assert resp.status == 200
        assert len((await resp.json())["apiServers"]) == 2
    await create(fleet, "web", "?dryRun=All")  # admitted by the first API server
    first, second = await metrics(fleet), await metrics(fleet)
    assert checks(first) == series("warn", 1) | series("audit", 1)
    assert checks(second) == {}
    starts = {re.search(r"^process_start_time_seconds (\S+)$", t, re.M).group(1)  # type: ignore[union-attr]
              for t in (first, second)}
    assert len(starts) == 2
    assert started.group(1) not in starts


# -- kubectl -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with running_sim_process(tmp_path_factory.mktemp("sim"), clusters=1) as sim:
        yield sim


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl")
def test_kubectl_prints_the_warning_and_creates_the_pod(sim: SimProcess, tmp_path: Path) -> None:
    def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", f"--kubeconfig={sim.kubeconfig_path}", "--context=c0001",
             f"--cache-dir={tmp_path / 'kube-cache'}", *args],
            input=stdin, capture_output=True, text=True, timeout=60, check=False)

    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NS, "labels": {BOUNDARY_LABEL: "team-a"}}}
    done = kubectl("apply", "--server-side", "-f", "-",
                   stdin=yaml.safe_dump_all([*admission(["Warn", "Audit"]), namespace]))
    assert done.returncode == 0, done.stderr
    done = kubectl("create", "-n", NS, "-f", "-", stdin=json.dumps(pod("web")))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pod/web created\n"
    assert done.stderr == f"Warning: {WARNING}\n"
