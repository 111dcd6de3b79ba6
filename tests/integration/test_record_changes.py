"""A round records what changed, not every delivery again (issue 19, item 1): against a real
PostgreSQL and the simulator, an in-sync round writes its cluster states and its round, and no
delivery row, while what status shows from the database stays what the replica that ran the
rounds knows. Rows are counted by triggers the test puts on the record tables."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.server import make_app
from convergerd.core.report import (
    ApplyResult,
)
from convergerd.sim.fleet import HOME, Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.status.sync import StatusSync
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import Rounds, import_doc, settings_for

Client = TestClient[web.Request, web.Application]

CLUSTERS = 200
POLICIES = 20

# Every row written to a record table, by table and operation.
COUNT_WRITES = """
CREATE TABLE test_written (tbl text NOT NULL, op text NOT NULL);
CREATE FUNCTION test_count_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_written VALUES (TG_TABLE_NAME, TG_OP);
    RETURN NULL;
END $$;
CREATE TRIGGER test_count AFTER INSERT OR UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION test_count_write();
CREATE TRIGGER test_count AFTER INSERT OR UPDATE OR DELETE ON cluster_state
    FOR EACH ROW EXECUTE FUNCTION test_count_write();
CREATE TRIGGER test_count AFTER INSERT OR UPDATE OR DELETE ON rounds
    FOR EACH ROW EXECUTE FUNCTION test_count_write();
CREATE TRIGGER test_count AFTER INSERT OR UPDATE OR DELETE ON invalid_policies
    FOR EACH ROW EXECUTE FUNCTION test_count_write();
"""

# What moves with time alone: left out when views are compared (ages may move).
TIMES = {"now", "since", "age_seconds", "lag_seconds", "pending_seconds"}


async def written(dsn: str) -> dict[str, int]:
    """Rows written since the last call, by table; the count starts again."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("DELETE FROM test_written RETURNING tbl")
    finally:
        await conn.close()
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["tbl"]] = counts.get(r["tbl"], 0) + 1
    return counts


def timeless(value: Any) -> Any:
    """`value` without the times in it (keys in `TIMES` or ending in `_at`)."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items()
                if k not in TIMES and not k.endswith("_at")}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


@pytest.fixture
async def big_fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with Fleet(clusters=CLUSTERS, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(20261203)) as f:
        yield f


def fleet_doc(clusters: Iterable[str]) -> dict[str, Any]:
    ids = sorted(clusters)
    return {
        "clusters": [{"id": c} for c in ids],
        "boundaries": [{"id": "everyone", "clusters": ids}],
        "policies": [
            {"id": f"p-{i:02d}", "boundary": "everyone",
             "rule": {"type": "RequiredLabels", "labels": [f"label-{i}"]}}
            for i in range(POLICIES)],
    }


async def views(app: web.Application, clusters: list[str]) -> dict[str, Any]:
    """`/status`, every policy's status and a few clusters' views, as the API answers them."""
    async with TestClient(TestServer(app)) as client:
        found: dict[str, Any] = {}
        paths = ["/status", *(f"/v1/policies/p-{i:02d}/status" for i in range(POLICIES)),
                 *(f"/v1/clusters/{c}" for c in clusters[:5] + clusters[-5:])]
        for path in paths:
            response = await client.get(path)
            assert response.status == 200, (path, await response.text())
            found[path] = await response.json()
        return found


async def test_an_in_sync_round_writes_one_row_per_cluster_and_status_stays(
    big_fleet: Fleet, database_url: str, store: Store
) -> None:
    """200 clusters x 20 policies: a create round, then in-sync rounds. Each in-sync round
    writes the clusters' states and its round, no delivery (at most 2 rows per cluster, the
    issue's bound; 4,201 before); what a replica that only reads the database shows
    (`/status`, every policy's view, clusters' views) is what the replica that ran the rounds
    shows, and the same after every in-sync round, times aside."""
    sim = big_fleet
    clusters = sorted(c for c in sim.clusters if c != HOME)
    await import_doc(database_url, fleet_doc(clusters))
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(COUNT_WRITES)
    finally:
        await conn.close()
    # 200 clusters answer one process on a shared machine: timeouts for that, not for faults.
    settings = settings_for(sim.kubeconfig_path, database_url,
                            CONVERGERD_API_TOKEN="a-token-for-the-test-only",
                            CONVERGERD_REQUEST_TIMEOUT_SECONDS="30",
                            CONVERGERD_CONNECT_TIMEOUT_SECONDS="30",
                            CONVERGERD_STATUS_READS_PER_SECOND="1000")
    rounds = Rounds(sim, store, settings)
    leader = StatusState(identity="leader", interval_s=settings.rounds.interval_s)
    metrics = Metrics(interval_s=settings.rounds.interval_s)

    async def after_round() -> tuple[dict[str, int], dict[str, Any], dict[str, Any]]:
        report = await rounds.run()
        leader.observe_round(report)
        counts = await written(database_url)
        standby = StatusState(identity="leader", interval_s=settings.rounds.interval_s)
        assert await StatusSync(store=store, state=standby).once()
        shown = {}
        for state in (leader, standby):
            app = make_app(metrics=metrics, state=state, store=store, settings=settings,
                           health=HealthCheck())
            shown[state is leader] = await views(app, clusters)
        return counts, report.counts(), {"leader": shown[True], "standby": shown[False]}

    try:
        created, counts, _ = await after_round()
        assert counts["created"] == CLUSTERS * POLICIES
        assert created["deliveries"] == CLUSTERS * POLICIES

        first, counts, shown = await after_round()
        assert (counts["converged"], counts["created"]) == (CLUSTERS, 0)
        second, _, shown_again = await after_round()
    finally:
        await rounds.close()

    for in_sync in (first, second):
        print(f"rows written by an in-sync round: {in_sync}")  # noqa: T201
        assert "deliveries" not in in_sync
        assert sum(in_sync.values()) <= 2 * CLUSTERS + 1
    # The standby shows what the leader knows; and the same after another in-sync round.
    for seen in (shown, shown_again):
        # Who ran the round: the leader's report has no epoch (no election), its row names it.
        seen["leader"]["/status"]["last_round"].pop("leader")
        seen["standby"]["/status"]["last_round"].pop("leader")
    assert timeless(shown["standby"]) == timeless(shown["leader"])
    assert timeless(shown_again["standby"]) == timeless(shown["standby"])
    assert timeless(shown_again["leader"]) == timeless(shown_again["standby"])
    policy = shown_again["standby"]["/v1/policies/p-07/status"]
    on = {c["cluster"]: c for c in policy["clusters"]}
    assert len(on) == CLUSTERS
    for view in on.values():
        assert view["last_result"] == ApplyResult.UNCHANGED.value
        assert view["stale"] is False
    # Seen and succeeded at the last round, though its rows were last written two rounds ago.
    last = shown_again["standby"]["/status"]["last_round"]
    assert all(last["started_at"] <= v["seen_at"] <= last["finished_at"] for v in on.values())
    assert all(last["started_at"] <= v["last_success_at"] <= last["finished_at"]
               for v in on.values())
