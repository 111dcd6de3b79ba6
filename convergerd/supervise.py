"""The supervisor's tools: waiting on the first of several things, and the health of the
supervised tasks behind `/healthz` (a heartbeat that shows a blocked event loop, the long
tasks, any of which ending is a problem, and the checks of loops that can be alive but stuck:
the elector, the round loop). Used by the daemon (`runtime`) and the operator.

Kubernetes' conventions decide which probe a check feeds: liveness (`check`, `/healthz`) only
what a restart fixes (a blocked loop, a task dead, a loop stuck); readiness (`ready_check`,
`/readyz`) what the process cannot fix by restarting (the home cluster unreachable, a Lease
nobody renews): a liveness probe restarting every replica for those would only add restarts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

# A check of a supervised loop: why it is stuck, or None while it works.
Check = Callable[[], str | None]


async def first(*aws: Awaitable[Any]) -> None:
    """Wait until any of `aws` completes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class HealthCheck:
    """The heartbeat and the supervised tasks behind `/healthz`.

    Run `heartbeat()` as a supervised task; hand the supervised tasks to `watch()`. `clock` is
    monotonic. Until the first beat, the time of construction counts as one (startup grace).
    """

    def __init__(
        self,
        *,
        period_s: float = 1.0,
        stale_after_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_lag: Callable[[float], None] | None = None,
    ) -> None:
        self.period_s = period_s
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.on_lag = on_lag
        self.last_beat = clock()
        self.lag_s = 0.0
        self._tasks: list[asyncio.Task[Any]] = []
        self._checks: list[Check] = []
        self._ready_checks: list[tuple[str, Check]] = []

    async def heartbeat(self) -> None:
        """Forever: sleep one period and note how late the loop woke us."""
        while True:
            expected = self.clock() + self.period_s
            await asyncio.sleep(self.period_s)
            self.beat(self.clock() - expected)

    def beat(self, lag_s: float = 0.0) -> None:
        self.last_beat = self.clock()
        self.lag_s = max(0.0, lag_s)
        if self.on_lag is not None:
            self.on_lag(self.lag_s)

    def watch(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        self._tasks.extend(tasks)

    def check(self, *checks: Check) -> None:
        """Also ask these at every `/healthz`: a task can be running and still be stuck."""
        self._checks.extend(checks)

    def ready_check(self, reason: str, check: Check) -> None:
        """Ask `check` at every `/readyz` (and scrape): a replica it fails is not ready, for
        `reason` (a metric label), and a restart would not help."""
        self._ready_checks.append((reason, check))

    def not_ready(self) -> list[tuple[str, str]]:
        """(reason, problem) for every readiness check that fails now."""
        return [(reason, problem) for reason, check in self._ready_checks
                if (problem := _ask(check)) is not None]

    def problems(self) -> list[str]:
        found = []
        silent_s = self.clock() - self.last_beat
        if silent_s > self.stale_after_s:
            found.append(f"event loop heartbeat {silent_s:.1f} s old "
                         f"(limit {self.stale_after_s:g} s): the loop was blocked")
        for task in self._tasks:
            if not task.done():
                continue
            if task.cancelled():
                found.append(f"task {task.get_name()!r} was cancelled")
            elif (exc := task.exception()) is not None:
                found.append(f"task {task.get_name()!r} crashed: {type(exc).__name__}")
            else:
                found.append(f"task {task.get_name()!r} ended")
        found.extend(problem for check in self._checks if (problem := _ask(check)) is not None)
        return found


def _ask(check: Check) -> str | None:
    try:
        return check()
    except Exception as exc:  # a broken check is a problem too, not a 500 without a body
        name = getattr(check, "__qualname__", type(check).__name__)
        return f"health check {name} failed: {type(exc).__name__}"
