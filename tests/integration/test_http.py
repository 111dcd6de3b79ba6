"""The HTTP server through aiohttp's test client: health, readiness, metrics, status views,
the token on mutating endpoints, and no secret in any response.

The database side is a small in-memory fake of the store (what the HTTP server and the status
sync read), returning the shared row types (the real `Store` is exercised at the end against
PostgreSQL). What the database recorded reaches `/status` through the status sync, never
through a GET."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.cli.status import StatusUnavailable, add_arguments, fetch_status
from convergerd.cli.status import run as run_status
from convergerd.config import Settings, StatusReadTuning, load_settings
from convergerd.core.errors import DatabaseUnavailable
from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId, PolicyRow
from convergerd.core.removal import Current, Target
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    RoundResult,
)
from convergerd.core.rollout import Rollout, Staged, Start
from convergerd.core.rows import (
    ClusterStateRow,
    ClusterStatusRows,
    DeliveryRow,
    PendingDeletions,
    PolicyStatusRows,
    RoundRow,
)
from convergerd.delivery.fanout import FanoutEnv, Saver
from convergerd.status.document import snapshot
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.status.sync import StatusSync
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck

STATUS_DB_CONCURRENCY = StatusReadTuning().db_concurrency

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
TOKEN = "canary-api-token-5e1d9c"
DB_PASSWORD = "CanaryDbPassword-77f3"
DSN = f"postgresql://convergerd:{DB_PASSWORD}@db.example:5432/policies"
Client = TestClient[web.Request, web.Application]


class NoPolicies:
    """The save side of the database, knowing no policy: a save or delete that gets past the
    token is answered by its handler (404) without reaching a cluster."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def save_target(self, policy_id: str, /) -> Target | None:
        self.asked.append(f"save {policy_id}")
        return None

    async def begin_deletion(self, policy_id: str, /) -> Target | None:
        self.asked.append(f"delete {policy_id}")
        return None

    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str], /) -> bool:
        raise AssertionError("no deletion begins here")

    async def record_deliveries(self, deliveries: Sequence[Delivery], /) -> None:
        raise AssertionError("nothing is delivered here")

    async def forget_deliveries(self, policy_id: str, clusters: Sequence[str], /) -> None:
        raise AssertionError("nothing is removed here")

    async def current(self, policy_ids: Sequence[PolicyId], /) -> dict[PolicyId, Current]:
        raise AssertionError("nothing is saved here")

    async def start_rollout(self, policy_id: str, revision: int, *, by: str,
                            already_delivered: bool, now: bool = False) -> Start:
        return Start()  # no rollout strategies here: every save goes everywhere at once

    async def staged_rollout(self, policy_id: str, /) -> Staged | None:
        return None


def _no_clusters() -> FanoutEnv:
    raise AssertionError("no save here reaches the clusters")


def saver(policies: NoPolicies | None = None) -> Saver:
    return Saver(store=policies or NoPolicies(), env=_no_clusters, guard_share=0.5)


class FakeStore:
    """What the leader recorded: c1 converged, c2 unreached; policy p1 on both."""

    def __init__(self) -> None:
        self.down = False
        self.calls: list[str] = []
        self.clusters = ("c1", "c2", "c3")
        self.policies = {"p1": PolicyRow("p1", "team-a", {"type": "ForbidLatestTag"}, True, 3)}
        self.scope = {"p1": frozenset({ClusterId("c1"), ClusterId("c2"), ClusterId("c3")})}
        self.deliveries = [
            DeliveryRow("p1", "c1", 3, ApplyResult.UPDATED, T0, T0, None, None, 0, 7,
                        PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", "Installed",
                                     "bound", 3, T0, verified_status="False",
                                     verified_reason="Admitted",
                                     verified_message="a pod was ADMITTED",
                                     verified_probed_at=T0 - dt.timedelta(seconds=20))),
            DeliveryRow("p1", "c2", 2, ApplyResult.FAILED, T0, T0 - dt.timedelta(hours=1),
                        "connect timeout", "unreachable", 1, 7,
                        PhaseReading(ClusterId("c2"), PolicyId("p1"), "Enforcing", None, None,
                                     2, T0 - dt.timedelta(hours=1))),
        ]

    def _check(self, call: str) -> None:
        self.calls.append(call)
        if self.down:
            # A careless driver message: the server must not pass the DSN on.
            raise DatabaseUnavailable(f"could not connect to {DSN}")

    async def ping(self) -> None:
        self._check("ping")

    async def last_round(self) -> RoundRow | None:
        self._check("last_round")
        return RoundRow(7, T0 - dt.timedelta(seconds=30), T0, RoundResult.PARTIAL,
                        Epoch("rep-leader", 2), "rep-leader",
                        {"clusters": 3, "converged": 1, "unreached": 1}, None)

    async def cluster_states(self) -> list[ClusterStateRow]:
        self._check("cluster_states")
        return [
            ClusterStateRow(ClusterId("c1"), True, T0, T0, T0, None, None, 1, 1, 0,
                            "v1.31.2", 7),
            ClusterStateRow(ClusterId("c2"), False, T0, None, None, "connect timeout",
                            "unreachable", 1, 0, 0, None, 7),
            ClusterStateRow(ClusterId("c3"), None, None, None, None, None, None, 0, 0, 0,
                            None, None),
        ]

    async def deliveries_for_clusters(self, cluster_ids: Sequence[str]) -> list[DeliveryRow]:
        self._check("deliveries_for_clusters")
        return [d for d in self.deliveries if d.cluster in cluster_ids]

    async def pending_deletions(self) -> PendingDeletions:
        self._check("pending_deletions")
        return PendingDeletions()

    async def recorded_invalid(self) -> list[InvalidPolicy]:
        self._check("recorded_invalid")
        return [InvalidPolicy("Bad", "team-a", 1, "id: 'Bad' is not a DNS label")]

    async def live_rollouts(self) -> list[Rollout]:
        self._check("live_rollouts")
        return []

    async def cluster_status(
        self, cluster_id: str, policies: Sequence[str]
    ) -> ClusterStatusRows:
        self._check("cluster_status")
        rows = tuple(d for d in self.deliveries if d.cluster == cluster_id)
        wanted = {*policies, *(d.policy for d in rows)}
        return ClusterStatusRows(
            known=cluster_id in self.clusters, deliveries=rows,
            current={PolicyId(p): self.policies[p].revision for p in wanted
                     if p in self.policies})

    async def policy_status(self, policy_id: str) -> PolicyStatusRows | None:
        self._check("policy_status")
        row = self.policies.get(policy_id)
        if row is None:
            return None
        return PolicyStatusRows(
            policy=row, invalid=None, scope=self.scope.get(policy_id, frozenset()),
            deliveries=tuple(d for d in self.deliveries if d.policy == policy_id))


def settings(**extra: str) -> Settings:
    env = {"CONVERGERD_DATABASE_URL": DSN, "CONVERGERD_API_TOKEN": TOKEN,
           "CONVERGERD_IDENTITY": "rep-standby", **extra}
    return load_settings(env)


class Now:
    def __init__(self) -> None:
        self.now = T0 + dt.timedelta(seconds=60)

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


@pytest.fixture
def state() -> StatusState:
    return StatusState(identity="rep-standby", interval_s=300, clock=Now())


@pytest.fixture
def sync(store: FakeStore, state: StatusState) -> StatusSync:
    """The status sync the daemon runs periodically; a test runs a pass when it wants one."""
    return StatusSync(store=store, state=state)


@pytest.fixture
def health() -> HealthCheck:
    return HealthCheck()


@pytest.fixture
def seen() -> list[str]:
    """Every response body and header served in the test, for the secrets check."""
    return []


async def _serve(app: web.Application, seen: list[str]) -> AsyncIterator[Client]:
    async def record(_: web.Request, response: web.StreamResponse) -> None:
        # Called just before a response goes out: after every middleware.
        seen.append(str(dict(response.headers)))
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            seen.append(response.body.decode(errors="replace"))

    app.on_response_prepare.append(record)
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.fixture
async def client(
    store: FakeStore, state: StatusState, health: HealthCheck, seen: list[str]
) -> AsyncIterator[Client]:
    app = make_app(metrics=Metrics(state=state), state=state,
                   store=store, settings=settings(), health=health, saver=saver())
    async for c in _serve(app, seen):
        yield c
    assert seen
    for text in seen:
        assert TOKEN not in text
        assert DB_PASSWORD not in text


# -- health ----------------------------------------------------------------------------------------


async def test_healthz_ok(client: Client) -> None:
    response = await client.get("/healthz")
    assert response.status == 200
    assert (await response.json())["ok"] is True


async def test_healthz_fails_when_the_heartbeat_is_stale(
    client: Client, health: HealthCheck
) -> None:
    health.last_beat -= 60  # as if the loop had been blocked for a minute
    response = await client.get("/healthz")
    assert response.status == 500
    assert "heartbeat" in (await response.json())["error"]


async def test_heartbeat_keeps_healthz_green_and_measures_lag() -> None:
    lags: list[float] = []
    health = HealthCheck(period_s=0.01, stale_after_s=0.5, on_lag=lags.append)
    task = asyncio.create_task(health.heartbeat(), name="heartbeat")
    await asyncio.sleep(0.05)
    assert lags
    assert health.problems() == []
    task.cancel()


async def test_healthz_names_a_dead_supervised_task(client: Client, health: HealthCheck) -> None:
    async def crash() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(crash(), name="prober")
    await asyncio.sleep(0)
    health.watch([task])
    response = await client.get("/healthz")
    assert response.status == 500
    assert "prober" in (await response.json())["error"]
    with pytest.raises(RuntimeError):
        task.result()


async def test_readyz(client: Client, store: FakeStore) -> None:
    assert (await client.get("/readyz")).status == 200
    store.down = True
    response = await client.get("/readyz")
    assert response.status == 503
    body = await response.json()
    assert body["reason"] == "database"
    assert "database unreachable" in body["error"]


async def test_readyz_names_every_failing_check_and_leaves_out_the_excluded_ones(
    client: Client, store: FakeStore, health: HealthCheck
) -> None:
    """What a restart would not fix fails readiness (the elector's checks, wired as the daemon
    wires them); `?exclude=` leaves a check out, as kube-apiserver's /readyz does."""
    failing: dict[str, str | None] = {"lease_unreachable": None, "lease_stalled": None}
    health.ready_check("lease_unreachable", lambda: failing["lease_unreachable"])
    health.ready_check("lease_stalled", lambda: failing["lease_stalled"])
    assert (await client.get("/readyz")).status == 200
    failing["lease_stalled"] = "leadership stalled: held by 'mallory'"
    failing["lease_unreachable"] = "leader election blocked: timed out"
    store.down = True
    response = await client.get("/readyz")
    assert response.status == 503
    body = await response.json()
    assert body["reason"] == "lease_unreachable"
    assert body["problems"] == ["leader election blocked: timed out",
                                "leadership stalled: held by 'mallory'"]
    assert (await client.get("/healthz")).status == 200  # alive: a restart would not help
    lease_left_out = await client.get("/readyz?exclude=lease_unreachable&exclude=lease_stalled")
    assert lease_left_out.status == 503
    assert (await lease_left_out.json())["reason"] == "database"
    everything = "/readyz?exclude=lease_unreachable&exclude=lease_stalled&exclude=database"
    assert (await client.get(everything)).status == 200
    store.down = False
    failing["lease_unreachable"] = None
    assert (await client.get("/readyz?exclude=lease_stalled")).status == 200


async def test_metrics_endpoint(client: Client, state: StatusState) -> None:
    state.set_clusters(["c1", "c2"])  # as the status sync does: the database's clusters
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    assert 'convergerd_cluster_lag_seconds{cluster="c1"}' in text
    assert "convergerd_event_loop_lag_seconds" in text


# -- status ----------------------------------------------------------------------------------------


async def test_status_on_a_standby_reads_the_database(
    client: Client, state: StatusState, sync: StatusSync
) -> None:
    state.set_leader(False, "rep-leader")
    assert await sync.once()
    response = await client.get("/status")
    assert response.status == 200
    doc = await response.json()
    assert doc["identity"] == "rep-standby"
    assert doc["leader"]["is_leader"] is False
    assert doc["leader"]["holder"] == "rep-leader"
    assert doc["last_round"]["result"] == "partial"
    assert doc["last_round"]["leader"] == "rep-leader"
    assert doc["database"]["reachable"] is True
    assert "***" in doc["database"]["url"]
    assert [c["id"] for c in doc["clusters"]] == ["c2", "c3", "c1"]  # worst first
    c2 = doc["clusters"][0]
    assert set(c2) >= {"id", "reachable", "lag_seconds", "desired", "in_sync", "failed",
                       "phases", "last_error", "server_version"}
    assert c2["reachable"] is False
    assert c2["last_error"] == "connect timeout"
    assert doc["clusters"][2]["lag_seconds"] == 60
    assert doc["invalid_policies"][0]["id"] == "Bad"


async def test_a_cluster_removed_from_the_database_leaves_status(
    client: Client, state: StatusState, sync: StatusSync
) -> None:
    """A standby knew c9 at start (or an old leader's round worked on it); it was deleted from
    the database since: /status and /v1/clusters/c9 no longer show it, lag growing forever."""
    state.set_clusters(["c1", "c9"])
    state.observe_probe("c9", reachable=False, error="connect timeout")
    assert (await client.get("/v1/clusters/c9")).status == 404  # the database knows better
    assert await sync.once()
    doc = await (await client.get("/status")).json()
    assert [c["id"] for c in doc["clusters"]] == ["c2", "c3", "c1"]
    assert (await client.get("/v1/clusters/c9")).status == 404


async def test_status_answers_from_memory_when_the_database_is_down(
    client: Client, store: FakeStore, state: StatusState, sync: StatusSync
) -> None:
    state.observe_round(RoundReport(
        started_at=T0, finished_at=T0, epoch=Epoch("rep-standby", 1),
        clusters=[ClusterOutcome(ClusterId("c1"), reached=True, desired=1, in_sync=1)]))
    store.down = True
    assert not await sync.once()
    response = await client.get("/status")
    assert response.status == 200
    doc = await response.json()
    assert doc["database"]["reachable"] is False
    assert [c["id"] for c in doc["clusters"]] == ["c1"]


async def test_cluster_view(client: Client, state: StatusState) -> None:
    live = PhaseReading(ClusterId("c1"), PolicyId("p9"), "Error", "CELInvalid", "bad", 1,
                        T0 + dt.timedelta(seconds=50))
    state.observe_round(RoundReport(
        started_at=T0, finished_at=T0 + dt.timedelta(seconds=50),
        clusters=[ClusterOutcome(ClusterId("c1"), reached=True, desired=1, in_sync=1,
                                 phases=[live], deliveries=[Delivery(
                                     ClusterId("c1"), PolicyId("p1"), 3, ApplyResult.UNCHANGED,
                                     T0 + dt.timedelta(seconds=50))])]))
    response = await client.get("/v1/clusters/c1")
    assert response.status == 200
    doc = await response.json()
    assert doc["cluster"]["id"] == "c1"
    policies = {p["id"]: p for p in doc["policies"]}
    p1 = policies["p1"]
    assert (p1["delivered_revision"], p1["current_revision"], p1["in_sync"]) == (3, 3, True)
    assert (p1["phase"], p1["stale"], p1["age_seconds"]) == ("Enforcing", False, 60)
    p9 = policies["p9"]  # in the cluster, no longer in the database
    assert (p9["in_database"], p9["phase"], p9["ready_reason"]) == (False, "Error", "CELInvalid")


async def test_unknown_cluster_is_404(client: Client) -> None:
    response = await client.get("/v1/clusters/nope")
    assert response.status == 404
    assert (await response.json())["error"] == "unknown cluster 'nope'"


async def test_policy_status(client: Client, state: StatusState) -> None:
    assert isinstance(state.clock, Now)
    state.clock.now = T0 + dt.timedelta(minutes=5)
    response = await client.get("/v1/policies/p1/status")
    assert response.status == 200
    doc = await response.json()
    assert doc["policy"]["revision"] == 3
    clusters = {c["cluster"]: c for c in doc["clusters"]}
    assert set(clusters) == {"c1", "c2", "c3"}
    c1, c2, c3 = clusters["c1"], clusters["c2"], clusters["c3"]
    assert (c1["in_scope"], c1["delivered_revision"], c1["in_sync"]) == (True, 3, True)
    assert (c1["phase"], c1["stale"]) == ("Enforcing", False)
    assert (c2["delivered_revision"], c2["current_revision"], c2["in_sync"]) == (2, 3, False)
    assert c2["last_error"] == "connect timeout"
    assert (c2["phase"], c2["stale"]) == ("Enforcing", True)  # 65 minutes old: stale
    assert c2["age_seconds"] == 3900
    assert (c3["in_scope"], c3["delivered_revision"], c3["phase"]) == (True, None, None)
    assert c1["verified"] == {"status": "False", "reason": "Admitted",
                              "message": "a pod was ADMITTED",
                              "probed_at": "2026-01-01T11:59:40Z", "since": None,
                              "verification": "admitted", "stale": False, "untrusted": None}
    assert (c2["verified"], c3["verified"]) == (None, None)


async def test_unknown_policy_is_404(client: Client) -> None:
    response = await client.get("/v1/policies/nope/status")
    assert response.status == 404
    assert (await response.json())["policy"] == "nope"


async def test_unknown_path_is_json_404(client: Client) -> None:
    response = await client.get("/v2/whatever")
    assert response.status == 404
    assert "error" in await response.json()


async def test_get_requests_only_read_and_ask_the_database_one_query_at_most(
    client: Client, store: FakeStore, state: StatusState
) -> None:
    """/status never asks the database; a cluster or policy view asks exactly one query; none of
    them changes what this replica keeps (the round and the sync own that)."""
    before = snapshot(state)
    assert (await client.get("/status")).status == 200
    assert store.calls == []
    assert (await client.get("/v1/clusters/c1")).status == 200
    assert store.calls == ["cluster_status"]
    assert (await client.get("/v1/policies/p1/status")).status == 200
    assert store.calls == ["cluster_status", "policy_status"]
    assert state.clusters == {}
    assert snapshot(state) == before


class SlowStore(FakeStore):
    """Every status read waits until released; counts how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most = 0

    async def _slow(self) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1

    async def cluster_status(
        self, cluster_id: str, policies: Sequence[str]
    ) -> ClusterStatusRows:
        await self._slow()
        return await super().cluster_status(cluster_id, policies)

    async def policy_status(self, policy_id: str) -> PolicyStatusRows | None:
        await self._slow()
        return await super().policy_status(policy_id)


async def test_status_reads_are_few_at_a_time_and_give_up_quickly(
    state: StatusState, health: HealthCheck, seen: list[str]
) -> None:
    """100 concurrent views hold at most STATUS_DB_CONCURRENCY database reads; a database that
    does not answer costs a request its short timeout (503 for a policy, the cluster from
    memory), not the rounds' connections."""
    slow = SlowStore()
    app = make_app(metrics=Metrics(state=state), state=state, store=slow,
                   settings=settings(CONVERGERD_STATUS_READS_PER_SECOND="100"),
                   health=health, status_db_timeout_s=0.3, saver=saver())
    state.observe_probe("c1", reachable=True)
    async for client in _serve(app, seen):
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(
            client.get("/v1/clusters/c1" if i % 2 else "/v1/policies/p1/status")
            for i in range(100)))
        took = asyncio.get_running_loop().time() - started
        assert slow.most == STATUS_DB_CONCURRENCY
        statuses = sorted({a.status for a in answers})
        assert statuses == [200, 503]  # the cluster from memory, the policy unavailable
        policy = await next(a for a in answers if a.status == 503).json()
        assert "did not answer within 0.3 s" in policy["error"]
        cluster = await next(a for a in answers if a.status == 200).json()
        assert cluster["database"]["reachable"] is False
        assert cluster["cluster"]["id"] == "c1"
        assert took < 10  # each waited its own 0.3 s, not 100 x 0.3 s one after another
        slow.release.set()
        assert (await client.get("/v1/policies/p1/status")).status == 200


async def test_status_reads_over_the_budget_are_shed_at_once_but_health_and_metrics_are_not(
    store: FakeStore, state: StatusState, health: HealthCheck, seen: list[str]
) -> None:
    """At 2 reads/s (bursts of 4) the 5th view in a burst is answered 429 with Retry-After,
    without a database query; health, readiness and metrics still answer; once the budget
    refills the views serve again."""
    metrics = Metrics(state=state)
    app = make_app(metrics=metrics, state=state, store=store, health=health,
                   settings=settings(CONVERGERD_STATUS_READS_PER_SECOND="2"), saver=saver())
    state.observe_probe("c1", reachable=True)
    async for client in _serve(app, seen):
        paths = ["/status", "/v1/clusters/c1", "/v1/policies/p1/status", "/status"]
        assert [(await client.get(p)).status for p in paths] == [200, 200, 200, 200]
        queries = len(store.calls)
        shed = [await client.get(p) for p in ("/v1/clusters/c1", "/v1/policies/p1/status",
                                              "/status")]
        assert [r.status for r in shed] == [429, 429, 429]
        assert len(store.calls) == queries  # shed before any database work
        assert shed[0].headers["Retry-After"] == "1"
        body = await shed[0].json()
        assert body["retry_after_seconds"] == 1
        assert "CONVERGERD_STATUS_READS_PER_SECOND" in body["error"]
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status == 200, path
        text = metrics.render().decode()
        assert 'convergerd_status_reads_shed_total{path="/v1/clusters/{id}"} 1.0' in text
        assert 'convergerd_status_reads_shed_total{path="/status"} 1.0' in text
        deadline = asyncio.get_running_loop().time() + 5  # refills at 2/s: one within 0.5 s
        while (status := (await client.get("/status")).status) == 429:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        assert status == 200


async def test_convergerd_status_waits_out_a_429(
    store: FakeStore, state: StatusState, health: HealthCheck, seen: list[str]
) -> None:
    """`convergerd status` against a daemon shedding status reads: it honours Retry-After and
    shows the status instead of failing; with no time left for the wait it says 429."""
    app = make_app(metrics=Metrics(state=state), state=state, store=store, health=health,
                   settings=settings(CONVERGERD_STATUS_READS_PER_SECOND="1"), saver=saver())
    async for client in _serve(app, seen):
        addr = str(client.make_url("")).rstrip("/")
        while (await client.get("/status")).status != 429:  # use up the burst
            pass
        doc = await asyncio.to_thread(fetch_status, addr, timeout_s=10)
        assert doc["identity"] == "rep-standby"
        while (await client.get("/status")).status != 429:
            pass
        with pytest.raises(StatusUnavailable, match="answered 429"):
            await asyncio.to_thread(fetch_status, addr, timeout_s=0.5)


async def test_convergerd_status_of_a_summarised_fleet_shows_the_worst_or_with_all_every_one(
    store: FakeStore, state: StatusState, health: HealthCheck, seen: list[str]
) -> None:
    """Past CONVERGERD_STATUS_MAX_CLUSTERS the daemon lists the worst clusters with the
    fleet's counts; `convergerd status` says so, and `--all` walks the pages to list all."""
    ids = [f"c{i:02d}" for i in range(12)]
    state.set_clusters(ids)
    for i, cluster in enumerate(ids):
        state.observe_probe(cluster, reachable=i not in (4, 9), at=T0)
    app = make_app(metrics=Metrics(state=state), state=state, store=store, health=health,
                   settings=settings(CONVERGERD_STATUS_MAX_CLUSTERS="5"), saver=saver())
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    async for client in _serve(app, seen):
        addr = str(client.make_url("")).rstrip("/")
        outputs = []
        for extra in ([], ["--all"]):
            out, err = io.StringIO(), io.StringIO()
            args = parser.parse_args(["--addr", addr, *extra])
            assert await asyncio.to_thread(run_status, args, out=out, err=err) == 0, err
            outputs.append(out.getvalue())
    worst, every = ({line.split()[0] for line in text.splitlines()
                     if re.match(r"c\d\d ", line)} for text in outputs)
    assert worst == {"c04", "c09", "c00", "c01", "c02"}  # the unreached first, then by id
    assert "12 clusters: 2 unreached" in outputs[0]
    assert "convergerd status --all" in outputs[0]
    assert every == set(ids)
    assert "12 clusters: 2 unreached, 0 reached but failing" in outputs[1]


# -- mutations -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/policies/p1/apply"), ("DELETE", "/v1/policies/p1")])
async def test_mutations_need_the_bearer_token(client: Client, method: str, path: str) -> None:
    assert (await client.request(method, path)).status == 401
    wrong = await client.request(method, path, headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401
    assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
    basic = await client.request(method, path, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status == 401
    right = await client.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status == 404  # the handler's answer: this database knows no policy p1
    assert "unknown policy" in (await right.json())["error"]


async def test_saves_reach_the_saver_only_after_auth(
    store: FakeStore, state: StatusState, health: HealthCheck, seen: list[str]
) -> None:
    policies = NoPolicies()
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings(),
                   health=health, saver=saver(policies))
    async for client in _serve(app, seen):
        assert (await client.post("/v1/policies/p1/apply")).status == 401
        assert (await client.delete("/v1/policies/p2")).status == 401
        assert policies.asked == []
        response = await client.post("/v1/policies/p1/apply",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status == 404
        response = await client.delete("/v1/policies/p2",
                                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status == 404
    assert policies.asked == ["save p1", "delete p2"]


async def test_mutations_disabled_without_a_token(
    store: FakeStore, state: StatusState, health: HealthCheck, seen: list[str]
) -> None:
    s = load_settings({"CONVERGERD_DATABASE_URL": DSN})
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=s,
                   health=health, saver=saver())
    async for client in _serve(app, seen):
        response = await client.delete("/v1/policies/p1", headers={"Authorization": "Bearer "})
        assert response.status == 503
        assert "CONVERGERD_API_TOKEN" in (await response.json())["error"]


async def test_no_secret_even_when_an_error_message_carries_one(
    client: Client, store: FakeStore, seen: list[str]
) -> None:
    store.down = True
    ready = await (await client.get("/readyz")).json()
    assert ready["error"].endswith("could not connect to ***")  # redacted on the way out
    for path in ("/readyz", "/status", "/v1/clusters/c1", "/v1/policies/p1/status", "/metrics",
                 "/healthz"):
        await client.get(path)
    await client.post("/v1/policies/p1/apply", headers={"Authorization": f"Bearer {TOKEN}x"})
    # (the fixture asserts neither the token nor the password was ever served)


# -- against the real store ------------------------------------------------------------------------


async def test_status_from_a_real_database(
    database_url: str, tmp_path: Path, seen: list[str]
) -> None:
    from convergerd.store.importer import import_file

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "clusters: [{id: c1}, {id: c2}]\n"
        "boundaries: [{id: team-a, clusters: [c1, c2]}]\n"
        "policies: [{id: p1, boundary: team-a, enabled: true, rule: {type: ForbidLatestTag}}]\n"
    )
    await import_file(database_url, fleet)
    real = await Store.connect(database_url)
    try:
        leader_report = RoundReport(
            started_at=T0, finished_at=T0 + dt.timedelta(seconds=2), epoch=Epoch("rep-a", 1),
            clusters=[
                ClusterOutcome(ClusterId("c1"), reached=True, desired=1, in_sync=1,
                               server_version="v1.29.1",
                               deliveries=[Delivery(ClusterId("c1"), PolicyId("p1"), 1,
                                                    ApplyResult.CREATED, T0)],
                               phases=[PhaseReading(ClusterId("c1"), PolicyId("p1"),
                                                    "Unsupported", "NoVAP", None, 1, T0)]),
                ClusterOutcome(ClusterId("c2"), reached=False, desired=1,
                               error="connect timeout", reason="unreachable"),
            ])
        await real.record_round(leader_report, identity="rep-a")
        standby = StatusState(identity="rep-b", interval_s=300, clock=Now())
        app = make_app(metrics=Metrics(state=standby), state=standby, store=real,
                       settings=settings(CONVERGERD_DATABASE_URL=database_url),
                       health=HealthCheck(), saver=saver())
        assert await StatusSync(store=real, state=standby).once()
        async for client in _serve(app, seen):
            doc = await (await client.get("/status")).json()
            assert doc["last_round"]["leader"] == "rep-a"
            assert [c["id"] for c in doc["clusters"]] == ["c2", "c1"]
            assert doc["clusters"][0]["last_error"] == "connect timeout"
            assert (await client.get("/readyz")).status == 200
            policy = await (await client.get("/v1/policies/p1/status")).json()
            by_cluster = {c["cluster"]: c for c in policy["clusters"]}
            assert by_cluster["c1"]["delivered_revision"] == 1
            assert by_cluster["c1"]["phase"] == "Unsupported"
            assert by_cluster["c2"]["in_scope"] is True
            view = await (await client.get("/v1/clusters/c1")).json()
            assert view["policies"][0]["id"] == "p1"
            assert doc["unsupported_by_version"] == {"v1.29.1": ["c1"]}
            assert doc["clusters"][1]["phases"] == {"Unsupported": 1}
    finally:
        await real.close()


async def test_policy_status_reports_an_invalid_row_as_the_database_holds_it_now(
    database_url: str, tmp_path: Path, seen: list[str]
) -> None:
    """A standby that never served /status, asked about rows module-policies wrote badly (a
    rule that is not a mapping, an unknown type) and about a row fixed since the last round."""
    from convergerd.store.importer import import_file

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "clusters: [{id: c1}]\n"
        "boundaries: [{id: team-a, clusters: [c1]}]\n"
        "policies: [{id: p1, boundary: team-a, rule: {type: ForbidLatestTag}}]\n"
    )
    await import_file(database_url, fleet)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            """INSERT INTO policies (id, boundary_id, rule) VALUES
               ('p-list', 'team-a', '["ForbidLatestTag"]'::jsonb),
               ('p-string', 'team-a', '"ForbidLatestTag"'::jsonb),
               ('p-type', 'team-a', '{"type": "NoSuchRule"}'::jsonb)""")
    finally:
        await conn.close()
    real = await Store.connect(database_url)
    try:
        standby = StatusState(identity="rep-b", interval_s=300, clock=Now())
        # What the last round found, before p1 was fixed (it is valid now).
        standby.set_invalid([("p1", "rule.type: unknown type 'Old'")])
        app = make_app(metrics=Metrics(state=standby), state=standby, store=real,
                       settings=settings(CONVERGERD_DATABASE_URL=database_url),
                       health=HealthCheck(), saver=saver())
        async for client in _serve(app, seen):
            for pid in ("p-list", "p-string", "p-type"):
                response = await client.get(f"/v1/policies/{pid}/status")
                assert response.status == 200, pid
                doc = await response.json()
                assert doc["policy"]["delivered_to_clusters"] is False, pid
                assert doc["policy"]["invalid"].startswith("rule"), (pid, doc["policy"])
            fixed = await (await client.get("/v1/policies/p1/status")).json()
            assert fixed["policy"]["invalid"] is None
    finally:
        await real.close()
