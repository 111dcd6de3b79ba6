"""Slots given back by holders that hear nothing: a bound on work in flight that a silent peer
cannot fill.

A semaphore bounds the work in flight on the assumption that its holders keep it busy. A
holder waiting on a peer that does not answer (a hung cluster: the connection accepted, the
request held until the timeout) keeps its slot for its whole timeout while work that would
finish in milliseconds waits behind it: with a tenth of 10,000 clusters hung, the healthy
clusters' part of a round took far longer than an in-sync round (bench/RESULTS.md, "Figures
once quoted in the code"). So a holder that has not
heard back within `Patience.seconds` gives its slots back and waits *aside* (its own timeout
still ends it), and the next in line takes them. `Aside` bounds how many wait so at once;
beyond it, holders keep their slots as before. Giving back is one-way: a holder aside stays
aside, even once it hears back.

How long is too long depends on how loaded this process and the peers are, so `Patience`
follows the answers seen (a multiple of their moving average, never under a floor): on a busy
loop where every answer takes a second, holders do not all step aside and multiply the work in
flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

# A holder waits for its first answer at least this long, however fast the answers seen so
# far...
PATIENCE_FLOOR_S = 1.0
# ...and at least this many times the moving average of the answers seen...
PATIENCE_FACTOR = 4.0
# ...each new answer weighing this much in it.
PATIENCE_WEIGHT = 0.05


class Patience:
    """How long a holder may wait for its first answer before it gives its slots back:
    `PATIENCE_FACTOR` times the moving average of the answers observed, within
    [`floor_s`, `ceiling_s`] (the floor until anything was observed)."""

    def __init__(self, *, ceiling_s: float, floor_s: float = PATIENCE_FLOOR_S) -> None:
        self.floor_s = floor_s
        self.ceiling_s = max(floor_s, ceiling_s)
        self._average_s: float | None = None

    def observe(self, seconds: float) -> None:
        """One holder heard back after `seconds`."""
        seconds = max(0.0, seconds)
        if self._average_s is None:
            self._average_s = seconds
        else:
            self._average_s += PATIENCE_WEIGHT * (seconds - self._average_s)

    @property
    def seconds(self) -> float:
        typical = self._average_s if self._average_s is not None else 0.0
        return min(self.ceiling_s, max(self.floor_s, PATIENCE_FACTOR * typical))


class Aside:
    """How many holders may wait aside, their slots given back, at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0  # aside now
        self.total = 0  # ever stepped aside


class Held:
    """Slots already acquired, lent to one holder: given back by `release` (at the end), or
    earlier, when the holder has not called `heard` within `patience.seconds` and `aside` has
    room (if full, it asks again after another `patience.seconds`)."""

    __slots__ = (
        "_aside",
        "_aside_now",
        "_gates",
        "_loop",
        "_patience",
        "_started",
        "_timer",
        "heard_at",
    )

    def __init__(
        self, gates: Sequence[asyncio.Semaphore], *, patience: Patience, aside: Aside
    ) -> None:
        self._gates: Sequence[asyncio.Semaphore] | None = gates
        self._patience = patience
        self._aside = aside
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._aside_now = False
        self.heard_at: float | None = None
        self._timer = self._loop.call_later(patience.seconds, self._give_back)

    def heard(self) -> None:
        """The holder's first answer came: the patience learns how long it took, aside or
        not (on a fleet where every answer is slow, holders that learned nothing from those
        aside would step aside until the aside is full)."""
        if self.heard_at is None:
            self.heard_at = self._loop.time()
            self._patience.observe(self.heard_at - self._started)

    def release(self) -> None:
        """The holder is done: its slots back, if it still has them. Idempotent."""
        self._timer.cancel()
        if self._aside_now:
            self._aside_now = False
            self._aside.count -= 1
        self._give_slots_back()

    def _give_back(self) -> None:
        if self.heard_at is not None or self._gates is None:
            return
        due = self._started + self._patience.seconds  # it may have grown since the start
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._give_back)
            return
        if self._aside.count >= self._aside.limit:
            self._timer = self._loop.call_later(self._patience.seconds, self._give_back)
            return
        self._aside_now = True
        self._aside.count += 1
        self._aside.total += 1
        self._give_slots_back()

    def _give_slots_back(self) -> None:
        gates, self._gates = self._gates, None
        for gate in reversed(gates or ()):
            gate.release()


@contextlib.asynccontextmanager
async def patient_slots(
    gates: Sequence[asyncio.Semaphore], *, patience: Patience, aside: Aside
) -> AsyncIterator[Held]:
    """Acquire `gates` in order and lend them to the block (`Held`)."""
    acquired: list[asyncio.Semaphore] = []
    try:
        for gate in gates:
            await gate.acquire()
            acquired.append(gate)
    except BaseException:
        for gate in reversed(acquired):
            gate.release()
        raise
    held = Held(acquired, patience=patience, aside=aside)
    try:
        yield held
    finally:
        held.release()
