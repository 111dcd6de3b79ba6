"""Enforcement modes where convergerd reads and writes them (docs/design.md, "Modes"): the
model, the Policy object a round applies, and the import file. The operator's side is in
`test_operator_modes.py`."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from convergerd import demo
from convergerd.cli.main import main
from convergerd.cli.policyeval import PolicyEval
from convergerd.core.model import (
    Enforcement,
    InvalidPolicy,
    Policy,
    PolicyRow,
    RuleError,
    parse_enforcement,
)
from convergerd.core.plan import ListedPolicy, Why, plan_cluster
from convergerd.core.render import render_policy, validate_policy
from convergerd.store.importer import (
    ImportedPolicy,
    ImportFileError,
    parse_file_bytes,
    parse_import,
)

RULE: dict[str, Any] = {"type": "ForbidLatestTag"}


def policy(enforcement: str = "Deny", revision: int = 3) -> Policy:
    result = validate_policy(PolicyRow("p-latest", "team-a", RULE, True, revision, enforcement))
    assert isinstance(result, Policy), result
    return result


def listed(body: dict[str, Any]) -> dict[str, ListedPolicy]:
    obj = {**body, "metadata": {**body["metadata"], "resourceVersion": "7"}}
    return {"policy-p-latest": ListedPolicy.from_object(obj)}


@pytest.mark.parametrize("mode", ["Deny", "Warn", "Audit"])
def test_each_mode_is_read_from_the_row(mode: str) -> None:
    assert policy(mode).enforcement is Enforcement(mode)


def test_a_row_without_a_mode_is_deny() -> None:
    row = PolicyRow("p-latest", "team-a", RULE, True, 1)
    found = validate_policy(row)
    assert isinstance(found, Policy)
    assert found.enforcement is Enforcement.DENY


@pytest.mark.parametrize(("value", "words"), [
    ("deny", "got 'deny' (the names are case-sensitive: Deny)"),
    ("Enforce", "got 'Enforce'"),
    ("", "got ''"),
    (None, "got None"),
    (["Warn"], "got ['Warn']"),
    ("x" * 10_000, "got 'xxxxx"),
])
def test_a_bad_mode_is_refused_naming_the_field_and_the_value(value: Any, words: str) -> None:
    with pytest.raises(RuleError) as caught:
        parse_enforcement(value)
    message = str(caught.value)
    assert message.startswith("enforcement: must be one of Deny, Warn, Audit, "), message
    assert words in message
    assert len(message) < 300  # a value is shown shortened


def test_a_row_with_a_bad_mode_is_invalid_with_that_reason() -> None:
    found = validate_policy(PolicyRow("p-latest", "team-a", RULE, True, 4, "Block"))
    assert isinstance(found, InvalidPolicy)
    assert found.reason == "enforcement: must be one of Deny, Warn, Audit, got 'Block'"


def test_a_deny_policy_renders_exactly_as_before_modes() -> None:
    """Byte for byte the object of a version without modes: no round rewrites it after an
    upgrade, and an operator from before never sees the field."""
    assert "enforcement" not in render_policy(policy("Deny"))["spec"]


@pytest.mark.parametrize("mode", ["Warn", "Audit"])
def test_warn_and_audit_are_in_the_spec(mode: str) -> None:
    assert render_policy(policy(mode))["spec"]["enforcement"] == mode


def test_an_object_from_before_modes_is_in_sync_with_a_deny_policy() -> None:
    assert plan_cluster([policy("Deny")], listed(render_policy(policy("Deny")))) == []


@pytest.mark.parametrize(("held", "wanted"), [
    ("Deny", "Warn"), ("Warn", "Deny"), ("Warn", "Audit"), ("Audit", "Deny")])
def test_a_cluster_holding_another_mode_is_drift(held: str, wanted: str) -> None:
    """A round puts back the mode of the database, as any other field of the spec."""
    [apply] = plan_cluster([policy(wanted)], listed(render_policy(policy(held))))
    assert apply.why is Why.DRIFT
    assert apply.body["spec"].get("enforcement", "Deny") == wanted


# --- the import file --------------------------------------------------------------------------

FILE = """
boundaries: [{id: team-a}]
policies:
  - {id: p-latest, boundary: team-a, rule: {type: ForbidLatestTag}}
  - {id: p-warn, boundary: team-a, enforcement: Warn, rule: {type: ForbidLatestTag}}
  - {id: p-audit, boundary: team-a, enforcement: Audit, rule: {type: ForbidLatestTag}}
"""


def test_the_import_file_carries_the_mode_deny_by_default() -> None:
    plan = parse_import(yaml.safe_load(FILE))
    assert [(p.id, p.enforcement) for p in plan.policies] == [
        ("p-latest", Enforcement.DENY), ("p-warn", Enforcement.WARN),
        ("p-audit", Enforcement.AUDIT)]
    assert plan.policies[0] == ImportedPolicy("p-latest", "team-a", RULE, True)


@pytest.mark.parametrize(("value", "words"), [
    ("warn", "enforcement: must be one of Deny, Warn, Audit, got 'warn' (the names are "
             "case-sensitive: Warn)"),
    ("Enforce", "enforcement: must be one of Deny, Warn, Audit, got 'Enforce'"),
    (True, "enforcement: must be one of Deny, Warn, Audit, got True"),
    (None, "enforcement: must be one of Deny, Warn, Audit, got None"),
])
def test_a_bad_mode_in_the_file_names_the_entry_the_field_and_the_value(
    value: Any, words: str
) -> None:
    data = yaml.safe_load(FILE)
    data["policies"][1]["enforcement"] = value
    with pytest.raises(ImportFileError) as caught:
        parse_import(data)
    assert caught.value.problems == [f"policies[1] (id 'p-warn'): {words}"]


def test_a_bad_mode_is_listed_with_the_entry_s_other_problems() -> None:
    data = {"policies": [{"id": "p", "boundary": "b", "enforcement": "Block",
                          "rule": {"type": "Nope"}}]}
    with pytest.raises(ImportFileError) as caught:
        parse_import(data)
    assert [p.split(": ", 1)[1] for p in caught.value.problems] == [
        "enforcement: must be one of Deny, Warn, Audit, got 'Block'",
        "rule.type: unknown type 'Nope'; known: RequiredLabels, AllowedRegistries, "
        "ForbidLatestTag, AllowedComputePlans"]


# --- the demo ---------------------------------------------------------------------------------


def test_the_demo_has_one_warn_policy_and_its_banner_pod_fails_only_that_one() -> None:
    """The banner's `kubectl create --dry-run=server` pod is admitted with the Warn policy's
    warning: no other enabled policy of its boundary would deny it."""
    tenants = importlib.resources.files("convergerd.demo").joinpath("tenants.yaml")
    plan = parse_file_bytes(tenants.read_bytes())
    [warn] = [p for p in plan.policies if p.enforcement is not Enforcement.DENY]
    assert (warn.id, warn.enforcement) == (demo.WARN_POLICY, Enforcement.WARN)
    pod = yaml.safe_load(demo.WARN_POD)
    fails = set()
    for p in plan.policies:
        if p.boundary != pod["metadata"]["namespace"] or not p.enabled:
            continue
        judge = PolicyEval({"policyId": p.id, "boundary": p.boundary, "enabled": True,
                            "revision": 1, "rule": p.rule}, None)
        if not judge.verdict("demo", pod).allowed:
            fails.add(p.id)
    assert fails == {demo.WARN_POLICY}


# --- policy eval ------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "does"), [
    ("Warn", "a cluster admits what it fails with a warning"),
    ("Audit", "a cluster admits what it fails and only records it in its audit log")])
def test_policy_eval_of_a_warn_or_audit_policy_admits_as_a_cluster_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, does: str
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(f"{{id: p-latest, boundary: team-a, enforcement: {mode}, "
                      "rule: {type: ForbidLatestTag}}\n")
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n"
                   "spec: {containers: [{name: c, image: nginx}]}\n")
    # Judged as a cluster judges it: admitted, with the warning (Warn) or the audit noted.
    assert main(["policy", "eval", "--policy", str(policy), "--object", str(pod)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"allowed  {pod}#1  Pod shop/web")
    if mode == "Warn":
        assert ("Warning: Validation failed for ValidatingAdmissionPolicy "
                "'stackship-p-latest'") in out
    else:
        assert "(audit annotation written)" in out
    assert (f"note: policy stackship-p-latest is in mode {mode}: {does}; the verdicts show it "
            "as allowed with the warning or audit annotation it would get") in err
    assert main(["policy", "eval", "--policy", str(policy), "--object", str(pod),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["enforcement"] == mode
