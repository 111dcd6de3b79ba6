"""Converge rounds end to end: a real PostgreSQL, the fleet simulator, and the round wired as
the daemon wires it (`rounds.round_env`: ClusterRegistry on the fleet's kubeconfig,
`call_with_retries`, the fence, the settings' limits; recorded by `Store.record_round`).

Covers issue 3's Tests: first round, in-sync round, drift, scope narrowed, control-plane rules,
invalid rows, every error class (docs/design.md, "Errors from a cluster"), down/hung clusters,
database down, `once` exit codes.
Timeouts are short and real (the simulator does real network I/O); waits are on conditions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from convergerd.core.errors import DatabaseUnavailable
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import ApplyResult, ClusterOutcome, RoundReport, RoundResult
from convergerd.retry import MAX_ATTEMPTS
from convergerd.runtime import Daemon
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES
from convergerd.sim.status import field_error, invalid_object
from convergerd.sim.store import AdmissionRequest
from convergerd.status.document import snapshot
from convergerd.status.views import record_view
from convergerd.store.store import Store
from tests.fixtures.fleet import kube_http
from tests.integration.rounds_helpers import (
    DESIRED,
    FLEET_DOC,
    Rounds,
    TcpProxy,
    import_doc,
    objects,
    running_daemon,
    settings_for,
    sigterm_mid_round,
    sql,
    wait_for,
    writes,
)

C1, C2, C3 = ClusterId("c0001"), ClusterId("c0002"), ClusterId("c0003")
MERGE_PATCH = "application/merge-patch+json"


def outcome(report: RoundReport, cluster: str) -> ClusterOutcome:
    return next(c for c in report.clusters if c.cluster == cluster)


def results(o: ClusterOutcome) -> dict[str, ApplyResult]:
    return {d.policy: d.result for d in o.deliveries}


def requests_to(fleet: Fleet, cluster: str) -> list[tuple[str, str, int]]:
    return [(r.verb, r.path, r.status) for r in fleet.accounting.requests(cluster=cluster)]


# --- the happy path -------------------------------------------------------------------------


async def test_first_round_creates_everything_and_records_it(
    rounds: Rounds, fleet: Fleet, store: Store
) -> None:
    report = await rounds.run()

    assert report.result is RoundResult.OK
    assert report.counts()["created"] == 7
    for cluster, names in DESIRED.items():
        assert set(objects(fleet, cluster)) == names, cluster
        assert outcome(report, cluster).converged

    obj = objects(fleet, C2)["policy-p-regs"]
    assert obj["apiVersion"] == "platform.stackship.se/v1alpha1"
    assert obj["kind"] == "Policy"
    assert obj["metadata"]["labels"] == {
        "platform.stackship.se/boundary": "team-a",
        "app.kubernetes.io/managed-by": "convergerd",
    }
    assert obj["spec"] == {
        "policyId": "p-regs", "boundary": "team-a", "enabled": True, "revision": 1,
        "rule": {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
    }
    assert "status" not in obj  # written only by the in-cluster operator
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert managers == {("stackship-platform", "Apply")}
    # Written as the platform: the requests carry convergerd's User-Agent.
    patches = fleet.accounting.requests(cluster=C2, verb="patch")
    assert patches
    assert all(r.user_agent.startswith("convergerd/") for r in patches)

    rows = await store.deliveries_for_policy("p-regs")
    assert [(r.cluster, r.delivered_revision, r.last_result, r.last_error) for r in rows] == [
        (c, 1, ApplyResult.CREATED, None) for c in (C1, C2, C3)
    ]
    assert all(r.last_success_at is not None for r in rows)
    states = {s.cluster: s for s in await store.cluster_states()}
    assert {c: (s.reachable, s.desired, s.in_sync, s.failed) for c, s in states.items()} == {
        C1: (True, 3, 3, 0), C2: (True, 2, 2, 0), C3: (True, 2, 2, 0),
    }
    last = await store.last_round()
    assert last is not None
    assert last.result is RoundResult.OK
    assert last.counts["created"] == 7


async def test_round_in_sync_makes_no_writes_and_one_list_per_cluster(
    rounds: Rounds, fleet: Fleet, store: Store
) -> None:
    await rounds.run()
    fleet.accounting.reset()

    report = await rounds.run()

    assert report.result is RoundResult.OK
    counts = report.counts()
    assert (counts["created"], counts["updated"], counts["failed"]) == (0, 0, 0)
    for cluster in DESIRED:
        stats = fleet.accounting.counts(cluster)
        assert stats["list"] == 1, (cluster, stats)
        assert stats["total"] == 1, (cluster, stats)  # no discovery, no gets, no writes
        assert writes(fleet, cluster) == 0
        assert set(results(outcome(report, cluster)).values()) == {ApplyResult.UNCHANGED}
    rows = await store.deliveries_for_cluster(C1)
    assert {r.last_result for r in rows} == {ApplyResult.UNCHANGED}
    assert {r.delivered_revision for r in rows} == {1}


async def test_drift_is_corrected_next_round(rounds: Rounds, fleet: Fleet) -> None:
    await rounds.run()
    # Someone edits one object with another field manager and deletes another.
    fleet.store(C2).patch(
        POLICIES, None, "policy-p-regs",
        json.dumps({"spec": {"rule": {"registries": ["evil.example.com"]}}}).encode(),
        content_type=MERGE_PATCH, manager="kubectl-edit", force=None,
    )
    fleet.store(C3).delete(POLICIES, None, "policy-p-latest")
    assert "policy-p-latest" not in objects(fleet, C3)
    fleet.accounting.reset()

    report = await rounds.run()

    assert report.result is RoundResult.OK
    assert results(outcome(report, C2))["p-regs"] is ApplyResult.UPDATED
    assert results(outcome(report, C3))["p-latest"] is ApplyResult.CREATED
    restored = objects(fleet, C2)["policy-p-regs"]
    assert restored["spec"]["rule"]["registries"] == ["registry.example.com"]
    assert objects(fleet, C3)["policy-p-latest"]["spec"]["policyId"] == "p-latest"
    # Only the drifted objects were written.
    assert (writes(fleet, C1), writes(fleet, C2), writes(fleet, C3)) == (0, 1, 1)


async def test_policy_moved_out_of_a_cluster_stays_there(
    rounds: Rounds, fleet: Fleet, database_url: str
) -> None:
    await rounds.run()
    before = objects(fleet, C1)["policy-p-labels"]
    # p-labels moves from team-b (c0001) to team-c (c0002, c0003).
    await import_doc(database_url, {
        "boundaries": [{"id": "team-c", "clusters": ["c0002", "c0003"]}],
        "policies": [{"id": "p-labels", "boundary": "team-c",
                      "rule": {"type": "RequiredLabels", "labels": ["app", "team"]}}],
    })
    fleet.accounting.reset()

    report = await rounds.run()

    assert report.result is RoundResult.OK
    # Never deleted from the cluster the boundary no longer covers, nor rewritten there.
    assert objects(fleet, C1)["policy-p-labels"] == before
    assert writes(fleet, C1) == 0
    assert all(fleet.accounting.counts(c)["delete"] == 0 for c in DESIRED)
    for cluster in (C2, C3):
        moved = objects(fleet, cluster)["policy-p-labels"]
        assert moved["metadata"]["labels"]["platform.stackship.se/boundary"] == "team-c"
        assert moved["spec"]["boundary"] == "team-c"
        assert moved["spec"]["revision"] == 2
        assert results(outcome(report, cluster))["p-labels"] is ApplyResult.CREATED


async def test_allowed_compute_plans_never_reaches_a_cluster(
    rounds: Rounds, fleet: Fleet, store: Store
) -> None:
    await rounds.run()
    await rounds.run()

    for cluster in fleet.clusters:  # home included
        for obj in objects(fleet, cluster).values():
            assert obj["spec"]["rule"]["type"] != "AllowedComputePlans", cluster
        assert "policy-p-plans" not in objects(fleet, cluster)
    assert not any("p-plans" in r.path for r in fleet.accounting.requests())
    assert await store.deliveries_for_policy("p-plans") == []
    assert "p-plans" not in {i.id for i in await store.invalid_policies()}  # not invalid either


async def test_invalid_rows_are_reported_and_the_rest_converge(
    rounds: Rounds, fleet: Fleet, store: Store, database_url: str
) -> None:
    # Rows as module-policies might write them, bypassing `convergerd import`'s checks.
    await sql(
        database_url,
        """INSERT INTO policies (id, boundary_id, rule) VALUES
           ('Bad_Id', 'team-a', '{"type": "ForbidLatestTag"}'),
           ('p-unknown', 'team-a', '{"type": "DenyEverything"}'),
           ('p-malformed', 'team-a',
            '{"type": "AllowedRegistries", "registries": "registry.example.com"}')""",
    )

    report = await rounds.run()

    assert report.result is RoundResult.OK
    assert report.counts()["created"] == 7
    reasons = {i.id: i.reason for i in report.invalid}
    assert set(reasons) == {"Bad_Id", "p-unknown", "p-malformed"}
    assert "not a DNS label" in reasons["Bad_Id"]
    assert reasons["p-unknown"].startswith("rule.type: unknown type 'DenyEverything'")
    assert reasons["p-malformed"].startswith("rule.registries: AllowedRegistries needs a")
    assert {i.id: i.reason for i in await store.invalid_policies()} == reasons
    recorded = await sql(database_url, "SELECT policy_id, reason FROM invalid_policies")
    assert {r["policy_id"]: r["reason"] for r in recorded} == reasons
    for cluster, names in DESIRED.items():
        assert set(objects(fleet, cluster)) == names
    paths = [r.path.lower() for r in fleet.accounting.requests()]
    assert not any(bad in p for p in paths for bad in ("bad_id", "p-unknown", "p-malformed"))


async def test_rows_over_the_parameter_limits_are_invalid_and_the_rest_converge(
    rounds: Rounds, fleet: Fleet, store: Store, database_url: str
) -> None:
    # Rows that bypassed `convergerd import`: too many entries, a huge label key.
    too_many = {"type": "AllowedRegistries",
                "registries": [f"r{i}.example.com" for i in range(65)]}
    huge_key = {"type": "RequiredLabels", "labels": ["k" * 100_000]}
    await sql(
        database_url,
        "INSERT INTO policies (id, boundary_id, rule) VALUES "
        "('p-too-many', 'team-a', $1::text::jsonb), ('p-huge-key', 'team-a', $2::text::jsonb)",
        json.dumps(too_many), json.dumps(huge_key),
    )

    report = await rounds.run()

    assert report.result is RoundResult.OK
    reasons = {i.id: i.reason for i in report.invalid}
    assert set(reasons) == {"p-too-many", "p-huge-key"}
    assert reasons["p-too-many"].startswith("rule.registries: 65 entries, at most 64")
    assert reasons["p-huge-key"].startswith("rule.labels: 'kkkk")
    assert "100000 characters, at most 317" in reasons["p-huge-key"]
    assert all(len(r) <= 300 for r in reasons.values())
    recorded = await sql(database_url, "SELECT policy_id, reason FROM invalid_policies")
    assert {r["policy_id"]: r["reason"] for r in recorded} == reasons
    for cluster, names in DESIRED.items():
        assert set(objects(fleet, cluster)) == names
    paths = [r.path for r in fleet.accounting.requests()]
    assert not any(bad in p for p in paths for bad in ("p-too-many", "p-huge-key"))


# --- errors from a cluster (docs/design.md) -------------------------------------------------


@pytest.mark.parametrize("status", [500, 503])
async def test_server_errors_are_retried_and_converge(
    rounds: Rounds, fleet: Fleet, status: int
) -> None:
    fleet.set_faults(C2, Faults(error_rate=0.5, error_status=status))

    report = await rounds.run()

    assert report.result is RoundResult.OK
    assert set(objects(fleet, C2)) == DESIRED[C2]
    answered = [s for _, _, s in requests_to(fleet, C2)]
    assert status in answered  # errors were injected, and retried past
    assert answered.count(200) + answered.count(201) == 3  # one list, two applies
    retried = f'convergerd_retries_total{{cluster="c0002",reason="server_error"}} ' \
        f'{float(answered.count(status))}'
    assert retried in rounds.metrics.render().decode()


async def test_throttled_requests_wait_for_retry_after(rounds: Rounds, fleet: Fleet) -> None:
    fleet.set_faults(C2, Faults(error_rate=0.5, error_status=429, retry_after_seconds=1))

    report = await rounds.run()

    assert report.result is RoundResult.OK
    assert set(objects(fleet, C2)) == DESIRED[C2]
    log = fleet.accounting.requests(cluster=C2)
    throttled = [r for r in log if r.status == 429]
    assert throttled
    for r in throttled:
        retry = next(n for n in log if n.seq > r.seq and (n.method, n.path) == (r.method, r.path))
        assert retry.time - r.time >= 0.95, (r.path, retry.time - r.time)


def _kubeconfig_with_token(source: Path, target: Path, context: str, token: str) -> Path:
    doc: dict[str, Any] = yaml.safe_load(source.read_text())
    for user in doc["users"]:
        ctx = next(c for c in doc["contexts"] if c["name"] == context)
        if user["name"] == ctx["context"]["user"]:
            user["user"]["token"] = token
    target.write_text(yaml.safe_dump(doc))
    return target


@pytest.mark.parametrize(
    "case",
    [
        ("wrong-token", "401 Unauthorized", "unauthorized"),
        ("readOnly", '403 Forbidden: policies.platform.stackship.se "policy-p-', "forbidden"),
        ("crd-missing", "CRD policies.platform.stackship.se not installed", "crd_missing"),
    ],
    ids=["401", "403", "404"],
)
async def test_cluster_level_failure_stops_that_cluster_only(
    fleet: Fleet, store: Store, database_url: str, tmp_path: Path, case: tuple[str, str, str]
) -> None:
    fault, error, reason = case
    await import_doc(database_url, FLEET_DOC)
    kubeconfig = fleet.kubeconfig_path
    if fault == "wrong-token":
        kubeconfig = _kubeconfig_with_token(kubeconfig, tmp_path / "kc", C2, "not-the-token")
    elif fault == "readOnly":
        fleet.set_faults(C2, Faults(read_only=True))
    else:
        fleet.set_faults(C2, Faults(crd=False))
    harness = Rounds(fleet, store, settings_for(kubeconfig, database_url))
    try:
        report = await harness.run()
    finally:
        await harness.close()

    assert report.result is RoundResult.PARTIAL
    failed = outcome(report, C2)
    assert failed.error is not None
    assert failed.error.startswith(error)
    assert failed.reason == reason
    assert failed.reached  # it answered; it refused
    assert not any(d.result is ApplyResult.FAILED for d in failed.deliveries)  # one reason
    for cluster in (C1, C3):
        assert outcome(report, cluster).converged
        assert set(objects(fleet, cluster)) == DESIRED[cluster]
    assert objects(fleet, C2) == {}
    verbs = [v for v, _, _ in requests_to(fleet, C2)]
    if fault == "readOnly":  # the list works; the first refused write stops the cluster
        assert verbs[0] == "list"
        assert 1 <= verbs.count("patch") <= 2
    else:
        assert verbs == ["list"]  # no retry, no applies
    states = {s.cluster: s for s in await store.cluster_states()}
    assert states[C2].last_error == failed.error
    assert states[C2].last_reason == reason
    assert "not-the-token" not in (states[C2].last_error or "")


async def test_rejected_object_fails_alone(
    rounds: Rounds, fleet: Fleet, store: Store
) -> None:
    def reject_regs(request: AdmissionRequest) -> None:
        if request.rt is POLICIES and request.name == "policy-p-regs":
            raise invalid_object(POLICIES, request.name, [
                field_error("spec.rule.registries[0]", "Forbidden", "registry not allowed here"),
            ])

    fleet.store(C1).admission = reject_regs

    report = await rounds.run()

    assert report.result is RoundResult.PARTIAL
    c1 = outcome(report, C1)
    assert c1.error is None  # not a cluster-level failure
    assert c1.reached
    assert (c1.desired, c1.in_sync, c1.failed) == (3, 2, 1)
    assert results(c1) == {"p-latest": ApplyResult.CREATED, "p-labels": ApplyResult.CREATED,
                           "p-regs": ApplyResult.FAILED}
    rejected = next(d for d in c1.deliveries if d.policy == "p-regs")
    assert rejected.error is not None
    assert rejected.error.startswith("422 ")
    assert "registry not allowed here" in rejected.error
    assert rejected.attempts == 1  # a 422 is not retried
    assert set(objects(fleet, C1)) == {"policy-p-latest", "policy-p-labels"}
    assert outcome(report, C2).converged
    assert outcome(report, C3).converged
    row = next(r for r in await store.deliveries_for_policy("p-regs") if r.cluster == C1)
    assert row.last_result is ApplyResult.FAILED
    assert row.last_error == rejected.error
    assert row.delivered_revision is None


# --- one bad cluster does not slow the others -----------------------------------------------


async def test_down_and_hung_clusters_do_not_delay_the_others(
    fleet: Fleet, store: Store, database_url: str
) -> None:
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url,
                            CONVERGERD_REQUEST_TIMEOUT_SECONDS="1.0")
    fleet.set_faults(C2, Faults(down=True))
    fleet.set_faults(C3, Faults(hang=True))
    harness = Rounds(fleet, store, settings)
    try:
        report = await harness.run()
    finally:
        await harness.close()

    healthy, down, hung = outcome(report, C1), outcome(report, C2), outcome(report, C3)
    assert report.result is RoundResult.PARTIAL
    assert healthy.converged
    assert healthy.duration_s < 0.5, healthy.duration_s  # long before the 1 s timeout
    assert set(objects(fleet, C1)) == DESIRED[C1]

    assert not hung.reached
    assert hung.reason == "timeout"
    assert 0.9 <= hung.duration_s < 2.0, hung.duration_s  # one request timeout
    assert [(v, s) for v, _, s in requests_to(fleet, C3)] == [("list", 0)]  # not one per policy

    assert not down.reached
    assert down.error
    down_requests = requests_to(fleet, C2)
    assert {v for v, _, _ in down_requests} == {"list"}  # never got as far as applying
    # Bounded by the retry policy: MAX_ATTEMPTS lists, each sent at most twice (aiohttp resends
    # an idempotent request once, at once, when the connection is reset under it).
    assert len(down_requests) <= 2 * MAX_ATTEMPTS
    assert writes(fleet, C2) == writes(fleet, C3) == 0


# --- the database goes down -----------------------------------------------------------------


def _via(database_url: str, port: int) -> str:
    parts = urllib.parse.urlsplit(database_url)
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


async def test_database_down_mid_round_waits_and_records_when_back(
    fleet: Fleet, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon itself (`Daemon.main`), its database behind a proxy that goes down after
    round 1 read the fleet, and comes back while round 2 waits for it."""
    await import_doc(database_url, FLEET_DOC)
    target = urllib.parse.urlsplit(database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.up()
    # A request timeout well above c0001's latency: on a loaded machine 300 ms plus a first TLS
    # handshake can pass 0.5 s, and the round's result is asserted. The deadline is unchanged.
    settings = settings_for(fleet.kubeconfig_path, _via(database_url, proxy.port),
                            Policies__ConvergeIntervalMinutes="0.05",  # 3 s, deadline 2.4 s
                            CONVERGERD_REQUEST_TIMEOUT_SECONDS="2")
    fleet.set_faults(C1, Faults(latency_ms=300))  # round 1 is still busy with c0001

    async def rounds_recorded() -> list[Any]:
        return await sql(database_url, "SELECT * FROM rounds ORDER BY id")

    try:
        async with running_daemon(settings) as (daemon, task):
            await wait_for(lambda: fleet.accounting.counts(C1)["list"] >= 1,
                           what="round 1 to list c0001")
            await proxy.down()
            await wait_for(lambda: "could not record round" in caplog.text,
                           what="round 1 failing to record")
            assert daemon.last_report is not None
            assert daemon.last_report.result is RoundResult.OK  # the clusters converged
            await wait_for(lambda: "; retrying in" in caplog.text,
                           what="round 2 waiting for the database")
            assert not task.done()
            await proxy.up()

            async def caught_up() -> bool:
                rows = await rounds_recorded()
                return len(rows) >= 2 and rows[-1]["result"] == "ok"

            await wait_for(caught_up, what="rounds recorded after the database came back")
            assert not task.done()
    finally:
        await proxy.down()

    rows = await rounds_recorded()
    first = rows[0]  # round 1, kept while the database was down, recorded first
    assert first["result"] == "ok"
    assert first["identity"] == settings.election.identity
    assert json.loads(first["counts"])["created"] == 7  # jsonb: text on a plain connection
    # Round 2 either got the database back within its deadline, or says why it could not.
    for row in rows[1:]:
        assert row["result"] == "ok" or row["error"].startswith("database unavailable"), row
    delivered = await sql(database_url,
                          "SELECT policy_id, cluster_id, delivered_revision FROM deliveries")
    assert {(r["policy_id"], r["cluster_id"]) for r in delivered} == {
        (name.removeprefix("policy-"), cluster)
        for cluster, names in DESIRED.items() for name in names
    }
    assert {r["delivered_revision"] for r in delivered} == {1}


async def test_a_daemon_started_before_its_database_waits_for_it(
    fleet: Fleet, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`Daemon.main` with its database refusing connections waits it out (each wait logged),
    and runs its first round once the database answers."""
    await import_doc(database_url, FLEET_DOC)
    target = urllib.parse.urlsplit(database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.up()
    await proxy.down()  # its port now refuses connections
    settings = settings_for(fleet.kubeconfig_path, _via(database_url, proxy.port))
    try:
        async with running_daemon(settings) as (daemon, task):
            await wait_for(lambda: "database unavailable" in caplog.text
                           and "; retrying in" in caplog.text,
                           what="the daemon waiting for its database")
            assert daemon.last_report is None
            await proxy.up()
            await wait_for(lambda: daemon.last_report is not None,
                           what="the first round once the database answers")
            assert not task.done()
    finally:
        await proxy.down()


async def test_daemon_uses_rotated_credentials_from_the_next_round(
    fleet: Fleet, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubeconfig is a mounted Secret: a token rotated in it counts from the next round,
    without a restart (a wrong one shows as 401 on that cluster only)."""
    caplog.set_level(logging.INFO, logger="convergerd")
    await import_doc(database_url, FLEET_DOC)
    good = fleet.kubeconfig_path.read_text()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(good)
    settings = settings_for(kubeconfig, database_url,
                            Policies__ConvergeIntervalMinutes="0.03")  # 1.8 s

    async with running_daemon(settings) as (daemon, _):
        await wait_for(lambda: daemon.last_report is not None, what="round 1")
        assert daemon.last_report is not None
        assert daemon.last_report.result is RoundResult.OK

        _kubeconfig_with_token(kubeconfig, kubeconfig, C2, "rotated-away")
        await wait_for(lambda: daemon.last_report is not None
                       and outcome(daemon.last_report, C2).reason == "unauthorized",
                       what="a round with the wrong token for c0002")
        report = daemon.last_report
        assert report is not None
        assert outcome(report, C2).error == "401 Unauthorized"
        assert outcome(report, C1).converged
        assert outcome(report, C3).converged

        kubeconfig.write_text(good)
        await wait_for(lambda: daemon.last_report is not None
                       and daemon.last_report.result is RoundResult.OK,
                       what="a round with the good token again")
    assert "kubeconfig reloaded" in caplog.text
    assert "rotated-away" not in caplog.text
    assert fleet.token(C2) not in caplog.text


# --- `convergerd once` ----------------------------------------------------------------------


async def _once(fleet: Fleet, database_url: str) -> tuple[int, str]:
    env = {
        **{k: v for k, v in os.environ.items()
           if not k.startswith(("CONVERGERD_", "Policies__"))},
        "CONVERGERD_DATABASE_URL": database_url,
        "CONVERGERD_KUBECONFIG": str(fleet.kubeconfig_path),
        "CONVERGERD_LEADER_ELECTION": "false",
        "CONVERGERD_REQUEST_TIMEOUT_SECONDS": "0.5",
        "CONVERGERD_CONNECT_TIMEOUT_SECONDS": "0.5",
        "Policies__ConvergeIntervalMinutes": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "convergerd", "once", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_once_exit_codes(fleet: Fleet, database_url: str, store: Store) -> None:
    await import_doc(database_url, FLEET_DOC)

    code, output = await _once(fleet, database_url)
    assert code == 0, output
    for cluster, names in DESIRED.items():
        assert set(objects(fleet, cluster)) == names

    fleet.set_faults(C2, Faults(down=True))
    code, output = await _once(fleet, database_url)
    assert code == 1, output
    summary = [line for line in output.splitlines() if "not converged" in line]
    assert len(summary) == 1, output
    assert "c0002" in summary[0]
    last = await store.last_round()
    assert last is not None
    assert last.result is RoundResult.PARTIAL


async def test_cluster_without_a_kubeconfig_context_is_reported_not_a_crash(
    rounds: Rounds, fleet: Fleet, store: Store, database_url: str
) -> None:
    await import_doc(database_url, {
        "clusters": [{"id": "c0099"}],
        "boundaries": [{"id": "team-a", "clusters": ["c0001", "c0002", "c0003", "c0099"]}],
    })

    report = await rounds.run()

    assert report.result is RoundResult.PARTIAL
    missing = outcome(report, ClusterId("c0099"))
    assert missing.reason == "no_context"
    assert missing.error is not None
    assert "c0099" in missing.error
    assert not missing.reached
    for cluster, names in DESIRED.items():
        assert outcome(report, cluster).converged
        assert set(objects(fleet, cluster)) == names
    states = {s.cluster: s for s in await store.cluster_states()}
    assert states[ClusterId("c0099")].last_reason == "no_context"


async def test_database_closed_to_connections_is_unavailable_not_a_crash(
    database_url: str, store: Store, postgres_server_dsn: str
) -> None:
    """A database taken out of service (`ALLOW_CONNECTIONS false`, backends terminated) is
    "down" like any other: `DatabaseUnavailable`, which rounds wait out, never a raw error
    that would end the daemon; the same pool works again once it is back."""
    name = urllib.parse.urlsplit(database_url).path.lstrip("/")
    await import_doc(database_url, FLEET_DOC)
    await sql(postgres_server_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    try:
        await sql(postgres_server_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                  "WHERE datname = $1 AND pid <> pg_backend_pid()", name)
        with pytest.raises(DatabaseUnavailable):
            await store.load_fleet()
        with pytest.raises(DatabaseUnavailable) as info:
            await Store.connect(database_url)
        assert "not currently accepting connections" in str(info.value)
    finally:
        await sql(postgres_server_dsn, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    fleet = await store.load_fleet()
    assert len(fleet.policies) == 4


async def test_leader_keeps_the_lease_when_the_home_context_changes_in_the_kubeconfig(
    fleet: Fleet, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubeconfig Secret is updated and home's entry changes (here: the same token, moved
    to a token file): the elector must go on renewing through the rebuilt client, not keep the
    closed one (every renewal then fails and the replica never leads again until restarted)."""
    caplog.set_level(logging.INFO, logger="convergerd")
    await import_doc(database_url, FLEET_DOC)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fleet.kubeconfig_path.read_text())
    settings = settings_for(
        kubeconfig, database_url,
        Policies__ConvergeIntervalMinutes="0.01",  # 0.6 s
        CONVERGERD_LEADER_ELECTION="true",
        CONVERGERD_HOME_CONTEXT="home",
        CONVERGERD_LEASE_DURATION_SECONDS="2.5",
        CONVERGERD_RENEW_DEADLINE_SECONDS="1.2",
        CONVERGERD_RETRY_PERIOD_SECONDS="0.2",
        CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS="0.5",
    )

    async with running_daemon(settings) as (daemon, _):
        await wait_for(lambda: daemon.last_report is not None, what="round 1 as the leader")
        token_file = tmp_path / "home-token"
        token_file.write_text(fleet.token("home"))
        doc: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        home_user = next(c for c in doc["contexts"] if c["name"] == "home")["context"]["user"]
        for user in doc["users"]:
            if user["name"] == home_user:
                user["user"] = {"tokenFile": str(token_file)}
        kubeconfig.write_text(yaml.safe_dump(doc))
        await wait_for(lambda: "kubeconfig reloaded" in caplog.text, what="the reload")
        reloaded = daemon.last_report

        # Well past the renew deadline: still leading, still renewing, rounds go on.
        renewals_before = _lease_renewals(fleet)
        await asyncio.sleep(3 * settings.election.renew_deadline_s)
        assert "no longer leading" not in caplog.text
        assert _lease_renewals(fleet) >= renewals_before + 5
        await wait_for(lambda: daemon.last_report is not reloaded, what="a round after it")


def _lease_renewals(fleet: Fleet) -> int:
    return sum(1 for r in fleet.accounting.requests(cluster="home", verb="update")
               if r.status == 200)


async def test_sigterm_stops_new_writes_and_lets_the_one_in_flight_finish(
    fleet: Fleet, database_url: str
) -> None:
    """SIGTERM mid-round: the write in flight lands, no new write starts (issue 4: "stop
    starting work"), and the daemon exits 0 without waiting out its grace period's writes."""
    await sigterm_mid_round(fleet, database_url)
    # Three desired on c0001: the first landed, at most the one then in flight followed.
    assert 1 <= writes(fleet, C1) <= 2
    assert len(objects(fleet, C1)) == writes(fleet, C1)


def _kubeconfig_with_c0002_unverified(fleet: Fleet, path: Path) -> Path:
    """The fleet's kubeconfig, but c0002's cluster says `insecure-skip-tls-verify: true`."""
    doc = yaml.safe_load(fleet.kubeconfig_path.read_text())
    for entry in doc["clusters"]:
        if entry["name"] == C2:
            entry["cluster"]["insecure-skip-tls-verify"] = True
    path.write_text(yaml.safe_dump(doc))
    return path


def _insecure_gauge(harness: Rounds | Daemon) -> dict[str, float]:
    text = harness.metrics.render().decode()
    return {
        s.labels["cluster"]: s.value
        for f in text_string_to_metric_families(text) if f.name == "convergerd_cluster_insecure"
        for s in f.samples
    }


@pytest.mark.parametrize("allowed", [False, True])
async def test_a_cluster_without_tls_verification_is_refused_unless_allowed(
    fleet: Fleet, store: Store, database_url: str, tmp_path: Path, allowed: bool
) -> None:
    await import_doc(database_url, FLEET_DOC)
    kubeconfig = _kubeconfig_with_c0002_unverified(fleet, tmp_path / "kubeconfig")
    settings = settings_for(kubeconfig, database_url,
                            CONVERGERD_ALLOW_INSECURE_CLUSTERS=str(allowed).lower())
    harness = Rounds(fleet, store, settings)
    try:
        report = await harness.run()
    finally:
        await harness.close()

    for cluster in (C1, C3):
        assert outcome(report, cluster).converged
        assert set(objects(fleet, cluster)) == DESIRED[cluster]
    c2 = outcome(report, C2)
    if allowed:
        assert report.result is RoundResult.OK
        assert c2.converged
        assert set(objects(fleet, C2)) == DESIRED[C2]
        assert _insecure_gauge(harness) == {C2: 1.0}
        return
    assert report.result is RoundResult.PARTIAL
    assert (c2.reached, c2.reason) == (False, "insecure")
    assert c2.error is not None
    assert "'c0002': refused as insecure: insecure-skip-tls-verify is true" in c2.error
    assert fleet.accounting.counts(C2)["total"] == 0  # not contacted: no token sent
    assert _insecure_gauge(harness) == {}
    states = {s.cluster: s for s in await store.cluster_states()}
    assert states[C2].last_reason == "insecure"


async def test_the_daemon_warns_once_about_an_allowed_insecure_cluster_and_exports_it(
    fleet: Fleet, database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await import_doc(database_url, FLEET_DOC)
    kubeconfig = _kubeconfig_with_c0002_unverified(fleet, tmp_path / "kubeconfig")
    settings = settings_for(kubeconfig, database_url, CONVERGERD_ALLOW_INSECURE_CLUSTERS="true",
                            Policies__ConvergeIntervalMinutes="0.01")  # a round every 0.6 s
    async with running_daemon(settings) as (daemon, _task):
        await wait_for(lambda: fleet.accounting.counts(C2)["list"] >= 3, what="three rounds")
        assert _insecure_gauge(daemon) == {C2: 1.0}
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "reached insecurely" in r.getMessage()]
    assert warnings == [
        "cluster c0002 is reached insecurely (allowed by CONVERGERD_ALLOW_INSECURE_CLUSTERS): "
        "insecure-skip-tls-verify is true (the server's certificate is not verified)"
    ]


async def test_a_verified_forged_into_the_future_is_not_counted_verified(
    rounds: Rounds, fleet: Fleet
) -> None:
    """Issue 17, item 9, the daemon's side: a Policy whose status says Verified True with
    lastProbeTime 9999-... (no operator wrote that) is read back by a round and shown as
    not verified, with the reason, in /status, the policy view and the metric."""
    await rounds.run()
    name = sorted(objects(fleet, C1))[0]
    forged = "9999-12-31T23:59:59Z"
    path = f"/apis/platform.stackship.se/v1alpha1/policies/{name}/status"
    resp = await kube_http(fleet, C1, "PATCH", path, body={
        "status": {"phase": "Enforcing", "conditions": [
            {"type": "Ready", "status": "True", "reason": "Enforcing", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Verified", "status": "True", "reason": "Denied", "message": "forged",
             "lastProbeTime": forged, "lastTransitionTime": forged}]}},
        content_type="application/merge-patch+json")
    assert resp.status == 200, resp.body
    report = await rounds.run()
    state = rounds.state
    state.observe_round(report)  # as the round loop does, with the counting below
    summary = next(c for c in snapshot(state)["clusters"] if c["id"] == C1)
    assert summary["verification"]["verified"] == 0
    assert summary["verification"]["not_verified"] == 1
    record = state.clusters[C1].policies[PolicyId(name.removeprefix("policy-"))]
    view = record_view(record, state.clock(), state.interval_s)["verified"]
    assert (view["status"], view["verification"]) == ("True", "not_verified")
    assert "in the future" in view["untrusted"]
    rounds.metrics.observe_round(report)
    text = rounds.metrics.render().decode()
    assert f'convergerd_policy_verification{{cluster="{C1}",result="verified"}} 0.0' in text
    assert f'convergerd_policy_verification{{cluster="{C1}",result="unverified"}}' in text
