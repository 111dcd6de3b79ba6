"""The shipped deployment: kustomize renders, alert rules and their promtool unit tests.

Runs the real tools: `kubectl kustomize` (kubectl ≥ 1.27 has kustomize built in) and `promtool`
(Debian's `prometheus` package; `.ci/install-tools` installs it). A test whose tool is missing
is skipped with the reason, never silently passed.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from convergerd.admission.verdict import Judge
from convergerd.config import OPERATOR_SETTINGS, SETTINGS
from convergerd.core.model import Policy, PolicyRow
from convergerd.core.render import render_policy, validate_policy
from convergerd.operator.audit import Incomplete, audit, audit_status
from convergerd.operator.cache import memory_limit_bytes

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES_FILE = DEPLOY / "prometheus" / "convergerd-rules.yaml"
PROMETHEUS_RULE = DEPLOY / "prometheus" / "prometheusrule.yaml"
PROMTOOL_TESTS = sorted((ROOT / "tests" / "promtool").glob("*.yaml"))
NAMESPACE = "stackship-system"
# The one place the version is written; the image `make image` tags and deploy/ references.
VERSION = str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
REPOSITORY = "ghcr.io/stackship/convergerd"
IMAGE = f"{REPOSITORY}:{VERSION}"

# Kinds that are cluster-scoped: they must render without metadata.namespace.
CLUSTER_SCOPED = {
    "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace", "Policy",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
}
API_VERSIONS = {
    "Deployment": "apps/v1",
    "ServiceAccount": "v1",
    "Service": "v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "PodDisruptionBudget": "policy/v1",
    "CustomResourceDefinition": "apiextensions.k8s.io/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
}
RENDERED_DIRS = ("base", "sharded", "large-fleet", "sidecar", "member-cluster", "operator",
                 "prometheus")
Obj = dict[str, Any]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        hint = " (run .ci/install-tools)" if name == "promtool" else ""
        pytest.skip(f"{name} is not installed{hint}")
    return path


@cache
def _render_cached(directory: str) -> tuple[Obj, ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / directory)],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def render(directory: str) -> tuple[Obj, ...]:
    _tool("kubectl")
    return _render_cached(directory)


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(deployment: Obj, name: str) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == name]
    assert len(found) == 1, f"no container {name!r} in {deployment['metadata']['name']}"
    result: Obj = found[0]
    return result


def env_of(c: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in c.get("env", [])}


# -- promtool ----------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    promtool = _tool("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES_FILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    promtool = _tool("promtool")
    assert PROMTOOL_TESTS, "no tests/promtool/*.yaml"
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, PROMTOOL_TESTS)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _rules() -> list[Obj]:
    doc = yaml.safe_load(RULES_FILE.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alert_cases() -> Iterator[tuple[str, bool]]:
    """(alertname, expects it firing) for every alert_rule_test case."""
    for path in PROMTOOL_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                yield case["alertname"], bool(case.get("exp_alerts"))


def test_every_alert_has_positive_and_negative_promtool_tests() -> None:
    cases = set(_alert_cases())
    for rule in _rules():
        name = rule["alert"]
        assert (name, True) in cases, f"{name}: no promtool test where it fires"
        assert (name, False) in cases, f"{name}: no promtool test where it stays silent"


def test_every_alert_is_routable_and_documented() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in runbooks.splitlines() if line.startswith("## ")
    }
    for rule in _rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        anchor = name.lower()
        assert annotations["runbook_url"].endswith(f"docs/runbooks.md#{anchor}"), name
        assert anchor in anchors, f"docs/runbooks.md has no section for {name}"
        if "cluster" in rule["expr"] and "by (namespace, job, cluster" in rule["expr"]:
            assert "{{ $labels.cluster }}" in annotations["summary"], name


def test_prometheusrule_holds_the_same_groups_as_the_rules_file() -> None:
    plain = yaml.safe_load(RULES_FILE.read_text())
    wrapped = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert wrapped["kind"] == "PrometheusRule"
    assert wrapped["spec"]["groups"] == plain["groups"], (
        "deploy/prometheus/prometheusrule.yaml is stale: run deploy/prometheus/generate.sh"
    )


@pytest.mark.parametrize("directory", ["base", "sharded", "large-fleet", "sidecar"])
def test_rendered_prometheusrule_is_the_rules_file(directory: str) -> None:
    plain = yaml.safe_load(RULES_FILE.read_text())
    rule = one(render(directory), "PrometheusRule", "convergerd")
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"]["groups"] == plain["groups"]


# -- kustomize: every directory ------------------------------------------------------------


@pytest.mark.parametrize("directory", RENDERED_DIRS)
def test_renders_with_known_api_versions_and_labels(directory: str) -> None:
    objs = render(directory)
    assert objs
    for obj in objs:
        kind = obj["kind"]
        if kind in API_VERSIONS:
            assert obj["apiVersion"] == API_VERSIONS[kind], f"{kind}: {obj['apiVersion']}"
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "stackship", obj["metadata"]["name"]


@pytest.mark.parametrize("directory", RENDERED_DIRS)
def test_scope_cluster_objects_have_no_namespace_and_the_rest_are_in_stackship_system(
    directory: str,
) -> None:
    for obj in render(directory):
        meta = obj["metadata"]
        where = f"{obj['kind']}/{meta['name']}"
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, f"cluster-scoped {where} carries a namespace"
        else:
            assert meta.get("namespace") == NAMESPACE, f"{where} is not in {NAMESPACE}"


def test_kustomize_would_stamp_a_namespace_on_a_cluster_scoped_custom_resource(
    tmp_path: Path,
) -> None:
    """Why deploy/member-cluster sets no `namespace:`: kustomize does not know that a Policy
    (a custom kind) is cluster-scoped, and stamps it."""
    kubectl = _tool("kubectl")
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(_rendered_policy()))
    (tmp_path / "kustomization.yaml").write_text(
        "namespace: stackship-system\nresources: [policy.yaml]\n")
    out = subprocess.run([kubectl, "kustomize", str(tmp_path)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert yaml.safe_load(out)["metadata"].get("namespace") == NAMESPACE


@pytest.mark.parametrize("directory", RENDERED_DIRS)
def test_no_secret_values_in_manifests(directory: str) -> None:
    for obj in render(directory):
        assert obj["kind"] != "Secret", "Secrets are created out of band, never shipped"
        for c in _all_containers(obj):
            for e in c.get("env", []):
                value = str(e.get("value", ""))
                assert not re.search(r"://[^/@\s]+:[^/@\s]+@", value), f"{e['name']}: a password"
                if e["name"] in ("CONVERGERD_DATABASE_URL", "CONVERGERD_API_TOKEN"):
                    assert "value" not in e, f"{e['name']} must come from a Secret"
                    assert "secretKeyRef" in e["valueFrom"], e["name"]
                if e["name"].endswith("_FILE"):
                    assert str(e["value"]).startswith("/etc/convergerd/"), e["name"]


@pytest.mark.parametrize("directory", RENDERED_DIRS)
def test_every_convergerd_image_and_version_label_is_the_package_version(
    directory: str,
) -> None:
    """Bumping pyproject's `version` without deploy/ (or the reverse) fails here."""
    for obj in render(directory):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        labels = [obj["metadata"].get("labels", {})]
        if obj["kind"] == "Deployment":
            labels.append(obj["spec"]["template"]["metadata"].get("labels", {}))
        for label in labels:
            assert label.get("app.kubernetes.io/version", VERSION) == VERSION, where
        for c in _all_containers(obj):
            repository = c["image"].rsplit("@", 1)[0].rsplit(":", 1)[0]
            if repository.endswith("/convergerd"):
                assert c["image"] == IMAGE, f"{where}: {c['image']}"


@pytest.mark.parametrize("directory", RENDERED_DIRS)
def test_every_environment_variable_set_is_a_setting(directory: str) -> None:
    """A misspelt or renamed variable would be ignored by the daemon without a word. (Other
    names, such as the operator's POD_NAME for `$(POD_NAME)`, are the manifest's own.)"""
    known = {s.env for s in (*SETTINGS, *OPERATOR_SETTINGS)}
    for obj in render(directory):
        for c in _all_containers(obj):
            if not c["image"].rsplit(":", 1)[0].endswith("/convergerd"):
                continue
            ours = {e["name"] for e in c.get("env", [])
                    if e["name"].startswith(("CONVERGERD_", "Policies__"))}
            unknown = ours - known
            assert not unknown, f"{obj['metadata']['name']}/{c['name']}: {sorted(unknown)}"



def _all_containers(obj: Obj) -> list[Obj]:
    if obj["kind"] != "Deployment":
        return []
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


# -- deploy/base ---------------------------------------------------------------------------


def _check_convergerd_container(pod: Obj, c: Obj, port_name: str) -> None:
    """What every convergerd container must have, standalone or as a sidecar."""
    assert c["args"] == ["run"]
    assert c["image"] == IMAGE
    env = env_of(c)
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # The DSN and the API token: files from the Secrets, never env values.
    assert not {"CONVERGERD_DATABASE_URL", "CONVERGERD_API_TOKEN"} & set(env)
    for name, secret_name, key in (
        ("CONVERGERD_DATABASE_URL_FILE", "convergerd-database", "url"),
        ("CONVERGERD_API_TOKEN_FILE", "convergerd-api-token", "token"),
    ):
        path = Path(env[name]["value"])
        mount = mounts[str(path.parent)]
        assert mount["readOnly"] is True, name
        sources = volumes[mount["name"]]["projected"]["sources"]
        assert {"key": key, "path": path.name} in next(
            s["secret"]["items"] for s in sources if s["secret"]["name"] == secret_name), name
    assert env["CONVERGERD_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["CONVERGERD_LEADER_ELECTION"]["value"] == "true"
    assert env["Policies__ConvergeIntervalMinutes"]["value"] == "5"
    grace = float(env["CONVERGERD_GRACE_PERIOD_SECONDS"]["value"])
    assert grace < pod["terminationGracePeriodSeconds"]

    # The kubeconfig: a file from a Secret volume, never an env value.
    kubeconfig = Path(env["CONVERGERD_KUBECONFIG"]["value"])
    mount = mounts[str(kubeconfig.parent)]
    assert mount["readOnly"] is True
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "convergerd-kubeconfig"
    assert kubeconfig.name in {i["path"] for i in secret["items"]}
    # The root filesystem is read-only: /tmp is an emptyDir.
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]

    ports = {p["name"]: p for p in c["ports"]}
    http_port = ports[port_name]["containerPort"]
    assert env["CONVERGERD_HTTP_ADDR"]["value"].endswith(f":{http_port}")
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port_name}
    ready = c["readinessProbe"]["httpGet"]
    assert (ready["path"].partition("?")[0], ready["port"]) == ("/readyz", port_name)
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert "memory" in c["resources"]["limits"]
    _check_restricted(pod, c)


def _check_restricted(pod: Obj, c: Obj) -> None:
    sc = c["securityContext"]
    pod_sc = pod.get("securityContext", {})
    assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile"))
    assert seccomp == {"type": "RuntimeDefault"}


def test_base_deployment() -> None:
    objs = render("base")
    deployment = one(objs, "Deployment", "convergerd")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "convergerd"
    assert pod["terminationGracePeriodSeconds"] == 30
    c = container(deployment, "convergerd")
    _check_convergerd_container(pod, c, "http")
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8080}
    # Every readiness check counts: what a restart does not fix takes a replica out.
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert env_of(c)["CONVERGERD_GRACE_PERIOD_SECONDS"]["value"] == "20"
    # Replicas on different nodes.
    spread = {t["topologyKey"]: t for t in pod["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"


def test_base_disruption_budget_service_and_scrape() -> None:
    objs = render("base")
    selector = one(objs, "Deployment", "convergerd")["spec"]["selector"]["matchLabels"]
    pdb = one(objs, "PodDisruptionBudget", "convergerd")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    service = one(objs, "Service", "convergerd")
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    monitor = one(objs, "ServiceMonitor", "convergerd")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert {"action": "replace", "targetLabel": "job", "replacement": "convergerd"} in endpoint[
        "relabelings"]


def _check_lease_role(role: Obj) -> None:
    rules = role["rules"]
    for rule in rules:
        assert rule["apiGroups"] == ["coordination.k8s.io"]
        assert rule["resources"] == ["leases"]
    named = [r for r in rules if r.get("resourceNames")]
    assert all(r["resourceNames"] == ["convergerd"] for r in named)
    assert sorted(v for r in named for v in r["verbs"]) == ["get", "update"]
    # create cannot be limited by name; it is the only unnamed verb.
    assert [r["verbs"] for r in rules if not r.get("resourceNames")] == [["create"]]


def test_base_role_allows_only_the_lease() -> None:
    objs = render("base")
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    _check_lease_role(one(objs, "Role", "convergerd-lease"))
    binding = one(objs, "RoleBinding", "convergerd-lease")
    assert binding["roleRef"]["name"] == "convergerd-lease"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "convergerd", "namespace": NAMESPACE}]


# -- sizing: deploy/base and deploy/large-fleet ---------------------------------------------
#
# The peak RSS of `convergerd run` at the largest fleet each is sized for, and the operator's
# before its cache (bench/RESULTS.md, "Sizing"; MiB), and the headroom docs/operations.md
# ("Sizing") gives it: directory -> (Deployment, container, MiB).
PEAK_RSS_MIB = {"base": ("convergerd", "convergerd", 319.5),
                "sharded": ("convergerd", "convergerd", 319.5),
                "sidecar": ("module-policies", "convergerd", 319.5),
                "large-fleet": ("convergerd", "convergerd", 1853.7),
                "operator": ("convergerd-operator", "operator", 84.2)}
HEADROOM = 1.3


def mebibytes(quantity: str) -> float:
    found = re.fullmatch(r"([0-9.]+)(Mi|Gi)", quantity)
    assert found is not None, f"a memory quantity in Mi or Gi: {quantity}"
    return float(found[1]) * (1024 if found[2] == "Gi" else 1)


@pytest.mark.parametrize("directory", sorted(PEAK_RSS_MIB))
def test_memory_is_the_measured_peak_with_headroom_requested_in_full(directory: str) -> None:
    """A replica over its limit is OOM-killed: the limit covers the peak measured at the fleet
    size the directory is for, and is requested whole (never evicted for using it)."""
    deployment, name, peak = PEAK_RSS_MIB[directory]
    resources = container(one(render(directory), "Deployment", deployment), name)["resources"]
    limit = mebibytes(resources["limits"]["memory"])
    assert limit >= HEADROOM * peak, (directory, limit)
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_large_fleet_is_the_base_with_more_resources() -> None:
    def without_resources(directory: str) -> Obj:
        deployment = one(render(directory), "Deployment", "convergerd")
        pod = deployment["spec"]["template"]["spec"]
        containers = [{k: v for k, v in c.items() if k != "resources"}
                      for c in pod["containers"]]
        return {**deployment, "spec": {**deployment["spec"], "template": {
            **deployment["spec"]["template"], "spec": {**pod, "containers": containers}}}}

    assert without_resources("large-fleet") == without_resources("base")
    others = {(o["kind"], o["metadata"]["name"]) for o in render("large-fleet")}
    assert others == {(o["kind"], o["metadata"]["name"]) for o in render("base")}
    large, base = (container(one(render(d), "Deployment", "convergerd"), "convergerd")
                   for d in ("large-fleet", "base"))
    assert mebibytes(large["resources"]["limits"]["memory"]) > mebibytes(
        base["resources"]["limits"]["memory"])


# -- deploy/sharded ------------------------------------------------------------------------
#
# Lease names by the fixed pattern (docs/design.md, "Leader election and fencing"): shard k is
# `convergerd-shard-<k>`, a replica's membership Lease `convergerd-member-<identity>`.


def _grants(role: Obj, verb: str, name: str | None) -> bool:
    """Whether the Role lets `verb` act on the Lease `name` (None: the collection, as list,
    watch and create are authorized), as the RBAC authorizer decides."""
    return any(
        "coordination.k8s.io" in rule["apiGroups"] and "leases" in rule["resources"]
        and verb in rule["verbs"]
        and (not rule.get("resourceNames") or (name is not None and name in rule["resourceNames"]))
        for rule in role["rules"]
    )


def test_sharded_deployment_runs_three_replicas_with_shards() -> None:
    objs = render("sharded")
    deployment = one(objs, "Deployment", "convergerd")
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment, "convergerd")
    _check_convergerd_container(pod, c, "http")
    # The rest of the container is deploy/base's.
    base = container(one(render("base"), "Deployment", "convergerd"), "convergerd")
    assert {k: v for k, v in env_of(c).items() if k != "CONVERGERD_SHARDS"} == env_of(base)
    shards = int(env_of(c)["CONVERGERD_SHARDS"]["value"])
    # More shards than replicas, split evenly: every replica holds the same share.
    assert shards > deployment["spec"]["replicas"]
    assert shards % deployment["spec"]["replicas"] == 0
    spread = {t["topologyKey"]: t for t in pod["topologySpreadConstraints"]}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"


def test_sharded_disruption_budget_takes_one_replica_at_a_time() -> None:
    objs = render("sharded")
    selector = one(objs, "Deployment", "convergerd")["spec"]["selector"]["matchLabels"]
    pdb = one(objs, "PodDisruptionBudget", "convergerd")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector


def test_sharded_role_covers_every_lease_the_replicas_use() -> None:
    objs = render("sharded")
    role = one(objs, "Role", "convergerd-lease")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    deployment = one(objs, "Deployment", "convergerd")
    shards = int(env_of(container(deployment, "convergerd"))["CONVERGERD_SHARDS"]["value"])
    # Shard Leases: taken (created when missing), renewed, released, and read by every replica.
    for k in range(shards):
        for verb in ("get", "create", "update"):
            assert _grants(role, verb, f"convergerd-shard-{k}"), (verb, k)
    # Membership Leases: named after the pod, so unknown until it runs.
    member = "convergerd-member-convergerd-7d9f8b6c4-x2x9q"
    for verb in ("get", "create", "update"):
        assert _grants(role, verb, member), verb
    assert _grants(role, "list", None)
    # What the code uses and nothing more (no watch, no delete).
    assert sorted({v for rule in role["rules"] for v in rule["verbs"]}) == [
        "create", "get", "list", "update"]
    # Leases only, nothing else in the namespace.
    for rule in role["rules"]:
        assert (rule["apiGroups"], rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    binding = one(objs, "RoleBinding", "convergerd-lease")
    assert binding["roleRef"]["name"] == "convergerd-lease"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "convergerd", "namespace": NAMESPACE}]


def test_base_role_does_not_reach_shard_leases() -> None:
    """The checker above, on deploy/base: it tells a name-limited Role from an open one."""
    role = one(render("base"), "Role", "convergerd-lease")
    assert _grants(role, "update", "convergerd")
    assert not _grants(role, "update", "convergerd-shard-0")
    assert not _grants(role, "list", None)


# -- deploy/sidecar ------------------------------------------------------------------------


def test_sidecar_runs_convergerd_in_every_module_policies_pod() -> None:
    objs = render("sidecar")
    deployment = one(objs, "Deployment", "module-policies")
    assert deployment["spec"]["replicas"] > 1
    pod = deployment["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    assert "module-policies" in names
    c = container(deployment, "convergerd")
    _check_convergerd_container(pod, c, "convergerd-http")
    # The sidecar's election trouble must not take module-policies out of its Service.
    assert c["readinessProbe"]["httpGet"]["path"] == (
        "/readyz?exclude=lease_unreachable&exclude=lease_stalled")
    # No clash with the main container's ports.
    main_ports = {p["containerPort"] for p in container(deployment, "module-policies")["ports"]}
    assert not main_ports & {p["containerPort"] for p in c["ports"]}
    _check_lease_role(one(objs, "Role", "module-policies-convergerd-lease"))
    binding = one(objs, "RoleBinding", "module-policies-convergerd-lease")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}]
    monitor = one(objs, "PodMonitor", "convergerd")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("convergerd-http", "/metrics")


# -- deploy/member-cluster -----------------------------------------------------------------


def _crd() -> Obj:
    return one(render("member-cluster"), "CustomResourceDefinition",
               "policies.platform.stackship.se")


def test_crd_names_scope_and_columns() -> None:
    spec = _crd()["spec"]
    assert spec["group"] == "platform.stackship.se"
    assert spec["scope"] == "Cluster"
    assert spec["names"] | {"categories": None} == {
        "kind": "Policy", "listKind": "PolicyList", "plural": "policies", "singular": "policy",
        "categories": None}
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Boundary", "Enabled", "Revision", "Phase", "Age"]


def _schema() -> Obj:
    schema: Obj = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_crd_schema_constrains_spec_and_status() -> None:
    props = _schema()["properties"]
    spec = props["spec"]["properties"]
    assert spec["policyId"]["maxLength"] == 50
    assert spec["revision"]["minimum"] == 1
    assert spec["enabled"]["type"] == "boolean"
    rule = spec["rule"]
    assert rule["properties"]["type"]["enum"] == [
        "RequiredLabels", "AllowedRegistries", "ForbidLatestTag"]
    assert len(rule["x-kubernetes-validations"]) == 3
    status = props["status"]["properties"]
    assert status["phase"]["enum"] == ["Enforcing", "Inert", "Unsupported", "Error"]
    assert status["observedGeneration"]["type"] == "integer"
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_the_audit_status_conforms_to_the_crd() -> None:
    """The operator's status.audit is accepted by the schema (a real apiserver would prune
    an undeclared field)."""
    judge = Judge.of({"policyId": "p", "boundary": "b", "enabled": False, "revision": 1,
                      "rule": {"type": "ForbidLatestTag"}})
    pods = [{"kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "team-a"},
             "images": ("nginx",)} for i in range(7)]
    status = {"audit": audit_status(audit(judge, pods), synced=True,
                                    now=dt.datetime(2026, 12, 3, tzinfo=dt.UTC))}
    _conforms(status, _schema()["properties"]["status"], "status")
    assert len(status["audit"]["sample"]) == _schema()["properties"]["status"]["properties"][
        "audit"]["properties"]["sample"]["maxItems"]


def _rendered_policy(rule: Obj | None = None) -> Obj:
    policy = validate_policy(PolicyRow(
        id="p-regs", boundary="team-a", enabled=True, revision=3,
        rule=rule or {"type": "AllowedRegistries", "registries": ["registry.example.com/team"]},
    ))
    assert isinstance(policy, Policy), policy
    return render_policy(policy)


def _conforms(value: Any, schema: Obj, where: str = "") -> None:
    """A small structural check of `value` against an OpenAPI v3 schema (the subset we use)."""
    kind = schema.get("type")
    python = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    if kind:
        assert isinstance(value, python[kind]), f"{where}: {value!r} is not {kind}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if "pattern" in schema:
        assert re.search(schema["pattern"], value), f"{where}: {value!r} !~ {schema['pattern']}"
    if "maxLength" in schema:
        assert len(value) <= schema["maxLength"], where
    if "minimum" in schema:
        assert value >= schema["minimum"], where
    if kind == "object" and "properties" in schema:
        for key in schema.get("required", []):
            assert key in value, f"{where}.{key} is required"
        for key, item in value.items():
            assert key in schema["properties"], f"{where}.{key} is not in the schema (pruned)"
            _conforms(item, schema["properties"][key], f"{where}.{key}")
    if kind == "array":
        for i, item in enumerate(value):
            _conforms(item, schema["items"], f"{where}[{i}]")


@pytest.mark.parametrize("rule", [
    {"type": "AllowedRegistries", "registries": ["registry.example.com/team", "ghcr.io"]},
    {"type": "RequiredLabels", "labels": ["app.kubernetes.io/name", "team"]},
    {"type": "ForbidLatestTag"},
])
def test_what_convergerd_renders_fits_the_crd_schema(rule: Obj) -> None:
    body = _rendered_policy(rule)
    schema = _schema()
    assert body["apiVersion"] == "platform.stackship.se/v1alpha1"
    assert body["metadata"]["name"] == "policy-" + body["spec"]["policyId"]
    _conforms(body["spec"], schema["properties"]["spec"], "spec")
    # The same object, sent through kustomize without a namespace, stays cluster-scoped.
    assert "namespace" not in body["metadata"]


def test_convergerd_may_only_touch_policies_in_member_clusters() -> None:
    objs = render("member-cluster")
    role = one(objs, "ClusterRole", "stackship:convergerd:policies")
    assert role["rules"] == [{
        "apiGroups": ["platform.stackship.se"], "resources": ["policies"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    }]
    binding = one(objs, "ClusterRoleBinding", "stackship:convergerd:policies")
    assert binding["roleRef"]["name"] == "stackship:convergerd:policies"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "convergerd", "namespace": NAMESPACE}]


def test_operator_rbac_and_deployment() -> None:
    objs = render("operator")
    role = one(objs, "ClusterRole", "stackship:convergerd:operator")
    grants: dict[tuple[str, str], list[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", ()):
            for resource in rule["resources"]:
                grants[group, resource] = sorted({*grants.get((group, resource), ()),
                                                  *rule["verbs"]})
    full = sorted(["get", "list", "watch", "create", "update", "patch", "delete"])
    watch = ["list", "watch"]  # the audit's workload cache
    assert grants == {
        ("platform.stackship.se", "policies"): ["get", "list", "watch"],
        ("platform.stackship.se", "policies/status"): ["patch", "update"],
        ("admissionregistration.k8s.io", "validatingadmissionpolicies"): full,
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"): full,
        ("", "namespaces"): ["get", "list", "watch"],
        ("", "pods"): ["create", "list", "watch"],  # the dry-run probe; the cache
        ("apps", "deployments"): watch, ("apps", "replicasets"): watch,
        ("apps", "statefulsets"): watch, ("apps", "daemonsets"): watch,
        ("batch", "jobs"): watch, ("batch", "cronjobs"): watch,
    }
    discovery = [r for r in role["rules"] if "nonResourceURLs" in r]
    assert discovery == [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/version"],
                          "verbs": ["get"]},
                         {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]  # admission counts
    lease_role = one(objs, "Role", "convergerd-operator-lease")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    named = [r for r in lease_role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["convergerd-operator"], "verbs": ["get", "update"]}]
    lease_binding = one(objs, "RoleBinding", "convergerd-operator-lease")
    assert lease_binding["subjects"][0]["name"] == "convergerd-operator"
    binding = one(objs, "ClusterRoleBinding", "stackship:convergerd:operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "convergerd-operator", "namespace": NAMESPACE}]
    deployment = one(objs, "Deployment", "convergerd-operator")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "convergerd-operator"
    assert deployment["spec"]["replicas"] == 2
    c = container(deployment, "operator")
    assert c["args"] == ["operator"]
    assert c["ports"] == [{"name": "health", "containerPort": 8081, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["resources"]["requests"]
    assert c["resources"]["limits"]
    _check_restricted(pod, c)


def test_the_operators_memory_limit_follows_from_its_cache_budget() -> None:
    """deploy/operator's limit is what `memory_limit_bytes` derives from the settings it
    sets (docs/operations.md): raising the budget without the limit fails here."""
    c = container(one(render("operator"), "Deployment", "convergerd-operator"), "operator")
    env = env_of(c)
    budget = int(env["CONVERGERD_OPERATOR_CACHE_MAX_BYTES"]["value"])
    cap = int(env["CONVERGERD_MAX_RESPONSE_BYTES"]["value"])
    limit = c["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert int(limit[:-2]) * 2**20 == memory_limit_bytes(budget, cap)
    assert cap >= 2 * 2**20  # above the largest object kube-apiserver stores (1.5 MiB)


def test_an_incomplete_audit_conforms_to_the_crd() -> None:
    judge = Judge.of({"policyId": "p", "boundary": "b", "enabled": False, "revision": 1,
                      "rule": {"type": "ForbidLatestTag"}})
    incomplete = Incomplete(refused=3, lost=1, too_large=tuple(
        ("Deployment", "n" * 63, f"huge-{i}" + "x" * 240) for i in range(5)),
        too_large_count=9, biggest=tuple((f"ns-{i}" + "y" * 58, 2**30) for i in range(3)),
        max_bytes=2**26)
    status = {"audit": audit_status(audit(judge, []), synced=False, incomplete=incomplete,
                                    now=dt.datetime(2026, 12, 3, tzinfo=dt.UTC))}
    _conforms(status, _schema()["properties"]["status"], "status")
    assert status["audit"]["incomplete"]["skipped"] == 12


@pytest.mark.parametrize("mode", ["Deny", "Warn", "Audit"])
def test_every_mode_fits_the_crd_and_the_crd_defaults_none(mode: str) -> None:
    """A Warn or Audit Policy (and the operator's status.enforcementAction) is accepted, not
    pruned; `spec.enforcement` has no default, so the API server never adds `Deny` to a Policy
    convergerd wrote without it (which every round would then see as drift)."""
    policy = validate_policy(PolicyRow("p-latest", "team-a", {"type": "ForbidLatestTag"}, True,
                                       3, mode))
    assert isinstance(policy, Policy), policy
    schema = _schema()["properties"]
    _conforms(render_policy(policy)["spec"], schema["spec"], "spec")
    _conforms({"phase": "Enforcing", "enforcementAction": mode}, schema["status"], "status")
    assert "default" not in schema["spec"]["properties"]["enforcement"]


def test_member_cluster_includes_the_operator() -> None:
    """Applying deploy/member-cluster installs the CRD, convergerd's access and the operator."""
    objs = render("member-cluster")
    one(objs, "CustomResourceDefinition", "policies.platform.stackship.se")
    one(objs, "ClusterRole", "stackship:convergerd:policies")
    deployment = one(objs, "Deployment", "convergerd-operator")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    one(objs, "ClusterRole", "stackship:convergerd:operator")


# -- the Grafana dashboard's queries -----------------------------------------------------------


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables replaced by what they expand to)."""
    promtool = _tool("promtool")
    dashboard = yaml.safe_load((ROOT / "grafana" / "convergerd.json").read_text())

    def panels(items: list[Obj]) -> Iterator[Obj]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    exprs = [t["expr"] for p in panels(dashboard["panels"]) for t in p.get("targets", [])]
    assert exprs
    expand = {"$__rate_interval": "2m", "$namespace": ".*", "$cluster": ".*"}
    rules = []
    for i, expr in enumerate(exprs):
        query = expr
        for var, value in expand.items():
            query = query.replace(var, value)
        assert "$" not in query, f"unexpanded variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": query})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
