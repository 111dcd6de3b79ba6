"""The real kubectl (1.32) against the simulator subprocess and the kubeconfig it writes.

kubectl is client-go: if these pass, discovery, OpenAPI v3 (for --validate=strict), server-side
apply with field managers, label selectors and Status errors look real enough to Go clients.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.fleet import SimProcess, running_sim_process

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")

POLICY = """\
apiVersion: platform.stackship.se/v1alpha1
kind: Policy
metadata:
  name: {name}
  labels:
    team: {team}
spec:
  policyId: {name}
  enabled: {enabled}
  revision: 1
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with running_sim_process(tmp_path_factory.mktemp("sim"), clusters=3) as sim:
        yield sim


class Kubectl:
    def __init__(self, sim: SimProcess, workdir: Path) -> None:
        self.sim = sim
        self.workdir = workdir

    def run(
        self, *args: str, context: str = "c0001", stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            "kubectl",
            f"--kubeconfig={self.sim.kubeconfig_path}",
            f"--context={context}",
            # A private discovery cache: fault changes between tests must not be served stale.
            f"--cache-dir={self.workdir / 'kube-cache'}",
            *args,
        ]
        proc = subprocess.run(
            cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def apply(self, manifest: str, *extra: str, context: str = "c0001", check: bool = True) -> Any:
        return self.run(
            "apply",
            "--server-side",
            "-f",
            "-",
            *extra,
            stdin=manifest,
            context=context,
            check=check,
        )

    def json(self, *args: str, context: str = "c0001") -> Any:
        out = self.run(*args, "-o", "json", "--show-managed-fields", context=context).stdout
        return json.loads(out)


@pytest.fixture
def kubectl(sim: SimProcess, tmp_path: Path) -> Iterator[Kubectl]:
    yield Kubectl(sim, tmp_path)
    for cid in ("c0001", "c0002", "c0003"):
        sim.admin("DELETE", f"/_sim/clusters/{cid}/faults")


def test_get_raw_version(kubectl: Kubectl) -> None:
    version = json.loads(kubectl.run("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == "v1.32.0"


def test_api_resources_follow_version_and_crd(kubectl: Kubectl, sim: SimProcess) -> None:
    names = kubectl.run("api-resources", "-o", "name", context="c0002").stdout.split()
    assert "policies.platform.stackship.se" in names
    assert "leases.coordination.k8s.io" in names
    assert "validatingadmissionpolicies.admissionregistration.k8s.io" in names
    assert "namespaces" in names

    sim.admin("POST", "/_sim/clusters/c0002/faults", {"version": "v1.29.4", "crd": False})
    names = kubectl.run("api-resources", "-o", "name", context="c0002").stdout.split()
    assert "validatingadmissionpolicies.admissionregistration.k8s.io" not in names
    assert "policies.platform.stackship.se" not in names
    assert "leases.coordination.k8s.io" in names


def test_server_side_apply_get_and_delete(kubectl: Kubectl) -> None:
    out = kubectl.apply(POLICY.format(name="p-apply", team="a", enabled="true")).stdout
    assert "policy.platform.stackship.se/p-apply serverside-applied" in out

    table = kubectl.run("get", "policies").stdout.splitlines()
    assert table[0].split() == ["NAME", "BOUNDARY", "ENABLED", "REVISION", "PHASE", "AGE"]
    assert any(line.split()[0] == "p-apply" for line in table[1:])

    obj = kubectl.json("get", "policy", "p-apply")
    assert obj["spec"]["enabled"] is True
    assert obj["metadata"]["generation"] == 1
    [entry] = obj["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("kubectl", "Apply")

    # Re-applying the same manifest changes nothing.
    kubectl.apply(POLICY.format(name="p-apply", team="a", enabled="true"))
    again = kubectl.json("get", "policy", "p-apply")
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]

    out = kubectl.run("delete", "policy", "p-apply").stdout
    assert 'policy.platform.stackship.se "p-apply" deleted' in out
    gone = kubectl.run("get", "policy", "p-apply", check=False)
    assert gone.returncode != 0
    assert 'policies.platform.stackship.se "p-apply" not found' in gone.stderr


FULL_POLICY = """\
apiVersion: platform.stackship.se/v1alpha1
kind: Policy
metadata:
  name: policy-{name}
  labels:
    tier: {tier}
spec:
  policyId: {name}
  boundary: {boundary}
  enabled: {enabled}
  revision: {revision}
  rule:
    type: ForbidLatestTag
"""


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_get_prints_the_crd_printer_columns(kubectl: Kubectl) -> None:
    """Server-side printing: kubectl asks for a Table and shows the CRD's columns."""
    ctx = "c0002"
    kubectl.apply(
        FULL_POLICY.format(
            name="tbl-a", tier="gold", boundary="team-a", enabled="true", revision=3
        ),
        context=ctx,
    )
    kubectl.apply(
        FULL_POLICY.format(
            name="tbl-b", tier="silver", boundary="team-b", enabled="false", revision=12
        ),
        context=ctx,
    )
    kubectl.run(
        "patch",
        "policy",
        "policy-tbl-a",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"phase":"Enforcing"}}',
        context=ctx,
    )

    rows = _rows(kubectl.run("get", "policies", context=ctx).stdout)
    assert rows[0] == ["NAME", "BOUNDARY", "ENABLED", "REVISION", "PHASE", "AGE"]
    body = {r[0]: r[1:] for r in rows[1:]}
    assert body["policy-tbl-a"][:4] == ["team-a", "true", "3", "Enforcing"]
    # no status yet: the server sends a null cell, which kubectl leaves blank
    assert body["policy-tbl-b"][:3] == ["team-b", "false", "12"]
    assert len(body["policy-tbl-b"]) == 4
    assert re.fullmatch(r"\d+s", body["policy-tbl-a"][4])
    assert re.fullmatch(r"\d+s", body["policy-tbl-b"][3])

    wide = _rows(kubectl.run("get", "policies", "-o", "wide", context=ctx).stdout)
    assert wide[0] == rows[0]

    selected = _rows(kubectl.run("get", "policies", "-l", "tier=silver", context=ctx).stdout)
    assert [r[0] for r in selected[1:]] == ["policy-tbl-b"]

    one = _rows(kubectl.run("get", "policy", "policy-tbl-a", context=ctx).stdout)
    assert one[1][:5] == ["policy-tbl-a", "team-a", "true", "3", "Enforcing"]

    # --show-labels reads the rows' PartialObjectMetadata
    labelled = _rows(kubectl.run("get", "policies", "--show-labels", context=ctx).stdout)
    assert labelled[0][-1] == "LABELS"
    assert {r[0]: r[-1] for r in labelled[1:]}["policy-tbl-b"] == "tier=silver"

    # --sort-by makes kubectl ask for includeObject=Object and sort on the full objects
    ordered = _rows(kubectl.run("get", "policies", "--sort-by=.spec.revision", context=ctx).stdout)
    names = [r[0] for r in ordered[1:]]
    assert names.index("policy-tbl-a") < names.index("policy-tbl-b")
    _, log = kubectl.sim.admin("GET", "/_sim/requests")
    entries = log["requests"] if isinstance(log, dict) else log
    assert any("includeObject=Object" in e["path"] for e in entries if e["cluster"] == ctx)
    reverse = _rows(kubectl.run("get", "policies", "--sort-by=.spec.boundary", context=ctx).stdout)
    assert [r[1] for r in reverse[1:] if r[0].startswith("policy-tbl-")] == ["team-a", "team-b"]


def test_get_watch_keeps_the_table_columns(kubectl: Kubectl) -> None:
    """kubectl get -w prints watch events with the list's columns and one header."""
    ctx = "c0001"
    manifest = FULL_POLICY.format(
        name="tbl-w", tier="gold", boundary="team-w", enabled="true", revision=1
    )
    kubectl.apply(manifest, context=ctx)
    base = kubectl.run("get", "policies", context=ctx).stdout.splitlines()
    cmd = [
        "kubectl",
        f"--kubeconfig={kubectl.sim.kubeconfig_path}",
        f"--context={ctx}",
        f"--cache-dir={kubectl.workdir / 'kube-cache'}",
        "get",
        "policies",
        "-w",
        "--request-timeout=3s",
    ]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as watch:
        assert watch.stdout is not None
        # the initial list: header plus the existing rows
        seen = [watch.stdout.readline() for _ in base]
        kubectl.apply(manifest.replace("revision: 1", "revision: 2"), context=ctx)
        changed = watch.stdout.readline().split()
        watch.terminate()
    assert seen[0].split() == ["NAME", "BOUNDARY", "ENABLED", "REVISION", "PHASE", "AGE"]
    assert changed[:4] == ["policy-tbl-w", "team-w", "true", "2"]
    kubectl.run("delete", "policy", "policy-tbl-w", context=ctx)


def test_get_builtins_uses_their_printers(kubectl: Kubectl) -> None:
    rows = _rows(kubectl.run("get", "namespaces", context="home").stdout)
    assert rows[0] == ["NAME", "STATUS", "AGE"]
    assert {r[0]: r for r in rows[1:]}["default"][1] == "Active"

    lease = (
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\n"
        "metadata: {name: table-lock, namespace: default}\n"
        "spec: {holderIdentity: replica-a, leaseDurationSeconds: 15}\n"
    )
    kubectl.apply(lease, context="home")
    rows = _rows(kubectl.run("get", "leases", "-A", context="home").stdout)
    # -A: kubectl adds NAMESPACE from the rows' PartialObjectMetadata
    assert rows[0] == ["NAMESPACE", "NAME", "HOLDER", "AGE"]
    assert ["default", "table-lock", "replica-a"] in [r[:3] for r in rows[1:]]
    kubectl.run("delete", "lease", "table-lock", "-n", "default", context="home")


def test_conflict_between_two_field_managers(kubectl: Kubectl) -> None:
    kubectl.apply(POLICY.format(name="p-conflict", team="a", enabled="true"))
    changed = POLICY.format(name="p-conflict", team="a", enabled="false")

    clash = kubectl.apply(changed, "--field-manager=someone-else", check=False)
    assert clash.returncode != 0
    assert "Apply failed with 1 conflict" in clash.stderr
    assert 'conflict with "kubectl": .spec.enabled' in clash.stderr

    kubectl.apply(changed, "--field-manager=someone-else", "--force-conflicts")
    obj = kubectl.json("get", "policy", "p-conflict")
    assert obj["spec"]["enabled"] is False
    assert obj["metadata"]["generation"] == 2
    managers = {e["manager"] for e in obj["metadata"]["managedFields"]}
    assert managers == {"kubectl", "someone-else"}


def test_label_selectors(kubectl: Kubectl) -> None:
    for name, team in (("sel-a", "a"), ("sel-b", "b"), ("sel-c", "c")):
        kubectl.apply(POLICY.format(name=name, team=team, enabled="true"), context="c0003")

    def names(selector: str) -> list[str]:
        out = kubectl.run("get", "policies", "-l", selector, "-o", "name", context="c0003")
        return sorted(line.rsplit("/", 1)[1] for line in out.stdout.split())

    assert names("team=a") == ["sel-a"]
    assert names("team!=a") == ["sel-b", "sel-c"]
    assert names("team in (a,c)") == ["sel-a", "sel-c"]
    assert names("team notin (a)") == ["sel-b", "sel-c"]
    assert names("team") == ["sel-a", "sel-b", "sel-c"]
    assert names("!team") == []


def test_namespaces_and_leases(kubectl: Kubectl) -> None:
    namespaces = kubectl.run("get", "namespaces", "-o", "name", context="home").stdout.split()
    assert "namespace/stackship-system" in namespaces
    assert "namespace/default" in namespaces
    listing = kubectl.json("get", "leases", "-n", "stackship-system", context="home")
    assert listing["items"] == []


def test_read_only_and_version_faults_reach_kubectl(kubectl: Kubectl, sim: SimProcess) -> None:
    sim.admin("POST", "/_sim/clusters/c0002/faults", {"readOnly": True})
    denied = kubectl.apply(
        POLICY.format(name="p-ro", team="a", enabled="true"), context="c0002", check=False
    )
    assert denied.returncode != 0
    assert "is forbidden" in denied.stderr

    sim.admin("POST", "/_sim/clusters/c0002/faults", {"readOnly": False, "crd": False})
    missing = kubectl.run("get", "policies", context="c0002", check=False)
    assert missing.returncode != 0
    # kubectl's discovery cache still knows the type, so the list itself meets the 404.
    assert "the server could not find the requested resource" in missing.stderr


def test_wrong_token_is_unauthorized(kubectl: Kubectl) -> None:
    proc = kubectl.run("--token=wrong", "get", "policies", check=False)
    assert proc.returncode != 0
    # client-go's wording for a 401 Status.
    assert "You must be logged in to the server" in proc.stderr
