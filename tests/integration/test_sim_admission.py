"""Rendered policies enforced by the simulator's admission, and `policy eval` agreeing with it.

The matrix runs each rule type on compliant and violating Pods, Deployments and CronJobs in a
namespace of the policy's boundary (enforced) and of another boundary (never enforced), through
a cluster store with the simulator's admission hook, and through `policy eval`'s evaluator:
both must give the same verdict and the same message. The wire tests go through HTTPS, the
official client and kubectl.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from convergerd.admission.evaluate import PolicyEvaluator
from convergerd.admission.render import render_admission
from convergerd.cli.main import main as cli_main
from convergerd.cli.policyeval import PolicyEval
from convergerd.sim import status
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import (
    CRONJOBS,
    DEPLOYMENTS,
    NAMESPACES,
    PODS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    ResourceType,
)
from convergerd.sim.store import ClusterStore
from convergerd.sim.vap import StoreAdmission
from tests.fixtures.fleet import SimProcess, kube_http, running_sim_process

BOUNDARY_LABEL = "platform.stackship.se/boundary"
OWN_NS, OTHER_NS = "team-a-apps", "team-b-apps"
LABELS: dict[str, Any] = {"type": "RequiredLabels", "labels": ["team", "example.com/cost-center"]}
REGISTRIES: dict[str, Any] = {"type": "AllowedRegistries",
              "registries": ["registry.example.com", "mirror.example.com/team-a"]}
LATEST: dict[str, Any] = {"type": "ForbidLatestTag"}
GOOD_IMAGE = "registry.example.com/app:1.2"
GOOD_LABELS = {"team": "a", "example.com/cost-center": "cc-1"}
DIGEST = "sha256:" + "a" * 64


def policy_spec(rule: dict[str, Any], policy_id: str = "p1") -> dict[str, Any]:
    return {"policyId": policy_id, "boundary": "team-a", "enabled": True, "revision": 1,
            "rule": rule}


@dataclass(frozen=True)
class Case:
    id: str
    rule: dict[str, Any]
    denied: bool  # in a namespace of the policy's boundary
    images: tuple[str, ...] = (GOOD_IMAGE,)
    init: tuple[str, ...] = ()
    ephemeral: tuple[str, ...] = ()
    labels: Any = None  # None: GOOD_LABELS

    def pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [
            {"name": f"c{i}", "image": image} for i, image in enumerate(self.images)]}
        if self.init:
            spec["initContainers"] = [{"name": f"i{i}", "image": im}
                                      for i, im in enumerate(self.init)]
        if self.ephemeral:
            spec["ephemeralContainers"] = [{"name": f"e{i}", "image": im}
                                           for i, im in enumerate(self.ephemeral)]
        return spec


CASES = [
    Case("labels-all-present", LABELS, denied=False),
    Case("labels-one-missing", LABELS, denied=True, labels={"team": "a"}),
    Case("labels-none", LABELS, denied=True, labels={}),
    Case("labels-value-empty-is-present", LABELS, denied=False,
         labels={"team": "", "example.com/cost-center": ""}),
    Case("registry-allowed", REGISTRIES, denied=False),
    Case("registry-allowed-path-prefix", REGISTRIES, denied=False,
         images=("mirror.example.com/team-a/app:1",)),
    Case("registry-host-suffix-trick", REGISTRIES, denied=True,
         images=("registry.example.com.evil.io/app:1",)),
    Case("registry-host-longer-name", REGISTRIES, denied=True,
         images=("registry.example.comx/app:1",)),
    Case("registry-path-prefix-trick", REGISTRIES, denied=True,
         images=("mirror.example.com/team-ab/app:1",)),
    Case("registry-parent-of-path-prefix", REGISTRIES, denied=True,
         images=("mirror.example.com/app:1",)),
    Case("registry-short-name", REGISTRIES, denied=True, images=("nginx:1.27",)),
    Case("registry-bad-init-container", REGISTRIES, denied=True,
         init=("docker.io/busybox:1.36",)),
    Case("registry-bad-ephemeral-container", REGISTRIES, denied=True,
         ephemeral=("docker.io/debug:1",)),
    Case("registry-one-bad-among-good", REGISTRIES, denied=True,
         images=(GOOD_IMAGE, "quay.io/x/y:1")),
    Case("latest-pinned-tag", LATEST, denied=False, images=("nginx:1.27.3",)),
    Case("latest-explicit", LATEST, denied=True, images=("nginx:latest",)),
    Case("latest-implicit", LATEST, denied=True, images=("nginx",)),
    Case("latest-implicit-with-path", LATEST, denied=True, images=("registry.example.com/a/b",)),
    Case("latest-registry-port-no-tag", LATEST, denied=True, images=("registry:5000/app",)),
    Case("latest-registry-port-with-tag", LATEST, denied=False, images=("registry:5000/app:2",)),
    Case("latest-digest", LATEST, denied=False, images=(f"nginx@{DIGEST}",)),
    Case("latest-port-and-digest", LATEST, denied=False, images=(f"registry:5000/app@{DIGEST}",)),
    Case("latest-tag-and-digest", LATEST, denied=False, images=(f"nginx:1.2@{DIGEST}",)),
    Case("latest-explicit-with-digest", LATEST, denied=True, images=(f"nginx:latest@{DIGEST}",)),
    Case("latest-look-alike-tag", LATEST, denied=False, images=("nginx:latest-alpine",)),
    Case("latest-init-container", LATEST, denied=True, init=("busybox",)),
    Case("latest-ephemeral-container", LATEST, denied=True, ephemeral=("debug:latest",)),
]
KINDS = {"Pod": PODS, "Deployment": DEPLOYMENTS, "CronJob": CRONJOBS}


def workload(kind: str, case: Case, name: str = "obj") -> dict[str, Any]:
    labels = GOOD_LABELS if case.labels is None else case.labels
    meta = {"name": name, "labels": labels}
    template = {"metadata": {"labels": {"app": name}}, "spec": case.pod_spec()}
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": case.pod_spec()}
    if kind == "Deployment":
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                "spec": {"selector": {"matchLabels": {"app": name}}, "template": template}}
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta,
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}}


def store_with_policies(rules: list[dict[str, Any]]) -> ClusterStore:
    store = ClusterStore()
    store.admission = StoreAdmission(store, PolicyEvaluator())
    for ns, boundary in ((OWN_NS, "team-a"), (OTHER_NS, "team-b")):
        store.create(NAMESPACES, None, {"metadata": {"name": ns, "labels": {
            BOUNDARY_LABEL: boundary}}}, manager="test")
    for i, rule in enumerate(rules):
        adm = render_admission(policy_spec(rule, f"p{i + 1}"))
        store.create(VALIDATING_ADMISSION_POLICIES, None, adm.policy, manager="op")
        store.create(VALIDATING_ADMISSION_POLICY_BINDINGS, None, adm.binding, manager="op")
    return store


@pytest.fixture(scope="module")
def stores() -> dict[str, ClusterStore]:
    return {rule["type"]: store_with_policies([rule]) for rule in (LABELS, REGISTRIES, LATEST)}


def sim_verdict(store: ClusterStore, rt: ResourceType, ns: str, obj: dict[str, Any]) -> str:
    """'' when the simulated cluster admits the dry-run create, else its Status message."""
    error: status.ApiError | None = None
    try:
        store.create(rt, ns, obj, manager="test", dry_run=True)
    except status.ApiError as exc:
        error = exc
    if error is None:
        return ""
    assert (error.code, error.reason) == (422, "Invalid")
    return error.message


@pytest.mark.parametrize("namespace", [OWN_NS, OTHER_NS])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_matrix_and_policy_eval_agree(
    stores: dict[str, ClusterStore], case: Case, kind: str, namespace: str
) -> None:
    obj = workload(kind, case)
    message = sim_verdict(stores[case.rule["type"]], KINDS[kind], namespace, obj)
    enforced = case.denied and namespace == OWN_NS
    assert bool(message) == enforced, message
    if enforced:
        plural = KINDS[kind].group_resource
        assert message.startswith(
            f'{plural} "obj" is forbidden: ValidatingAdmissionPolicy \'stackship-p1\' with '
            "binding 'stackship-p1' denied request: ")

    labels = {BOUNDARY_LABEL: "team-b" if namespace == OTHER_NS else "team-a"}
    verdict = PolicyEval(policy_spec(case.rule), labels).verdict(
        "f#1", obj | {"metadata": obj["metadata"] | {"namespace": namespace}})
    assert verdict.allowed == (not enforced)
    assert verdict.message == message


def test_messages_name_the_offending_images_and_labels(stores: dict[str, ClusterStore]) -> None:
    case = Case("x", LATEST, True, images=("nginx", "redis:7"), init=("busybox:latest",))
    message = sim_verdict(stores["ForbidLatestTag"], PODS, OWN_NS, workload("Pod", case))
    assert message.endswith(
        "denied request: image(s) 'busybox:latest' use the tag 'latest', which changes under "
        "you: pin a version tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)")
    only_implicit = Case("y", LATEST, True, images=("nginx", "registry:5000/app"))
    message = sim_verdict(stores["ForbidLatestTag"], PODS, OWN_NS, workload("Pod", only_implicit))
    assert "image(s) 'nginx', 'registry:5000/app' have no tag or digest" in message

    missing = Case("z", LABELS, True, labels={"team": "a"})
    message = sim_verdict(stores["RequiredLabels"], DEPLOYMENTS, OWN_NS,
                          workload("Deployment", missing))
    assert "missing required label(s) 'example.com/cost-center': add them to metadata.labels " \
           "of this Deployment" in message

    foreign = Case("w", REGISTRIES, True, images=("registry.example.com.evil.io/x:1",))
    message = sim_verdict(stores["AllowedRegistries"], PODS, OWN_NS, workload("Pod", foreign))
    assert "image(s) 'registry.example.com.evil.io/x:1' not from an allowed registry: every " \
           "image must start with one of 'registry.example.com/', 'mirror.example.com/team-a/'" \
           in message


def test_update_to_a_violating_object_is_denied_and_the_stored_one_kept() -> None:
    store = store_with_policies([LATEST])
    good = workload("Deployment", Case("g", LATEST, False, images=("nginx:1.27",)))
    store.create(DEPLOYMENTS, OWN_NS, good, manager="test")
    stored = store.get(DEPLOYMENTS, OWN_NS, "obj")
    bad = workload("Deployment", Case("b", LATEST, True, images=("nginx",)))
    with pytest.raises(status.ApiError, match="have no tag or digest"):
        store.update(DEPLOYMENTS, OWN_NS, "obj", bad, manager="test")
    assert store.get(DEPLOYMENTS, OWN_NS, "obj") == stored


# -- over HTTPS -------------------------------------------------------------------------------


async def install(fleet: Fleet, cluster: str, rule: dict[str, Any]) -> None:
    """As the operator does: server-side apply of the policy and the binding."""
    adm = render_admission(policy_spec(rule))
    base = "/apis/admissionregistration.k8s.io/v1"
    for plural, body in (("validatingadmissionpolicies", adm.policy),
                         ("validatingadmissionpolicybindings", adm.binding)):
        resp = await kube_http(fleet, cluster, "PATCH",
                               f"{base}/{plural}/stackship-p1?fieldManager=operator",
                               body=body, content_type="application/apply-patch+yaml")
        assert resp.status == 201, resp.body
    for ns, boundary in ((OWN_NS, "team-a"), (OTHER_NS, "team-b")):
        resp = await kube_http(fleet, cluster, "POST", "/api/v1/namespaces", body={
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {BOUNDARY_LABEL: boundary}}})
        assert resp.status == 201, resp.body


async def test_denial_is_the_apiservers_status_and_dry_run_stores_nothing(fleet: Fleet) -> None:
    await install(fleet, "c0001", LATEST)
    pod = workload("Pod", Case("x", LATEST, True, images=("nginx",)), name="web")
    path = f"/api/v1/namespaces/{OWN_NS}/pods"
    for query in ("?dryRun=All", ""):
        resp = await kube_http(fleet, "c0001", "POST", path + query, body=pod)
        message = (
            "ValidatingAdmissionPolicy 'stackship-p1' with binding 'stackship-p1' denied "
            "request: image(s) 'nginx' have no tag or digest, which means tag 'latest': pin a "
            "version tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)")
        assert resp.status == 422
        assert resp.json() == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'pods "web" is forbidden: {message}', "reason": "Invalid",
            "details": {"name": "web", "kind": "pods", "causes": [{"message": message}]},
            "code": 422,
        }
    assert (await kube_http(fleet, "c0001", "GET", f"{path}/web")).status == 404

    dep = workload("Deployment", Case("y", LATEST, True, images=("nginx",)), name="api")
    resp = await kube_http(fleet, "c0001", "POST",
                           f"/apis/apps/v1/namespaces/{OWN_NS}/deployments", body=dep)
    assert resp.status == 422
    assert resp.json()["message"].startswith('deployments.apps "api" is forbidden: ')
    assert resp.json()["details"]["group"] == "apps"

    resp = await kube_http(fleet, "c0001", "POST",
                           f"/api/v1/namespaces/{OTHER_NS}/pods", body=pod)
    assert resp.status == 201  # another boundary's namespace: not bound there


async def test_without_the_binding_nothing_is_enforced(fleet: Fleet) -> None:
    await install(fleet, "c0001", LATEST)
    resp = await kube_http(fleet, "c0001", "DELETE", "/apis/admissionregistration.k8s.io/v1/"
                           "validatingadmissionpolicybindings/stackship-p1")
    assert resp.status == 200
    pod = workload("Pod", Case("x", LATEST, True, images=("nginx",)), name="web")
    resp = await kube_http(fleet, "c0001", "POST", f"/api/v1/namespaces/{OWN_NS}/pods", body=pod)
    assert resp.status == 201


async def test_reason_and_failure_policy_as_the_apiserver_applies_them(fleet: Fleet) -> None:
    base = "/apis/admissionregistration.k8s.io/v1"
    await install(fleet, "c0001", LATEST)
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
              "operations": ["CREATE"]}]
    for name, failure, validation in (
        ("forbid", "Fail", {"expression": "false", "reason": "Forbidden", "message": "no"}),
        ("broken", "Fail", {"expression": "object.spec.nope == 1"}),
        ("ignored", "Ignore", {"expression": "object.spec.nope == 1"}),
    ):
        vap = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
               "spec": {"failurePolicy": failure, "matchConstraints": {"resourceRules": rules},
                        "validations": [validation]}}
        binding = {"apiVersion": "admissionregistration.k8s.io/v1",
                   "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
                   "spec": {"policyName": name, "validationActions": ["Deny"],
                            "matchResources": {"namespaceSelector": {"matchLabels": {
                                "kubernetes.io/metadata.name": f"ns-{name}"}}}}}
        for path, body in ((f"{base}/validatingadmissionpolicies", vap),
                           (f"{base}/validatingadmissionpolicybindings", binding),
                           ("/api/v1/namespaces", {"metadata": {"name": f"ns-{name}"}})):
            assert (await kube_http(fleet, "c0001", "POST", path, body=body)).status == 201
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}
    resp = await kube_http(fleet, "c0001", "POST", "/api/v1/namespaces/ns-forbid/pods", body=pod)
    assert (resp.status, resp.json()["reason"]) == (403, "Forbidden")
    assert resp.json()["message"].endswith("with binding 'forbid' denied request: no")
    resp = await kube_http(fleet, "c0001", "POST", "/api/v1/namespaces/ns-broken/pods", body=pod)
    assert (resp.status, resp.json()["reason"]) == (422, "Invalid")
    assert "denied request: expression 'object.spec.nope == 1' resulted in error: " in \
        resp.json()["message"]
    resp = await kube_http(fleet, "c0001", "POST", "/api/v1/namespaces/ns-ignored/pods", body=pod)
    assert resp.status == 201


async def test_below_1_30_there_is_no_admission_policy_api(fleet: Fleet) -> None:
    fleet.set_faults("c0002", Faults(version="v1.29.4"))
    resp = await kube_http(fleet, "c0002", "GET",
                           "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")
    assert resp.status == 404
    resp = await kube_http(fleet, "c0002", "GET", "/apis/apps/v1/namespaces/default/deployments")
    assert resp.status == 200


# -- kubectl and `convergerd policy eval` ----------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with running_sim_process(tmp_path_factory.mktemp("sim"), clusters=1) as sim:
        yield sim


def kubectl(sim: SimProcess, tmp: Path, *args: str, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", f"--kubeconfig={sim.kubeconfig_path}", "--context=c0001",
         f"--cache-dir={tmp / 'kube-cache'}", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False)


def install_with_kubectl(sim: SimProcess, tmp: Path) -> None:
    """The ForbidLatestTag policy p1 and a team-a namespace, applied server-side."""
    adm = render_admission(policy_spec(LATEST))
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": OWN_NS, "labels": {BOUNDARY_LABEL: "team-a"}}}
    setup = yaml.safe_dump_all([adm.policy, adm.binding, namespace])
    done = kubectl(sim, tmp, "apply", "--server-side", "-f", "-", stdin=setup)
    assert done.returncode == 0, done.stderr


needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl")


@needs_kubectl
def test_official_client_sees_the_denial_as_an_api_exception(
    sim: SimProcess, tmp_path: Path
) -> None:
    install_with_kubectl(sim, tmp_path)
    sync: Any = kubernetes  # the generated stubs disagree with dict bodies
    pod = workload("Pod", Case("x", LATEST, True, images=("nginx:latest",)), name="web")
    api = sync.config.new_client_from_config(
        config_file=str(sim.kubeconfig_path), context="c0001")
    with api, pytest.raises(sync.client.ApiException) as caught:
        sync.client.CoreV1Api(api).create_namespaced_pod(OWN_NS, pod, dry_run="All")
    assert caught.value.status == 422
    body = json.loads(caught.value.body)
    assert body["reason"] == "Invalid"
    assert body["message"].startswith(
        'pods "web" is forbidden: ValidatingAdmissionPolicy \'stackship-p1\' with binding '
        "'stackship-p1' denied request: image(s) 'nginx:latest' use the tag 'latest'")


@needs_kubectl
def test_kubectl_and_policy_eval_give_the_same_denial(
    sim: SimProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install_with_kubectl(sim, tmp_path)

    bad = workload("Deployment", Case("b", LATEST, True, init=("busybox",)), name="api")
    good = workload("CronJob", Case("g", LATEST, False, images=("nginx:1.27",)), name="tick")
    for obj in (bad, good):
        obj["metadata"]["namespace"] = OWN_NS
    objects = tmp_path / "objects.yaml"
    objects.write_text(yaml.safe_dump_all([bad, good]))

    done = kubectl(sim, tmp_path, "create", "-f", str(objects))
    assert done.returncode == 1
    assert done.stdout == "cronjob.batch/tick created\n"
    # kubectl prints a 422 by its causes, as it does for a real cluster's denial
    assert done.stderr.strip() == (
        "The deployments \"api\" is invalid: : ValidatingAdmissionPolicy 'stackship-p1' with "
        "binding 'stackship-p1' denied request: image(s) 'busybox' have no tag or digest, "
        "which means tag 'latest': pin a version tag (e.g. nginx:1.27.3) or a digest "
        "(nginx@sha256:...)")
    cause = done.stderr.strip().split("is invalid: : ", 1)[1]
    listed = kubectl(sim, tmp_path, "get", "cronjobs,deployments", "-n", OWN_NS, "-o", "name")
    assert listed.stdout.split() == ["cronjob.batch/tick"]

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"id": "p1", "boundary": "team-a", "rule": LATEST}))
    code = cli_main(["policy", "eval", "--policy", str(policy), "--object", str(objects),
                     "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    denied, allowed = out["results"]
    assert (denied["allowed"], allowed["allowed"]) == (False, True)
    assert denied["message"] == f'deployments.apps "api" is forbidden: {cause}'
