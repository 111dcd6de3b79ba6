"""What an admin sees of the fleet (docs/design.md, "Status and metrics"): the real `Daemon`,
run in-process
against the in-process simulator and a database of this test's own, read over HTTP the way
Prometheus, a dashboard and `convergerd status` read it.

Faults are injected in the simulator; the in-cluster operator (not part of these tests) is
emulated by writing `status` through the Policy objects' status subresource. Every wait polls a
condition; nothing sleeps "long enough". Rounds run every 1.2 s (phases are stale after 2.4 s)
and the reachability prober every 0.3 s, unless a test says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from convergerd.cli import status as statuscli
from convergerd.config import load_settings
from convergerd.runtime import Daemon
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import HOME, Fleet
from convergerd.sim.kubeconfig import KubeconfigEntry, write_kubeconfig
from convergerd.sim.resources import POLICIES
from convergerd.store.importer import apply_plan, parse_import
from tests.fixtures.fleet import free_port

C1, C2, C3 = "c0001", "c0002", "c0003"
POLICY_IDS = ("p-latest", "p-regs")
TENANTS: dict[str, Any] = {
    "clusters": [{"id": C1}, {"id": C2}, {"id": C3}],
    "boundaries": [{"id": "team-a", "clusters": [C1, C2, C3]}],
    "policies": [
        {"id": "p-latest", "boundary": "team-a", "rule": {"type": "ForbidLatestTag"}},
        {"id": "p-regs", "boundary": "team-a",
         "rule": {"type": "AllowedRegistries", "registries": ["registry.example.com"]}},
    ],
}
INTERVAL_MINUTES = "0.02"  # 1.2 s between rounds, deadline 0.96 s, phases stale after 2.4 s
PROBE_PERIOD_S = 0.3
API_TOKEN = "canary-api-token-0b7e4f2d9a"
DB_PASSWORD = "canary-db-password-58c1e3"
KUBE_TOKEN = "canary-kube-token-9d2a6b11f0"  # a working token (C1)
WRONG_KUBE_TOKEN = "canary-wrong-kube-token-4471ce"  # one the cluster refuses (C2)


# ---------------------------------------------------------------------------------------------
# Helpers


async def wait_for(
    condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 20.0, what: str
) -> float:
    """Poll `condition` until true; returns the seconds it took. Fails after `timeout_s`."""
    started = time.monotonic()
    while not await condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def import_tenants(database_url: str, doc: Mapping[str, Any] = TENANTS) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await apply_plan(conn, parse_import(doc))
    finally:
        await conn.close()


def with_password(dsn: str, password: str, *, form: str) -> str:
    """The DSN with a password, in its user info or as a `password=` query parameter (libpq
    and asyncpg take both). Trust auth on the test server ignores it, so the daemon still
    connects: the password is only there to be leaked, or not."""
    parts = urllib.parse.urlsplit(dsn)
    if form == "query":
        query = "&".join(q for q in (parts.query, f"password={password}") if q)
        return urllib.parse.urlunsplit(parts._replace(query=query))
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or "postgres"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def operator_sets_phase(fleet: Fleet, cluster: str, phase: str, reason: str) -> int:
    """Emulate the in-cluster operator: write `status` of every Policy in `cluster` through
    the status subresource, as the operator's own field manager. Returns how many."""
    store = fleet.store(cluster)
    items = store.list(POLICIES, None)["items"]
    for obj in items:
        obj["status"] = {
            "phase": phase,
            "observedGeneration": obj["metadata"].get("generation", 1),
            "conditions": [{
                "type": "Ready", "status": "True" if phase == "Enforcing" else "False",
                "reason": reason, "message": f"operator says {phase}",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        }
        store.update(POLICIES, None, obj["metadata"]["name"], obj,
                     manager="convergerd-operator", subresource="status")
    return len(items)


async def drop_database(server_dsn: str, database_url: str) -> None:
    """The database goes away under whoever is connected to it."""
    name = urllib.parse.urlsplit(database_url).path.lstrip("/")
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def policy_count(fleet: Fleet, cluster: str) -> int:
    return len(fleet.store(cluster).list(POLICIES, None)["items"])


@dataclass(frozen=True)
class Scrape:
    """One `/metrics` answer, parsed by Prometheus' own parser."""

    text: str
    samples: Sequence[tuple[str, Mapping[str, str], float]]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples = [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
        return cls(text, samples)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample with exactly these labels, or None when there is none."""
        for sample_name, sample_labels, value in self.samples:
            if sample_name == name and sample_labels == labels:
                return value
        return None

    def up(self, cluster: str) -> float | None:
        return self.value("convergerd_cluster_up", cluster=cluster)

    def lag(self, cluster: str) -> float:
        lag = self.value("convergerd_cluster_lag_seconds", cluster=cluster)
        assert lag is not None, f"no lag for {cluster}"
        return lag

    def failures(self, cluster: str, reason: str) -> float:
        return self.value("convergerd_apply_failures_total", cluster=cluster,
                          reason=reason) or 0.0

    def phase(self, cluster: str, phase: str) -> float | None:
        return self.value("convergerd_policy_phase", cluster=cluster, phase=phase)


@dataclass
class Running:
    """A daemon under test and an HTTP client for it."""

    daemon: Daemon
    task: asyncio.Task[int]
    base: str
    http: aiohttp.ClientSession
    bodies: list[str]  # every body read, for the secrets test

    async def request(
        self, method: str, path: str, headers: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        if self.task.done():
            raise AssertionError(f"the daemon stopped: {self.task.result()!r}")
        async with self.http.request(method, self.base + path, headers=headers) as resp:
            body = await resp.text()
        self.bodies.append(body)
        return resp.status, body

    async def json(self, path: str) -> dict[str, Any]:
        async with self.http.get(self.base + path) as resp:
            assert resp.status == 200, (path, resp.status, await resp.text())
            self.bodies.append(await resp.text())
            doc: dict[str, Any] = await resp.json()
        return doc

    async def scrape(self) -> Scrape:
        status, text = await self.request("GET", "/metrics")
        assert status == 200, text
        return Scrape.parse(text)

    async def status(self) -> dict[str, Any]:
        return await self.json("/status")

    async def cluster(self, cluster: str) -> dict[str, Any]:
        """That cluster's entry in `/status`."""
        for entry in (await self.status())["clusters"]:
            if entry["id"] == cluster:
                found: dict[str, Any] = entry
                return found
        raise AssertionError(f"{cluster} not in /status")

    async def status_command(self) -> str:
        """`convergerd status --addr ...` (blocking urllib: in a thread, the daemon runs on
        this loop)."""
        out, err = io.StringIO(), io.StringIO()
        args = argparse.Namespace(addr=self.base, timeout=10.0, json=False, all=False)
        code = await asyncio.to_thread(statuscli.run, args, out=out, err=err)
        assert code == statuscli.EXIT_OK, err.getvalue()
        self.bodies.append(out.getvalue())
        return out.getvalue()

    async def rounds(self) -> float:
        scrape = await self.scrape()
        return sum(scrape.value("convergerd_rounds_total", result=r) or 0.0
                   for r in ("ok", "partial", "failed"))


@contextlib.asynccontextmanager
async def running(
    fleet: Fleet,
    database_url: str,
    *,
    interval_minutes: str = INTERVAL_MINUTES,
    probe_period_s: float = PROBE_PERIOD_S,
    **env: str,
) -> AsyncIterator[Running]:
    """`convergerd run` in-process: leader election off, a free port, short timeouts. Stopped
    through its `stopping` event (what SIGTERM sets); it must exit 0."""
    port = free_port()
    settings = load_settings({
        "CONVERGERD_DATABASE_URL": database_url,
        "CONVERGERD_KUBECONFIG": str(fleet.kubeconfig_path),
        "CONVERGERD_LEADER_ELECTION": "false",
        "CONVERGERD_IDENTITY": "observability-test",
        "CONVERGERD_HTTP_ADDR": f"127.0.0.1:{port}",
        "CONVERGERD_REQUEST_TIMEOUT_SECONDS": "0.5",
        "CONVERGERD_CONNECT_TIMEOUT_SECONDS": "0.5",
        "CONVERGERD_CLUSTER_QPS": "1000",
        "CONVERGERD_CLUSTER_BURST": "1000",
        "Policies__ConvergeIntervalMinutes": interval_minutes,
        **env,
    })
    daemon = Daemon(settings, probe_period_s=probe_period_s)
    task = asyncio.create_task(daemon.main(), name="daemon under test")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
        run = Running(daemon, task, f"http://127.0.0.1:{port}", http, [])

        async def serving() -> bool:
            if task.done():
                raise AssertionError(f"the daemon stopped: {task.result()!r}")
            try:
                status, _ = await run.request("GET", "/healthz")
            except aiohttp.ClientConnectionError:
                return False
            return status == 200

        try:
            await wait_for(serving, what="the daemon's HTTP server")
            yield run
        finally:
            daemon.stopping.set()
            exit_code = await asyncio.wait_for(task, 30)
    assert exit_code == 0


async def first_round(run: Running) -> None:
    async def done() -> bool:
        return run.daemon.last_report is not None

    await wait_for(done, what="the first round")


# ---------------------------------------------------------------------------------------------
# 1. A cluster that is down


async def test_down_cluster_up_0_lag_growing_reason_and_worst_first(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    fleet.set_faults(C1, Faults(down=True))
    async with running(fleet, database_url) as run:

        async def settled() -> bool:
            m = await run.scrape()
            return (
                m.up(C1) == 0 and m.up(C2) == 1 and m.up(C3) == 1
                and m.value("convergerd_cluster_out_of_sync_policies", cluster=C2) == 0
                and m.value("convergerd_cluster_out_of_sync_policies", cluster=C3) == 0
                and m.failures(C1, "connect_error") >= 1
            )

        await wait_for(settled, what="c0001 down, the others in sync")
        before = await run.scrape()

        async def worse() -> bool:
            now = await run.scrape()
            return (now.lag(C1) > before.lag(C1) + 1.0
                    and now.failures(C1, "connect_error") > before.failures(C1, "connect_error"))

        # Lag is true at scrape time, and every round counts the failure again.
        await wait_for(worse, what="c0001's lag and failures to grow")
        after = await run.scrape()
        assert after.up(C1) == 0
        # The others converged: their lag is about the time since the last round, not since start.
        assert after.lag(C2) < after.lag(C1)
        assert after.lag(C3) < after.lag(C1)
        assert after.value("convergerd_cluster_last_success_timestamp_seconds", cluster=C1) is None
        assert after.value("convergerd_cluster_last_success_timestamp_seconds",
                           cluster=C2) is not None
        # Series pre-created at zero are the reasons that really occur (rate() sees the first).
        assert after.failures(C2, "connect_error") == 0
        assert after.value("convergerd_apply_failures_total", cluster=C2,
                           reason="connect_error") == 0

        assert after.value("convergerd_is_leader") == 1
        assert (after.value("convergerd_rounds_total", result="partial") or 0) >= 2

        doc = await run.status()
        assert doc["identity"] == "observability-test"
        assert doc["leader"]["is_leader"] is True
        assert doc["leader"]["holder"] == "observability-test"
        assert doc["last_round"]["result"] == "partial"
        assert doc["last_round"]["counts"]["unreached"] == 1
        assert doc["next_round_at"] is not None
        ids = [c["id"] for c in doc["clusters"]]
        assert ids[0] == C1, ids
        down = doc["clusters"][0]
        assert down["reachable"] is False
        assert down["last_error"] in ("connection reset", "connection refused"), down
        assert down["last_success_at"] is None
        assert down["lag_seconds"] > 1.0
        for entry in doc["clusters"][1:]:
            assert entry["reachable"] is True, entry
            assert entry["desired"] == entry["in_sync"] == 2, entry
            assert entry["failed"] == 0, entry
            assert entry["last_error"] is None, entry

        table = await run.status_command()
        rows = [line for line in table.splitlines() if line.startswith("c0")]
        assert rows[0].split()[0] == C1, table
        assert rows[0].split()[1] == "DOWN", table
        assert "connection re" in rows[0], table
        assert all(r.split()[1] == "up" for r in rows[1:]), table
        assert "3 clusters: 1 unreached" in table

        # It comes back: the next round converges it and its lag drops to about nothing.
        fleet.clear_faults(C1)

        async def recovered() -> bool:
            m = await run.scrape()
            return m.up(C1) == 1 and m.lag(C1) < 1.5 and m.value(
                "convergerd_cluster_last_success_timestamp_seconds", cluster=C1) is not None

        await wait_for(recovered, what="c0001 converged once it answers again")
        entry = await run.cluster(C1)
        assert entry["reachable"] is True
        assert entry["last_error"] is None
        assert entry["in_sync"] == 2


# ---------------------------------------------------------------------------------------------
# 2. A cluster that stops answering between rounds


@pytest.mark.parametrize("fault", [Faults(hang=True), Faults(down=True)], ids=["hang", "down"])
async def test_cluster_that_stops_answering_is_up_0_before_the_next_round(
    fleet: Fleet, database_url: str, fault: Faults
) -> None:
    await import_tenants(database_url)
    # Five minutes between rounds: nothing but the prober can notice within this test.
    async with running(fleet, database_url, interval_minutes="5") as run:
        await first_round(run)

        async def up_after_round() -> bool:
            return (await run.scrape()).up(C2) == 1

        await wait_for(up_after_round, what="c0002 up after the first round")
        rounds = await run.rounds()

        fleet.set_faults(C2, fault)

        async def noticed() -> bool:
            return (await run.scrape()).up(C2) == 0

        took = await wait_for(noticed, timeout_s=30, what="c0002 up 0 after it stopped answering")
        how = "hangs" if fault.hang else "resets connections"
        print(f"\nc0002 {how}: convergerd_cluster_up 0 after {took:.2f} s "  # noqa: T201
              f"(prober period {PROBE_PERIOD_S} s, request timeout 0.5 s)")
        assert took < 30  # the product requirement (default period 10 s + timeout 5 s)
        assert await run.rounds() == rounds  # no round ran: the prober noticed
        # Lag is true at scrape time without rounds too: it keeps growing between scrapes.
        lag = (await run.scrape()).lag(C2)

        async def lag_grows() -> bool:
            return (await run.scrape()).lag(C2) > lag + 0.2

        await wait_for(lag_grows, what="c0002's lag to grow between rounds")

        entry = await run.cluster(C2)
        assert entry["reachable"] is False
        expected = "no answer within" if fault.hang else "connection re"
        assert expected in (entry["last_error"] or ""), entry
        assert (await run.status())["clusters"][0]["id"] == C2
        assert (await run.scrape()).up(C1) == 1

        fleet.clear_faults(C2)
        await wait_for(up_after_round, what="c0002 up again once it answers")
        assert (await run.cluster(C2))["reachable"] is True


# ---------------------------------------------------------------------------------------------
# 3. Phases read back: a 1.29 cluster is Unsupported


async def test_unsupported_cluster_counted_rolled_up_by_version_and_shown_per_policy(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    fleet.set_faults(C3, Faults(version="v1.29.4"))
    async with running(fleet, database_url) as run:

        async def delivered() -> bool:
            return all(policy_count(fleet, c) == 2 for c in (C1, C2, C3))

        await wait_for(delivered, what="both policies in every cluster")
        assert operator_sets_phase(fleet, C3, "Unsupported", "NoValidatingAdmissionPolicy") == 2
        assert operator_sets_phase(fleet, C2, "Enforcing", "Installed") == 2

        async def read_back() -> bool:
            m = await run.scrape()
            return m.phase(C3, "Unsupported") == 2 and m.phase(C2, "Enforcing") == 2

        await wait_for(read_back, what="the phases read back by a round")
        m = await run.scrape()
        # C1 has no status yet (no operator there): Unknown, never a guess.
        assert m.phase(C1, "Unknown") == 2
        assert m.phase(C1, "Enforcing") == 0
        assert m.phase(C3, "Enforcing") == 0
        assert m.phase(C2, "Unsupported") == 0
        assert m.value("convergerd_unsupported_clusters", version="v1.29.4") == 1
        assert m.value("convergerd_cluster_server_info", cluster=C3, version="v1.29.4") == 1

        doc = await run.status()
        assert doc["unsupported_by_version"] == {"v1.29.4": [C3]}
        by_id = {c["id"]: c for c in doc["clusters"]}
        assert by_id[C3]["phases"] == {"Unsupported": 2}
        assert by_id[C2]["phases"] == {"Enforcing": 2}
        assert by_id[C3]["server_version"] == "v1.29.4"

        policy = await run.json("/v1/policies/p-regs/status")
        phases = {c["cluster"]: c for c in policy["clusters"]}
        assert set(phases) == {C1, C2, C3}
        assert phases[C3]["phase"] == "Unsupported"
        assert phases[C3]["stale"] is False
        assert phases[C3]["ready_reason"] == "NoValidatingAdmissionPolicy"
        assert phases[C2]["phase"] == "Enforcing"
        assert phases[C2]["ready_reason"] == "Installed"
        assert phases[C1]["phase"] == "Unknown"
        for entry in phases.values():
            assert entry["in_scope"] is True
            assert entry["delivered_revision"] == entry["current_revision"] == 1, entry

        status, _ = await run.request("GET", "/v1/policies/no-such-policy/status")
        assert status == 404
        status, _ = await run.request("GET", "/v1/clusters/no-such-cluster")
        assert status == 404

        table = await run.status_command()
        assert "Kubernetes v1.29.4: c0003" in table, table
        assert "Unsupported=2" in table, table


# ---------------------------------------------------------------------------------------------
# 4 and 5. Reached but refused: CRD missing, read-only token


async def test_missing_crd_and_read_only_token_are_readable_cluster_level_reasons(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    fleet.set_faults(C1, Faults(crd=False))
    fleet.set_faults(C2, Faults(read_only=True))
    async with running(fleet, database_url) as run:

        async def failed_twice() -> bool:
            m = await run.scrape()
            return m.failures(C1, "crd_missing") >= 2 and m.failures(C2, "forbidden") >= 2

        await wait_for(failed_twice, what="two rounds refused by c0001 and c0002")
        m = await run.scrape()
        # Reached (the API server answered), but not converged and never has been.
        assert m.up(C1) == 1
        assert m.up(C2) == 1
        assert m.up(C3) == 1
        for cluster in (C1, C2):
            assert m.value("convergerd_cluster_out_of_sync_policies", cluster=cluster) == 2
            assert m.value("convergerd_cluster_last_success_timestamp_seconds",
                           cluster=cluster) is None
        assert m.value("convergerd_cluster_out_of_sync_policies", cluster=C3) == 0
        assert m.failures(C3, "crd_missing") == m.failures(C3, "forbidden") == 0

        doc = await run.status()
        by_id = {c["id"]: c for c in doc["clusters"]}
        crd = by_id[C1]
        assert crd["reachable"] is True
        assert crd["last_error"] == "CRD policies.platform.stackship.se not installed"
        assert crd["last_reason"] == "crd_missing"
        assert crd["in_sync"] == 0
        assert crd["desired"] == 2
        ro = by_id[C2]
        assert ro["reachable"] is True
        assert ro["last_error"].startswith("403 Forbidden"), ro
        assert ro["last_reason"] == "forbidden"
        # Cluster-level: the cluster's work stopped at the refusal, not one failure per policy.
        assert ro["in_sync"] == 0
        assert [c["id"] for c in doc["clusters"]][2] == C3  # failing ones first

        table = await run.status_command()
        assert "CRD policies.platform.stackship.se not installed" in table, table
        assert "403 Forbidden" in table, table
        assert "2 reached but failing" in table, table


# ---------------------------------------------------------------------------------------------
# 6. Phases go stale when a cluster stops answering


async def test_phases_become_stale_when_a_cluster_stops_answering(
    fleet: Fleet, database_url: str
) -> None:
    await import_tenants(database_url)
    async with running(fleet, database_url) as run:

        async def delivered() -> bool:
            return policy_count(fleet, C1) == 2

        await wait_for(delivered, what="the policies in c0001")
        operator_sets_phase(fleet, C1, "Enforcing", "Installed")

        async def fresh() -> bool:
            view = await run.json(f"/v1/clusters/{C1}")
            return all(p["phase"] == "Enforcing" and p["stale"] is False
                       for p in view["policies"]) and len(view["policies"]) == 2

        await wait_for(fresh, what="Enforcing read back from c0001")
        fleet.set_faults(C1, Faults(down=True))
        stale_after = (await run.status())["stale_after_seconds"]
        assert stale_after == pytest.approx(2.4)

        async def stale() -> bool:
            view = await run.json(f"/v1/clusters/{C1}")
            return all(p["stale"] for p in view["policies"])

        await wait_for(stale, what="c0001's phases to go stale")
        view = await run.json(f"/v1/clusters/{C1}")
        assert view["cluster"]["reachable"] is False
        for p in view["policies"]:
            assert p["phase"] == "Enforcing", p  # the last known phase, flagged, with its age
            assert p["age_seconds"] > stale_after, p
            assert p["seen_at"] is not None
        m = await run.scrape()
        assert m.phase(C1, "Stale") == 2
        assert m.phase(C1, "Enforcing") == 0
        assert (await run.cluster(C1))["phases"] == {"Stale": 2}
        policy = await run.json("/v1/policies/p-latest/status")
        on_c1 = next(c for c in policy["clusters"] if c["cluster"] == C1)
        assert on_c1["phase"] == "Enforcing"
        assert on_c1["stale"] is True
        assert on_c1["cluster_reachable"] is False
        # A cluster that answers keeps fresh (Unknown: no operator there) readings.
        assert m.phase(C2, "Stale") == 0
        assert m.phase(C2, "Unknown") == 2


# ---------------------------------------------------------------------------------------------
# 7. No secret anywhere


def _rewrite_kubeconfig(fleet: Fleet, tokens: Mapping[str, str]) -> None:
    """The fleet's kubeconfig with some clusters' tokens replaced."""
    entries = [
        KubeconfigEntry(name=c.id, server=c.base_url, ca_pem=c.listener.ca.cert_pem,
                        token=tokens.get(c.id, c.token))
        for c in fleet.clusters.values()
    ]
    write_kubeconfig(fleet.kubeconfig_path, entries, current=HOME)


def _log_texts(records: Sequence[logging.LogRecord]) -> list[str]:
    """Everything a log handler could write: message, arguments, extra fields, traceback."""
    texts = []
    for record in records:
        texts.append(record.getMessage())
        texts.append(repr({k: v for k, v in vars(record).items() if k != "msg"}))
        if record.exc_info and record.exc_info[1] is not None:
            texts.append(logging.Formatter().formatException(record.exc_info))
    return texts


@pytest.mark.parametrize("dsn_form", ["userinfo", "query"])
async def test_no_secret_in_logs_status_metrics_or_errors(
    fleet: Fleet, database_url: str, postgres_server_dsn: str, caplog: pytest.LogCaptureFixture,
    dsn_form: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    await import_tenants(database_url)
    # C1's token is a canary that works; C2's kubeconfig holds a canary the cluster refuses.
    fleet.cluster(C1).token = KUBE_TOKEN
    _rewrite_kubeconfig(fleet, {C1: KUBE_TOKEN, C2: WRONG_KUBE_TOKEN})
    secrets = [API_TOKEN, DB_PASSWORD, KUBE_TOKEN, WRONG_KUBE_TOKEN,
               *(c.token for c in fleet.clusters.values())]
    dsn = with_password(database_url, DB_PASSWORD, form=dsn_form)
    async with running(fleet, database_url=dsn, CONVERGERD_API_TOKEN=API_TOKEN,
                       CONVERGERD_LOG_LEVEL="DEBUG") as run:

        async def refused_twice() -> bool:
            m = await run.scrape()
            return m.failures(C2, "unauthorized") >= 2 and m.up(C1) == 1

        await wait_for(refused_twice, what="two rounds refused by c0002 (wrong token)")
        entry = await run.cluster(C2)
        assert entry["reachable"] is True
        assert entry["last_error"].startswith("401 Unauthorized"), entry
        assert (await run.cluster(C1))["in_sync"] == 2  # the canary token itself works

        for path in ("/status", "/metrics", "/healthz", "/readyz", f"/v1/clusters/{C1}",
                     f"/v1/clusters/{C2}", "/v1/policies/p-latest/status",
                     "/v1/policies/nope/status"):
            await run.request("GET", path)
        for method in ("POST", "DELETE"):
            path = "/v1/policies/p-latest/apply" if method == "POST" else "/v1/policies/p-latest"
            await run.request(method, path)
            await run.request(method, path, headers={"Authorization": f"Bearer {API_TOKEN}x"})
        await run.status_command()
        report = run.daemon.last_report
        round_errors = [c.error or "" for c in report.clusters] if report else []

        # Database errors name the database: redacted, in logs, /readyz, /status and rounds.
        await drop_database(postgres_server_dsn, database_url)

        async def db_errors_everywhere() -> bool:
            ready, _ = await run.request("GET", "/readyz")
            await run.request("GET", "/status")
            return ready == 503 and "could not record round" in caplog.text

        await wait_for(db_errors_everywhere, what="the database errors")
        await run.status_command()
        if run.daemon.last_report is not None and run.daemon.last_report.error:
            round_errors.append(run.daemon.last_report.error)

    texts = {
        "logs": "\n".join(_log_texts(caplog.records)),
        "responses": "\n".join(run.bodies),
        "round errors": "\n".join(round_errors),
    }
    assert "401 Unauthorized" in texts["round errors"]
    assert caplog.records, "nothing logged?"
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret ({secret[:8]}...) appears in the {where}"
    assert "***" in texts["responses"]  # the redacted DSN is shown in /status
    # Not even the HTTP server's last line of defence had to redact anything.
    assert "a secret was about to be sent" not in texts["logs"]


# ---------------------------------------------------------------------------------------------
# 8. Health, readiness and the token on mutating endpoints


async def test_health_readiness_and_token_on_mutating_endpoints(
    fleet: Fleet, database_url: str, postgres_server_dsn: str
) -> None:
    await import_tenants(database_url)
    async with running(fleet, database_url, CONVERGERD_API_TOKEN=API_TOKEN) as run:
        await first_round(run)
        assert (await run.request("GET", "/healthz"))[0] == 200
        status, body = await run.request("GET", "/readyz")
        assert status == 200, body

        for method, path in (("POST", "/v1/policies/p-latest/apply"),
                             ("DELETE", "/v1/policies/p-latest")):
            assert (await run.request(method, path))[0] == 401
            wrong = {"Authorization": "Bearer not-the-token"}
            assert (await run.request(method, path, headers=wrong))[0] == 401
            right = {"Authorization": f"Bearer {API_TOKEN}"}
            assert (await run.request(method, path, headers=right))[0] != 401

        await drop_database(postgres_server_dsn, database_url)

        async def unready() -> bool:
            return (await run.request("GET", "/readyz"))[0] == 503

        await wait_for(unready, what="/readyz 503 with the database gone")
        status, body = await run.request("GET", "/readyz")
        assert "database" in body, body
        # Alive all the same: liveness is the loop, not the database.
        assert (await run.request("GET", "/healthz"))[0] == 200
        # /status shows the database as of the last status sync (one per round interval).
        async def shown_unreachable() -> bool:
            return (await run.status())["database"]["reachable"] is False

        await wait_for(shown_unreachable, what="/status showing the database unreachable")
        doc = await run.status()
        assert doc["database"]["reachable"] is False
        assert doc["database"]["error"]
