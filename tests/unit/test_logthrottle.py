"""The log throttle with a fake clock and a fake timer: a flood writes `burst` lines and one
summary per window, the summary of the last burst comes from the timer (no later line needed),
keys do not share a budget."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from convergerd.logthrottle import LogThrottle
from tests.unit.faketime import FakeTime

log = logging.getLogger("tests.logthrottle")


@dataclass
class Timer:
    at: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeLater:
    time: FakeTime
    timers: list[Timer] = field(default_factory=list)

    def __call__(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self.time.now + delay_s, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock, firing the timers that come due (in order)."""
        end = self.time.now + seconds
        for timer in sorted(self.timers, key=lambda t: t.at):
            if timer.at <= end and not timer.cancelled:
                self.time.now = timer.at
                timer.cancelled = True
                timer.callback()
        self.time.now = end


def throttle(burst: int = 3, window_s: float = 60.0) -> tuple[LogThrottle, FakeLater]:
    time = FakeTime()
    later = FakeLater(time)
    return LogThrottle(log, burst=burst, window_s=window_s, clock=time.clock,
                       later=later), later


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == log.name]


def test_a_flood_writes_the_burst_then_one_summary_from_the_timer(
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    throttled, later = throttle()
    written = [throttled.log("invalid", logging.WARNING, "bad payload %d", n)
               for n in range(50_000)]
    assert written.count(True) == 3
    assert lines(caplog) == ["bad payload 0", "bad payload 1", "bad payload 2"]
    assert throttled.suppressed("invalid") == 49_997
    later.advance(59.0)
    assert len(lines(caplog)) == 3  # the window is not over
    later.advance(1.0)  # no new line comes: the timer reports the last burst
    assert lines(caplog)[3:] == ["suppressed 49997 similar lines (invalid) in the last 60 s"]
    assert caplog.records[-1].levelno == logging.WARNING
    assert throttled.suppressed("invalid") == 0


def test_a_new_window_lets_lines_through_again_and_a_quiet_one_has_no_summary(
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    throttled, later = throttle(burst=2)
    for _ in range(2):
        throttled.log("k", logging.WARNING, "line")
    later.advance(61.0)  # within the burst: nothing was suppressed, no summary
    assert lines(caplog) == ["line", "line"]
    assert throttled.log("k", logging.WARNING, "again")
    assert lines(caplog)[-1] == "again"


def test_keys_have_budgets_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    throttled, later = throttle(burst=1)
    for _ in range(10):
        throttled.log("a", logging.WARNING, "a")
        throttled.log("b", logging.INFO, "b")
    assert lines(caplog) == ["a", "b"]
    later.advance(60.0)
    assert sorted(lines(caplog)[2:]) == ["suppressed 9 similar lines (a) in the last 60 s",
                                         "suppressed 9 similar lines (b) in the last 60 s"]
    levels = {r.getMessage(): r.levelno for r in caplog.records[2:]}
    assert levels["suppressed 9 similar lines (a) in the last 60 s"] == logging.WARNING
    assert levels["suppressed 9 similar lines (b) in the last 60 s"] == logging.INFO


def test_without_a_timer_the_next_line_ends_the_window_and_flush_ends_them_all(
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    time = FakeTime()
    throttled = LogThrottle(log, burst=1, window_s=10.0, clock=time.clock)  # no loop running
    for _ in range(4):
        throttled.log("k", logging.WARNING, "line")
    time.now += 10.0
    throttled.log("k", logging.WARNING, "line")
    assert lines(caplog) == ["line", "suppressed 3 similar lines (k) in the last 10 s", "line"]
    throttled.log("k", logging.WARNING, "line")
    throttled.flush()
    assert lines(caplog)[-1] == "suppressed 1 similar lines (k) in the last 10 s"


async def test_on_the_running_loop_the_summary_comes_by_itself(
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    throttled = LogThrottle(log, burst=1, window_s=0.05)
    for _ in range(3):
        throttled.log("k", logging.WARNING, "line")
    while len(lines(caplog)) < 2:
        await asyncio.sleep(0.01)
    assert lines(caplog) == ["line", "suppressed 2 similar lines (k) in the last 0.05 s"]
