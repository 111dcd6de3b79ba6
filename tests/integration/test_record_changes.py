"""A round records what changed, not every delivery again (issue 19, item 1): against a real
PostgreSQL and the simulator, an in-sync round writes its cluster states and its round, and no
delivery row, while what status shows from the database stays what the replica that ran the
rounds knows. Rows are counted by triggers the test puts on the record tables."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    PhaseReading,
    RoundReport,
    Verification,
    verified_fields,
)
from convergerd.core.rows import DeliveryRow
from convergerd.sim.fleet import HOME, Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.phases import VERIFIED_STALE_PERIODS
from convergerd.status.records import PolicyRecord
from convergerd.status.state import StatusState
from convergerd.status.sync import StatusSync
from convergerd.status.views import record_view
from convergerd.store.schema import load_migrations, migrate
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import Rounds, import_doc, settings_for
from tests.integration.test_http import saver

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

def read(row: DeliveryRow) -> PhaseReading:
    """The reading recorded with `row` (there must be one)."""
    assert row.reading is not None
    return row.reading



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

    async def after_round() -> tuple[dict[str, int], dict[str, Any], dict[str, Any]]:
        report = await rounds.run()
        leader.observe_round(report)
        counts = await written(database_url)
        standby = StatusState(identity="leader", interval_s=settings.rounds.interval_s)
        assert await StatusSync(store=store, state=standby).once()
        shown = {}
        for state in (leader, standby):
            app = make_app(metrics=Metrics(state=state, process_collectors=False), state=state,
                           store=store, settings=settings,
                           health=HealthCheck(), saver=saver())
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


# ---- what a round writes, and what status derives, one fact at a time -------------------------

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
C1 = ClusterId("c1")
P1, P2 = PolicyId("p1"), PolicyId("p2")


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


async def counting(dsn: str) -> None:
    """One cluster, two policies in its boundary, and the write counter."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("""
            INSERT INTO clusters (id) VALUES ('c1');
            INSERT INTO boundaries (id) VALUES ('b');
            INSERT INTO boundary_clusters VALUES ('b', 'c1');
            INSERT INTO policies (id, boundary_id, rule, revision) VALUES
                ('p1', 'b', '{"type": "ForbidLatestTag"}', 3),
                ('p2', 'b', '{"type": "ForbidLatestTag"}', 5);
        """)
        await conn.execute(COUNT_WRITES)
    finally:
        await conn.close()


def reading(policy: PolicyId, seen: float, verified: Verification | None = None,
            phase: str = "Enforcing") -> PhaseReading:
    return PhaseReading(C1, policy, phase, "Enforcing", "ok", 3 if policy == P1 else 5,
                        at(seen), **verified_fields(verified))


def listed(seen: float, *readings: PhaseReading, deliveries: bool = True) -> RoundReport:
    """A round that listed c1 at `seen` and found `readings`, each in sync."""
    in_sync = [Delivery(C1, r.policy, r.revision or 0, ApplyResult.UNCHANGED, at(seen + 0.1))
               for r in readings] if deliveries else []
    return RoundReport(started_at=at(seen - 1), finished_at=at(seen + 1), clusters=[
        ClusterOutcome(C1, reached=True, desired=len(readings), in_sync=len(readings),
                       deliveries=in_sync, phases=list(readings))])


async def test_a_probe_moving_forward_is_not_written_and_its_age_still_shows(
    database_url: str, store: Store
) -> None:
    """The operators probe every period: a lastProbeTime moving forward alone is no change, the
    row's probe time is derived from the listing's oldest, and it ages as before when the
    operator stops probing (Verified `stale`). A new verdict is written."""
    await counting(database_url)
    denied = Verification("True", "Denied", "denied", at(40), at(30))

    def probed(t: float) -> Verification:
        return Verification("True", "Denied", "denied", at(t), at(30))

    await store.record_round(listed(50, reading(P1, 50, denied), reading(P2, 50, probed(45))),
                             identity="r")
    assert (await written(database_url))["deliveries"] == 2
    await store.record_round(listed(350, reading(P1, 350, probed(340)),
                                    reading(P2, 350, probed(345))), identity="r")
    assert "deliveries" not in await written(database_url)
    rows = {r.policy: r for r in await store.deliveries_for_cluster(C1)}
    # At least the listing's oldest probe (p1's 340), never later than its own.
    assert read(rows["p1"]).verified_probed_at == at(340)
    assert read(rows["p2"]).verified_probed_at == at(340)
    assert read(rows["p1"]).seen_at == at(350)

    # The operator stops probing; the listings go on.
    await store.record_round(listed(650, reading(P1, 650, probed(340)),
                                    reading(P2, 650, probed(345))), identity="r")
    assert "deliveries" not in await written(database_url)
    [row, _] = await store.deliveries_for_cluster(C1)
    probe_period_s = 600.0
    current = record_view(PolicyRecord.from_row(row), at(660), 3600,
                          probe_period_s=probe_period_s)
    assert current["verified"]["verification"] == "verified"
    later = at(340 + VERIFIED_STALE_PERIODS * probe_period_s + 1)
    gone = record_view(PolicyRecord.from_row(row), later, 3600, probe_period_s=probe_period_s)
    assert (gone["verified"]["stale"], gone["verified"]["verification"]) == (True, "stale")

    admitted = Verification("False", "Admitted", "a violating pod was ADMITTED", at(900),
                            at(900))
    await store.record_round(listed(950, reading(P1, 950, admitted),
                                    reading(P2, 950, probed(345))), identity="r")
    assert (await written(database_url))["deliveries"] == 1
    rows = {r.policy: r for r in await store.deliveries_for_cluster(C1)}
    r1 = read(rows["p1"])
    assert (r1.verified_reason, r1.verified_probed_at) == ("Admitted", at(900))


async def test_a_policy_the_listing_no_longer_finds_loses_its_phase(
    database_url: str, store: Store
) -> None:
    """Rows a round does not write are taken as seen at its listing, so one the listing did not
    find is written: its phase cleared, as this replica's own status has it. A late record
    of an older listing neither clears nor restores anything."""
    await counting(database_url)
    both = listed(50, reading(P1, 50), reading(P2, 50))
    await store.record_round(both, identity="r")
    await written(database_url)
    await store.record_round(listed(350, reading(P1, 350)), identity="r")
    assert (await written(database_url))["deliveries"] == 1  # p2 cleared, p1 unchanged
    rows = {r.policy: r for r in await store.deliveries_for_cluster(C1)}
    assert (read(rows["p1"]).phase, read(rows["p1"]).seen_at) == ("Enforcing", at(350))
    assert rows["p2"].reading is None
    # p2's delivery is no longer confirmed by a listing: its own times stay.
    assert (rows["p2"].last_result, rows["p2"].last_attempt_at) == (
        ApplyResult.UNCHANGED, at(50.1))
    assert rows["p1"].last_attempt_at == at(350)

    await store.record_round(both, identity="r")  # late: the listing at 50 again
    assert "deliveries" not in await written(database_url)
    rows = {r.policy: r for r in await store.deliveries_for_cluster(C1)}
    assert (read(rows["p1"]).seen_at, rows["p2"].reading) == (at(350), None)


async def test_an_unreached_cluster_s_rows_age_from_its_last_listing(
    database_url: str, store: Store
) -> None:
    """No listing, nothing confirmed: the rows show the last listing's times, and age into
    `Stale` after two intervals as before."""
    await counting(database_url)
    await store.record_round(listed(50, reading(P1, 50)), identity="r")
    await store.record_round(listed(350, reading(P1, 350)), identity="r")
    await written(database_url)
    down = RoundReport(started_at=at(649), finished_at=at(651), clusters=[
        ClusterOutcome(C1, desired=1, error="connect timeout", reason="unreachable")])
    await store.record_round(down, identity="r")
    assert "deliveries" not in await written(database_url)
    [row] = await store.deliveries_for_cluster(C1)
    assert (read(row).seen_at, row.last_success_at) == (at(350), at(350))
    view = record_view(PolicyRecord.from_row(row), at(350 + 600 + 1), 300)
    assert view["stale"] is True


async def test_a_database_recorded_before_0004_is_carried_over(
    empty_database_url: str
) -> None:
    """A database at 0003 with rows the old version rewrote every round: after `migrate`, the
    rows show their own times (no listing recorded yet), and the first round that reads them
    unchanged writes none of them and confirms them."""
    migrations = load_migrations()
    before = [m for m in migrations if int(m.version) < 4]
    after = [m.version for m in migrations if int(m.version) >= 4]
    assert after[0] == "0004"
    conn = await asyncpg.connect(empty_database_url)
    try:
        async with conn.transaction():
            await conn.execute(
                "CREATE TABLE schema_migrations (version text PRIMARY KEY, name text NOT NULL,"
                " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            for m in before:
                await conn.execute(m.sql)
                await conn.execute("INSERT INTO schema_migrations (version, name, checksum) "
                                   "VALUES ($1, $2, $3)", m.version, m.name, m.checksum)
        await conn.execute("""
            INSERT INTO clusters (id) VALUES ('c1');
            INSERT INTO cluster_state (cluster_id, last_attempt_at, last_success_at,
                                       last_reached_at, reachable, desired, in_sync)
                VALUES ('c1', $1, $1, $1, true, 1, 1);
            INSERT INTO deliveries (policy_id, cluster_id, delivered_revision, last_result,
                                    last_attempt_at, last_success_at, phase, phase_revision,
                                    phase_seen_at)
                VALUES ('p1', 'c1', 3, 'unchanged', $1, $1, 'Enforcing', 3, $1);
        """.replace("$1", f"'{at(50).isoformat()}'"))
        assert await migrate(empty_database_url) == after
        await conn.execute(COUNT_WRITES)
    finally:
        await conn.close()
    store = await Store.connect(empty_database_url)
    try:
        [row] = await store.deliveries_for_cluster(C1)
        assert (row.last_attempt_at, read(row).seen_at, row.last_result) == (
            at(50), at(50), ApplyResult.UNCHANGED)
        await store.record_round(listed(350, PhaseReading(
            C1, P1, "Enforcing", None, None, 3, at(350))), identity="r")
        assert "deliveries" not in await written(empty_database_url)
        [row] = await store.deliveries_for_cluster(C1)
    finally:
        await store.close()
    assert (row.last_attempt_at, row.last_success_at, read(row).seen_at) == (
        at(350), at(350), at(350))


async def test_a_cluster_recorded_row_by_row_is_not_taken_as_listed(
    database_url: str, store: Store
) -> None:
    """When the database refuses one of a cluster's rows, the others are written one by one:
    the rows not written are then not known to be unchanged, so the cluster's listing is not
    recorded, and they keep the times of the last listing that was."""
    await counting(database_url)
    await store.record_round(listed(50, reading(P1, 50), reading(P2, 50)), identity="r")
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("""
            CREATE FUNCTION test_refuse_p2() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.policy_id = 'p2' THEN RAISE EXCEPTION 'refused by the test'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse BEFORE INSERT OR UPDATE ON deliveries
                FOR EACH ROW EXECUTE FUNCTION test_refuse_p2();
        """)
        await written(database_url)
        await store.record_round(listed(350, reading(P1, 350), reading(P2, 350, phase="Error")),
                                 identity="r")
        state = await conn.fetchrow(
            "SELECT last_attempt_at, listed_at FROM cluster_state WHERE cluster_id = 'c1'")
    finally:
        await conn.close()
    assert "deliveries" not in await written(database_url)
    assert state is not None
    assert (state["last_attempt_at"], state["listed_at"]) == (at(351), at(50))
    rows = {r.policy: r for r in await store.deliveries_for_cluster(C1)}
    assert (read(rows["p1"]).seen_at, read(rows["p2"]).phase) == (at(50), "Enforcing")
