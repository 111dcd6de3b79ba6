"""Token bucket arithmetic (tables) and the deadline rule of `acquire`."""

from __future__ import annotations

import pytest

from convergerd.core.errors import ClusterUnreachable
from convergerd.ratelimit import (
    BucketState,
    TokenBucket,
    charge,
    refill,
    reserve,
    take,
)
from tests.unit.faketime import FakeTime


@pytest.mark.parametrize(
    ("tokens", "updated", "now", "expected"),
    [  # rate 10/s, burst 5
        (0.0, 0.0, 0.0, 0.0),  # no time passed
        (0.0, 0.0, 0.1, 1.0),  # 0.1 s at 10/s
        (0.0, 0.0, 10.0, 5.0),  # capped at burst
        (-3.0, 0.0, 0.2, -1.0),  # debt is paid back first
        (2.0, 5.0, 4.0, 2.0),  # clock going backwards adds nothing
    ],
)
def test_refill(tokens: float, updated: float, now: float, expected: float) -> None:
    state = refill(BucketState(tokens, updated), now, rate=10.0, burst=5)
    assert state.tokens == pytest.approx(expected)
    assert state.updated == max(now, updated)


@pytest.mark.parametrize(
    ("tokens", "now", "rate", "expected_tokens", "expected_wait"),
    [
        (5.0, 0.0, 10.0, 4.0, 0.0),  # a token is there
        (1.0, 0.0, 10.0, 0.0, 0.0),  # the last one
        (0.0, 0.0, 10.0, -1.0, 0.1),  # wait for the next one
        (-1.0, 0.0, 10.0, -2.0, 0.2),  # queue behind an earlier promise
        (0.0, 0.05, 10.0, -0.5, 0.05),  # half a token accrued
        (0.0, 0.0, 0.5, -1.0, 2.0),  # slow rate
    ],
)
def test_reserve(
    tokens: float, now: float, rate: float, expected_tokens: float, expected_wait: float
) -> None:
    state, wait = reserve(BucketState(tokens, 0.0), now, rate=rate, burst=5)
    assert state.tokens == pytest.approx(expected_tokens)
    assert wait == pytest.approx(expected_wait)




async def test_burst_then_rate() -> None:
    t = FakeTime()
    bucket = TokenBucket(rate=10.0, burst=3, clock=t.clock, sleep=t.sleep)
    for _ in range(3):
        await bucket.acquire(deadline=t.now + 1)
    assert t.slept == []
    await bucket.acquire(deadline=t.now + 1)
    assert t.slept == [pytest.approx(0.1)]


async def test_never_waits_past_the_deadline() -> None:
    t = FakeTime()
    bucket = TokenBucket(rate=1.0, burst=1, clock=t.clock, sleep=t.sleep)
    await bucket.acquire(deadline=t.now + 0.5)
    with pytest.raises(ClusterUnreachable, match="rate limit") as info:
        await bucket.acquire(deadline=t.now + 0.5)  # the next slot is 1 s away
    assert info.value.reason == "timeout"
    assert t.slept == []
    # The refused caller took no token: a caller with time enough gets the slot at 1 s.
    await bucket.acquire(deadline=t.now + 2)
    assert t.slept == [pytest.approx(1.0)]


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0, burst=1, clock=lambda: 0.0)


@pytest.mark.parametrize(
    ("tokens", "now", "expected_tokens", "expected_wait"),
    [  # rate 10/s, burst 5
        (5.0, 0.0, 4.0, 0.0),  # a token is there: taken
        (1.0, 0.0, 0.0, 0.0),  # the last one
        (0.0, 0.0, 0.0, 0.1),  # none: refused, nothing promised ahead
        (0.5, 0.0, 0.5, 0.05),  # half a token: refused, the wait for the other half
        (0.0, 0.1, 0.0, 0.0),  # one accrued by now: taken
    ],
)
def test_take_never_goes_into_debt(
    tokens: float, now: float, expected_tokens: float, expected_wait: float
) -> None:
    state, wait = take(BucketState(tokens, 0.0), now, rate=10.0, burst=5)
    assert state.tokens == pytest.approx(expected_tokens)
    assert wait == pytest.approx(expected_wait)


def test_try_take_refuses_past_the_burst_and_serves_again_after_the_wait() -> None:
    time = FakeTime()
    bucket = TokenBucket(rate=2.0, burst=2, clock=time.clock)
    assert [bucket.try_take() for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]
    assert bucket.try_take() == pytest.approx(0.5)  # refusals take nothing
    time.now += 0.5
    assert bucket.try_take() == 0.0


def test_charge_goes_into_debt_that_later_takers_wait_out() -> None:
    state = charge(BucketState(5.0, 0.0), 0.0, 12.0, rate=10.0, burst=5)
    assert state.tokens == pytest.approx(-7.0)
    state, wait = take(state, 0.0, rate=10.0, burst=5)
    assert wait == pytest.approx(0.8)  # 8 tokens short of one at 10/s
    time = FakeTime()
    bucket = TokenBucket(rate=10.0, burst=5, clock=time.clock)
    bucket.charge(0)  # nothing more to take
    assert bucket.try_take() == 0.0
    bucket.charge(6)
    assert bucket.try_take() == pytest.approx(0.3)
