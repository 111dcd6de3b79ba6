"""Retry decisions (tables) and `call_with_retries` on a fake clock."""

from __future__ import annotations

import asyncio
import random

import pytest
import tenacity

from convergerd.core.errors import (
    ClusterError,
    ClusterLevelError,
    ClusterUnreachable,
    NoCredentials,
    ObjectRejected,
    Throttled,
    TransientApiError,
)
from convergerd.retry import BackoffWait, StopBefore, backoff_s, call_with_retries, next_wait
from tests.unit.faketime import FakeTime


class Top:
    """An rng that always draws the top of the range (so waits are the ceilings)."""

    def uniform(self, a: float, b: float) -> float:
        return b


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 3.2), (6, 5.0), (30, 5.0)],
)
def test_backoff_ceiling_doubles_up_to_cap(attempt: int, expected: float) -> None:
    assert backoff_s(attempt, base=0.2, cap=5.0, rng=Top()) == pytest.approx(expected)


def test_backoff_is_full_jitter() -> None:
    rng = random.Random(7)
    draws = [backoff_s(4, base=0.2, cap=5.0, rng=rng) for _ in range(500)]
    assert min(draws) >= 0.0
    assert max(draws) <= 1.6
    assert min(draws) < 0.2  # spread over the whole range, not just near the top
    assert max(draws) > 1.4


async def test_tenacity_waits_our_backoff_and_stops_before_the_deadline() -> None:
    """The database waits: tenacity's loop, `BackoffWait` and `StopBefore` around
    `backoff_s`; no wait ends past the deadline, the last error is raised as is."""
    fake = FakeTime(start=100.0)
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError(f"attempt {calls}")

    retrying = tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(OSError), reraise=True, sleep=fake.sleep,
        wait=BackoffWait(base=1.0, cap=30.0, rng=Top()), stop=StopBefore(108.0, fake.clock))

    async def retried() -> None:
        async for attempt in retrying:
            with attempt:
                await down()

    with pytest.raises(ConnectionRefusedError, match="attempt 4"):
        await retried()
    assert fake.slept == [1.0, 2.0, 4.0]  # the next, 8 s at 107, would end past 108


UNREACHABLE = ClusterUnreachable("connection refused", reason="connect_error")
TIMEOUT = ClusterUnreachable("connect timeout after 3 s", reason="timeout")
E503 = TransientApiError("503 Service Unavailable", status=503)
E429 = Throttled("429 Too Many Requests", status=429, retry_after_s=2.0)
E429_BARE = Throttled("429 Too Many Requests", status=429)
E403 = ClusterLevelError("403 Forbidden", status=403, reason="forbidden")
E404 = ClusterLevelError("CRD missing", status=404, reason="crd_missing")
E409 = ObjectRejected("409 Conflict", status=409, reason="conflict")
E422 = ObjectRejected("422 Unprocessable Entity", status=422, reason="invalid")


@pytest.mark.parametrize(
    ("exc", "attempt", "now", "deadline", "expected"),
    [
        (UNREACHABLE, 1, 0.0, 60.0, 0.2),  # refused: backoff
        (UNREACHABLE, 3, 0.0, 60.0, 0.8),
        (E503, 2, 0.0, 60.0, 0.4),  # 5xx: backoff
        (E429, 1, 0.0, 60.0, 2.0),  # 429: Retry-After
        (E429_BARE, 1, 0.0, 60.0, 0.2),  # 429 without Retry-After: backoff
        (TIMEOUT, 1, 0.0, 60.0, None),  # a timeout is never retried in the round
        (E403, 1, 0.0, 60.0, None),  # cluster-level
        (E404, 1, 0.0, 60.0, None),
        (E409, 1, 0.0, 60.0, None),  # object-level
        (E422, 1, 0.0, 60.0, None),
        (NoCredentials("no context"), 1, 0.0, 60.0, None),
        (ValueError("a bug"), 1, 0.0, 60.0, None),  # not ours: never retried
        (E429, 1, 0.0, 1.5, None),  # Retry-After would pass the deadline
        (UNREACHABLE, 1, 59.9, 60.0, None),  # backoff would pass the deadline
        (UNREACHABLE, 6, 0.0, 60.0, None),  # attempts used up
    ],
)
def test_next_wait(
    exc: BaseException, attempt: int, now: float, deadline: float, expected: float | None
) -> None:
    wait = next_wait(exc, attempt, now=now, deadline=deadline, rng=Top())
    assert wait == (pytest.approx(expected) if expected is not None else None)




class Retries:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def retry(self, cluster: str, reason: str) -> None:
        self.seen.append((cluster, reason))


class Script:
    """Fails with the given errors in turn, then returns "ok"; records when each call began."""

    def __init__(self, t: FakeTime, errors: list[ClusterError], cost_s: float = 0.0) -> None:
        self.t = t
        self.errors = list(errors)
        self.cost_s = cost_s
        self.calls: list[float] = []

    async def __call__(self) -> str:
        self.calls.append(self.t.now)
        self.t.now += self.cost_s
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_retries_transient_errors_then_succeeds() -> None:
    t, obs = FakeTime(1000.0), Retries()
    fn = Script(t, [UNREACHABLE, E503, E429])
    result = await call_with_retries(
        fn, deadline=t.now + 60, cluster="c1", observer=obs,
        clock=t.clock, sleep=t.sleep, rng=Top(),
    )
    assert result == "ok"
    assert t.slept == [pytest.approx(0.2), pytest.approx(0.4), pytest.approx(2.0)]
    assert obs.seen == [("c1", "connect_error"), ("c1", "server_error"), ("c1", "throttled")]


async def test_a_timeout_costs_one_attempt() -> None:
    t = FakeTime(1000.0)
    fn = Script(t, [TIMEOUT], cost_s=3.0)
    with pytest.raises(ClusterUnreachable) as info:
        await call_with_retries(fn, deadline=t.now + 60, cluster="c1",
                                clock=t.clock, sleep=t.sleep, rng=Top())
    assert info.value is TIMEOUT
    assert len(fn.calls) == 1
    assert t.slept == []


async def test_non_retryable_error_is_raised_as_is() -> None:
    t = FakeTime(1000.0)
    fn = Script(t, [E409])
    with pytest.raises(ObjectRejected) as info:
        await call_with_retries(fn, deadline=t.now + 60, cluster="c1",
                                clock=t.clock, sleep=t.sleep, rng=Top())
    assert info.value is E409
    assert len(fn.calls) == 1


async def test_an_attempt_running_at_the_deadline_is_cut() -> None:
    loop = asyncio.get_running_loop()
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(10)
        return "late"

    start = loop.time()
    with pytest.raises(ClusterUnreachable, match="deadline passed during") as info:
        await call_with_retries(slow, deadline=start + 0.05, cluster="c1")
    assert info.value.reason == "deadline"  # the work's own deadline, not the cluster's fault
    assert calls == 1
    assert loop.time() - start < 1.0


async def test_a_timeout_raised_by_the_call_itself_is_not_rewritten() -> None:
    async def broken() -> str:
        raise TimeoutError("not ours")

    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError, match="not ours"):
        await call_with_retries(broken, deadline=loop.time() + 5, cluster="c1")


async def test_gives_up_when_the_wait_would_pass_the_deadline() -> None:
    t = FakeTime(1000.0)
    slow = Throttled("429 Too Many Requests", status=429, retry_after_s=30.0)
    fn = Script(t, [slow])
    with pytest.raises(Throttled):
        await call_with_retries(fn, deadline=t.now + 10, cluster="c1",
                                clock=t.clock, sleep=t.sleep, rng=Top())
    assert t.slept == []


async def test_deadline_already_passed() -> None:
    t = FakeTime(1000.0)
    fn = Script(t, [])
    with pytest.raises(ClusterUnreachable, match="deadline") as info:
        await call_with_retries(fn, deadline=t.now - 1, cluster="c1",
                                clock=t.clock, sleep=t.sleep, rng=Top())
    assert info.value.reason == "deadline"
    assert fn.calls == []
