"""The retry policy for cluster calls (docs/design.md, "Errors from a cluster"), on tenacity.

Decisions are pure functions of the error's class, the attempt number and the clock:

- `ClusterUnreachable` with reason `timeout` (connect timeout, hung server): no retry in this
  round, so a down or slow cluster costs one timeout per round, not one per attempt;
- `ClusterUnreachable` otherwise (refused, reset, TLS): exponential backoff, full jitter;
- `TransientApiError` (500, 502, 503, 504): exponential backoff, full jitter;
- `Throttled` (429): wait `Retry-After` (backoff when the server gave none);
- anything else (`ClusterLevelError`, `ObjectRejected`, `NoCredentials`, not ours): no retry.

No wait may end past the caller's deadline: then the last error is raised at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import tenacity

from convergerd.core.errors import DEADLINE_REASON, ClusterError, ClusterUnreachable, Throttled

T = TypeVar("T")

BASE_S = 0.2
CAP_S = 5.0
MAX_ATTEMPTS = 6
# The reason slug the client gives a timeout (`convergerd.kube.client.REASON_TIMEOUT`).
TIMEOUT_REASON = "timeout"
# An attempt needs some time to be worth starting: never wait to end up with less than this.
MIN_ATTEMPT_S = 0.05
# One jitter source for the process: seeding a fresh `random.Random()` per call reads
# os.urandom, a large share of what a first-try success spends here, on every request
# (bench/RESULTS.md, "Figures once quoted in the code").
_JITTER = random.Random()


class RetryObserver(Protocol):
    def retry(self, cluster: str, reason: str) -> None: ...


class Random(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_s(attempt: int, *, base: float, cap: float, rng: Random | None = None) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]; `attempt` counts from 1
    (the attempt that just failed). The one backoff of the process: cluster calls, and the
    waits for the database."""
    ceiling = min(cap, base * 2.0 ** max(0, attempt - 1))
    return (rng or _JITTER).uniform(0.0, ceiling)


class BackoffWait(tenacity.wait.wait_base):
    """tenacity's wait for `backoff_s`: full jitter for the attempt that just failed."""

    def __init__(self, *, base: float, cap: float, rng: Random | None = None) -> None:
        self.base, self.cap, self.rng = base, cap, rng

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return backoff_s(retry_state.attempt_number, base=self.base, cap=self.cap, rng=self.rng)


class StopBefore(tenacity.stop.stop_base):
    """tenacity's stop at a deadline: no wait that would end at or past it. tenacity's own
    `stop_before_delay` counts on `time.monotonic` from the first attempt; ours is the
    caller's deadline on the caller's clock (the event loop's)."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline, self.clock = deadline, clock

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self.clock() + retry_state.upcoming_sleep >= self.deadline


def next_wait(
    exc: BaseException,
    attempt: int,
    *,
    now: float,
    deadline: float,
    base: float = BASE_S,
    cap: float = CAP_S,
    max_attempts: int = MAX_ATTEMPTS,
    rng: Random,
) -> float | None:
    """Seconds to wait before the next attempt, or None: do not retry (raise `exc`)."""
    if not isinstance(exc, ClusterError) or not exc.retryable:
        return None
    if isinstance(exc, ClusterUnreachable) and exc.reason in (TIMEOUT_REASON, DEADLINE_REASON):
        return None
    if attempt >= max_attempts:
        return None
    if isinstance(exc, Throttled) and exc.retry_after_s is not None:
        wait = exc.retry_after_s
    else:
        wait = backoff_s(attempt, base=base, cap=cap, rng=rng)
    if now + wait + MIN_ATTEMPT_S > deadline:
        return None
    return wait


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    cluster: str,
    observer: RetryObserver | None = None,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: Random | None = None,
    base: float = BASE_S,
    cap: float = CAP_S,
    max_attempts: int = MAX_ATTEMPTS,
) -> T:
    """`await fn()` until it succeeds or `next_wait` says stop; the last error is raised as
    is. `deadline` is in `clock` time (default: the running loop's); an attempt still running
    at the deadline is cancelled and raised as a timeout-class `ClusterUnreachable`."""
    now_fn = clock or asyncio.get_running_loop().time
    jitter: Random = rng or _JITTER

    def decide(exc: BaseException, attempt_number: int) -> float | None:
        wait = next_wait(exc, attempt_number, now=now_fn(), deadline=deadline,
                         base=base, cap=cap, max_attempts=max_attempts, rng=jitter)
        if wait is not None and observer is not None and isinstance(exc, ClusterError):
            observer.retry(cluster, exc.reason)
        return wait

    # The first attempt runs outside tenacity: nearly every call succeeds at once, and
    # tenacity's per-call machinery cost more CPU than the rest of a request's own code in a
    # create round (bench/RESULTS.md). Same decision, same wait, same error as tenacity's path.
    first_wait: float | None = None
    try:
        return await _attempt(fn, deadline - now_fn())
    except Exception as exc:
        first_wait = decide(exc, 1)
        if first_wait is None:
            raise
    await sleep(first_wait)

    decided: list[float | None] = [None]

    def should_retry(state: tenacity.RetryCallState) -> bool:
        outcome = state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        if exc is None:
            return False
        # tenacity's first attempt is our second.
        decided[0] = decide(exc, state.attempt_number + 1)
        return decided[0] is not None

    def wait_for(state: tenacity.RetryCallState) -> float:
        return decided[0] or 0.0

    retrying = tenacity.AsyncRetrying(
        retry=should_retry,
        wait=wait_for,
        stop=tenacity.stop_never,  # next_wait owns every stop decision
        sleep=sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await _attempt(fn, deadline - now_fn())
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover


async def _attempt(fn: Callable[[], Awaitable[T]], remaining_s: float) -> T:
    if remaining_s <= 0:
        raise ClusterUnreachable("the deadline passed before the request was sent",
                                 reason=DEADLINE_REASON)
    bound = asyncio.timeout(remaining_s)
    try:
        async with bound:
            return await fn()
    except TimeoutError as exc:
        if not bound.expired():
            raise
        raise ClusterUnreachable(
            "the deadline passed during the request", reason=DEADLINE_REASON
        ) from exc
