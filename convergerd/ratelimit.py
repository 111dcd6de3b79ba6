"""A per-cluster token bucket (QPS + burst), so a round is a good citizen of every cluster.

The arithmetic is in plain functions (`refill`, `reserve`) tested by tables; `TokenBucket` only
adds the clock and the sleep. A caller that cannot get a slot before its deadline is told at
once (a timeout-class `ClusterUnreachable`) instead of waiting past it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from convergerd.core.errors import ClusterUnreachable


@dataclass(frozen=True, slots=True)
class BucketState:
    tokens: float  # may go negative: requests already promised a future slot
    updated: float  # clock reading when `tokens` was computed


def refill(state: BucketState, now: float, *, rate: float, burst: int) -> BucketState:
    """Tokens at `now`: accrued at `rate` per second since the last update, capped at `burst`."""
    elapsed = max(0.0, now - state.updated)
    return BucketState(tokens=min(float(burst), state.tokens + elapsed * rate),
                       updated=max(now, state.updated))


def reserve(
    state: BucketState, now: float, *, rate: float, burst: int
) -> tuple[BucketState, float]:
    """Take one token, returning the new state and how long to wait before using it (0 if a
    token was available)."""
    current = refill(state, now, rate=rate, burst=burst)
    tokens = current.tokens - 1.0
    wait = 0.0 if tokens >= 0 else -tokens / rate
    return BucketState(tokens=tokens, updated=current.updated), wait


def take(
    state: BucketState, now: float, *, rate: float, burst: int
) -> tuple[BucketState, float]:
    """Take one token only if one is there now: the new state and 0; else the state unchanged
    (refilled) and how long until a token is there. Nothing is promised ahead: a caller that is
    refused answers at once instead of waiting (load shedding)."""
    current = refill(state, now, rate=rate, burst=burst)
    if current.tokens >= 1.0:
        return BucketState(tokens=current.tokens - 1.0, updated=current.updated), 0.0
    return current, (1.0 - current.tokens) / rate


def charge(state: BucketState, now: float, tokens: float, *, rate: float,
           burst: int) -> BucketState:
    """Take `tokens` more after the fact (work found to be bigger than one token), going into
    debt if need be: the next takers wait until it is paid back."""
    current = refill(state, now, rate=rate, burst=burst)
    return BucketState(tokens=current.tokens - tokens, updated=current.updated)


class TokenBucket:
    """Starts full (a burst is allowed at once). One instance per cluster (`acquire`), or for
    the status views (`try_take`)."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._state = BucketState(tokens=float(burst), updated=clock())

    async def acquire(self, deadline: float) -> None:
        """Wait for a slot; raise at once if it would come after `deadline` (clock time)."""
        now = self._clock()
        new_state, wait = reserve(self._state, now, rate=self.rate, burst=self.burst)
        if now + wait > deadline:
            raise ClusterUnreachable(
                f"timeout: the client rate limit ({self.rate:g} requests/s) has no slot "
                f"within {max(0.0, deadline - now):.2g} s",
                reason="timeout",
            )
        self._state = new_state
        if wait > 0:
            await self._sleep(wait)

    def try_take(self) -> float:
        """Take a token if one is there now (0.0); else the seconds until one is, taking none."""
        self._state, wait = take(self._state, self._clock(), rate=self.rate, burst=self.burst)
        return wait

    def charge(self, tokens: float) -> None:
        """Take `tokens` more for work already done (see `charge`)."""
        if tokens > 0:
            self._state = charge(self._state, self._clock(), tokens, rate=self.rate,
                                 burst=self.burst)
