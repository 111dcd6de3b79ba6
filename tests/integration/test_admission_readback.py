"""The mode in force and what admission counted, read back by the daemon (issue 35, items 1 and 2):
the operator against the simulator installs a policy saved as Warn, a violating pod is admitted
with the warning and counted by the simulated API server's
`apiserver_validating_admission_policy_check_total`, the operator writes the count on the
Policy (`status.admission`), and the daemon's next round reads it with the phase: per cluster
and in the fleet total of `GET /v1/policies/{id}/status`, in `/status`, in the metrics per
policy. A save switching it to Deny shows the new mode and counts from the new revision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from convergerd.api.app import make_app
from convergerd.sim.fleet import Fleet
from convergerd.status.document import snapshot
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.fixtures.fleet import kube_http
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, settings_for
from tests.integration.savedelete_helpers import make_saver
from tests.integration.test_enforcement_modes import AUTH, PID, TOKEN, verified_in_mode
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    get,
    operator_settings,
    put_namespace,
    running,
    wait_for,
)

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def daemon(fleet: Fleet, database_url: str,
                 store: Store) -> AsyncIterator[tuple[Client, Rounds]]:
    """The daemon's app over the real store and the simulator, its state fed by `Rounds`."""
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN)
    rounds = Rounds(fleet, store, settings)
    app = make_app(metrics=rounds.metrics, state=rounds.state, store=store, settings=settings,
                   health=HealthCheck(), saver=make_saver(rounds, store), modes=store)
    try:
        async with TestClient(TestServer(app)) as c:
            yield c, rounds
    finally:
        await rounds.close()


async def save(client: Client, enforcement: str) -> None:
    async with client.post(f"/v1/policies/{PID}/apply", headers=AUTH,
                           json={"enforcement": enforcement}) as resp:
        assert resp.status == 200, await resp.text()


async def violate(fleet: Fleet, name: str) -> Any:
    """A pod p-latest fails (no tag: latest), in the boundary's namespace on c0001."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
           "spec": {"containers": [{"name": "app", "image": "registry.example.com/app"}]}}
    return await kube_http(fleet, CLUSTER, "POST", "/api/v1/namespaces/team-a/pods", body=pod)


async def counted(fleet: Fleet, revision: int | None, accept: Any) -> dict[str, Any] | None:
    """The Policy's `status.admission` once it is of `revision` (None: any) and `accept`
    holds."""
    policy = await get(fleet, f"{POLICIES}/policy-{PID}")
    found = ((policy or {}).get("status") or {}).get("admission")
    if not found or revision not in (None, found.get("revision")):
        return None
    return found if accept(found) else None


async def round_and_view(client: Client, rounds: Rounds,
                         fleet: Fleet) -> tuple[dict[str, Any], dict[str, Any]]:
    """A round observed, then the policy's view, and `status.admission` as the round read it
    (rounds again while the operator wrote it meanwhile)."""
    for _ in range(10):
        before = await counted(fleet, None, lambda a: True)
        rounds.state.observe_round(await rounds.run())
        if await counted(fleet, None, lambda a: True) == before:
            break
    async with client.get(f"/v1/policies/{PID}/status") as resp:
        assert resp.status == 200
        view: dict[str, Any] = await resp.json()
    assert before is not None
    return view, before


def metric(rounds: Rounds, name: str, **labels: str) -> float | None:
    text = rounds.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


async def test_a_warn_policy_s_counts_are_read_back_per_cluster_and_in_the_fleet_total(
    daemon: tuple[Client, Rounds], fleet: Fleet
) -> None:
    client, rounds = daemon
    await put_namespace(fleet, "team-a", "team-a")
    settings = operator_settings(fleet, CONVERGERD_OPERATOR_ADMISSION_READ_SECONDS="0.2")
    async with running(settings):
        await save(client, "Warn")  # revision 2 on c0001..c0003; an operator runs on c0001
        await verified_in_mode(fleet, "Warn", "Warned")
        resp = await violate(fleet, "warned")
        assert resp.status == 201
        assert "stackship-p-latest" in resp.headers["Warning"]
        # What the operator wrote (its own Warn probe may be among the warnings: the
        # operator's figures, shown as they are).
        await wait_for(lambda: counted(fleet, 2, lambda a: a["warned"] >= 1))

        view, wrote = await round_and_view(client, rounds, fleet)
        assert wrote["warned"] >= 1
        by_cluster = {c["cluster"]: c for c in view["clusters"]}
        c1 = by_cluster[CLUSTER]
        assert (c1["phase"], c1["enforcement_action"]) == ("Enforcing", "Warn")
        shown = c1["admission"]
        assert (shown["denied"], shown["warned"], shown["audited"], shown["revision"]) == (
            wrote["denied"], wrote["warned"], wrote["audited"], 2)
        assert shown["last_hour"]["warned"] == wrote["lastHour"]["warned"]
        assert (shown["problem"], shown["stale"]) == (None, False)
        assert shown["read_at"] == wrote["readAt"]
        # No operator on the other two: their Policies carry no mode and no counts.
        assert [by_cluster[c]["admission"] for c in ("c0002", "c0003")] == [None, None]
        total = view["admission"]
        assert (total["warned"], total["clusters_counted"]) == (wrote["warned"], 1)
        assert total["clusters_by_enforcement"] == {"Deny": 0, "Warn": 1, "Audit": 0,
                                                    "other": 0}

        # /status and the metrics: per policy, summed over the fleet.
        head = snapshot(rounds.state)
        [listed] = [p for p in head["admission"]["policies"] if p["id"] == PID]
        assert (listed["warned"], listed["clusters_by_enforcement"]["Warn"]) == (
            wrote["warned"], 1)
        assert {c["id"]: c["enforcement"] for c in head["clusters"]}[CLUSTER] == {"Warn": 1}
        assert metric(rounds, "convergerd_policy_admissions", policy=PID,
                      action="warn") == wrote["warned"]
        assert metric(rounds, "convergerd_policy_clusters_by_enforcement", policy=PID,
                      enforcement="Warn") == 1

        # A save switches it to Deny: the next pod is denied and counted from revision 3.
        await save(client, "Deny")
        await verified_in_mode(fleet, "Deny", "Denied")
        assert (await violate(fleet, "denied")).status == 422
        await wait_for(lambda: counted(fleet, 3, lambda a: a["denied"] >= 1))
        view, wrote = await round_and_view(client, rounds, fleet)
        assert (wrote["revision"], wrote["denied"] >= 1) == (3, True)
        c1 = {c["cluster"]: c for c in view["clusters"]}[CLUSTER]
        assert c1["enforcement_action"] == "Deny"
        assert (c1["admission"]["denied"], c1["admission"]["warned"],
                c1["admission"]["revision"]) == (wrote["denied"], 0, 3)
        assert view["admission"]["clusters_by_enforcement"]["Deny"] == 1
        assert metric(rounds, "convergerd_policy_admissions", policy=PID, action="warn") == 0
        assert metric(rounds, "convergerd_policy_admissions", policy=PID,
                      action="deny") == wrote["denied"]
