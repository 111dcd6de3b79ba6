"""The operator's audit rolled up by the daemon (issue 21): audits seeded on the simulated
clusters' Policy objects through their status subresource, as the operator writes them, read
back by the real `Daemon`'s rounds and shown per cluster and in total by
`/v1/policies/{id}/status`, as a VIOLATIONS column by `convergerd status`, and as metrics
without a per-policy label. A cluster that sends a malformed audit shows it as unknown, and its
phase is read as usual."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

from convergerd.core.model import PolicyId
from convergerd.core.report import Audit, PhaseReading, audit_fields
from convergerd.core.rows import DeliveryRow
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES
from convergerd.status.document import cluster_audit_view, snapshot
from convergerd.status.records import PolicyRecord
from convergerd.status.state import StatusState
from convergerd.status.views import record_view
from convergerd.store.store import Store
from tests.integration.test_observability import (
    C1,
    C2,
    C3,
    import_tenants,
    policy_count,
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

MANAGER = "convergerd-operator"

def read(row: DeliveryRow) -> PhaseReading:
    """The reading recorded with `row` (there must be one)."""
    assert row.reading is not None
    return row.reading



def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def operator_writes(fleet: Fleet, cluster: str, audits: dict[str, Any]) -> None:
    """Emulate the operator: phase Enforcing and `status.audit` (per policy id, None: no audit)
    on every Policy of `cluster`, through the status subresource."""
    store = fleet.store(cluster)
    for obj in store.list(POLICIES, None)["items"]:
        pid = obj["spec"]["policyId"]
        status: dict[str, Any] = {
            "phase": "Enforcing", "observedGeneration": obj["metadata"].get("generation", 1),
            "conditions": [{"type": "Ready", "status": "True", "reason": "Installed",
                            "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        if audits.get(pid) is not None:
            status["audit"] = audits[pid]
        obj["status"] = status
        store.update(POLICIES, None, obj["metadata"]["name"], obj, manager=MANAGER,
                     subresource="status")


def pods(prefix: str, n: int) -> list[dict[str, str]]:
    return [{"kind": "Pod", "namespace": "team-a", "name": f"{prefix}-{i}",
             "message": "image nginx:latest uses the tag latest"} for i in range(n)]


async def test_audits_roll_up_per_cluster_per_policy_in_status_cli_and_metrics(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    async with running(fleet, database_url) as run:

        async def delivered() -> bool:
            return all(policy_count(fleet, c) == 2 for c in (C1, C2, C3))

        await wait_for(delivered, what="both policies in every cluster")
        at = now_rfc3339()
        operator_writes(fleet, C1, {
            "p-latest": {"violations": 3, "auditedAt": at, "cacheSynced": True,
                         "sample": pods("web", 3)},
            "p-regs": {"violations": 0, "auditedAt": at, "cacheSynced": True, "sample": []}})
        operator_writes(fleet, C2, {
            "p-latest": {"violations": 2, "auditedAt": at, "cacheSynced": False,
                         "sample": pods("batch", 2)},
            # What a broken or hostile cluster may send: unknown, never a broken phase.
            "p-regs": {"violations": "lots\u0000", "auditedAt": at, "cacheSynced": True,
                       "sample": [{"kind": "Pod"}] * 50}})
        operator_writes(fleet, C3, {})  # an operator that does not audit

        found: dict[str, Any] = {}

        async def rolled_up() -> bool:
            found.update(await run.json("/v1/policies/p-latest/status"))
            return bool(found["audit"]["violations"] == 5)

        await wait_for(rolled_up, what=f"the audits read back ({found.get('audit')})")
        per_cluster = {c["cluster"]: c for c in found["clusters"]}
        assert per_cluster[C1]["audit"]["violations"] == 3
        assert per_cluster[C1]["audit"]["state"] == "current"
        assert per_cluster[C1]["audit"]["audited_at"] == at
        assert per_cluster[C2]["audit"]["violations"] == 2
        assert per_cluster[C2]["audit"]["state"] == "unsynced"
        assert per_cluster[C3]["audit"] is None
        assert found["audit"]["clusters_with_violations"] == 2
        assert found["audit"]["clusters_audited"] == 2
        sample = found["audit"]["sample"]
        assert len(sample) <= 5
        assert {(s["cluster"], s["name"]) for s in sample} >= {(C1, "web-0"), (C2, "batch-0")}

        regs = await run.json("/v1/policies/p-regs/status")
        regs_by = {c["cluster"]: c for c in regs["clusters"]}
        assert regs_by[C2]["phase"] == "Enforcing"  # the phase is read as usual
        assert regs_by[C2]["audit"]["violations"] is None
        assert regs_by[C2]["audit"]["state"] == "unknown"
        assert "status.audit.violations" in regs_by[C2]["audit"]["problem"]
        assert "\u0000" not in regs_by[C2]["audit"]["problem"]
        assert regs["audit"] == {"violations": 0, "clusters_audited": 2,
                                 "clusters_with_violations": 0, "clusters_unknown": 1,
                                 "clusters_not_current": 1, "sample": [],
                                 "excepted": None}

        status = await run.status()
        assert status["audit"]["policies"] == [{"id": "p-latest", "violations": 5, "clusters": 2}]
        by_id = {c["id"]: c for c in status["clusters"]}
        assert by_id[C2]["audit"] == {"violations": 2, "policies_with_violations": 1,
                                      "policies_audited": 2, "unknown": 1, "unsynced": True}

        scrape = await run.scrape()
        assert scrape.value("convergerd_audit_violations", cluster=C1) == 3
        assert scrape.value("convergerd_audit_violations", cluster=C2) == 2
        assert scrape.value("convergerd_audit_violations", cluster=C3) is None
        assert scrape.value("convergerd_audit_clusters_with_violations") == 2
        assert scrape.value("convergerd_audit_unsynced_clusters") == 1
        assert not [s for s in scrape.samples
                    if s[0].startswith("convergerd_audit") and "policy" in s[1]]

        table = await run.status_command()
        lines = table.splitlines()
        header = next(line for line in lines if line.startswith("CLUSTER"))
        col = header.index("VIOLATIONS")
        cells = {line.split()[0]: line[col:].split("  ")[0].strip()
                 for line in lines if re.match(r"c\d{4} ", line)}
        assert cells == {C1: "3", C2: "2 UNKNOWN=1 UNSYNCED", C3: "-"}, table
        assert "  p-latest: 5 on 2 clusters" in lines, table

        # The operator fixes what runs on C1: the next round reads 0, and C1's samples go.
        operator_writes(fleet, C1, {
            "p-latest": {"violations": 0, "auditedAt": now_rfc3339(), "cacheSynced": True},
            "p-regs": {"violations": 0, "auditedAt": now_rfc3339(), "cacheSynced": True}})

        async def fixed() -> bool:
            doc = await run.json("/v1/policies/p-latest/status")
            found.update(doc)
            return bool(doc["audit"]["violations"] == 2)

        await wait_for(fixed, what="C1's audit of 0 read back")
        assert {s["cluster"] for s in found["audit"]["sample"]} == {C2}
        assert (await run.scrape()).value("convergerd_audit_clusters_with_violations") == 1


# ---------------------------------------------------------------------------------------------
# Recorded with the phase (migration 0006): a standby shows what the leader read


def audited(policy: PolicyId, seen: float, violations: int | None, audited_s: float, *,
            synced: bool = True) -> PhaseReading:
    found = (Audit(violations, at(audited_s), synced, None, ())
             if violations is not None else Audit(None, problem="status.audit.violations: bad"))
    return dataclasses.replace(reading(policy, seen), **audit_fields(found))


async def test_an_audit_is_recorded_when_it_changes_and_a_standby_shows_it(
    database_url: str, store: Store
) -> None:
    await counting(database_url)
    await store.record_round(listed(50, audited(P1, 50, 3, 40), audited(P2, 50, 0, 45)),
                             identity="r")
    assert (await written(database_url))["deliveries"] == 2
    # The operator audits again and finds the same: auditedAt moving forward is no change.
    await store.record_round(listed(350, audited(P1, 350, 3, 340), audited(P2, 350, 0, 345)),
                             identity="r")
    assert "deliveries" not in await written(database_url)
    rows = {r.policy: r for r in await store.deliveries_for_cluster(RECORDED_C1)}
    # At least the listing's oldest audit (p1's 340), never later than its own.
    assert (read(rows["p1"]).audit_violations, read(rows["p1"]).audit_at) == (3, at(340))
    assert read(rows["p2"]).audit_at == at(340)

    # A standby's status, from those rows alone.
    standby = StatusState(identity="standby", interval_s=300, clock=lambda: at(360))
    standby.set_clusters([RECORDED_C1])
    standby.absorb_delivery_rows(list(rows.values()), cluster=RECORDED_C1)
    views = {p: record_view(r, at(360), 300)["audit"]
             for p, r in standby.clusters[RECORDED_C1].policies.items()}
    assert views[P1] == {"violations": 3, "audited_at": "2026-01-01T12:05:40Z",
                         "cache_synced": True, "excepted": None, "state": "current",
                         "problem": None}
    summary = cluster_audit_view(standby, standby.clusters[RECORDED_C1], at(360))
    assert summary is not None
    assert summary["violations"] == 3
    assert snapshot(standby)["audit"]["policies"] == [
        {"id": "p1", "violations": 3, "clusters": 1}]

    # A new count, an unsynced cache, an unreadable audit: each is written.
    await store.record_round(listed(650, audited(P1, 650, 1, 640),
                                    audited(P2, 650, None, 0)), identity="r")
    assert (await written(database_url))["deliveries"] == 2
    rows = {r.policy: r for r in await store.deliveries_for_cluster(RECORDED_C1)}
    assert read(rows["p1"]).audit_violations == 1
    assert (read(rows["p2"]).audit_violations, read(rows["p2"]).audit_synced) == (None, False)
    assert read(rows["p2"]).audit_problem == "status.audit.violations: bad"
    view = record_view(PolicyRecord.from_row(rows["p2"]), at(660), 300)["audit"]
    assert (view["violations"], view["state"]) == (None, "unknown")
    await store.record_round(listed(950, audited(P1, 950, 1, 940, synced=False),
                                    audited(P2, 950, None, 0)), identity="r")
    assert (await written(database_url))["deliveries"] == 1
