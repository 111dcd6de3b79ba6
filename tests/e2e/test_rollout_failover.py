"""A rollout survives the death of its leader (docs/design.md, "Rollouts: the state machine,
why a failover cannot skip a wave"): real `convergerd run` replicas under the Lease (and under
shard Leases), the simulator as its own process with twelve labelled clusters, the real
operators in every cluster (one helper process), and a real PostgreSQL. The leader is killed
with SIGKILL while a wave bakes; the new leader goes on at the same wave. Counted from the
simulator's request log: every cluster is written the new revision exactly once (no wave
repeated), in the order of the waves (none skipped), and every transition happened once."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes as _kubernetes
import pytest

from convergerd.core.model import ClusterId
from convergerd.core.rollout import assign, parse_strategy
from tests.e2e.harness import (
    STARTUP_S,
    Daemon,
    Request,
    World,
    agent,
    http_json,
    open_world,
    say,
    wait_for,
)

pytestmark = pytest.mark.e2e
# The official sync client; its partial stubs disagree with how it is called.
kubernetes: Any = _kubernetes

N = 12
CLUSTERS = [f"c{i:04d}" for i in range(1, N + 1)]
CANARY = "c0001"
NAME = "policy-p-regs"
STRATEGY: dict[str, Any] = {
    "id": "careful",
    "waves": [{"name": "canary", "selector": {"ring": "canary"}},
              {"name": "half", "fraction": 0.5}, {"name": "rest", "fraction": 1.0}],
    "bakeSeconds": 3, "onHalt": "pause",
}
WAVES = assign(parse_strategy(STRATEGY),
               {ClusterId(c): {"ring": "canary"} if c == CANARY else {} for c in CLUSTERS})
OPERATORS = """
import asyncio, pathlib, sys
from convergerd import eventloop
from convergerd.demo.operators import running_operators

async def main():
    env = {"CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "0.2"}
    async with running_operators(sys.argv[2:], kubeconfig=pathlib.Path(sys.argv[1]), env=env):
        await asyncio.Event().wait()

eventloop.run(main())
"""


def tenants(registries: list[str], strategy: str | None) -> str:
    clusters = ", ".join(f"{{id: {c}, labels: {{ring: canary}}}}" if c == CANARY else c
                         for c in CLUSTERS)
    policy = (f"{{id: p-regs, boundary: team-a, "
              f"rule: {{type: AllowedRegistries, registries: [{', '.join(registries)}]}}"
              + (f", rolloutStrategy: {strategy}" if strategy else "") + "}")
    waves = ", ".join(
        "{name: canary, selector: {ring: canary}}" if w["name"] == "canary"
        else f"{{name: {w['name']}, fraction: {w['fraction']}}}" for w in STRATEGY["waves"])
    return (f"clusters: [{clusters}]\n"
            f"boundaries: [{{id: team-a, clusters: [{', '.join(CLUSTERS)}]}}]\n"
            f"rolloutStrategies:\n"
            f"  - {{id: careful, waves: [{waves}], bakeSeconds: {STRATEGY['bakeSeconds']}, "
            f"onHalt: {STRATEGY['onHalt']}}}\n"
            f"policies: [{policy}]\n")


class WriteLog:
    """Every daemon write of p-regs the simulator logged, read as it goes (its log is a ring)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.seen: list[Request] = []
        self._last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WriteLog:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.read()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.read()

    def read(self) -> None:
        for r in self.world.requests(self._last):
            self._last = max(self._last, r.seq)
            if (r.verb in ("create", "update", "patch") and NAME in r.path
                    and not r.path.endswith("/status")
                    and not r.user_agent.endswith("-operator-" + r.cluster + ")")):
                self.seen.append(r)

    def after(self, seq: int) -> list[Request]:
        self.read()
        return [r for r in self.seen if r.seq > seq]


@pytest.fixture
def twelve(tmp_path: Path, database_url: str) -> Iterator[World]:
    """Twelve clusters with p-regs (no strategy yet) and the strategy in the database, the
    boundary's namespace in each (the operators' probe needs one), the operators running."""
    with open_world(tmp_path, database_url, clusters=N,
                    tenants=tenants(["docker.io"], None)) as world:
        for c in CLUSTERS:
            api = kubernetes.config.new_client_from_config(
                config_file=str(world.sim.kubeconfig_path), context=c)
            with api:
                kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {
                    "name": "team-a", "labels": {"platform.stackship.se/boundary": "team-a"}}})
        log = (tmp_path / "operators.log").open("wb")
        operators = subprocess.Popen(
            [sys.executable, "-c", OPERATORS, str(world.sim.kubeconfig_path), *CLUSTERS],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            yield world
        finally:
            operators.kill()
            operators.wait(10)
            log.close()


def rollout(world: World) -> dict[str, Any] | None:
    """p-regs' rollout as a live replica's API shows it (None: none yet, or no answer)."""
    for daemon in world.daemons:
        if daemon.proc.poll() is not None:
            continue
        try:
            doc: dict[str, Any] = http_json(daemon.url + "/v1/policies/p-regs/rollout")
        except (OSError, ValueError):
            continue
        return doc
    return None


def at(world: World, state: str, wave: int, *, baking: bool = False) -> dict[str, Any] | None:
    found = rollout(world)
    if found is None or found.get("to_revision") != 2 or found["state"] != state \
            or found["wave"]["index"] != wave:
        return None
    return found if not baking or found["wave"]["ready_at"] is not None else None


def enforcing_everywhere(world: World) -> bool:
    """The leader's /status: every cluster reports p-regs Enforcing."""
    leader = world.leader()
    doc = leader.status() if leader is not None else None
    if doc is None:
        return False
    return all(c.get("phases", {}).get("Enforcing") == 1 for c in doc["clusters"]) and \
        len(doc["clusters"]) == N


@pytest.mark.parametrize("shards", [1, 2])
def test_a_new_leader_goes_on_at_the_same_wave(twelve: World, shards: int) -> None:
    world = twelve
    env = {"CONVERGERD_SHARDS": str(shards), "CONVERGERD_ROLLOUT_GATE_SECONDS": "0.5"}
    daemons: list[Daemon] = [world.start(name, **env) for name in ("alpha", "bravo")]
    wait_for(lambda: all(d.serving() for d in daemons), STARTUP_S, "both serving")
    wait_for(lambda: enforcing_everywhere(world), 90, "revision 1 enforced everywhere")
    start = world.last_seq()

    with WriteLog(world) as writes:
        path = world.workdir / "tenants-2.yaml"
        path.write_text(tenants(["docker.io", "registry.example.com"], "careful"))
        imported = world.cli("import", str(path))
        assert imported.returncode == 0, imported.stdout + imported.stderr
        # Mid-rollout: the half's wave has every cluster reporting and bakes.
        wait_for(lambda: at(world, "progressing", 1, baking=True), 90, "the half baking")
        old = world.leader()
        assert old is not None
        old.kill()  # SIGKILL: no release, its Lease runs out
        say(f"shards={shards}: killed the leader {old.identity} at wave 1")
        new = wait_for(lambda: world.leader([d for d in daemons if d is not old]), 60,
                       "a new leader")
        done = wait_for(lambda: at(world, "completed", 2), 90,
                        "the rollout completed under the new leader")
        mine = writes.after(start)

    # Every cluster written once (no wave repeated), in the order of the waves (none skipped).
    per_cluster = {c: [w for w in mine if w.cluster == c] for c in CLUSTERS}
    assert {c: len(ws) for c, ws in per_cluster.items()} == dict.fromkeys(CLUSTERS, 1), [
        (w.cluster, w.verb, w.user_agent) for w in mine]
    last_of = {wave: max(per_cluster[c][0].seq for c in CLUSTERS if WAVES[ClusterId(c)] == wave)
               for wave in (0, 1, 2)}
    first_of = {wave: min(per_cluster[c][0].seq for c in CLUSTERS
                          if WAVES[ClusterId(c)] == wave) for wave in (0, 1, 2)}
    assert last_of[0] < first_of[1]
    assert last_of[1] < first_of[2]
    # The last wave was written by the new leader; each transition happened once.
    assert all(w.user_agent == agent(new.identity) for c in CLUSTERS
               if WAVES[ClusterId(c)] == 2 for w in per_cluster[c])
    events = [(e["what"], e["wave"]) for e in done["events"] if e["what"] != "wait"]
    assert events == [("started", 0), ("ready", 0), ("advance", 1), ("ready", 1),
                      ("advance", 2), ("ready", 2), ("complete", 2)], events
