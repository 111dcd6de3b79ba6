"""Exceptions that expire, with the operator alone against the simulator (no daemon, no
database: the Policy is written as convergerd would write it, and nothing else touches it):
an exception for one namespace admits its violating pod while another namespace's is denied,
the audit counts it as `excepted`; at its expiry the operator re-renders by itself, the next
pod in that namespace is denied and the audit counts it as a violation."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from convergerd.core.exceptions import EXPIRY_LEAD_S
from convergerd.sim.fleet import Fleet
from tests.fixtures.fleet import kube_http
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    get,
    operator_settings,
    put_namespace,
    running,
    vap_path,
    verified_of,
    wait_for,
)
from tests.integration.test_operator_audit import audit_of, pod, put_pod

EXCEPTED, JUDGED = "team-a-api", "team-a-web"  # the excepted one is listed first: not probed
# Long enough for the operator to render, a pod to be admitted and the audit to run before the
# exception lapses (EXPIRY_LEAD_S before its expiresAt); short enough for a test.
EXPIRES_IN_S = 12.0


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with Fleet(clusters=1, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(35), bookmark_interval_s=0.5) as f:
        yield f


async def put_excepted_policy(fleet: Fleet, expires: dt.datetime) -> None:
    """The Policy as a save of `nolatest` with one exception delivers it."""
    body = {
        "apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": "policy-nolatest", "labels": {
            "platform.stackship.se/boundary": "b1",
            "app.kubernetes.io/managed-by": "convergerd"}},
        "spec": {"policyId": "nolatest", "boundary": "b1", "enabled": True, "revision": 2,
                 "rule": {"type": "ForbidLatestTag"},
                 "exceptions": [{
                     "id": "api-migration", "namespace": EXCEPTED,
                     "reason": "moving to pinned tags, TICKET-35",
                     "requestedBy": "dev@team-a", "approvedBy": "admin@platform",
                     "expiresAt": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}]},
    }
    resp = await kube_http(
        fleet, CLUSTER, "PATCH",
        f"{POLICIES}/policy-nolatest?fieldManager=stackship-platform&force=true",
        body=body, content_type="application/apply-patch+yaml")
    assert resp.status in (200, 201), resp.body


async def create_pod(fleet: Fleet, namespace: str, name: str) -> tuple[int, str]:
    resp = await kube_http(fleet, CLUSTER, "POST", f"/api/v1/namespaces/{namespace}/pods",
                           body=pod(name, "nginx"))  # no tag: latest, denied by the rule
    return resp.status, str(resp.json().get("message", "")) if resp.body else ""


async def conditions_of_vap(fleet: Fleet) -> list[dict[str, Any]] | None:
    vap = await get(fleet, vap_path("nolatest"))
    return None if vap is None else vap["spec"].get("matchConditions", [])


async def test_an_exception_admits_its_namespace_until_it_expires_with_no_hub(
        fleet: Fleet) -> None:
    for ns in (EXCEPTED, JUDGED):
        await put_namespace(fleet, ns, "b1")
    put_pod(fleet, EXCEPTED, "old-api", "nginx")
    put_pod(fleet, JUDGED, "old-web", "nginx")
    async with running(operator_settings(fleet)) as proc:
        assert proc is not None
        expires = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(
            seconds=EXPIRES_IN_S)
        await put_excepted_policy(fleet, expires)

        # Rendered as one matchCondition; the excepted namespace's pod is admitted, the other's
        # denied; the audit counts the excepted apart.
        conditions = await wait_for(lambda: conditions_of_vap(fleet))
        assert [c["name"] for c in conditions] == ["exception-api-migration"]
        status, _ = await create_pod(fleet, EXCEPTED, "new-api")
        assert status == 201
        status, message = await create_pod(fleet, JUDGED, "new-web")
        assert status != 201
        assert "stackship-nolatest" in message
        found = await wait_for(lambda: audit_of(fleet, "nolatest", violations=1, excepted=2))
        assert [s["name"] for s in found["sample"]] == ["old-web"]
        # The probe went where no exception admits its pod, so enforcement is proven.
        verified = await wait_for(lambda: verified_of(fleet, "nolatest"))
        assert verified["status"] == "True", verified
        assert dt.datetime.now(dt.UTC) < expires - dt.timedelta(seconds=EXPIRY_LEAD_S), (
            "the checks before expiry ran past it: raise EXPIRES_IN_S")

        # At expiry, with nothing but the operator running: re-rendered without it, so the
        # next pod there is denied, and the audit counts what it excepted as violations.
        await wait_for(lambda: _no_conditions(fleet), EXPIRES_IN_S + 10)
        lapsed_at = dt.datetime.now(dt.UTC)
        assert lapsed_at >= expires - dt.timedelta(seconds=EXPIRY_LEAD_S + 1)
        status, message = await create_pod(fleet, EXCEPTED, "later-api")
        assert status != 201
        assert "stackship-nolatest" in message
        found = await wait_for(lambda: audit_of(fleet, "nolatest", violations=3))
        assert "excepted" not in found
        assert {s["name"] for s in found["sample"]} == {"old-api", "new-api", "old-web"}
        policy = await get(fleet, f"{POLICIES}/policy-nolatest")
        assert policy is not None
        assert policy["spec"]["exceptions"][0]["id"] == "api-migration"  # nobody removed it


async def _no_conditions(fleet: Fleet) -> bool:
    return await conditions_of_vap(fleet) == []
