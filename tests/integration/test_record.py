"""Recording a round against a real PostgreSQL when part of it cannot be stored: values
PostgreSQL cannot hold are cleaned and named, rows the database refuses are dropped alone (and
named), every other cluster's rows land, and nothing is left behind for the next round.

Refusals are real: a value out of range for the database's own arithmetic, and triggers created
by the test that raise for one cluster (or one policy) as a broken constraint or a strict DBA
would."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from convergerd.errors import DatabaseRejected
from convergerd.model import ClusterId, PolicyId
from convergerd.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
)
from convergerd.store.store import Store
from convergerd.store.values import INT32_MAX, TEXT_MAX_CHARS

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)

# Raises for rows of the cluster (and, given, the policy) named in the trigger's arguments.
REFUSE_FUNCTION = """
CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF to_jsonb(NEW) ->> 'cluster_id' = TG_ARGV[0]
       AND (TG_NARGS < 2 OR to_jsonb(NEW) ->> 'policy_id' = TG_ARGV[1]) THEN
        RAISE EXCEPTION 'refused by the test: %', TG_ARGV[0];
    END IF;
    RETURN NEW;
END $$
"""


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


async def sql(dsn: str, *statements: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        rows: list[asyncpg.Record] = []
        for statement in statements:
            rows = list(await conn.fetch(statement))
        return rows
    finally:
        await conn.close()


async def refuse(dsn: str, table: str, *args: str) -> None:
    """From now on, `table` refuses rows of the cluster (and policy) in `args`."""
    quoted = ", ".join(f"'{a}'" for a in args)
    await sql(dsn, f"CREATE TRIGGER refuse_{table} BEFORE INSERT OR UPDATE ON {table} "
                   f"FOR EACH ROW EXECUTE FUNCTION test_refuse({quoted})")


class Refusals:
    """The store's `RecordObserver`: what it was told it dropped."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def record_refused(self, reason: str) -> None:
        self.reasons.append(reason)


@pytest.fixture
async def counted(database_url: str) -> AsyncIterator[tuple[Store, Refusals]]:
    """A store on this test's database that reports what it drops; `test_refuse()` exists."""
    refusals = Refusals()
    await sql(database_url, REFUSE_FUNCTION)
    store = await Store.connect(database_url, observer=refusals)
    try:
        yield store, refusals
    finally:
        await store.close()


def cluster(name: str, policies: list[str], t: float, *, result: ApplyResult = ApplyResult.CREATED,
            attempts: int = 1, error: str | None = None, message: str = "",
            revision: int | None = 1, server_version: str = "v1.31") -> ClusterOutcome:
    c = ClusterId(name)
    failed = result is ApplyResult.FAILED
    return ClusterOutcome(
        c, reached=True, desired=len(policies), in_sync=0 if failed else len(policies),
        failed=len(policies) if failed else 0, server_version=server_version,
        deliveries=[Delivery(c, PolicyId(p), 1, result, at(t), error=error,
                             reason="forbidden" if failed else None, attempts=attempts)
                    for p in policies],
        phases=[PhaseReading(c, PolicyId(p), "Enforcing", "Installed", message, revision, at(t))
                for p in policies],
    )


def report(t: float, *clusters: ClusterOutcome, epoch: Epoch | None = None) -> RoundReport:
    return RoundReport(started_at=at(t), finished_at=at(t + 1), epoch=epoch,
                       clusters=list(clusters))


async def deliveries(dsn: str) -> dict[tuple[str, str], asyncpg.Record]:
    rows = await sql(dsn, "SELECT * FROM deliveries")
    return {(r["cluster_id"], r["policy_id"]): r for r in rows}


async def states(dsn: str) -> dict[str, asyncpg.Record]:
    return {r["cluster_id"]: r for r in await sql(dsn, "SELECT * FROM cluster_state")}


async def test_values_postgres_cannot_hold_are_cleaned_and_named(
    database_url: str, counted: tuple[Store, Refusals], caplog: pytest.LogCaptureFixture
) -> None:
    """A condition message "ok\\u0000", a 403 body with a NUL, a lone surrogate, a 100k-char
    message, a revision beyond int64, a holder with a NUL: recorded cleaned, and the log names
    where each came from."""
    store, refusals = counted
    nul = cluster("c-nul", ["p1"], 1, result=ApplyResult.FAILED,
                  error='403 Forbidden: {"message": "no\x00"}', message="ok\x00",
                  server_version="v1.31\x00")
    odd = cluster("c-odd", ["p1"], 1, message="bad \ud800 byte " + "m" * 100_000,
                  revision=2**70)
    fine = cluster("c-fine", ["p1", "p2"], 1, message="Installed")
    round_id = await store.record_round(
        report(0, nul, odd, fine, epoch=Epoch("holder\x00", 2**70)), identity="r")

    rows = await deliveries(database_url)
    assert rows["c-nul", "p1"]["phase_message"] == "ok"
    assert rows["c-nul", "p1"]["last_error"] == '403 Forbidden: {"message": "no"}'
    message = rows["c-odd", "p1"]["phase_message"]
    assert message.startswith("bad \ufffd byte mmm")
    assert len(message) == TEXT_MAX_CHARS
    assert rows["c-odd", "p1"]["phase_revision"] is None
    assert rows["c-fine", "p2"]["phase_message"] == "Installed"
    assert {r["round_id"] for r in rows.values()} == {round_id}
    assert (await states(database_url))["c-nul"]["server_version"] == "v1.31"
    (round_row,) = await sql(database_url, "SELECT * FROM rounds")
    assert (round_row["epoch_holder"], round_row["epoch_transitions"]) == ("holder", None)
    assert refusals.reasons == []  # cleaned, nothing dropped

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("c-nul" in w and "p1" in w and "phase_message" in w for w in warnings), warnings


async def test_an_int_beyond_the_column_is_dropped_alone(
    database_url: str, counted: tuple[Store, Refusals], caplog: pytest.LogCaptureFixture
) -> None:
    """Failed attempts add up in the database: past the integer column, PostgreSQL refuses the
    sum (numeric out of range). That one row is dropped and named; the rest of its cluster and
    every other cluster land."""
    store, refusals = counted
    # 2**40 attempts are clamped to the column's maximum on the way in...
    first = cluster("c-over", ["p-over"], 1, result=ApplyResult.FAILED, attempts=2**40,
                    error="403")
    await store.record_round(report(0, first), identity="r")
    assert (await deliveries(database_url))["c-over", "p-over"]["attempts"] == INT32_MAX

    # ...and one more failure would overflow it in the upsert.
    again = cluster("c-over", ["p-over"], 61, result=ApplyResult.FAILED, error="403")
    again.deliveries.append(Delivery(ClusterId("c-over"), PolicyId("p-ok"), 1,
                                     ApplyResult.CREATED, at(61)))
    others = cluster("c-other", ["p-over", "p-ok"], 61)
    round_id = await store.record_round(report(60, again, others), identity="r")

    rows = await deliveries(database_url)
    assert rows["c-over", "p-over"]["round_id"] != round_id  # the refused row: as before
    assert rows["c-over", "p-over"]["attempts"] == INT32_MAX
    assert rows["c-over", "p-ok"]["round_id"] == round_id
    assert {rows["c-other", p]["round_id"] for p in ("p-over", "p-ok")} == {round_id}
    assert (await states(database_url))["c-over"]["round_id"] == round_id
    assert refusals.reasons == ["data"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("c-over" in e and "p-over" in e and "SQLSTATE 22003" in e for e in errors), errors


async def test_a_cluster_the_database_refuses_is_dropped_and_the_rest_recorded(
    database_url: str, counted: tuple[Store, Refusals], caplog: pytest.LogCaptureFixture
) -> None:
    store, refusals = counted
    await refuse(database_url, "deliveries", "c-bad")
    await refuse(database_url, "cluster_state", "c-bad")
    round_id = await store.record_round(
        report(0, cluster("c1", ["p1", "p2"], 1), cluster("c-bad", ["p1", "p2"], 1),
               cluster("c2", ["p1"], 1)),
        identity="r")

    rows = await deliveries(database_url)
    assert set(rows) == {("c1", "p1"), ("c1", "p2"), ("c2", "p1")}
    assert {r["round_id"] for r in rows.values()} == {round_id}
    assert set(await states(database_url)) == {"c1", "c2"}
    assert refusals.reasons == ["raised"]  # one per cluster dropped, not one per row
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [getattr(r, "cluster", None) for r in errors] == ["c-bad"]
    assert "refused 3 of its 3 rows" in errors[0].getMessage()

    # The cause removed, the next round records that cluster too.
    await sql(database_url, "DROP TRIGGER refuse_deliveries ON deliveries",
              "DROP TRIGGER refuse_cluster_state ON cluster_state")
    await store.record_round(report(60, cluster("c-bad", ["p1", "p2"], 61)), identity="r")
    assert {("c-bad", "p1"), ("c-bad", "p2")} <= set(await deliveries(database_url))


async def test_one_refused_row_drops_only_that_policy(
    database_url: str, counted: tuple[Store, Refusals], caplog: pytest.LogCaptureFixture
) -> None:
    store, refusals = counted
    await refuse(database_url, "deliveries", "c1", "p-bad")
    round_id = await store.record_round(
        report(0, cluster("c1", ["p1", "p-bad", "p2"], 1), cluster("c2", ["p-bad"], 1)),
        identity="r")

    rows = await deliveries(database_url)
    assert set(rows) == {("c1", "p1"), ("c1", "p2"), ("c2", "p-bad")}
    assert (await states(database_url))["c1"]["round_id"] == round_id
    assert refusals.reasons == ["raised"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "cluster c1" in errors[0]
    assert "dropped: p-bad;" in errors[0]


async def test_a_refused_round_row_is_rejected_not_unavailable(
    database_url: str, counted: tuple[Store, Refusals]
) -> None:
    """When not even the round's own row can be written, the caller learns it for good
    (`DatabaseRejected`, reason from the SQLSTATE class) and drops the round; nothing half
    written stays behind."""
    store, _ = counted
    await sql(database_url, "CREATE FUNCTION test_no_rounds() RETURNS trigger LANGUAGE plpgsql "
                            "AS $$ BEGIN RAISE EXCEPTION 'no rounds today'; END $$",
              "CREATE TRIGGER no_rounds BEFORE INSERT ON rounds "
              "FOR EACH ROW EXECUTE FUNCTION test_no_rounds()")
    with pytest.raises(DatabaseRejected) as info:
        await store.record_round(report(0, cluster("c1", ["p1"], 1)), identity="r")
    assert info.value.reason == "raised"
    assert "P0001" in str(info.value)
    assert await deliveries(database_url) == {}
