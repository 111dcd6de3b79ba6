"""The demo's workloads that predate the policies: which of them each sample tenant policy
would deny, judged as the operator renders the policy and a simulated cluster evaluates it
(`convergerd policy eval`'s evaluator). What the demo test expects the operators' audits to
count is this, not a guess."""

from __future__ import annotations

import datetime as dt
import importlib.resources
from collections import Counter

from convergerd.cli.policyeval import PolicyEval
from convergerd.core.exceptions import covers
from convergerd.core.model import DELIVERED_RULE_TYPES
from convergerd.demo import EXCEPTED_POLICY, EXCEPTION_DAYS, EXCEPTION_ID, sample_exception
from convergerd.demo.operators import LEGACY_WORKLOADS
from convergerd.store.importer import parse_file_bytes
from tests.integration.test_demo import EXPECTED_VIOLATIONS


def test_the_legacy_workloads_violate_what_the_demo_test_expects() -> None:
    tenants = importlib.resources.files("convergerd.demo").joinpath("tenants.yaml")
    plan = parse_file_bytes(tenants.read_bytes())
    clusters = {b.id: set(b.clusters) for b in plan.boundaries}
    denied: Counter[str] = Counter()
    where: dict[str, set[tuple[str, str]]] = {}
    for policy in plan.policies:
        if policy.rule.get("type") not in DELIVERED_RULE_TYPES:
            continue
        # Audited enabled or not: a disabled policy's audit says what it would deny.
        judge = PolicyEval({"policyId": policy.id, "boundary": policy.boundary,
                            "enabled": True, "revision": 1, "rule": policy.rule}, None)
        for cluster, namespace, _resource, body in LEGACY_WORKLOADS:
            if namespace != policy.boundary or cluster not in clusters[policy.boundary]:
                continue
            obj = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
            if not judge.verdict("demo", obj).allowed:
                denied[policy.id] += 1
                where.setdefault(policy.id, set()).add((cluster, body["metadata"]["name"]))
    assert dict(denied) == EXPECTED_VIOLATIONS
    assert where["no-latest"] == {("c0001", "legacy-cache"), ("c0002", "legacy-web")}


def test_the_sample_exception_imports_and_covers_no_workload_the_audit_counts() -> None:
    tenants = importlib.resources.files("convergerd.demo").joinpath("tenants.yaml")
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    plan = parse_file_bytes(tenants.read_bytes() + sample_exception(now).encode())
    [(policy, exception)] = plan.exceptions
    assert (policy, exception.id) == (EXCEPTED_POLICY, EXCEPTION_ID)
    assert exception.expires_at == now + dt.timedelta(days=EXCEPTION_DAYS)
    for _cluster, namespace, _resource, body in LEGACY_WORKLOADS:
        meta = body["metadata"]
        assert not covers(exception, namespace, meta["name"], meta.get("labels")), meta["name"]
