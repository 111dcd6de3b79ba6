"""The Store against a real PostgreSQL: the fleet as the round sees it, round records, the reads
the status API makes, and database errors classified by class and SQLSTATE."""

from __future__ import annotations

import datetime as dt
import json
import time
import traceback

import asyncpg
import pytest

from convergerd.core.errors import DatabaseUnavailable
from convergerd.core.model import BoundaryId, ClusterId, InvalidPolicy, PolicyId, PolicyRow
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    RoundResult,
    Verification,
    verified_fields,
)
from convergerd.core.rows import ClusterStateRow, DeliveryRow
from convergerd.demo.pgserver import free_port
from convergerd.store.errors import is_transient
from convergerd.store.store import Store

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)

def read(row: DeliveryRow) -> PhaseReading:
    """The reading recorded with `row` (there must be one)."""
    assert row.reading is not None
    return row.reading



def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


async def execute(dsn: str, sql: str, *args: object) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


async def seed(dsn: str) -> None:
    """Two clusters in one boundary, a third in none; valid and invalid policy rows as
    module-policies may write them."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """
            INSERT INTO clusters (id) VALUES ('c1'), ('c2'), ('c3');
            INSERT INTO boundaries (id) VALUES ('team-a'), ('empty');
            INSERT INTO boundary_clusters VALUES ('team-a', 'c1'), ('team-a', 'c2');
            """
        )
        rows = [
            ("p-latest", "team-a", {"type": "ForbidLatestTag"}, True, 3),
            ("p-plans", "team-a", {"type": "AllowedComputePlans", "plans": ["small"]}, True, 1),
            ("Bad_Id", "team-a", {"type": "ForbidLatestTag"}, True, 1),
            ("p-unknown", "team-a", {"type": "AllowedEverything"}, True, 2),
            ("p-orphan", "team-z", {"type": "ForbidLatestTag"}, False, 1),
            ("p-nowhere", "empty", {"type": "RequiredLabels", "labels": ["team"]}, True, 1),
        ]
        await conn.executemany(
            "INSERT INTO policies (id, boundary_id, rule, enabled, revision) "
            "VALUES ($1, $2, $3::jsonb, $4, $5)",
            [(i, b, json.dumps(r), e, rev) for i, b, r, e, rev in rows],
        )
        await conn.execute(
            """INSERT INTO policies (id, boundary_id, rule, deleted_at)
               VALUES ('p-deleting', 'team-a', '{"type": "ForbidLatestTag"}', now())"""
        )
    finally:
        await conn.close()


async def test_load_fleet_validates_every_row(database_url: str, store: Store) -> None:
    await seed(database_url)
    fleet = await store.load_fleet()
    assert [c.id for c in fleet.clusters] == ["c1", "c2", "c3"]
    assert fleet.boundaries[BoundaryId("team-a")].clusters == {"c1", "c2"}
    assert fleet.boundaries[BoundaryId("empty")].clusters == frozenset()
    assert sorted(p.id for p in fleet.policies) == ["p-latest", "p-nowhere", "p-plans"]
    invalid = {p.id: p for p in fleet.invalid}
    assert sorted(invalid) == ["Bad_Id", "p-orphan", "p-unknown"]
    assert invalid["Bad_Id"].reason.startswith("id: 'Bad_Id' is not a DNS label")
    assert invalid["p-unknown"] == InvalidPolicy(
        "p-unknown", "team-a", 2,
        "rule.type: unknown type 'AllowedEverything'; known: RequiredLabels, "
        "AllowedRegistries, ForbidLatestTag, AllowedComputePlans",
    )
    assert invalid["p-orphan"].reason == "boundary: 'team-z' does not exist"
    # The round's input: control-plane rules never leave, invalid rows never reach a cluster.
    desired = fleet.desired_by_cluster()
    assert {c: [p.id for p in ps] for c, ps in desired.items()} == {
        "c1": ["p-latest"], "c2": ["p-latest"], "c3": [],
    }
    assert await store.invalid_policies() == list(fleet.invalid)


async def test_policy_reads(database_url: str, store: Store) -> None:
    await seed(database_url)
    assert await store.get_policy("p-latest") == PolicyRow(
        "p-latest", "team-a", {"type": "ForbidLatestTag"}, True, 3
    )
    assert await store.get_policy("Bad_Id") is not None  # stored as written
    assert await store.get_policy("p-deleting") is None
    assert await store.get_policy("nope") is None
    assert await store.policy_scope("p-latest") == {ClusterId("c1"), ClusterId("c2")}
    assert await store.policy_scope("p-nowhere") == frozenset()
    assert await store.policy_scope("nope") == frozenset()


async def test_a_content_change_by_another_writer_raises_the_revision(
    database_url: str, store: Store
) -> None:
    await seed(database_url)
    await execute(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-latest'")
    await execute(
        database_url, "UPDATE policies SET updated_at = now() WHERE id = 'p-latest'"
    )  # not a content change
    policy = await store.get_policy("p-latest")
    assert policy is not None
    assert (policy.enabled, policy.revision) == (False, 4)


async def test_policy_changes_are_notified(database_url: str) -> None:
    await seed(database_url)
    listener = await asyncpg.connect(database_url)
    received: list[str] = []
    try:
        await listener.add_listener(
            "convergerd_policies", lambda *args: received.append(args[3])
        )
        await execute(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-latest'")
        await listener.execute("SELECT 1")  # notifications arrive before the next reply
    finally:
        await listener.close()
    assert received == ["p-latest"]


def delivery(cluster: str, policy: str, revision: int, result: ApplyResult, t: float,
             **kwargs: object) -> Delivery:
    return Delivery(ClusterId(cluster), PolicyId(policy), revision, result, at(t),
                    **kwargs)  # type: ignore[arg-type]


async def test_record_round_keeps_the_last_success_across_failures(
    database_url: str, store: Store
) -> None:
    await seed(database_url)
    ok = ClusterOutcome(
        ClusterId("c1"), reached=True, desired=1, in_sync=1, server_version="v1.31.0",
        deliveries=[delivery("c1", "p-latest", 3, ApplyResult.CREATED, 1)],
        phases=[PhaseReading(ClusterId("c1"), PolicyId("p-latest"), "Enforcing", "Installed",
                             "bound", 3, at(2))],
    )
    down = ClusterOutcome(ClusterId("c2"), desired=1, error="connect timeout",
                          reason="unreachable")
    first = RoundReport(started_at=at(0), finished_at=at(5), epoch=Epoch("replica-a", 2),
                        clusters=[ok, down])
    round1 = await store.record_round(first, identity="replica-a")

    last = await store.last_round()
    assert last is not None
    assert (last.id, last.result, last.epoch, last.identity) == (
        round1, RoundResult.PARTIAL, Epoch("replica-a", 2), "replica-a"
    )
    assert (last.started_at, last.finished_at) == (at(0), at(5))
    assert last.counts["unreached"] == 1

    failed = ClusterOutcome(
        ClusterId("c1"), reached=True, desired=1, failed=1,
        deliveries=[delivery("c1", "p-latest", 4, ApplyResult.FAILED, 61,
                             error="422: spec.rule: Invalid", reason="invalid", attempts=2)],
        phases=[PhaseReading(ClusterId("c1"), PolicyId("p-latest"), "Enforcing", "Installed",
                             "bound", 3, at(60))],
    )
    second = RoundReport(started_at=at(60), finished_at=at(65), clusters=[failed])
    round2 = await store.record_round(second, identity="replica-b")
    third = RoundReport(started_at=at(120), finished_at=at(125), clusters=[failed])
    await store.record_round(third, identity="replica-b")

    [row] = await store.deliveries_for_cluster("c1")
    assert row.policy == "p-latest"
    assert row.delivered_revision == 3  # what the cluster last accepted
    assert row.last_result is ApplyResult.FAILED
    assert (row.last_attempt_at, row.last_success_at) == (at(61), at(1))
    assert (row.last_error, row.last_reason, row.attempts) == (
        "422: spec.rule: Invalid", "invalid", 4
    )
    assert row.round_id == round2 + 1
    # Read unchanged at 60: not rewritten, seen then (the cluster's listing).
    r = read(row)
    assert (r.phase, r.ready_reason, r.ready_message, r.revision, r.seen_at) == (
        "Enforcing", "Installed", "bound", 3, at(60))

    fixed = ClusterOutcome(
        ClusterId("c1"), reached=True, desired=1, in_sync=1,
        deliveries=[delivery("c1", "p-latest", 4, ApplyResult.UNCHANGED, 181)],
    )
    await store.record_round(RoundReport(started_at=at(180), finished_at=at(185),
                                         clusters=[fixed]), identity="replica-b")
    [row] = await store.deliveries_for_policy("p-latest")
    assert (row.delivered_revision, row.last_success_at, row.last_error, row.attempts) == (
        4, at(181), None, 0
    )

    states = {s.cluster: s for s in await store.cluster_states()}
    assert states[ClusterId("c1")] == ClusterStateRow(
        cluster=ClusterId("c1"), reachable=True, last_attempt_at=at(185),
        last_success_at=at(185), last_reached_at=at(185), last_error=None, last_reason=None,
        desired=1, in_sync=1, failed=0, server_version="v1.31.0", round_id=round2 + 2,
    )
    assert states[ClusterId("c2")] == ClusterStateRow(
        cluster=ClusterId("c2"), reachable=False, last_attempt_at=at(5), last_success_at=None,
        last_reached_at=None, last_error="connect timeout", last_reason="unreachable",
        desired=1, in_sync=0, failed=0, server_version=None, round_id=round1,
    )
    # Never attempted, still listed.
    assert states[ClusterId("c3")].reachable is None
    assert states[ClusterId("c3")].last_attempt_at is None


async def test_older_facts_never_overwrite_newer_ones(database_url: str, store: Store) -> None:
    await seed(database_url)
    await store.record_deliveries([delivery("c1", "p-latest", 4, ApplyResult.UPDATED, 100)])
    late_round = RoundReport(started_at=at(0), finished_at=at(200), clusters=[ClusterOutcome(
        ClusterId("c1"), reached=True, desired=1, failed=1,
        deliveries=[delivery("c1", "p-latest", 3, ApplyResult.FAILED, 50, error="boom")],
        phases=[PhaseReading(ClusterId("c1"), PolicyId("p-latest"), "Error", "CelError",
                             "bad", 3, at(50))],
    )])
    await store.record_round(late_round, identity="r")
    newer_phase = PhaseReading(ClusterId("c1"), PolicyId("p-latest"), "Enforcing", None, None,
                               4, at(150))
    await store.record_round(RoundReport(started_at=at(140), finished_at=at(160), clusters=[
        ClusterOutcome(ClusterId("c1"), reached=True, phases=[newer_phase])
    ]), identity="r")
    await store.record_round(late_round, identity="r")
    [row] = await store.deliveries_for_cluster("c1")
    # The save at 100 stands (round_id None), confirmed in sync by the listing at 150.
    assert (row.delivered_revision, row.last_result, row.last_error, row.round_id,
            row.last_attempt_at) == (4, ApplyResult.UNCHANGED, None, None, at(150))
    r = read(row)
    assert (r.phase, r.revision, r.seen_at) == ("Enforcing", 4, at(150))


async def test_the_verified_condition_is_recorded_with_the_phase_newest_wins(
    database_url: str, store: Store
) -> None:
    await seed(database_url)
    admitted = Verification("False", "Admitted", "a violating pod was ADMITTED", at(40), at(30))
    denied = Verification("True", "Denied", "denied", at(140), at(140))

    def reading(verified: Verification | None, seen: float) -> PhaseReading:
        return PhaseReading(ClusterId("c1"), PolicyId("p-latest"), "Enforcing", "Enforcing",
                            "ok", 3, at(seen), **verified_fields(verified))

    def round_with(verified: Verification | None, seen: float) -> RoundReport:
        return RoundReport(started_at=at(seen - 1), finished_at=at(seen + 1), clusters=[
            ClusterOutcome(ClusterId("c1"), reached=True, phases=[reading(verified, seen)])])

    await store.record_round(round_with(admitted, 50), identity="r")
    [row] = await store.deliveries_for_cluster("c1")
    r = read(row)
    assert (r.verified_status, r.verified_reason, r.verified_message, r.verified_probed_at,
            r.verified_since) == (
        "False", "Admitted", "a violating pod was ADMITTED", at(40), at(30))
    await store.record_round(round_with(denied, 150), identity="r")
    await store.record_round(round_with(admitted, 50), identity="r")  # late: older
    [row] = await store.deliveries_for_policy("p-latest")
    r = read(row)
    assert (r.verified_status, r.verified_reason, r.verified_probed_at) == (
        "True", "Denied", at(140))
    await store.record_round(round_with(None, 250), identity="r")  # the condition is gone
    [row] = await store.deliveries_for_cluster("c1")
    r = read(row)
    assert (r.verified_status, r.verified_reason, r.verified_probed_at) == (
        None, None, None)


async def test_a_late_round_does_not_overwrite_a_newer_cluster_state(
    database_url: str, store: Store
) -> None:
    """A round recorded late (kept while the database was down, recorded when its replica next
    ran one) is older than what the database holds: the newer outcome stays, and stays the
    last round; only a newer success or reach time is taken from it."""
    await seed(database_url)
    newer = RoundReport(started_at=at(290), finished_at=at(300), clusters=[ClusterOutcome(
        ClusterId("c1"), desired=1, error="connect timeout", reason="unreachable")])
    newer_id = await store.record_round(newer, identity="replica-b")
    late = RoundReport(started_at=at(90), finished_at=at(100), clusters=[ClusterOutcome(
        ClusterId("c1"), reached=True, desired=1, in_sync=1, server_version="v1.30.1")])
    await store.record_round(late, identity="replica-a")

    states = {s.cluster: s for s in await store.cluster_states()}
    assert states[ClusterId("c1")] == ClusterStateRow(
        cluster=ClusterId("c1"), reachable=False, last_attempt_at=at(300),
        last_success_at=at(100), last_reached_at=at(100), last_error="connect timeout",
        last_reason="unreachable", desired=1, in_sync=0, failed=0, server_version="v1.30.1",
        round_id=newer_id,
    )
    last = await store.last_round()
    assert last is not None
    assert (last.id, last.started_at, last.identity) == (newer_id, at(290), "replica-b")


async def test_invalid_policies_snapshot(database_url: str, store: Store) -> None:
    await seed(database_url)
    fleet = await store.load_fleet()
    report = RoundReport(started_at=at(0), finished_at=at(1), invalid=list(fleet.invalid))
    await store.record_round(report, identity="r")
    report = RoundReport(started_at=at(60), finished_at=at(61), invalid=list(fleet.invalid[:1]))
    await store.record_round(report, identity="r")
    # A round that could not run says nothing about invalid policies.
    await store.record_round(RoundReport(started_at=at(120), error="database down"),
                             identity="r")
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT * FROM invalid_policies")
    finally:
        await conn.close()
    assert [(r["policy_id"], r["first_seen_at"], r["seen_at"]) for r in rows] == [
        (fleet.invalid[0].id, at(1), at(61))
    ]
    last = await store.last_round()
    assert last is not None
    assert (last.result, last.error, last.finished_at) == (
        RoundResult.FAILED, "database down", None
    )


async def test_record_round_at_fleet_scale(database_url: str, store: Store) -> None:
    """1,000 clusters x 100 policies: 100k deliveries and phase readings in one record."""
    clusters, policies = 1000, 100
    outcomes = []
    for c in range(clusters):
        cluster = ClusterId(f"c{c:04d}")
        outcomes.append(ClusterOutcome(
            cluster, reached=True, desired=policies, in_sync=policies, server_version="v1.31",
            deliveries=[Delivery(cluster, PolicyId(f"p{p:03d}"), 1, ApplyResult.CREATED, at(1))
                        for p in range(policies)],
            phases=[PhaseReading(cluster, PolicyId(f"p{p:03d}"), "Enforcing", "Installed", "",
                                 1, at(2)) for p in range(policies)],
        ))
    timings = []
    for n in range(2):  # first round inserts, the second updates every row
        report = RoundReport(started_at=at(60 * n), finished_at=at(60 * n + 30),
                             clusters=outcomes)
        started = time.perf_counter()
        await store.record_round(report, identity="bench")
        timings.append(time.perf_counter() - started)
    print(  # noqa: T201 - the figure is the point of this test
        f"\nrecord_round, {clusters} clusters x {policies} policies "
        f"({clusters * policies} deliveries + phases): insert {timings[0]:.2f} s, "
        f"update {timings[1]:.2f} s"
    )
    assert len(await store.deliveries_for_cluster("c0999")) == policies
    assert max(timings) < 30


async def test_round_history_is_bounded(database_url: str, store: Store) -> None:
    store.rounds_kept = 2
    ids = [await store.record_round(RoundReport(started_at=at(n), finished_at=at(n)),
                                    identity="r") for n in range(4)]
    last = await store.last_round()
    assert last is not None
    assert last.id == ids[-1]
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT array_agg(id ORDER BY id) FROM rounds") == ids[2:]
    finally:
        await conn.close()


async def test_the_last_rounds_replica_identities_are_bounded_as_lease_holders(
    database_url: str, store: Store
) -> None:
    """/status shows who ran the last round: a row written by hand with a 1 MB identity
    reads as at most 128 printable characters, like a Lease holder."""
    await execute(database_url, "INSERT INTO rounds (started_at, result, epoch_holder, "
                  "epoch_transitions, identity) VALUES ($1, 'ok', $2, 3, $3)",
                  at(0), "\x1b[2J" + "h" * 2**20, "i" * 2**20)
    last = await store.last_round()
    assert last is not None
    assert last.epoch is not None
    assert len(last.epoch.holder) == 128
    assert last.epoch.holder.isprintable()
    assert last.identity == "i" * 127 + "…"


async def test_ping(store: Store) -> None:
    await store.ping()


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://convergerd:canary-s3cret@127.0.0.1:{port}/nothing",
         "postgresql://convergerd:***@127.0.0.1:{port}/nothing"),
        ("postgresql://convergerd@127.0.0.1:{port}/nothing?password=canary-s3cret",
         "postgresql://convergerd@127.0.0.1:{port}/nothing?password=***"),
    ],
)
async def test_unreachable_database_is_unavailable_without_the_password(
    dsn: str, shown: str
) -> None:
    port = free_port()
    with pytest.raises(DatabaseUnavailable) as caught:
        await Store.connect(dsn.format(port=port))
    rendered = "".join(traceback.format_exception(caught.value))
    assert "canary-s3cret" not in rendered
    assert f"cannot connect to {shown.format(port=port)}: ConnectionRefusedError" in str(
        caught.value
    )


async def test_a_lost_connection_is_unavailable(database_url: str, store: Store) -> None:
    admin = await asyncpg.connect(database_url)

    async def query_a_terminated_backend() -> None:
        async with store._acquire() as conn:
            await admin.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
            await conn.fetchval("SELECT 1")

    try:
        with pytest.raises(DatabaseUnavailable, match="lost the database at"):
            await query_a_terminated_backend()
    finally:
        await admin.close()
    await store.ping()  # the pool replaces the lost connection


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (asyncpg.exceptions.ConnectionDoesNotExistError("gone"), True),
        (asyncpg.CannotConnectNowError("starting up"), True),
        (asyncpg.exceptions.AdminShutdownError("terminating"), True),
        (asyncpg.exceptions.InternalClientError("protocol is in the failed state"), True),
        (asyncpg.exceptions.TooManyConnectionsError("too many"), True),
        (asyncpg.exceptions.SerializationError("retry"), True),
        (asyncpg.exceptions.DeadlockDetectedError("retry"), True),
        (asyncpg.exceptions.InvalidPasswordError("no"), False),
        (asyncpg.exceptions.UniqueViolationError("dup"), False),
        (asyncpg.exceptions.UndefinedTableError("no table"), False),
        (ValueError("bug"), False),
    ],
)
def test_errors_are_classified_by_class_and_sqlstate(
    error: Exception, transient: bool
) -> None:
    assert is_transient(error) is transient


def test_authentication_failures_are_transient_only_while_connecting() -> None:
    error = asyncpg.exceptions.InvalidPasswordError("password authentication failed")
    assert is_transient(error, connecting=True)
