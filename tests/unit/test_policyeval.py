"""`convergerd policy eval`: inputs, verdict lines and exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from convergerd.cli import policyeval
from convergerd.cli.main import main

POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop}
spec: {containers: [{name: c, image: "nginx:1.27"}]}
"""
POLICY_OBJECT = """\
apiVersion: platform.stackship.se/v1alpha1
kind: Policy
metadata: {name: policy-regs}
spec:
  policyId: regs
  boundary: team-a
  enabled: true
  revision: 4
  rule: {type: AllowedRegistries, registries: [registry.example.com]}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_policy_object_and_a_list_of_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write(tmp_path, "p.yaml", POLICY_OBJECT)
    good = POD.replace("nginx:1.27", "registry.example.com/web:1")
    objects = write(tmp_path, "o.json", json.dumps({"kind": "List", "items": [
        yaml.safe_load(good), yaml.safe_load(POD)]}))
    assert main(["policy", "eval", "--policy", str(policy), "--object", str(objects)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"allowed  {objects}#1  Pod shop/web"
    assert lines[1].startswith(f"denied   {objects}#2  Pod shop/web: pods \"web\" is forbidden: "
                               "ValidatingAdmissionPolicy 'stackship-regs'")
    assert "namespaceSelector not applied" in err


def test_all_allowed_is_exit_0_and_namespace_labels_apply_the_selector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = write(tmp_path, "p.yaml", POLICY_OBJECT)
    objects = write(tmp_path, "o.yaml", POD)
    args = ["policy", "eval", "--policy", str(policy), "--object", str(objects), "--json"]
    assert main([*args, "--namespace-labels", "platform.stackship.se/boundary=team-b"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["results"][0]["allowed"] is True


@pytest.mark.parametrize(("policy_text", "objects_text", "words"), [
    ("{id: x, boundary: team-a, rule: {type: AllowedComputePlans, plans: [s]}}", POD,
     "p.yaml: cannot be enforced (NotDelivered)"),
    ("{id: x, boundary: team-a, rule: {type: ForbidLatestTag}}", "a: [", "o.yaml: not valid YAML"),
    ("{id: x, boundary: team-a, rule: {type: ForbidLatestTag}}", "- 1\n", "o.yaml: object 1 is "
     "not a Kubernetes object"),
    ("kind: ConfigMap\napiVersion: v1\n", POD, "is not a Policy"),
    ("policies: []\n", POD, "whole import file"),
    ("{id: x, boundary: team-a, rule: {type: ForbidLatestTag}, rule: {type: ForbidLatestTag}}",
     POD, "p.yaml: duplicate key 'rule'"),
    ("{id: x, boundary: team-a, rule: {type: ForbidLatestTag}}", POD + "---\n" + POD.replace(
        "kind: Pod", "kind: Pod\nkind: Pod"), "o.yaml: duplicate key 'kind' at line 8"),
    ("{id: x, boundary: team-a, rule: {type: ForbidLatestTag}}", "[" * 40 + "]" * 40,
     "o.yaml: nested deeper than 32 levels"),
])
def test_input_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy_text: str, objects_text: str,
    words: str,
) -> None:
    policy = write(tmp_path, "p.yaml", policy_text)
    objects = write(tmp_path, "o.yaml", objects_text)
    assert main(["policy", "eval", "--policy", str(policy), "--object", str(objects)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert words in err


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = write(tmp_path, "p.yaml", POLICY_OBJECT)
    missing = tmp_path / "nope.yaml"
    assert main(["policy", "eval", "--policy", str(policy), "--object", str(missing)]) == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err


def test_a_warn_binding_admits_with_the_warning_a_cluster_would_send(
    capsys: pytest.CaptureFixture[str]
) -> None:
    # The operator renders `validationActions` from the Policy's enforcement mode; the
    # evaluator follows whatever the rendered binding says.
    spec = yaml.safe_load(POLICY_OBJECT)["spec"]
    evaluator = policyeval.PolicyEval(spec, None)
    evaluator.admission.binding["spec"]["validationActions"] = ["Warn", "Audit"]
    verdict = evaluator.verdict("pod.yaml#1", yaml.safe_load(POD))
    warning = ("Validation failed for ValidatingAdmissionPolicy 'stackship-regs' with binding "
               "'stackship-regs': image(s) 'nginx:1.27' not from an allowed registry: every "
               "image must start with one of 'registry.example.com/', e.g. "
               "registry.example.com/app:1.0")
    assert verdict.allowed
    assert verdict.warnings == (warning,)
    assert verdict.as_dict()["warnings"] == [warning]
    assert verdict.as_dict()["audited"] is True
    policyeval._print(evaluator, [verdict], as_json=False, selector="s", out=sys.stdout,
                      err=sys.stderr)
    assert capsys.readouterr().out.splitlines() == [
        "allowed  pod.yaml#1  Pod shop/web (audit annotation written)",
        f"         Warning: {warning}"]
