"""Saves on database notifications, against a real PostgreSQL (and the simulator): a change
written only to the database reaches the clusters without a round, once with two replicas
running; the listener reconnects after its backend is terminated, and says so; a flood of
notifications from another role writes a few log lines, is counted, and does not keep a
genuine notification from its save."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from convergerd.config import Settings
from convergerd.delivery.listener import CHANNEL, Listener
from convergerd.logthrottle import LogThrottle
from convergerd.runtime import Daemon
from convergerd.sim.fleet import HOME, Fleet
from convergerd.status.metrics import FanoutMetrics
from convergerd.store.notify import PgNotifications
from tests.integration.rounds_helpers import (
    FLEET_DOC,
    import_doc,
    objects,
    running_daemon,
    settings_for,
    sql,
    wait_for,
)

REGS = "policy-p-regs"  # team-a: c0001, c0002, c0003
NEW_REGS = ("UPDATE policies SET rule = '{\"type\": \"AllowedRegistries\", "
            "\"registries\": [\"registry.example.org\"]}' WHERE id = 'p-regs'")


@dataclass
class RecordingSaver:
    saved: list[str] = field(default_factory=list)

    async def save(self, policy_id: str, *, trigger: str) -> object:
        assert trigger == "notify"
        self.saved.append(policy_id)
        return None


def sample(metrics: FanoutMetrics, name: str, **labels: str) -> float:
    registry = CollectorRegistry()
    registry.register(metrics)
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@contextlib.asynccontextmanager
async def listening(
    database_url: str, saver: RecordingSaver, metrics: FanoutMetrics,
    known: frozenset[str] | None = None, throttle: LogThrottle | None = None,
) -> AsyncIterator[Listener]:
    listener = Listener(source=PgNotifications(database_url), saver=saver,
                        leading=lambda: True, observer=metrics,
                        known=lambda p: known is None or p in known, throttle=throttle)
    task = asyncio.create_task(listener.run(), name="listener under test")
    try:
        await wait_for(lambda: sample(metrics, "convergerd_notify_listener_connected") == 1,
                       what="the listener connected")
        yield listener
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_database_write_is_saved_and_bad_payloads_are_dropped(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await import_doc(database_url, FLEET_DOC)
    saver, metrics = RecordingSaver(), FanoutMetrics()
    async with listening(database_url, saver, metrics):
        hostile = "Bad\nid\x1b[31m" + "x" * 500
        await sql(database_url, "SELECT pg_notify($1, $2)", CHANNEL, hostile)
        await sql(database_url, NEW_REGS)
        await wait_for(lambda: saver.saved == ["p-regs"], what="the save of p-regs")
    assert sample(metrics, "convergerd_notifications_total", handling="invalid") == 1
    assert sample(metrics, "convergerd_notifications_total", handling="queued") == 1
    [line] = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "not a policy id" in r.getMessage()]
    assert "\n" not in line
    assert "\x1b" not in line
    assert len(line) < 250


async def test_the_listener_reconnects_after_its_backend_is_terminated(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="convergerd.delivery.listener")
    await import_doc(database_url, FLEET_DOC)
    saver, metrics = RecordingSaver(), FanoutMetrics()
    async with listening(database_url, saver, metrics):
        [row] = await sql(database_url, "SELECT count(pg_terminate_backend(pid)) AS n "
                          "FROM pg_stat_activity WHERE datname = current_database() "
                          "AND query LIKE 'LISTEN%'")
        assert row["n"] == 1
        await wait_for(
            lambda: sample(metrics, "convergerd_notify_listener_reconnects_total") == 1,
            what="the reconnection counted")
        assert sample(metrics, "convergerd_notify_listener_connected") == 1
        await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-latest'")
        await wait_for(lambda: saver.saved == ["p-latest"], what="a save after reconnecting")
    messages = [r.getMessage() for r in caplog.records]
    assert any("lost its connection" in m for m in messages)
    assert any("reconnected" in m for m in messages)


async def test_a_notify_flood_is_counted_logged_in_a_few_lines_and_spares_genuine_ones(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Any role that can connect can NOTIFY our channel: 50,000 invalid payloads and 60,000
    made-up ids from one connection, a genuine change written from another in the middle."""
    caplog.set_level(logging.INFO, logger="convergerd.delivery.listener")
    await import_doc(database_url, FLEET_DOC)
    known = frozenset(r["id"] for r in await sql(database_url, "SELECT id FROM policies"))
    saver, metrics = RecordingSaver(), FanoutMetrics()
    # The default burst of lines, in a window short enough to see its summary come.
    throttle = LogThrottle(logging.getLogger("convergerd.delivery.listener"), window_s=1.0)
    flood = ("SELECT count(pg_notify($1, $2 || g)) FROM generate_series(1, $3) AS g")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "convergerd.delivery.listener" and r.levelno >= logging.WARNING]

    def logged(key: str, marker: str) -> int:
        """The drops of `key` the log accounts for: its lines and its summaries' counts."""
        summaries = [re.fullmatch(rf"suppressed (\d+) similar lines \({key}\) .*", line)
                     for line in lines()]
        return (sum(marker in line for line in lines())
                + sum(int(m.group(1)) for m in summaries if m is not None))

    started = time.monotonic()
    async with listening(database_url, saver, metrics, known, throttle):
        await sql(database_url, flood, CHANNEL, "Bad\nid\x1b[31m", 50_000)
        await sql(database_url, flood, CHANNEL, "made-up-", 30_000)
        await sql(database_url, NEW_REGS)
        await sql(database_url, flood, CHANNEL, "also-made-up-", 30_000)
        await wait_for(lambda: "p-regs" in saver.saved, what="the genuine save of p-regs")
        await wait_for(lambda: sample(metrics, "convergerd_notifications_total",
                                      handling="unknown_overflow") > 59_000,
                       what="the whole flood counted")
        unknown = sample(metrics, "convergerd_notifications_total", handling="unknown_overflow")
        # Every drop is in the log, as a line or in a summary written when its window ended.
        await wait_for(lambda: logged("invalid", "is not a policy id") == 50_000
                       and logged("unknown_overflow", "not in the last round") == unknown,
                       what="every drop accounted for in the log")
    windows = (time.monotonic() - started) // throttle.window_s + 1
    assert sample(metrics, "convergerd_notifications_total", handling="invalid") == 50_000
    queued = sample(metrics, "convergerd_notifications_total", handling="queued")
    assert queued + unknown == 60_000 + 1  # every notification counted, the genuine one queued
    assert unknown > 59_000  # a few made-up ids waited at a time, the rest were dropped
    # Two reasons, each at most its burst and a summary per window.
    assert len(lines()) <= 2 * (throttle.burst + 1) * windows, lines()
    assert all("\n" not in line and "\x1b" not in line for line in lines())


# ---------------------------------------------------------------------------------------------
# Two replicas


def replica_settings(fleet: Fleet, database_url: str, identity: str) -> Settings:
    return settings_for(
        fleet.kubeconfig_path, database_url,
        CONVERGERD_LEADER_ELECTION="true",
        CONVERGERD_HOME_CONTEXT=HOME,
        CONVERGERD_IDENTITY=identity,
        CONVERGERD_LEASE_DURATION_SECONDS="4",
        CONVERGERD_RENEW_DEADLINE_SECONDS="2.5",
        CONVERGERD_RETRY_PERIOD_SECONDS="0.5",
        CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS="0.5",
        Policies__ConvergeIntervalMinutes="60",
    )


def leads(daemon: Daemon) -> bool:
    return daemon.metrics.registry.get_sample_value("convergerd_is_leader") == 1


def connected(daemon: Daemon) -> bool:
    return sample(daemon.fanout_metrics, "convergerd_notify_listener_connected") == 1


async def test_a_database_write_fans_out_once_with_two_replicas(
    fleet: Fleet, database_url: str
) -> None:
    await import_doc(database_url, FLEET_DOC)
    async with (
        running_daemon(replica_settings(fleet, database_url, "replica-a")) as (a, _),
        running_daemon(replica_settings(fleet, database_url, "replica-b")) as (b, _),
    ):
        await wait_for(lambda: leads(a) != leads(b), what="one leader")
        leader, standby = (a, b) if leads(a) else (b, a)
        await wait_for(lambda: leader.last_report is not None, what="the first round")
        first_round = leader.last_report
        await wait_for(lambda: connected(a) and connected(b), what="both listeners")
        since = max((r.seq for r in fleet.accounting.requests()), default=0)

        await sql(database_url, NEW_REGS)

        def delivered() -> bool:
            return all(objects(fleet, c).get(REGS, {}).get("spec", {}).get("revision") == 2
                       for c in ("c0001", "c0002", "c0003"))

        await wait_for(delivered, what="revision 2 on every cluster in scope")
        await wait_for(lambda: sample(standby.fanout_metrics, "convergerd_notifications_total",
                                      handling="standby") == 1,
                       what="the standby left the notification to the leader")
        await wait_for(lambda: sample(leader.fanout_metrics, "convergerd_saves_total",
                                      trigger="notify", result="ok") == 1,
                       what="the leader's save finished")
        assert leader.last_report is first_round  # no round delivered it
        assert sample(standby.fanout_metrics, "convergerd_saves_total",
                      trigger="notify", result="ok") == 0
        # A save of a new revision writes each cluster once, without reading it first.
        writes = [r for r in fleet.accounting.requests(after=since)
                  if r.method == "PATCH" and r.path.split("?")[0].endswith("/" + REGS)]
        assert sorted(r.cluster for r in writes) == ["c0001", "c0002", "c0003"]  # one fan-out
        assert all(f"({leader.identity})" in r.user_agent for r in writes)
