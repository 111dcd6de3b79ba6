"""Leader election and failover with real `convergerd` processes (docs/design.md, "Leader
election and fencing").

Assertions are on what the simulator saw (its request log: who wrote which Policy, by
User-Agent), on `/status` and on the Lease in `home`; log text only where the log *is* the
contract (the `once` summary, the election-off warning, the setup error).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from convergerd.config import ClusterAccess, Election
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import Elector
from convergerd.leader.lease import format_microtime
from convergerd.sim.fleet import Fleet
from tests.e2e.harness import (
    CONVERGERD,
    LEASE_NAME,
    LEASE_NS,
    LEASE_REQUEST_S,
    LEASE_S,
    MEMBERS,
    RENEW_DEADLINE_S,
    RETRY_S,
    STARTUP_S,
    TIMINGS,
    Daemon,
    Drift,
    HangingProxy,
    LeaseWatch,
    Request,
    World,
    say,
    wait_for,
)
from tests.fixtures.fleet import free_port

pytestmark = pytest.mark.e2e

# Process scheduling on a loaded 2-core machine (a poll interval, a GC pause, a slow status
# answer), added to every bound derived from the election timings.
ALLOWANCE_S = 1.5
# A standby's attempts are spread over retry period x [0.8, 1.2], plus up to 0.2 x retry of
# jitter after a lease expires.
RETRY_MAX_S = 1.4 * RETRY_S


def _start(world: World, *names: str) -> list[Daemon]:
    daemons = [world.start(name) for name in names]
    wait_for(lambda: all(d.serving() for d in daemons), STARTUP_S, f"{names} serving")
    return daemons


def _new_leader(world: World, old: Daemon) -> Daemon | None:
    return world.leader([d for d in world.daemons if d is not old])


def _first_write_by(writes: list[Request], identity: str) -> Request | None:
    return next((w for w in writes if w.by(identity)), None)


def _writes_by(world: World, identity: str, after: int = 0) -> list[Request]:
    return [w for w in world.policy_writes(after) if w.by(identity)]


def test_exactly_one_of_three_leads(world: World) -> None:
    _start(world, "alpha", "bravo", "charlie")
    leader = wait_for(world.leader, STARTUP_S, "a leader")
    assert world.lease_holder() == leader.identity
    for standby in world.daemons:
        if standby is not leader:
            # A standby names the holder once it has read the Lease: its first attempt comes
            # within a (jittered) retry period of its start.
            def names_leader(d: Daemon = standby) -> bool:
                doc = d.status()
                return doc is not None and (
                    doc["leader"]["is_leader"], doc["leader"]["holder"]
                ) == (False, leader.identity)

            wait_for(names_leader, STARTUP_S, f"{standby.identity} naming the leader")

    with Drift(world):
        seen = world.last_seq()
        wait_for(lambda: len({w.cluster for w in world.policy_writes()}) == len(MEMBERS)
                 and len(world.policy_writes(seen)) >= 4, 20,
                 "writes to every member cluster, and several rounds of drift repaired")
    writes = world.policy_writes()
    assert {w.user_agent for w in writes} == {leader.user_agent}
    assert all(w.status in (200, 201) for w in writes), writes
    assert world.leader() is leader
    assert world.lease_holder() == leader.identity


def test_sigkill_of_the_leader(world: World) -> None:
    _start(world, "alpha", "bravo", "charlie")
    old = wait_for(world.leader, STARTUP_S, "a leader")
    with Drift(world):
        wait_for(lambda: _writes_by(world, old.identity), 20, "the leader writing")
        old.proc.kill()
        killed = time.monotonic()
        killed_wall = time.time()
        new = wait_for(lambda: _new_leader(world, old), LEASE_S + RETRY_MAX_S + 10,
                       "a standby leading")
        took_over_s = time.monotonic() - killed
        first = wait_for(lambda: _first_write_by(world.policy_writes(), new.identity), 10,
                         "the new leader's first write")
    say(f"SIGKILL: {new.identity} leads {took_over_s:.2f} s after {old.identity} was killed; "
        f"first write after {first.time - killed_wall:.2f} s "
        f"(bound {LEASE_S:g} + {RETRY_S:g} + {ALLOWANCE_S:g} s)")
    assert took_over_s <= LEASE_S + RETRY_S + ALLOWANCE_S
    assert old.proc.wait(5) == -signal.SIGKILL
    assert world.lease_holder() == new.identity
    writes = world.policy_writes()
    assert all(w.seq < first.seq for w in writes if w.by(old.identity))


def test_sigterm_hands_over_at_once(world: World) -> None:
    _start(world, "alpha", "bravo", "charlie")
    old = wait_for(world.leader, STARTUP_S, "a leader")
    with Drift(world), LeaseWatch(world) as watch:
        wait_for(lambda: _writes_by(world, old.identity), 20, "the leader writing")
        before = world.lease()
        assert before is not None
        # Taken before the signal: the old leader may release the Lease before this thread
        # runs again.
        termed = time.monotonic()
        termed_wall = time.time()
        old.proc.send_signal(signal.SIGTERM)
        new = wait_for(lambda: _new_leader(world, old), LEASE_S + 10, "a standby leading")
        handover_s = time.monotonic() - termed
        assert old.proc.wait(10) == 0
        first = wait_for(lambda: _first_write_by(world.policy_writes(), new.identity), 10,
                         "the new leader's first write")
    say(f"SIGTERM: {new.identity} leads {handover_s:.2f} s after {old.identity} got SIGTERM "
        f"(retry period {RETRY_S:g} s, lease {LEASE_S:g} s); first write after "
        f"{first.time - termed_wall:.2f} s")
    # Released, not expired: the standby did not wait for the lease duration.
    assert handover_s <= RETRY_MAX_S + 2 * LEASE_REQUEST_S + ALLOWANCE_S < LEASE_S
    holders = watch.holders()
    assert holders[-2:] == ["", new.identity], holders  # the empty holder, then the standby
    released = [r for r in world.requests() if r.lease_write and r.by(old.identity)
                and r.time >= termed_wall and r.status == 200]
    assert released, "no Lease write by the old leader after SIGTERM"
    after = world.lease()
    assert after is not None
    assert after["spec"]["holderIdentity"] == new.identity
    assert after["spec"]["leaseTransitions"] == before["spec"]["leaseTransitions"] + 1
    # Its last round finished (or was cancelled) before the standby's first write.
    late = [w for w in world.policy_writes() if w.by(old.identity) and w.seq > first.seq]
    assert not late, late


def test_leader_cut_off_from_home_stops_writing_before_its_lease_expires(world: World) -> None:
    """`home` hangs for the leader only (each replica reaches it through a relay, and the test
    stops the leader's), so the standbys see the Lease expire and take over: the case fencing
    is for."""
    proxies: dict[str, HangingProxy] = {}
    for name in ("alpha", "bravo", "charlie"):
        proxy, kubeconfig = world.hanging_home(name)
        proxies[name] = proxy
        world.start(name, CONVERGERD_KUBECONFIG=str(kubeconfig))
    old = wait_for(world.leader, STARTUP_S, "a leader")
    with Drift(world):
        wait_for(lambda: len(_writes_by(world, old.identity)) >= 2, 20, "the leader writing")
        proxies[old.identity].hung.set()
        hung_wall = time.time()
        new = wait_for(lambda: _new_leader(world, old), LEASE_S + RETRY_MAX_S + 10,
                       "a standby leading")
        first = wait_for(lambda: _first_write_by(world.policy_writes(), new.identity), 10,
                         "the new leader's first write")
        wait_for(lambda: not old.is_leader(), 5, "the old leader knowing it no longer leads")
    log = world.requests()
    renewed = [r.time for r in log
               if r.lease_write and r.by(old.identity) and r.status in (200, 201)]
    last_renew = max(renewed)
    old_writes = [w for w in log if w.policy_write and w.by(old.identity)]
    last_write = max(w.time for w in old_writes)
    taken = min(r.time for r in log
                if r.lease_write and r.by(new.identity) and r.status in (200, 201))
    say(f"home hung for {old.identity} at +0: last renew {last_renew - hung_wall:+.2f} s, "
        f"last write {last_write - hung_wall:+.2f} s "
        f"({last_write - last_renew:.2f} s after the renew, deadline {RENEW_DEADLINE_S:g} s), "
        f"{new.identity} took the Lease "
        f"{taken - last_renew:.2f} s after the old leader's last renew (lease {LEASE_S:g} s), "
        f"first write {first.time - hung_wall:+.2f} s")
    # Times are arrivals at the simulator: the write may arrive a little after the fence
    # closed (it was sent before), the renew a little after it was sent. Both are far from
    # the lease expiring.
    assert last_write - last_renew <= RENEW_DEADLINE_S + 0.1
    assert last_write < taken
    assert taken >= last_renew + LEASE_S - 0.05  # the standby waited for the lease to expire
    assert all(w.seq < first.seq for w in old_writes)
    assert old.proc.poll() is None  # alive, a standby now


def test_a_lease_held_by_another_identity_is_respected(world: World) -> None:
    stop_renewing = threading.Event()
    renewed_at: list[float] = []  # time.monotonic() of each successful renew
    errors: list[BaseException] = []

    def stamp() -> str:
        return format_microtime(dt.datetime.now(dt.UTC))

    lease = world.put_lease({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE_NAME, "namespace": LEASE_NS},
        "spec": {"holderIdentity": "intruder", "leaseDurationSeconds": int(LEASE_S),
                 "acquireTime": stamp(), "renewTime": stamp(), "leaseTransitions": 7},
    })
    renewed_at.append(time.monotonic())

    def renew() -> None:
        current = lease
        while not stop_renewing.wait(RETRY_S):
            try:
                current["spec"]["renewTime"] = stamp()
                current = world.put_lease(current)
                renewed_at.append(time.monotonic())
            except Exception as exc:
                errors.append(exc)

    renewer = threading.Thread(target=renew, name="intruder", daemon=True)
    renewer.start()
    try:
        daemons = _start(world, "alpha", "bravo")

        def lease_reads_span(identity: str) -> float:
            reads = [r.time for r in world.requests() if r.cluster == "home" and r.by(identity)
                     and r.verb == "get" and "/leases/" in r.path]
            return max(reads) - min(reads) if reads else 0.0

        # Long enough that a replica judging the Lease wrongly would have taken it.
        wait_for(lambda: all(lease_reads_span(d.identity) > LEASE_S + 2 * RETRY_S
                             for d in daemons), 30, "both replicas watching the Lease")
        assert world.policy_writes() == []
        for d in daemons:
            doc = d.status()
            assert doc is not None
            assert (doc["leader"]["is_leader"], doc["leader"]["holder"]) == (False, "intruder")
        assert world.lease_holder() == "intruder"
    finally:
        stop_renewing.set()
        renewer.join(10)
    assert not errors, errors
    new = wait_for(world.leader, LEASE_S + RETRY_MAX_S + 10, "a replica taking over")
    took_over_s = time.monotonic() - renewed_at[-1]
    say(f"foreign lease: {new.identity} leads {took_over_s:.2f} s after the last foreign renew "
        f"(lease {LEASE_S:g} s)")
    assert LEASE_S - 0.1 <= took_over_s <= LEASE_S + RETRY_MAX_S + ALLOWANCE_S
    lease_now = world.lease()
    assert lease_now is not None
    assert lease_now["spec"]["holderIdentity"] == new.identity
    assert lease_now["spec"]["leaseTransitions"] == 8
    wait_for(lambda: _writes_by(world, new.identity), 10, "the new leader writing")


def _election(identity: str) -> Election:
    return Election(enabled=True, home_context="home", lease_name=LEASE_NAME,
                    lease_namespace=LEASE_NS, identity=identity, lease_duration_s=2.0,
                    renew_deadline_s=1.2, retry_period_s=0.25, request_timeout_s=0.25)


async def test_a_wall_clock_jump_causes_no_takeover(fleet: Fleet) -> None:
    """Two electors in this process against the simulator's home cluster; one's wall clock is
    years ahead (then the leader's jumps back a day). Monotonic time decides; nobody takes over.
    """
    access = ClusterAccess(kubeconfig=fleet.kubeconfig_path, request_timeout_s=1,
                           connect_timeout_s=1, qps=1000, burst=1000, apply_concurrency=4)
    offsets = {"alpha": dt.timedelta(0), "bravo": dt.timedelta(days=3650)}

    def wall(identity: str) -> Any:
        return lambda: dt.datetime.now(dt.UTC) + offsets[identity]

    registries = [ClusterRegistry(kubeconfig=fleet.kubeconfig_path, access=access,
                                  identity=name) for name in offsets]
    electors = {name: Elector(reg.home("home"), _election(name), wall=wall(name))
                for name, reg in zip(offsets, registries, strict=True)}
    alpha, bravo = electors["alpha"], electors["bravo"]
    tasks = [asyncio.create_task(alpha.run(), name="alpha")]
    try:
        await asyncio.wait_for(alpha.wait_leading(), 10)
        tasks.append(asyncio.create_task(bravo.run(), name="bravo"))
        loop = asyncio.get_running_loop()

        async def alpha_keeps_leading(for_s: float) -> None:
            until = loop.time() + for_s
            while loop.time() < until:
                assert alpha.is_leader()
                assert not bravo.is_leader()
                await asyncio.sleep(0.05)

        await alpha_keeps_leading(2 * 2.0)  # two lease durations
        assert bravo.leader == "alpha"
        offsets["alpha"] = -dt.timedelta(days=1)
        await alpha_keeps_leading(2 * 2.0)
        assert bravo.leader == "alpha"
        assert alpha.transitions == 1
        assert bravo.transitions == 0
    finally:
        for elector in electors.values():
            elector.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for reg in registries:
            await reg.close()


def test_once_exit_codes(world: World) -> None:
    done = world.cli("once", CONVERGERD_IDENTITY="once-1")
    assert done.returncode == 0, done.stderr
    assert {w.cluster for w in _writes_by(world, "once-1")} == set(MEMBERS)

    world.delete_policies(MEMBERS[1])
    world.faults(MEMBERS[1], down=True)
    failed = world.cli("once", CONVERGERD_IDENTITY="once-2")
    assert failed.returncode == 1, failed.stderr
    assert f"cluster {MEMBERS[1]}" in failed.stderr
    assert MEMBERS[0] not in failed.stderr.split("not converged", 1)[-1]
    world.clear_faults(MEMBERS[1])

    daemon = world.start("alpha")
    wait_for(daemon.is_leader, STARTUP_S, "alpha leading")
    with Drift(world):  # something to write, should `once` wrongly write
        started = time.monotonic()
        blocked = world.cli("once", CONVERGERD_IDENTITY="once-3")
        waited_s = time.monotonic() - started
    say(f"once behind a leader: exit {blocked.returncode} after {waited_s:.1f} s (bound "
        f"{LEASE_S:g} + {RENEW_DEADLINE_S:g} s + start-up)")
    assert blocked.returncode == 1, blocked.stderr
    assert waited_s < LEASE_S + RENEW_DEADLINE_S + STARTUP_S  # bounded, not forever
    assert "alpha leads" in blocked.stderr
    assert _writes_by(world, "once-3") == []
    assert daemon.is_leader()


def test_election_off_runs_a_single_replica_loudly(world: World) -> None:
    solo = world.start("solo", CONVERGERD_LEADER_ELECTION="false", CONVERGERD_HOME_CONTEXT=None)
    wait_for(solo.is_leader, STARTUP_S, "solo leading")
    wait_for(lambda: {w.cluster for w in _writes_by(world, "solo")} == set(MEMBERS), 20,
             "solo writing to every member cluster")
    solo.proc.send_signal(signal.SIGTERM)
    assert solo.proc.wait(15) == 0
    assert world.lease() is None  # no Lease was ever taken
    assert "LEADER ELECTION IS OFF" in solo.log()
    assert not [r for r in world.requests() if r.cluster == "home" and r.by("solo")]


def test_election_on_without_a_home_cluster_stops(tmp_path: Path) -> None:
    """Outside a cluster, with no home context: stop before touching anything, naming both
    settings. (Neither the database nor the kubeconfig is reached, so neither exists here.)"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONVERGERD_", "Policies__", "KUBERNETES_SERVICE"))}
    env.update(TIMINGS)
    env.update(CONVERGERD_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
               CONVERGERD_KUBECONFIG=str(tmp_path / "absent.kubeconfig"),
               CONVERGERD_HTTP_ADDR=f"127.0.0.1:{free_port()}")
    refused = subprocess.run([*CONVERGERD, "run"], capture_output=True, text=True, check=False,
                             timeout=60, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "CONVERGERD_HOME_CONTEXT" in refused.stderr
    assert "CONVERGERD_LEADER_ELECTION=false" in refused.stderr
