"""The Elector against an in-memory Lease store with injectable failures, in fast-forwarded loop
time (looptime): minutes of election in milliseconds, no real sleeps."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import logging
import random
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar, cast

import pytest

from convergerd.config import Election
from convergerd.core.errors import ClusterUnreachable, Fenced, ObjectRejected
from convergerd.core.report import Epoch
from convergerd.kube.api import KubeObject, LeaseApi
from convergerd.leader.elector import STUCK_AFTER_DURATIONS, Elector, Leadership, NoElection
from convergerd.leader.lease import (
    INT32_MAX,
    MAX_HOLDER_CHARS,
    MAX_PEER_DURATION_FACTOR,
    STALLED_AFTER_DURATIONS,
    format_microtime,
    parse_microtime,
)
from convergerd.supervise import HealthCheck

pytestmark = pytest.mark.looptime

T = TypeVar("T")
NS, NAME = "stackship-system", "convergerd"
DURATION, DEADLINE, RETRY, TIMEOUT = 15.0, 10.0, 2.0, 2.0
LATENCY = 0.05
MICROTIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
T0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def settings(identity: str) -> Election:
    return Election(
        enabled=True, home_context=None, lease_name=NAME, lease_namespace=NS, identity=identity,
        lease_duration_s=DURATION, renew_deadline_s=DEADLINE, retry_period_s=RETRY,
        request_timeout_s=TIMEOUT,
    )


def now() -> float:
    return asyncio.get_running_loop().time()


def wall_clock(offset: dt.timedelta = dt.timedelta(0)) -> Callable[[], dt.datetime]:
    """A wall clock that follows loop time (from T0), shifted by `offset`."""
    return lambda: T0 + offset + dt.timedelta(seconds=now())


@dataclasses.dataclass
class Write:
    at: float
    holder: str
    transitions: int


class LeaseServer:
    """The home cluster's Lease as the API server keeps it: resourceVersion preconditions (409),
    MicroTime validation (400), and an identical PUT is not a write."""

    def __init__(self) -> None:
        self.obj: KubeObject | None = None
        self.rv = 0
        self.writes: list[Write] = []

    def writes_by(self, holder: str) -> list[Write]:
        return [w for w in self.writes if w.holder == holder]

    def get(self) -> KubeObject | None:
        return copy.deepcopy(self.obj)

    def create(self, body: KubeObject) -> KubeObject:
        if self.obj is not None:
            raise ObjectRejected("leases.coordination.k8s.io \"convergerd\" already exists",
                                 status=409, k8s_reason="AlreadyExists")
        return self._store(body)

    def replace(self, body: KubeObject) -> KubeObject:
        if self.obj is None:
            return self._store(body)  # a Lease PUT creates
        if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            raise ObjectRejected("the object has been modified", status=409, k8s_reason="Conflict")
        if body["spec"] == self.obj["spec"]:
            return copy.deepcopy(self.obj)  # nothing changed: not a write, same RV
        return self._store(body)

    def hand_edit(self, **spec: object) -> None:
        """What `kubectl edit` could leave (no validation): a new record, a new RV."""
        assert self.obj is not None
        self.rv += 1
        self.obj["spec"].update(spec)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)

    def _store(self, body: KubeObject) -> KubeObject:
        for key in ("acquireTime", "renewTime"):
            value = body["spec"].get(key)
            if value is not None and not MICROTIME.match(value):
                raise ObjectRejected(f"bad MicroTime {value!r}", status=400)
        for key in ("leaseDurationSeconds", "leaseTransitions"):
            number = body["spec"].get(key)
            if number is not None and not 0 <= number <= INT32_MAX:
                raise ObjectRejected(f"{key} is an int32, got {number}", status=400)
        self.rv += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.rv)
        spec = self.obj["spec"]
        self.writes.append(Write(now(), spec.get("holderIdentity", ""), spec["leaseTransitions"]))
        return copy.deepcopy(self.obj)


class FakeLeaseApi:
    """One replica's view of the home cluster, with a fault that can be switched on and off:

    - `hang`: no answer ever (ignores the timeout: the elector must bound it itself)
    - `timeout`: the client's timeout fires (`ClusterUnreachable`)
    - `conflict`: every write answers 409
    - `garbage`: every answer is an HTML page instead of a Lease
    - `error`: an unexpected exception
    - `lost_answer`: the request lands on the server but the answer never arrives
    """

    def __init__(self, server: LeaseServer) -> None:
        self.server = server
        self.fault: str | None = None

    async def _request(self, timeout_s: float, op: Callable[[], T], *, write: bool) -> T:
        fault = self.fault
        if fault == "hang":
            await asyncio.Event().wait()
        if fault == "timeout":
            await asyncio.sleep(timeout_s)
            raise ClusterUnreachable("timed out", reason="timeout")
        await asyncio.sleep(LATENCY)
        if fault == "error":
            raise RuntimeError("something unexpected")
        if fault == "conflict" and write:
            raise ObjectRejected("the object has been modified", status=409)
        result = op()
        if fault == "lost_answer":
            await asyncio.sleep(timeout_s)
            raise ClusterUnreachable("timed out", reason="timeout")
        if fault == "garbage":
            return cast(T, "<html><body>502 Bad Gateway</body></html>")
        return result

    async def get_lease(self, namespace: str, name: str, *, timeout_s: float) -> KubeObject | None:
        assert (namespace, name) == (NS, NAME)
        assert timeout_s <= TIMEOUT
        return await self._request(timeout_s, self.server.get, write=False)

    async def create_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        assert timeout_s <= TIMEOUT
        return await self._request(timeout_s, lambda: self.server.create(body), write=True)

    async def replace_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        assert timeout_s <= TIMEOUT
        return await self._request(timeout_s, lambda: self.server.replace(body), write=True)


def _is_lease_api(api: FakeLeaseApi) -> LeaseApi:
    return api  # mypy checks the fake against the Protocol


class Replica:
    """An elector with its own connection, wall clock and record of leadership changes."""

    def __init__(self, server: LeaseServer, identity: str, *, seed: int = 0,
                 wall: Callable[[], dt.datetime] | None = None) -> None:
        self.api = FakeLeaseApi(server)
        self.changes: list[tuple[float, bool, str | None]] = []
        self.elector = Elector(
            _is_lease_api(self.api), settings(identity), wall=wall or wall_clock(),
            on_change=lambda leading, holder: self.changes.append((now(), leading, holder)),
            rng=random.Random(seed),
        )

    def led_at(self) -> list[float]:
        return [t for t, leading, _ in self.changes if leading]


@asynccontextmanager
async def running(*electors: Leadership) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(e.run()) for e in electors]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(condition: Callable[[], bool], within_s: float) -> float:
    """Wait (in loop time) until `condition` holds; return the loop time it first held."""
    deadline = now() + within_s
    while not condition():
        if now() > deadline:
            raise AssertionError(f"condition not met within {within_s} s")
        await asyncio.sleep(0.01)
    return now()


@asynccontextmanager
async def never_two_leaders(*replicas: Replica) -> AsyncIterator[None]:
    """Check every 50 ms (loop time) that no two replicas may write at once."""
    problems: list[str] = []

    async def watch() -> None:
        while True:
            writers = [r.elector.identity for r in replicas if _may_write(r.elector)]
            if len(writers) > 1:
                problems.append(f"{now():.2f}: {writers}")
            await asyncio.sleep(0.05)

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
    assert not problems


def _may_write(elector: Elector) -> bool:
    try:
        return elector.fence().remaining_s() > 0
    except Fenced:
        return False


# --- contention -----------------------------------------------------------------------------------


async def test_two_electors_contend_and_exactly_one_leads() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a", seed=1), Replica(server, "b", seed=2)
    async with running(a.elector, b.elector), never_two_leaders(a, b):
        await until(lambda: a.elector.is_leader() or b.elector.is_leader(), within_s=RETRY * 2)
        await asyncio.sleep(120)
        leader, standby = (a, b) if a.elector.is_leader() else (b, a)
        assert leader.elector.epoch == Epoch(leader.elector.identity, 0)
        assert standby.elector.epoch is None
        assert leader.elector.leader == standby.elector.leader == leader.elector.identity
        assert leader.elector.transitions == 1
        assert standby.elector.transitions == 0
        assert standby.led_at() == []
        renewals = server.writes_by(leader.elector.identity)
        assert 55 <= len(renewals) <= 62  # every retry period, for 2 minutes
        assert {w.transitions for w in renewals} == {0}
        assert server.writes_by(standby.elector.identity) == []


async def test_wait_leading_returns_the_epoch_and_the_hook_sees_it() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    async with running(a.elector):
        epoch = await asyncio.wait_for(a.elector.wait_leading(), timeout=1)
        assert epoch == Epoch("a", 0)
        [(at, leading, holder)] = a.changes
        assert (leading, holder) == (True, "a")
        assert at == pytest.approx(2 * LATENCY, abs=0.01)
        assert not a.elector.leadership_lost().is_set()
        lease = server.get()
        assert lease is not None
        spec = lease["spec"]
        assert spec["holderIdentity"] == "a"
        assert spec["leaseDurationSeconds"] == 15
        assert spec["leaseTransitions"] == 0
        assert MICROTIME.match(spec["acquireTime"])
        assert MICROTIME.match(spec["renewTime"])


async def test_fence_budget_follows_the_last_renewal() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    fence = a.elector.fence()
    with pytest.raises(Fenced, match="not the leader"):
        fence.remaining_s()
    async with running(a.elector):
        await a.elector.wait_leading()
        fence = a.elector.fence()
        for _ in range(20):
            await asyncio.sleep(0.37)
            # Renewed every 2 s: between 10 - 2 - latency and 10 s left.
            assert DEADLINE - RETRY - 2 * LATENCY - 0.01 <= fence.remaining_s() <= DEADLINE


# --- failing renewals fence the leader before the lease can be taken ------------------------------


@pytest.mark.parametrize(
    "fault", ["hang", "timeout", "conflict", "garbage", "error", "lost_answer"]
)
async def test_failed_renewals_fence_the_leader_before_the_lease_expires(fault: str) -> None:
    server = LeaseServer()
    a, b = Replica(server, "a", seed=1), Replica(server, "b", seed=2)
    async with running(a.elector), never_two_leaders(a, b):
        epoch = await a.elector.wait_leading()
        fence = a.elector.fence()
        async with running(b.elector):
            await asyncio.sleep(7.3)
            a.api.fault = fault  # a is cut off from its home cluster; b is not
            faulted_at = now()
            await asyncio.wait_for(a.elector.wait_lost(epoch), timeout=DEADLINE + 1)
            lost_at = now()
            with pytest.raises(Fenced):
                fence.remaining_s()
            assert not a.elector.is_leader()
            assert a.elector.leadership_lost().is_set()
            b_leads_at = await until(b.elector.is_leader, within_s=DURATION + 2 * RETRY)
            assert b.elector.epoch == Epoch("b", 1)

    last_renewal = max(w.at for w in server.writes_by("a"))
    assert last_renewal <= faulted_at + (LATENCY if fault == "lost_answer" else 0)
    # a stopped within the renew deadline of its last renewal that it saw succeed ...
    assert lost_at <= last_renewal + DEADLINE
    # ... and b took over only after a's last write stood unchanged for the lease duration.
    b_first = server.writes_by("b")[0]
    assert b_first.at >= last_renewal + DURATION
    assert b_first.transitions == 1
    assert b_leads_at - lost_at >= DURATION - DEADLINE - 0.1


@pytest.mark.parametrize("fault", ["hang", "garbage", "error"])
async def test_a_lone_leader_that_loses_its_lease_takes_it_back_when_the_cluster_returns(
    fault: str,
) -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    async with running(a.elector):
        first = await a.elector.wait_leading()
        old_fence = a.elector.fence(first)
        a.api.fault = fault
        await asyncio.wait_for(a.elector.wait_lost(), timeout=DEADLINE + 1)
        await asyncio.sleep(5)
        a.api.fault = None
        again = await asyncio.wait_for(a.elector.wait_leading(), timeout=RETRY * 2 + 1)
        # Still the holder in the record: the same epoch, no transition in the Lease ...
        assert again == first == Epoch("a", 0)
        # ... but this replica's leadership changed three times, and the old fence stays closed.
        assert a.elector.transitions == 3
        assert [leading for _, leading, _ in a.changes] == [True, False, True]
        with pytest.raises(Fenced, match="has ended"):
            old_fence.remaining_s()
        assert a.elector.fence(first).remaining_s() > 0


async def test_a_leader_that_finds_another_holder_steps_down_at_once() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    async with running(a.elector):
        await a.elector.wait_leading()
        obj = server.get()
        assert obj is not None
        obj["spec"]["holderIdentity"] = "intruder"
        obj["spec"]["leaseTransitions"] = 1
        server.replace(obj)
        stolen_at = now()
        await asyncio.wait_for(a.elector.wait_lost(), timeout=RETRY + 1)
        assert now() - stolen_at <= RETRY + 2 * LATENCY
        assert a.elector.leader == "intruder"
        assert a.changes[-1][1:] == (False, "intruder")


# --- release --------------------------------------------------------------------------------------


async def test_release_hands_over_at_once() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a", seed=1), Replica(server, "b", seed=2)
    async with running(a.elector), never_two_leaders(a, b):
        await a.elector.wait_leading()
        async with running(b.elector):
            await asyncio.sleep(31)
            assert not b.elector.is_leader()
            released_at = now()
            await a.elector.release()
            assert not a.elector.is_leader()
            assert a.elector.leadership_lost().is_set()
            took_over_at = await until(b.elector.is_leader, within_s=DURATION)
            assert b.elector.epoch == Epoch("b", 1)
    assert took_over_at - released_at <= RETRY * 1.2 + 4 * LATENCY  # not a lease duration
    release = server.writes[server.writes.index(server.writes_by("b")[0]) - 1]
    assert release.holder == ""
    assert release.transitions == 0
    assert a.elector.leader is None
    assert a.elector.transitions == 2


async def test_release_waits_for_an_inflight_renewal_and_still_releases() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    async with running(a.elector):
        await a.elector.wait_leading()
        await asyncio.sleep(RETRY - LATENCY / 2)  # in the middle of the next renewal
        await a.elector.release()
    lease = server.get()
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == ""


async def test_release_that_cannot_reach_the_cluster_gives_up_within_its_timeout() -> None:
    server = LeaseServer()
    a = Replica(server, "a")
    async with running(a.elector):
        await a.elector.wait_leading()
        a.api.fault = "hang"
        started = now()
        await a.elector.release()
        assert now() - started <= 2 * TIMEOUT + RETRY + 0.1  # in-flight renewal, then one try
        assert not a.elector.is_leader()


async def test_release_of_a_standby_writes_nothing() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a"), Replica(server, "b")
    async with running(a.elector, b.elector):
        await until(lambda: a.elector.is_leader() or b.elector.is_leader(), within_s=5)
        standby = b if a.elector.is_leader() else a
        writes = len(server.writes)
        await standby.elector.release()
        await asyncio.sleep(0.5)
        assert len(server.writes) == writes


# --- a foreign holder, wall clocks ----------------------------------------------------------------


async def test_a_lease_held_by_another_identity_is_respected_until_it_stops_changing() -> None:
    server = LeaseServer()
    server.create({"metadata": {"name": NAME, "namespace": NS},
                   "spec": {"holderIdentity": "foreign", "leaseDurationSeconds": 30,
                            "renewTime": format_microtime(T0), "leaseTransitions": 4}})

    async def foreign_renewer() -> None:
        while True:
            await asyncio.sleep(RETRY)
            obj = server.get()
            assert obj is not None
            # Its wall clock is a decade behind ours: irrelevant.
            obj["spec"]["renewTime"] = format_microtime(
                T0 - dt.timedelta(days=3650) + dt.timedelta(seconds=now()))
            server.replace(obj)

    a = Replica(server, "a")
    renewer = asyncio.create_task(foreign_renewer())
    async with running(a.elector):
        await asyncio.sleep(100)
        assert a.led_at() == []
        assert a.elector.leader == "foreign"
        renewer.cancel()
        stopped_at = max(w.at for w in server.writes_by("foreign"))
        took_at = await until(a.elector.is_leader, within_s=60)
        assert a.elector.epoch == Epoch("a", 5)
    # The record's own duration (30 s) counts, measured from when a saw its last change.
    assert stopped_at + 30 <= took_at <= stopped_at + 30 + RETRY * 1.2 + RETRY + 0.5


@pytest.mark.parametrize(
    ("leader_wall", "standby_wall"),
    [
        ("frozen", "normal"),  # the leader's wall clock stands still
        ("back_a_day", "normal"),  # the leader's wall clock jumps back mid-term
        ("normal", "ahead_a_year"),  # the standby's wall clock jumps ahead mid-term
    ],
)
async def test_wall_clock_jumps_do_not_cause_a_takeover(
    leader_wall: str, standby_wall: str
) -> None:
    jumped = False

    def clock(kind: str) -> Callable[[], dt.datetime]:
        def read() -> dt.datetime:
            base = T0 + dt.timedelta(seconds=now())
            if kind == "frozen":
                return T0
            if kind == "back_a_day" and jumped:
                return base - dt.timedelta(days=1)
            if kind == "ahead_a_year" and jumped:
                return base + dt.timedelta(days=365)
            return base
        return read

    server = LeaseServer()
    a = Replica(server, "a", wall=clock(leader_wall))
    b = Replica(server, "b", seed=3, wall=clock(standby_wall))
    async with running(a.elector), never_two_leaders(a, b):
        await a.elector.wait_leading()
        async with running(b.elector):
            await asyncio.sleep(20)
            jumped = True
            await asyncio.sleep(100)
            assert a.elector.is_leader()
            assert b.led_at() == []
            assert a.elector.transitions == 1
    assert len(server.writes_by("a")) >= 55  # every renewal was a real change the standby could see


# --- values at the edge of the calendar and of int32 ----------------------------------------------


@pytest.mark.parametrize(
    "renew", [
        "9999-12-31T23:59:59.999999Z",
        # An offset across the calendar's ends, as written and as a Go server answers it.
        "9999-12-31T23:30:00.000000-01:00", "0001-01-01T00:30:00.000000+01:00",
        "10000-01-01T00:30:00.000000Z", "-0001-12-31T23:30:00.000000Z",
    ])
async def test_a_far_future_renew_time_written_into_our_lease_does_not_end_leadership(
    renew: str,
) -> None:
    """Before: OverflowError on every renewal, leadership lost at the renew deadline and never
    taken again."""
    server = LeaseServer()
    a = Replica(server, "a")
    async with running(a.elector):
        epoch = await a.elector.wait_leading()
        server.hand_edit(renewTime=renew, acquireTime=renew)
        edited_at = now()
        await asyncio.sleep(4 * DURATION)
        assert a.elector.is_leader()
        assert a.elector.epoch == epoch
        assert [leading for _, leading, _ in a.changes] == [True]  # never lost, not even once
        assert a.elector.problem() is None
    lease = server.get()
    assert lease is not None
    # Renewed every retry period since, and the Lease shows a sane time again.
    assert len([w for w in server.writes_by("a") if w.at > edited_at]) >= 4 * DURATION / RETRY - 1
    shown = parse_microtime(lease["spec"]["renewTime"])
    assert wall_clock()() - dt.timedelta(seconds=RETRY) <= shown <= wall_clock()()
    assert parse_microtime(lease["spec"]["acquireTime"]) <= shown


async def test_a_dead_holders_lease_with_values_at_their_limits_is_taken_over() -> None:
    """A holder that left 9999-12-31 times, the int32 maximum of transitions and a duration
    the API would refuse: a standby still takes over within one lease duration."""
    server = LeaseServer()
    server.create({"metadata": {"name": NAME, "namespace": NS},
                   "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 15,
                            "leaseTransitions": 0, "renewTime": format_microtime(T0)}})
    far = "9999-12-31T23:59:59.999999Z"
    server.hand_edit(renewTime=far, acquireTime=far, leaseTransitions=INT32_MAX,
                     leaseDurationSeconds=2**40)
    b = Replica(server, "b")
    async with running(b.elector):
        took_at = await until(b.elector.is_leader, within_s=DURATION + 2 * RETRY)
        assert b.elector.epoch == Epoch("b", 0)  # transitions wrapped, not refused
        await asyncio.sleep(2 * DURATION)
        assert b.elector.is_leader()
    assert took_at <= DURATION + 2 * RETRY


async def test_a_holder_that_never_renews_a_68_year_claim_stalls_readiness_then_is_taken_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: leaseDurationSeconds 2^31-1 from a holder that never renews stopped every round
    for 68 years with /healthz and /readyz 200, and its 1 MB identity went everywhere."""
    caplog.set_level(logging.WARNING, logger="convergerd.leader.elector")
    server = LeaseServer()
    server.create({"metadata": {"name": NAME, "namespace": NS},
                   "spec": {"holderIdentity": "\x1b[2J" + "g" * 2**20,
                            "leaseDurationSeconds": INT32_MAX, "leaseTransitions": 3,
                            "renewTime": format_microtime(T0)}})
    b = Replica(server, "b")
    health = elector_health(b.elector)
    stalled_after = STALLED_AFTER_DURATIONS * DURATION
    cap = MAX_PEER_DURATION_FACTOR * DURATION
    async with running(b.elector):
        beat = asyncio.create_task(health.heartbeat())
        await asyncio.sleep(stalled_after - 1)
        assert health.not_ready() == []
        holder = b.elector.leader
        assert holder is not None
        assert len(holder) == MAX_HOLDER_CHARS
        assert holder.isprintable()
        await asyncio.sleep(2)
        [(reason, problem)] = health.not_ready()
        assert reason == "lease_stalled"
        assert "leadership stalled" in problem
        assert len(problem) < 600  # the identity quoted, bounded
        assert health.problems() == []  # a restart would not help
        [warning] = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
        assert len(warning) < 800
        took_at = await until(b.elector.is_leader, within_s=cap)
        assert cap - RETRY <= took_at <= cap + 2 * RETRY
        assert health.not_ready() == []
        assert b.elector.epoch == Epoch("b", 4)
        beat.cancel()


# --- health: a blocked elector is reported, and never quiet ------------------------------------


def elector_health(elector: Elector) -> HealthCheck:
    """Wired as the daemon wires it (`runtime`): liveness, then readiness."""
    health = HealthCheck(clock=now)
    health.check(elector.problem)
    health.ready_check("lease_unreachable", elector.unreachable)
    health.ready_check("lease_stalled", elector.stalled)
    return health


async def test_a_blocked_elector_fails_readiness_not_liveness_and_keeps_warning_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Failing attempts are no reason to restart (before: /healthz 500, so a liveness probe
    restarted every replica when the home cluster was away)."""
    caplog.set_level(logging.DEBUG, logger="convergerd.leader.elector")
    server = LeaseServer()
    a = Replica(server, "a")
    a.api.fault = "error"  # an exception that is not ours, on every attempt
    health = elector_health(a.elector)
    stuck_after = STUCK_AFTER_DURATIONS * DURATION
    async with running(a.elector):
        beat = asyncio.create_task(health.heartbeat())
        started = now()
        await asyncio.sleep(stuck_after - 1)
        assert health.not_ready() == []
        await asyncio.sleep(2)
        [(reason, problem)] = health.not_ready()
        assert reason == "lease_unreachable"
        assert "leader election blocked" in problem
        assert "RuntimeError: something unexpected" in problem
        assert health.problems() == []  # alive: a restart would not help
        await asyncio.sleep(3 * stuck_after)
        # Loud (ERROR, with the traceback) on the first failure, then once per stuck period.
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert 4 <= len(loud) <= 5
        assert all(r.levelno == logging.ERROR and r.exc_info for r in loud)
        assert "kubectl -n stackship-system get lease convergerd" in loud[0].getMessage()
        assert a.led_at() == []
        assert health.problems() == []
        a.api.fault = None
        await until(a.elector.is_leader, within_s=2 * RETRY)
        assert health.not_ready() == []
        beat.cancel()
    assert now() - started > 4 * stuck_after


async def test_conflicts_that_never_end_are_stuck_too_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One 409 is a race lost, and quiet; every write refused is not."""
    caplog.set_level(logging.DEBUG, logger="convergerd.leader.elector")
    server = LeaseServer()
    a = Replica(server, "a")
    a.api.fault = "conflict"
    stuck_after = STUCK_AFTER_DURATIONS * DURATION
    async with running(a.elector):
        await asyncio.sleep(stuck_after - 1)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert a.elector.unreachable() is None
        await asyncio.sleep(2 + RETRY * 1.2)
        [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert warning.levelno == logging.WARNING
        assert "the object has been modified" in warning.getMessage()
        assert "the object has been modified" in (a.elector.unreachable() or "")
        assert a.elector.problem() is None


async def test_a_standby_behind_a_live_leader_is_not_stuck() -> None:
    server = LeaseServer()
    a, b = Replica(server, "a", seed=1), Replica(server, "b", seed=2)
    async with running(a.elector):
        await a.elector.wait_leading()
        async with running(b.elector):
            await asyncio.sleep(5 * STUCK_AFTER_DURATIONS * DURATION)
            assert b.led_at() == []
            for replica in (a, b):
                health = elector_health(replica.elector)
                assert (health.problems(), health.not_ready()) == ([], [])


@pytest.mark.parametrize("fault", ["timeout", "hang"])
async def test_a_standby_that_cannot_reach_home_is_not_ready_but_alive(fault: str) -> None:
    """Not knowing whether anyone leads: nothing says a round runs anywhere, and a restart
    would not bring the home cluster back."""
    server = LeaseServer()
    a = Replica(server, "a")
    a.api.fault = fault
    health = elector_health(a.elector)
    async with running(a.elector):
        beat = asyncio.create_task(health.heartbeat())
        await asyncio.sleep(STUCK_AFTER_DURATIONS * DURATION + RETRY * 1.2 + 2 * TIMEOUT)
        [(reason, problem)] = health.not_ready()
        assert reason == "lease_unreachable"
        assert "timed out" in problem
        assert health.problems() == []
        beat.cancel()


# --- the no-election stand-in ---------------------------------------------------------------------


async def test_no_election_always_leads_and_never_fences() -> None:
    seen: list[tuple[bool, str | None]] = []
    solo: Leadership = NoElection(identity="solo", on_change=lambda *c: seen.append(c))
    task = asyncio.create_task(solo.run())
    await asyncio.sleep(0)
    assert await solo.wait_leading() == Epoch("solo", 0)
    assert solo.is_leader()
    assert solo.leader == "solo"
    assert solo.epoch == Epoch("solo", 0)
    assert solo.fence().remaining_s() == float("inf")
    assert not solo.leadership_lost().is_set()
    lost = asyncio.create_task(solo.wait_lost())
    await asyncio.sleep(3600)
    assert not lost.done()
    lost.cancel()
    assert solo.problem() is None
    await solo.release()
    await asyncio.wait_for(task, timeout=1)
    assert seen == [(True, "solo")]
    assert solo.transitions == 0
