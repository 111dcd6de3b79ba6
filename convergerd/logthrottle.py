"""Log lines an outsider can set off (a notification, a refused connection, a malformed
request), rate limited and deduplicated: the first `burst` lines of a key in a window go out,
the others are only counted, and when the window ends a timer writes one summary line
("suppressed K similar lines") so the last burst of a flood is reported too, not only when the
next one comes. At most `burst + 1` lines per key per window, whatever the flood.

The counters (metrics) count every event; this only keeps the log readable and bounded. Keys
are the code's own (a reason, a channel), never a value from outside, so their number is
bounded by the code; a line's arguments are shown (`core.shown`) by the caller as usual.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# Five lines of one kind, then one summary a minute: a flood is visible, not a log's size.
BURST = 5
WINDOW_S = 60.0


class Cancellable(Protocol):
    def cancel(self) -> None: ...


# Runs a callback after a delay (the running loop's `call_later`; a fake in tests).
Later = Callable[[float, Callable[[], None]], Cancellable]


@dataclass(slots=True)
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0
    level: int = logging.DEBUG
    timer: Cancellable | None = None


def _loop_later(delay_s: float, callback: Callable[[], None]) -> Cancellable | None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None  # no loop: the summary is written by the next line of the key instead
    return loop.call_later(delay_s, callback)


class LogThrottle:
    """Per key: `burst` lines per `window_s`, then a summary when the window ends."""

    def __init__(
        self,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        *,
        burst: int = BURST,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        later: Later | None = None,
    ) -> None:
        """`clock` and `later` go together: the window is measured by `clock`, its end is
        scheduled by `later` (default: the running loop's `call_later` and `time.monotonic`,
        the loop's clock)."""
        self._log = logger
        self.burst = burst
        self.window_s = window_s
        self._clock = clock
        self._later = later
        self._windows: dict[str, _Window] = {}

    def log(self, key: str, level: int, msg: str, *args: object,
            extra: Mapping[str, object] | None = None) -> bool:
        """`msg % args` at `level` unless `key` had `burst` lines in this window; True when
        it was written."""
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.started >= self.window_s:
            self._end(key)  # its timer did not run (no loop): end it now
            window = None
        if window is None:
            window = self._windows[key] = _Window(started=now)
            window.timer = self._schedule(key)
        if window.passed < self.burst:
            window.passed += 1
            self._log.log(level, msg, *args, extra=extra)
            return True
        window.suppressed += 1
        window.level = max(window.level, level)
        return False

    def suppressed(self, key: str) -> int:
        """Lines of `key` counted but not written in its current window."""
        window = self._windows.get(key)
        return window.suppressed if window is not None else 0

    def flush(self) -> None:
        """End every window now (summaries written): on shutdown."""
        for key in list(self._windows):
            self._end(key)

    def _schedule(self, key: str) -> Cancellable | None:
        if self._later is not None:
            return self._later(self.window_s, lambda: self._end(key, timer=True))
        return _loop_later(self.window_s, lambda: self._end(key, timer=True))

    def _end(self, key: str, *, timer: bool = False) -> None:
        window = self._windows.pop(key, None)
        if window is None:
            return
        if window.timer is not None and not timer:
            window.timer.cancel()
        if window.suppressed:
            self._log.log(window.level, "suppressed %d similar lines (%s) in the last %g s",
                          window.suppressed, key, self.window_s, extra={"suppressed": key})
