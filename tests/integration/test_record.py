"""Recording a round against a real PostgreSQL when part of it cannot be stored: values
PostgreSQL cannot hold are cleaned and named, rows the database refuses are dropped alone (and
named), every other cluster's rows land, and nothing is left behind for the next round.

Refusals are real: a value out of range for the database's own arithmetic, and triggers created
by the test that raise for one cluster (or one policy) as a broken constraint or a strict DBA
would."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from convergerd.config import Settings
from convergerd.core.errors import DatabaseRejected
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
)
from convergerd.runtime import Daemon
from convergerd.sim.fleet import HOME, Fleet
from convergerd.sim.resources import LEASES, POLICIES
from convergerd.store.records import round_record, write_round
from convergerd.store.store import Store
from convergerd.store.values import INT32_MAX, TEXT_MAX_CHARS
from tests.fixtures.fleet import free_port
from tests.integration.rounds_helpers import (
    FLEET_DOC,
    import_doc,
    objects,
    running_daemon,
    settings_for,
    sigterm_mid_round,
    wait_for,
)

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
C1 = ClusterId("c0001")

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


class Copying(asyncpg.Connection):
    """asyncpg's connection, counting the rows a COPY takes as it takes them."""

    copied = 0

    async def copy_records_to_table(  # type: ignore[override]
        self, table_name: str, *,
        records: Iterable[tuple[Any, ...]] | AsyncIterable[tuple[Any, ...]], **kwargs: Any,
    ) -> str:
        async def counted() -> AsyncIterator[tuple[Any, ...]]:
            if isinstance(records, AsyncIterable):
                async for row in records:
                    self.copied += 1
                    yield row
            else:
                for row in records:
                    self.copied += 1
                    yield row

        result: str = await super().copy_records_to_table(
            table_name, records=counted(), **kwargs)
        return result


async def test_other_tasks_run_while_a_big_record_is_copied(database_url: str) -> None:
    """1,200 clusters x 25 policies: while the record's rows are made and copied (asyncpg's
    COPY lets the loop run only when the socket is full), a task that only waits for a turn
    of the loop gets one with the COPY part done. Every row lands, every cluster's state (in
    more than one statement)."""
    policies = [f"p{j:03d}" for j in range(25)]
    big = report(0, *(cluster(f"c{i:04d}", policies, 0, result=ApplyResult.UNCHANGED)
                      for i in range(1200)))
    rows = 1200 * 25
    conn = await asyncpg.connect(database_url, connection_class=Copying)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                              schema="pg_catalog")  # as the store's connections
    seen: list[int] = []  # rows copied at each turn the other task had

    async def other() -> None:
        while True:
            seen.append(conn.copied)
            await asyncio.sleep(0)

    try:
        task = asyncio.create_task(other())
        async with conn.transaction():
            await write_round(conn, await round_record(big, "test"), kept=10)
        task.cancel()
        assert await conn.fetchval("SELECT count(*) FROM deliveries") == rows
        assert await conn.fetchval("SELECT count(*) FROM cluster_state") == 1200
    finally:
        await conn.close()
    assert conn.copied == rows
    assert any(0 < n < rows for n in seen)


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


# --- the daemon ------------------------------------------------------------------------------


async def http_get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(
        f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)
    ) as response:
        return response.status, await response.text()


def record_failures(daemon: Daemon, reason: str) -> float:
    for family in text_string_to_metric_families(daemon.metrics.render().decode()):
        for sample in family.samples:
            if sample.name == "convergerd_record_failures_total" \
                    and sample.labels == {"reason": reason}:
                return sample.value
    raise AssertionError("convergerd_record_failures_total not exposed")


async def test_database_refusals_never_stop_the_daemon(
    fleet: Fleet, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon (`Daemon.main`): one cluster's rows refused, then the fleet unreadable (a
    table renamed under it): each round logs it and goes on, /healthz and /metrics answer, and
    once the cause is removed the next rounds record everything."""
    await import_doc(database_url, FLEET_DOC)
    await sql(database_url, REFUSE_FUNCTION)
    await refuse(database_url, "deliveries", "c0002")
    await refuse(database_url, "cluster_state", "c0002")
    port = free_port()
    settings = settings_for(fleet.kubeconfig_path, database_url,
                            Policies__ConvergeIntervalMinutes="0.01",  # 0.6 s
                            CONVERGERD_HTTP_ADDR=f"127.0.0.1:{port}")

    async def recorded(cluster: str) -> set[str]:
        return {p for c, p in await deliveries(database_url) if c == cluster}

    async def rounds() -> list[asyncpg.Record]:
        return await sql(database_url, "SELECT * FROM rounds ORDER BY id")

    async with running_daemon(settings) as (daemon, task):
        await wait_for(lambda: record_failures(daemon, "raised") >= 2,
                       what="two rounds with c0002 refused")
        assert await recorded("c0001") == {"p-latest", "p-regs", "p-labels"}
        assert await recorded("c0003") == {"p-latest", "p-regs"}
        assert await recorded("c0002") == set()
        assert any(getattr(r, "cluster", None) == "c0002" and r.levelno == logging.ERROR
                   for r in caplog.records)
        assert (await http_get(port, "/healthz"))[0] == 200

        # The fleet cannot be read at all: rounds say why, and the daemon waits it out.
        await sql(database_url, "ALTER TABLE boundaries RENAME TO boundaries_away")
        await wait_for(lambda: "could not read the fleet" in caplog.text,
                       what="a round refused its fleet")

        async def refused_round_recorded() -> bool:
            return any((r["error"] or "").startswith("database refused")
                       for r in await rounds())

        await wait_for(refused_round_recorded, what="the refused round recorded")
        assert not task.done()
        status, metrics = await http_get(port, "/metrics")
        assert status == 200
        assert 'convergerd_record_failures_total{reason="raised"}' in metrics

        await sql(database_url, "ALTER TABLE boundaries_away RENAME TO boundaries",
                  "DROP TRIGGER refuse_deliveries ON deliveries",
                  "DROP TRIGGER refuse_cluster_state ON cluster_state")

        async def c0002_recorded() -> bool:
            return await recorded("c0002") == {"p-latest", "p-regs"}

        await wait_for(c0002_recorded, what="c0002 recorded once the triggers are gone")
        last = (await rounds())[-1]
        assert last["error"] is None
        assert not task.done()


def lease_holder(fleet: Fleet, settings: Settings) -> str | None:
    lease = fleet.store(HOME).get(LEASES, settings.election.lease_namespace,
                                  settings.election.lease_name)
    holder: str | None = lease["spec"].get("holderIdentity")
    return holder


def electing(fleet: Fleet, database_url: str, **env: str) -> Settings:
    return settings_for(
        fleet.kubeconfig_path, database_url,
        Policies__ConvergeIntervalMinutes="0.01",
        CONVERGERD_LEADER_ELECTION="true",
        CONVERGERD_HOME_CONTEXT=HOME,
        CONVERGERD_LEASE_DURATION_SECONDS="2.5",
        CONVERGERD_RENEW_DEADLINE_SECONDS="1.2",
        CONVERGERD_RETRY_PERIOD_SECONDS="0.2",
        CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS="0.5",
        **env,
    )


async def test_sigterm_releases_the_lease_after_refused_rounds(
    fleet: Fleet, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every round's record refused whole (a trigger on `rounds`): rounds go on, each dropped
    and counted; SIGTERM still ends with exit 0 and the Lease released (empty holder)."""
    await import_doc(database_url, FLEET_DOC)
    await sql(database_url,
              "CREATE FUNCTION test_no_rounds() RETURNS trigger LANGUAGE plpgsql "
              "AS $$ BEGIN RAISE EXCEPTION 'no rounds today'; END $$",
              "CREATE TRIGGER no_rounds BEFORE INSERT ON rounds "
              "FOR EACH ROW EXECUTE FUNCTION test_no_rounds()")
    settings = electing(fleet, database_url)
    async with running_daemon(settings) as (daemon, task):
        await wait_for(lambda: record_failures(daemon, "raised") >= 2,
                       what="two rounds refused")
        assert "not recorded, dropped" in caplog.text
        assert lease_holder(fleet, settings) == settings.election.identity
        daemon.stopping.set()  # what the SIGTERM handler does
        assert await asyncio.wait_for(task, 10) == 0
    assert lease_holder(fleet, settings) in (None, "")
    assert await sql(database_url, "SELECT * FROM rounds") == []


async def test_an_unexpected_way_out_still_releases_the_lease(
    fleet: Fleet, database_url: str
) -> None:
    """The daemon's main task cancelled mid-run (what a crash of a supervised task does to it):
    the Lease is released on the way out all the same, so a standby need not wait it out."""
    await import_doc(database_url, FLEET_DOC)
    settings = electing(fleet, database_url)
    daemon = Daemon(settings)
    task = asyncio.create_task(daemon.main())
    await wait_for(lambda: daemon.last_report is not None, what="a round as the leader")
    assert lease_holder(fleet, settings) == settings.election.identity
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert lease_holder(fleet, settings) in (None, "")


async def test_a_round_cut_by_sigterm_records_the_writes_it_made(
    fleet: Fleet, database_url: str
) -> None:
    """SIGTERM mid-round: the policies written on the slow cluster before the stop, and the
    clusters that finished, are recorded; the round itself is recorded as cut short."""
    await sigterm_mid_round(fleet, database_url)

    written = {name.removeprefix("policy-") for name in objects(fleet, C1)}
    assert 1 <= len(written) < 3
    rows = await deliveries(database_url)
    assert {p for c, p in rows if c == C1} == written
    assert {rows[C1, p]["last_result"] for p in written} == {"created"}
    for c in ("c0002", "c0003"):  # fast clusters finished before the stop
        assert {p for cl, p in rows if cl == c} == {"p-latest", "p-regs"}
    (round_row,) = await sql(database_url, "SELECT * FROM rounds")
    assert round_row["result"] == "failed"
    assert round_row["error"].startswith("fenced")
    assert {r["round_id"] for r in rows.values()} == {round_row["id"]}
    # c0001 did not finish: its state is not recorded as if it had.
    assert C1 not in await states(database_url)


async def test_a_nul_in_a_policy_status_neither_stops_nor_blocks_the_daemon(
    fleet: Fleet, database_url: str
) -> None:
    """The reported case: one Policy in one cluster reports a Ready condition whose message
    holds a NUL ("ok\\u0000"). Rounds go on being recorded (the message cleaned), and SIGTERM
    releases the Lease."""
    await import_doc(database_url, FLEET_DOC)
    settings = electing(fleet, database_url)
    async with running_daemon(settings) as (daemon, task):
        await wait_for(lambda: "policy-p-latest" in objects(fleet, C1), what="round 1")
        obj = objects(fleet, C1)["policy-p-latest"]
        obj["status"] = {"phase": "Enforcing", "conditions": [
            {"type": "Ready", "status": "True", "reason": "Installed", "message": "ok\x00"}]}
        fleet.store(C1).update(POLICIES, None, "policy-p-latest", obj, manager="operator",
                               subresource="status")

        async def message_recorded() -> bool:
            row = (await deliveries(database_url)).get((C1, "p-latest"))
            return row is not None and row["phase_message"] is not None

        await wait_for(message_recorded, what="the condition read back and recorded")
        # Cleaned where it entered (the cluster edge shows a replaced character as U+FFFD).
        assert (await deliveries(database_url))[C1, "p-latest"]["phase_message"] == "ok\ufffd"
        rounds_before = len(await sql(database_url, "SELECT id FROM rounds"))

        async def more_rounds() -> bool:
            return len(await sql(database_url, "SELECT id FROM rounds")) >= rounds_before + 2

        await wait_for(more_rounds, what="rounds recorded after it")
        daemon.stopping.set()
        assert await asyncio.wait_for(task, 10) == 0
    assert lease_holder(fleet, settings) in (None, "")
