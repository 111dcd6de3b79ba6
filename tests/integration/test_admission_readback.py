"""The mode in force and what admission counted, read back by the daemon (issue 35, items 1 and 2):
the operator against the simulator installs a policy saved as Warn, a violating pod is admitted
with the warning and counted by the simulated API server's
`apiserver_validating_admission_policy_check_total`, the operator writes the count on the
Policy (`status.admission`), and the daemon's next round reads it with the phase: per cluster
and in the fleet total of `GET /v1/policies/{id}/status`, in `/status`, in the metrics per
policy. A save switching it to Deny shows the new mode and counts from the new revision."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from convergerd.api.app import make_app
from convergerd.core.model import PolicyId
from convergerd.core.report import PhaseReading
from convergerd.sim.fleet import Fleet
from convergerd.status.document import snapshot
from convergerd.status.state import StatusState
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
from tests.integration.test_record_changes import C1 as RECORDED_C1
from tests.integration.test_record_changes import (
    P1,
    P2,
    at,
    counting,
    listed,
    reading,
    written,
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


# --- recorded with the phase ------------------------------------------------------------------


def admitted(policy: PolicyId, seen: float, warned: int, read_s: float, *,
             mode: str = "Warn") -> PhaseReading:
    """A reading with the mode and admission's counts, read at `read_s`."""
    return dataclasses.replace(
        reading(policy, seen), enforcement_action=mode, admission_denied=0,
        admission_warned=warned, admission_audited=warned, admission_last_hour_denied=0,
        admission_last_hour_warned=warned, admission_last_hour_audited=warned,
        admission_since=at(0), admission_read_at=at(read_s), admission_revision=3,
        admission_resets=0)


async def test_counts_are_recorded_when_they_change_and_a_standby_shows_them(
    database_url: str, store: Store
) -> None:
    await counting(database_url)
    await store.record_round(listed(50, admitted(P1, 50, 2, 40), admitted(P2, 50, 0, 45)),
                             identity="r")
    assert (await written(database_url))["deliveries"] == 2
    # The operator's heartbeat: readAt moving forward alone is no change (not rewritten).
    await store.record_round(listed(350, admitted(P1, 350, 2, 340),
                                    admitted(P2, 350, 0, 345)), identity="r")
    assert "deliveries" not in await written(database_url)
    rows = {r.policy: r.reading for r in await store.deliveries_for_cluster(RECORDED_C1)}
    # At least the listing's oldest readAt (p1's 340).
    assert rows["p1"] is not None
    assert rows["p2"] is not None
    assert (rows["p1"].admission_warned, rows["p1"].admission_read_at) == (2, at(340))
    assert rows["p2"].admission_read_at == at(340)
    assert (rows["p1"].enforcement_action, rows["p1"].admission_revision) == ("Warn", 3)

    # A standby shows them from those rows alone.
    standby = StatusState(identity="standby", interval_s=300, clock=lambda: at(360))
    standby.set_clusters([RECORDED_C1])
    standby.absorb_delivery_rows(await store.deliveries_for_cluster(RECORDED_C1),
                                 cluster=RECORDED_C1)
    totals = standby.admission_totals[P1]
    assert (totals.warned, totals.clusters_by_enforcement["Warn"]) == (2, 1)
    assert standby.clusters[RECORDED_C1].admission_tally.mode_counts() == {"Warn": 2}

    # A new count, a new mode, unreadable counts: each is written.
    await store.record_round(listed(650, admitted(P1, 650, 3, 640),
                                    admitted(P2, 650, 0, 645, mode="Deny")), identity="r")
    assert (await written(database_url))["deliveries"] == 2
    unreadable = dataclasses.replace(reading(P1, 950), enforcement_action="Warn",
                                     admission_problem="status.admission.warned: bad")
    await store.record_round(listed(950, unreadable, admitted(P2, 950, 0, 945, mode="Deny")),
                             identity="r")
    assert (await written(database_url))["deliveries"] == 1
    rows = {r.policy: r.reading for r in await store.deliveries_for_cluster(RECORDED_C1)}
    assert rows["p1"] is not None
    assert rows["p2"] is not None
    assert (rows["p1"].admission_warned, rows["p1"].admission_problem) == (
        None, "status.admission.warned: bad")
    assert rows["p2"].enforcement_action == "Deny"
