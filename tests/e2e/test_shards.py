"""Shards across replicas with real `convergerd` processes (docs/design.md, "Shards").

What is asserted comes from the simulator: the shard Leases in `home` (who holds which, how
many transitions) and its request log (who wrote which Policy, by User-Agent); the fleet view
of `/status` for the rounds recorded. Every bound is the election's own arithmetic plus an
allowance for a busy machine; the measured figures are printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convergerd.core.shards import shard_of
from tests.e2e.harness import (
    CONVERGERD,
    INTERVAL_MINUTES,
    LEASE_S,
    MEMBERS,
    POLICIES,
    RETRY_S,
    STARTUP_S,
    TENANTS,
    WRITE_VERBS,
    Daemon,
    Drift,
    Request,
    World,
    open_world,
    say,
    wait_for,
)

pytestmark = pytest.mark.e2e

INTERVAL_S = INTERVAL_MINUTES * 60
# Process scheduling on a loaded 2-core machine, added to every bound.
ALLOWANCE_S = 3.0
# A replica plans every retry period; a standby's attempt is spread over retry x [0.8, 1.2].
PLAN_S = 2.5 * RETRY_S
CLUSTERS = [f"c{i:04d}" for i in range(1, 13)]
FIRST = CLUSTERS[:8]  # imported at the start; the rest are added while a replica dies


def _tenants(clusters: list[str]) -> str:
    return (f"clusters: [{', '.join(f'{{id: {c}}}' for c in clusters)}]\n"
            f"boundaries:\n  - {{id: everyone, clusters: [{', '.join(clusters)}]}}\n"
            "policies:\n"
            "  - {id: no-latest, boundary: everyone, rule: {type: ForbidLatestTag}}\n")


@pytest.fixture
def fleet_world(tmp_path: Path, database_url: str) -> Iterator[World]:
    """Twelve member clusters in the simulator; the first eight in the database."""
    with open_world(tmp_path, database_url, clusters=len(CLUSTERS),
                    tenants=_tenants(FIRST)) as w:
        yield w


def _leases(world: World) -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item for item in world.leases()}


def _holders(world: World, shards: int) -> list[str]:
    leases = _leases(world)
    return [(leases.get(f"convergerd-shard-{k}") or {}).get("spec", {}).get("holderIdentity")
            or "" for k in range(shards)]


def _transitions(world: World, shards: int) -> list[int]:
    leases = _leases(world)
    return [(leases.get(f"convergerd-shard-{k}") or {}).get("spec", {}).get("leaseTransitions")
            or 0 for k in range(shards)]


def _balanced(world: World, shards: int, expected: dict[str, int]) -> list[str] | None:
    holders = _holders(world, shards)
    return holders if Counter(holders) == expected else None


def _settled(world: World, shards: int, expected: dict[str, int], timeout_s: float,
             what: str) -> list[str]:
    """Balanced as `expected`, and still the same holders two plan periods later."""
    def steady() -> list[str] | None:
        first = _balanced(world, shards, expected)
        if first is None:
            return None
        time.sleep(2 * PLAN_S)
        return first if _holders(world, shards) == first else None
    return wait_for(steady, timeout_s, what)


def _start(world: World, *names: str, **env: str) -> list[Daemon]:
    daemons = [world.start(name, **env) for name in names]
    wait_for(lambda: all(d.serving() for d in daemons), STARTUP_S, f"{names} serving")
    return daemons


def _policy_writes(world: World, after: int = 0) -> list[Request]:
    return [r for r in world.requests(after)
            if r.cluster in CLUSTERS and r.verb in WRITE_VERBS and "/policies" in r.path]


def _shard_acquired(r: Request, identity: str) -> bool:
    """A Lease write of `identity` that the server accepted, on a shard Lease."""
    return (r.cluster == "home" and r.verb in WRITE_VERBS and "convergerd-shard-" in r.path
            and r.status in (200, 201) and r.by(identity))


def test_kill_while_adding_clusters_then_freeze_a_holder(fleet_world: World) -> None:
    world = fleet_world
    shards = 6
    env = {"CONVERGERD_SHARDS": str(shards)}
    daemons = {d.identity: d for d in _start(world, "alpha", "bravo", "charlie", **env)}
    holders = _settled(world, shards, {"alpha": 2, "bravo": 2, "charlie": 2}, STARTUP_S,
                       "2/2/2 shards")

    # SIGKILL a replica mid-round (right after one of its writes) while clusters are added.
    # The victim holds the shard of a cluster already in the fleet (some shards have none).
    drifted = FIRST[0]
    victim = daemons[holders[shard_of(drifted, shards)]]
    alive = sorted(n for n in daemons if n != victim.identity)
    with Drift(world, cluster=drifted):
        seq = world.last_seq()
        wait_for(lambda: any(w.by(victim.identity) for w in _policy_writes(world, seq)), 20,
                 f"a write by {victim.identity}")
        tenants = world.workdir / "more.yaml"
        tenants.write_text(_tenants(CLUSTERS))
        adding = subprocess.Popen([*CONVERGERD, "import", str(tenants)],
                                  env=world.env(None, 0), stdout=subprocess.DEVNULL)
        victim.kill()
        killed_at = time.time()
        assert adding.wait(60) == 0
        wait_for(lambda: _balanced(world, shards, dict.fromkeys(alive, 3)),
                 LEASE_S + RETRY_S + ALLOWANCE_S + 10, "3/3 shards after the kill")
        moved_s = time.time() - killed_at
        say(f"the killed replica's shards held by the others {moved_s:.1f} s after the kill "
            f"(lease {LEASE_S:g} s + retry {RETRY_S:g} s)")
        assert moved_s <= LEASE_S + RETRY_S + ALLOWANCE_S

        def every_cluster_rounded() -> bool:
            doc = daemons[alive[0]].status()
            if doc is None:
                return False
            done = {c["id"] for c in doc["clusters"] if c["last_attempt_at"] is not None
                    and _epoch(c["last_attempt_at"]) > killed_at}
            return done >= set(CLUSTERS)

        bound = LEASE_S + 2 * INTERVAL_S + PLAN_S + ALLOWANCE_S
        wait_for(every_cluster_rounded, bound + 10, "a finished round on every cluster")
        took = time.time() - killed_at
        say(f"every cluster (4 of them new) had a finished round {took:.1f} s after the kill "
            f"(lease {LEASE_S:g} s + 2 intervals {2 * INTERVAL_S:g} s)")
        assert took <= bound, f"{took:.1f} s > {bound:.1f} s"
        holders = _settled(world, shards, dict.fromkeys(alive, 3), 4 * PLAN_S + 10,
                           "3/3 shards, steady")

    # Freeze the holder of a cluster's shard; its shards move to the other; thawed, it writes
    # nothing until it holds a shard Lease again.
    frozen = daemons[holders[shard_of(drifted, shards)]]
    other = next(n for n in alive if n != frozen.identity)
    with Drift(world, cluster=drifted):
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _balanced(world, shards, {other: 6}),
                     LEASE_S + PLAN_S + ALLOWANCE_S + 5, f"{other} holding all six shards")
            seq = world.last_seq()
            wait_for(lambda: any(w.by(other) and w.cluster == drifted
                                 for w in _policy_writes(world, seq)), 20,
                     f"{other} writing to {drifted}, a shard the frozen replica held")
        finally:
            thawed = world.last_seq()
            os.kill(frozen.proc.pid, signal.SIGCONT)
        # It rejoins: fair share gives it three shards back.
        _settled(world, shards, dict.fromkeys(alive, 3), LEASE_S + 4 * PLAN_S + 10,
                 "3/3 shards after the thaw")
    after = world.requests(thawed)
    reacquired = next((r.seq for r in after if _shard_acquired(r, frozen.identity)), None)
    assert reacquired is not None
    stale = [w for w in _policy_writes(world, thawed)
             if w.by(frozen.identity) and w.seq < reacquired]
    say(f"the thawed replica's writes before its next shard Lease: {len(stale)}")
    assert stale == []
    assert all(daemons[n].proc.poll() is None for n in alive)


def _epoch(iso: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(iso).timestamp()


def test_scaling_moves_only_the_shards_that_must_move(world: World) -> None:
    shards = 12
    env = {"CONVERGERD_SHARDS": str(shards)}
    _start(world, "alpha", "bravo", "charlie", **env)
    before = _settled(world, shards, {"alpha": 4, "bravo": 4, "charlie": 4},
                      STARTUP_S + 10, "4/4/4 shards")
    t0 = _transitions(world, shards)

    _start(world, "delta", **env)
    four = _settled(world, shards, {"alpha": 3, "bravo": 3, "charlie": 3, "delta": 3},
                    LEASE_S + 6 * PLAN_S + 10, "3/3/3/3 shards")
    moved = [k for k in range(shards) if before[k] != four[k]]
    t1 = _transitions(world, shards)
    say(f"3 -> 4 replicas: shards {moved} moved, {sum(t1) - sum(t0)} Lease transitions")
    assert len(moved) == 3
    assert all(four[k] == "delta" for k in moved)
    assert sum(t1) - sum(t0) == 3  # each moved once, nothing else changed holder

    for daemon in world.daemons:
        if daemon.identity in ("charlie", "delta"):
            daemon.proc.send_signal(signal.SIGTERM)
    two = _settled(world, shards, {"alpha": 6, "bravo": 6}, LEASE_S + 6 * PLAN_S + 10,
                   "6/6 shards")
    t2 = _transitions(world, shards)
    kept = [k for k in range(shards) if four[k] in ("alpha", "bravo")]
    say(f"4 -> 2 replicas: {shards - len(kept)} shards moved, "
        f"{sum(t2) - sum(t1)} Lease transitions")
    assert all(two[k] == four[k] for k in kept)
    assert sum(t2) - sum(t1) == shards - len(kept)


def test_status_from_any_replica_shows_each_clusters_shard_and_holder(world: World) -> None:
    shards = 3
    env = {"CONVERGERD_SHARDS": str(shards)}
    daemons = _start(world, "alpha", "bravo", "charlie", **env)
    holders = _settled(world, shards, {"alpha": 1, "bravo": 1, "charlie": 1}, STARTUP_S + 10,
                       "1/1/1 shards")
    for daemon in daemons:
        def shown_by(d: Daemon = daemon) -> dict[str, Any] | None:
            doc = d.status()
            return doc if doc and all(c["last_attempt_at"] for c in doc["clusters"]) \
                and [s["holder"] for s in doc["shards"]["shards"]] == holders else None
        doc = wait_for(shown_by, 20, f"{daemon.identity}'s status with every shard")
        assert {c["id"]: (c["shard"], c["holder"]) for c in doc["clusters"]} == {
            c: (shard_of(c, shards), holders[shard_of(c, shards)]) for c in MEMBERS}
        assert doc["shards"]["orphan_clusters"] == 0
        assert sorted(doc["shards"]["held_here"]) == [holders.index(daemon.identity)]
    printed = world.cli("status", "--addr", f"127.0.0.1:{daemons[1].port}")
    assert printed.returncode == 0, printed.stderr
    for cluster in MEMBERS:
        line = next(x for x in printed.stdout.splitlines() if x.startswith(cluster))
        assert line.split()[1:3] == [str(shard_of(cluster, shards)),
                                     holders[shard_of(cluster, shards)]]


def test_once_runs_every_shard_it_can_acquire(world: World) -> None:
    env = {"CONVERGERD_SHARDS": "3"}
    alone = world.cli("once", CONVERGERD_IDENTITY="once-1", CONVERGERD_SHARDS="3")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "a round ran on shards [0, 1, 2]; could not acquire shards none" in alone.stderr
    # A daemon holds every shard: `once` says which it could not take, and fails.
    (daemon,) = _start(world, "alpha", **env)
    wait_for(lambda: _balanced(world, 3, {"alpha": 3}), STARTUP_S, "alpha holding every shard")
    blocked = world.cli("once", CONVERGERD_IDENTITY="once-2", CONVERGERD_SHARDS="3")
    assert blocked.returncode == 1
    assert "could not acquire shards [0, 1, 2]" in blocked.stderr
    assert daemon.proc.poll() is None


def _counter(daemon: Daemon, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=5) as resp:  # noqa: S310
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def test_a_notification_is_fanned_out_once_by_the_holder_of_shard_0(world: World) -> None:
    shards = 3
    daemons = _start(world, "alpha", "bravo", "charlie", CONVERGERD_SHARDS=str(shards))
    holders = _settled(world, shards, {"alpha": 1, "bravo": 1, "charlie": 1}, STARTUP_S + 10,
                       "1/1/1 shards")
    first = next(d for d in daemons if d.identity == holders[0])
    wait_for(lambda: all(_counter(d, "convergerd_notify_listener_connected") == 1
                         for d in daemons), 20, "every listener connected")
    changed = world.workdir / "changed.yaml"
    changed.write_text(TENANTS.replace("labels: [team]", "labels: [team, owner]"))
    assert world.cli("import", str(changed)).returncode == 0  # one policy changed: NOTIFY
    name = "convergerd_notifications_total"
    wait_for(lambda: all(_counter(d, name, handling="queued" if d is first else "standby") == 1
                         for d in daemons), 20, "the notification handled on every replica")
    assert [_counter(d, name, handling="queued") for d in daemons].count(1.0) == 1
    assert _counter(first, "convergerd_saves_total", trigger="notify", result="ok") == 1


def test_a_save_is_spread_over_the_shard_holders(world: World) -> None:
    shards = 5  # c0001, c0002 and c0003 fall in shards 2, 1 and 4
    token = "e2e-token"
    daemons = _start(world, "alpha", "bravo", "charlie", CONVERGERD_SHARDS=str(shards),
                     CONVERGERD_API_TOKEN=token)

    def spread_and_delivered() -> list[str] | None:
        holders = _holders(world, shards)
        if sorted(Counter(holders).values()) != [1, 2, 2] or "" in holders:
            return None
        doc = daemons[0].status()
        delivered = doc is not None and all(
            c["last_attempt_at"] and c["failed"] == 0 for c in doc["clusters"])
        time.sleep(2 * PLAN_S)
        return holders if delivered and _holders(world, shards) == holders else None

    holders = wait_for(spread_and_delivered, STARTUP_S + 20, "2/2/1 shards, policies delivered")
    owner = {c: holders[shard_of(c, shards)] for c in MEMBERS}
    # Through the replica that holds the fewest of the clusters' shards: the others are asked.
    requester = min(daemons, key=lambda d: list(owner.values()).count(d.identity))
    seq = world.last_seq()
    request = urllib.request.Request(  # noqa: S310 - a local URL
        f"{requester.url}/v1/policies/{POLICIES[1]}/apply", data=b"{}", method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310
        answer = json.loads(resp.read())
    assert answer["status"] == "ok"
    assert {c["cluster"]: c["result"] for c in answer["clusters"]} == dict.fromkeys(
        MEMBERS, "unchanged")
    # Recorded as delivered: each cluster is read (not written) by its shard's holder.
    name = f"/policy-{POLICIES[1]}"
    reads = [r for r in world.requests(seq) if r.verb == "get" and r.path.endswith(name)]
    readers = {c: {agent_identity(r.user_agent) for r in reads if r.cluster == c}
               for c in MEMBERS}
    say(f"shard holders {holders}; save through {requester.identity}; readers {readers}")
    assert readers == {c: {owner[c]} for c in MEMBERS}
    asked = sum(1 for c in MEMBERS if owner[c] != requester.identity)
    assert f"({asked} done by the other shard holders)" in requester.log()


def agent_identity(user_agent: str) -> str:
    return user_agent.rsplit("(", 1)[-1].rstrip(")")
