"""Rollouts operated end to end in one process (issue 37, items 4-5): the daemon as `convergerd
run` wires it (the gate job on the leader, the API), twelve simulated clusters with labels, a
real PostgreSQL, and the real in-cluster operator in every cluster (phases, `Verified`, the
audit of running workloads): a three-wave rollout passes each wave only after its gates, an
approval wave waits for `approve`, a canary whose audit finds violations halts and is sent
back at once, a fixed revision then rolls through, `abort` sends every cluster back, and a
rollback goes through the waves."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from convergerd.cli.main import main
from convergerd.core.model import ClusterId
from convergerd.core.rollout import assign, parse_strategy
from convergerd.demo.operators import running_operators
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import NAMESPACES, PODS
from tests.fixtures.fleet import free_port
from tests.integration.rounds_helpers import (
    IDENTITY,
    import_doc,
    objects,
    running_daemon,
    settings_for,
    sql,
    wait_for,
)

N = 12
CLUSTERS = [f"c{i:04d}" for i in range(1, N + 1)]
CANARY = "c0001"
NAME = "policy-p-regs"
TOKEN = "rollout-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GATE_S = 0.3
OK_REGISTRIES = ["docker.io", "registry.example.com"]  # the canary's running pod passes
STRATEGY: dict[str, Any] = {
    "id": "careful",
    "waves": [{"name": "canary", "selector": {"ring": "canary"}},
              {"name": "half", "fraction": 0.5}, {"name": "rest", "fraction": 1.0}],
    "bakeSeconds": 1, "onHalt": "revert",
    "gates": {"maxNewViolations": 0, "maxErrorClusters": 0, "maxUnreachedShare": 0.1},
}
WAVES = assign(parse_strategy(STRATEGY),
               {ClusterId(c): {"ring": "canary"} if c == CANARY else {} for c in CLUSTERS})
HALF = sorted(c for c, w in WAVES.items() if w == 1)
REST = sorted(c for c, w in WAVES.items() if w == 2)


def doc(registries: list[str], strategy: dict[str, Any] | None) -> dict[str, Any]:
    policy: dict[str, Any] = {"id": "p-regs", "boundary": "team-a",
                              "rule": {"type": "AllowedRegistries", "registries": registries}}
    if strategy is not None:
        policy["rolloutStrategy"] = strategy["id"]
    return {
        "clusters": [{"id": c, "labels": {"ring": "canary"}} if c == CANARY else c
                     for c in CLUSTERS],
        "boundaries": [{"id": "team-a", "clusters": CLUSTERS}],
        "rolloutStrategies": [strategy] if strategy is not None else [],
        "policies": [policy],
    }


def revisions(fleet: Fleet) -> dict[str, int | None]:
    """Each cluster's copy of p-regs: its revision (None: no copy)."""
    out: dict[str, int | None] = {}
    for c in CLUSTERS:
        found = objects(fleet, c).get(NAME)
        out[c] = found["spec"]["revision"] if found else None
    return out


def writes(fleet: Fleet, cluster: str) -> int:
    """The daemon's writes of p-regs to `cluster` (not the operator's status writes), from the
    simulator's request log."""
    return sum(1 for r in fleet.accounting.requests(cluster=cluster)
               if r.user_agent.endswith(f"({IDENTITY})") and NAME in r.path
               and r.verb in ("create", "update", "patch", "delete"))


def by_wave(canary: int | None, half: int | None, rest: int | None) -> dict[str, int | None]:
    wanted = {0: canary, 1: half, 2: rest}
    return {c: wanted[WAVES[ClusterId(c)]] for c in CLUSTERS}


class Daemon:
    """The running daemon's API, and what the database says of p-regs' rollouts."""

    def __init__(self, url: str, http: aiohttp.ClientSession, database_url: str) -> None:
        self.url, self.http, self.database_url = url, http, database_url

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path) as resp:
            return resp.status, await resp.json()

    async def post(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        async with self.http.post(self.url + path, json=body or {}, headers=AUTH) as resp:
            return resp.status, await resp.json()

    async def rollout(self) -> dict[str, Any]:
        status, body = await self.get("/v1/policies/p-regs/rollout")
        assert status == 200, body
        return dict(body)

    async def at(self, state: str, wave: int, *, to: int) -> bool:
        status, body = await self.get("/v1/policies/p-regs/rollout")
        return (status == 200 and body["to_revision"] == to and body["state"] == state
                and body["wave"]["index"] == wave)

    async def cli(self, *args: str) -> str:
        """`convergerd ARGS --addr URL` (in a thread: it blocks), with the admin token; its
        output (it must exit 0)."""
        out = io.StringIO()

        def run() -> int:
            with contextlib.redirect_stdout(out):
                return main([*args, "--addr", self.url])

        with pytest.MonkeyPatch.context() as env:
            env.setenv("CONVERGERD_API_TOKEN", TOKEN)
            code = await asyncio.to_thread(run)
        assert code == 0, out.getvalue()
        return out.getvalue()

    async def events(self) -> list[str]:
        rows = await sql(self.database_url, "SELECT what FROM rollout_events e JOIN rollouts r "
                         "ON r.id = e.rollout_id WHERE r.policy_id = 'p-regs' ORDER BY e.at")
        return [r["what"] for r in rows]


@pytest.fixture
async def twelve(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with Fleet(clusters=N, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(37), bookmark_interval_s=0.5) as f:
        yield f


@contextlib.asynccontextmanager
async def rollout_daemon(fleet: Fleet, database_url: str, *,
                         operator_env: dict[str, str] | None = None) -> AsyncIterator[Daemon]:
    """Revision 1 of p-regs, without a strategy, everywhere; the team-a namespace in every
    cluster (the probe's), and in the canary a running pod from docker.io; an operator per
    cluster (`operator_env` added to its settings) and the daemon running."""
    assert HALF, WAVES  # the hash puts clusters in both fraction waves
    assert REST, WAVES
    for c in CLUSTERS:
        fleet.store(c).create(NAMESPACES, None, {"metadata": {
            "name": "team-a", "labels": {"platform.stackship.se/boundary": "team-a"}}},
            manager="test")
    fleet.store(CANARY).create(PODS, "team-a", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "docker.io/library/nginx:1.27"}]}},
        manager="test")
    await import_doc(database_url, doc(OK_REGISTRIES, None))
    port = free_port()
    settings = settings_for(
        fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN,
        CONVERGERD_HTTP_ADDR=f"127.0.0.1:{port}", CONVERGERD_ROLLOUT_GATE_SECONDS=str(GATE_S),
        Policies__ConvergeIntervalMinutes="0.01", CONVERGERD_PROBE_PERIOD_SECONDS="1",
        CONVERGERD_STATUS_READS_PER_SECOND="1000", CONVERGERD_TOKEN_READS_PER_SECOND="1000")
    env = {"CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "0.1", **(operator_env or {})}
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(running_operators(
            CLUSTERS, kubeconfig=fleet.kubeconfig_path, env=env))
        await stack.enter_async_context(running_daemon(settings))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        await wait_for(lambda: revisions(fleet) == dict.fromkeys(CLUSTERS, 1),
                       timeout_s=60, what="revision 1 everywhere")
        yield Daemon(f"http://127.0.0.1:{port}", http, database_url)


@pytest.fixture
async def daemon(twelve: Fleet, database_url: str) -> AsyncIterator[Daemon]:
    """`rollout_daemon` on the twelve clusters."""
    async with rollout_daemon(twelve, database_url) as running:
        yield running


async def test_three_waves_each_after_its_gates_and_an_approval_wave_waits(
    twelve: Fleet, daemon: Daemon, database_url: str
) -> None:
    strategy = {**STRATEGY, "approval": ["rest"]}
    await import_doc(database_url, doc([*OK_REGISTRIES, "mirror.example.com"], strategy))
    # The save on the database's notification starts the rollout: the canary first.
    await wait_for(lambda: daemon.at("progressing", 1, to=2), timeout_s=60,
                   what="the canary's wave passed")
    assert revisions(twelve) == {**by_wave(2, 1, 1),
                                 **{c: r for c, r in revisions(twelve).items() if c in HALF}}
    await wait_for(lambda: daemon.at("waiting_approval", 2, to=2), timeout_s=60,
                   what="the half passed; the rest waits for approval")
    assert revisions(twelve) == by_wave(2, 2, 1)
    view = await daemon.rollout()
    assert view["gate"] == "approval"
    assert [w["clusters"] for w in view["waves"]] == [1, len(HALF), len(REST)]
    assert [w["approval"] for w in view["waves"]] == [False, False, True]
    # Waiting: rounds keep the rest at revision 1 (several rounds and gate looks go by).
    seen = writes(twelve, REST[0])
    await wait_for(lambda: daemon.at("waiting_approval", 2, to=2), what="still waiting")
    assert revisions(twelve) == by_wave(2, 2, 1)

    listed = (await daemon.cli("rollout", "status")).splitlines()
    assert listed[1].split()[:6] == ["p-regs", "1", "->", "2", "waiting_approval", "3/3"]
    shown = (await daemon.cli("rollout", "status", "p-regs")).splitlines()
    assert shown[1] == "reason: approval: wave rest waits for approval"
    assert shown[2] == (f"clusters: {1 + len(HALF)} report the new revision, {len(REST)} "
                        "another, 0 none")
    assert shown[7].split() == ["2", "rest", "fraction", "1.0", str(len(REST)), "1:",
                                str(len(REST)), "yes"]
    approved = await daemon.cli("rollout", "approve", "p-regs", "--by", "alice")
    assert approved.startswith("policy p-regs: rollout 1 is progressing at wave 3/3 rest; "
                               f"{len(REST)} cluster(s) written"), approved
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 2)  # at once, by the approval
    assert writes(twelve, REST[0]) == seen + 1
    await wait_for(lambda: daemon.at("completed", 2, to=2), timeout_s=60, what="completed")
    # Every transition once, in order (a change of what holds a wave is a `wait` event).
    assert [e for e in await daemon.events() if e != "wait"] == [
        "started", "ready", "advance", "ready", "advance", "approve", "ready", "complete"]
    rows = await sql(database_url, "SELECT by FROM rollout_events WHERE what = 'approve'")
    assert [r["by"] for r in rows] == ["alice"]
    status, body = await daemon.get("/v1/rollouts")
    assert (status, body) == (200, {"rollouts": []})


async def test_a_canary_with_violations_is_sent_back_then_a_fixed_revision_rolls_through(
    twelve: Fleet, daemon: Daemon, database_url: str
) -> None:
    # Revision 2 leaves docker.io out: the canary's running pod violates it. The bake is long:
    # the halt comes from the gate's next look, not after the bake.
    strategy = {**STRATEGY, "bakeSeconds": 600}
    await import_doc(database_url, doc(["registry.example.com"], strategy))
    await wait_for(lambda: daemon.at("reverted", 0, to=2), timeout_s=60,
                   what="the canary's audit halts the rollout")
    view = await daemon.rollout()
    assert view["gate"] == "new_violations"
    assert CANARY in view["reason"]
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)  # the canary sent back
    for c in [*HALF, *REST]:  # never given revision 2: written once, revision 1
        assert writes(twelve, c) == 1, c
    # Rounds keep it so.
    await wait_for(lambda: daemon.at("reverted", 0, to=2), what="still reverted")
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)

    # The fixed revision (docker.io allowed again) rolls through every wave.
    await import_doc(database_url, doc([*OK_REGISTRIES, "mirror.example.com"], STRATEGY))
    await wait_for(lambda: daemon.at("completed", 2, to=3), timeout_s=90,
                   what="revision 3 through every wave")
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)


async def test_abort_sends_every_cluster_back_and_a_rollback_goes_through_the_waves(
    twelve: Fleet, daemon: Daemon, database_url: str
) -> None:
    strategy = {**STRATEGY, "approval": ["rest"]}
    await import_doc(database_url, doc([*OK_REGISTRIES, "mirror.example.com"], strategy))
    await wait_for(lambda: daemon.at("waiting_approval", 2, to=2), timeout_s=60,
                   what="waiting for approval")
    assert revisions(twelve) == by_wave(2, 2, 1)
    status, done = await daemon.post("/v1/policies/p-regs/rollout/abort")
    assert status == 200, done
    assert done["state"] == "aborted"
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)
    status, refused = await daemon.post("/v1/policies/p-regs/rollout/approve")
    assert status == 409, refused

    # A rollback is a new revision (3) with revision 1's content, through the same waves.
    async with daemon.http.post(daemon.url + "/v1/policies/p-regs/rollback",
                                json={"to": 1}, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
    await wait_for(lambda: daemon.at("waiting_approval", 2, to=3), timeout_s=60,
                   what="the rollback's rollout waits at the rest")
    assert revisions(twelve) == by_wave(3, 3, 1)
    status, _ = await daemon.post("/v1/policies/p-regs/rollout/approve")
    assert status == 200
    await wait_for(lambda: daemon.at("completed", 2, to=3), timeout_s=60, what="completed")
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)


async def test_a_warn_first_wave_runs_in_warn_then_in_the_policys_mode(
    twelve: Fleet, daemon: Daemon, database_url: str
) -> None:
    strategy = {**STRATEGY, "waves": [STRATEGY["waves"][0],
                                      {**STRATEGY["waves"][1], "warnFirst": True},
                                      STRATEGY["waves"][2]]}
    await import_doc(database_url, doc([*OK_REGISTRIES, "mirror.example.com"], strategy))
    await wait_for(lambda: daemon.at("progressing", 1, to=2), timeout_s=60,
                   what="the half's wave")
    view = await daemon.rollout()
    assert view["wave"]["warn_step"] is True
    await wait_for(lambda: all(objects(twelve, c)[NAME]["spec"].get("enforcement") == "Warn"
                               for c in HALF), what="the half in Warn")
    assert all("enforcement" not in objects(twelve, c)[NAME]["spec"] for c in REST)
    await wait_for(lambda: daemon.at("completed", 2, to=2), timeout_s=90, what="completed")
    # Every cluster in the policy's own mode (Deny: no `enforcement` in the object).
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 2)
    assert all("enforcement" not in objects(twelve, c)[NAME]["spec"] for c in CLUSTERS)
    assert [e for e in await daemon.events() if e != "wait"] == [
        "started", "ready", "advance", "ready", "enforce", "ready", "advance", "ready",
        "complete"]
