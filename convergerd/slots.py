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

`Lanes` is the one scheduler of a fan-out over clusters, a round's and a save's: the slots
above, and a small lane for the clusters last seen unreachable (the suspects).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from typing import Generic, TypeVar

from convergerd.config import SlotTuning

K = TypeVar("K", bound=str)  # a cluster id

DEFAULT_SLOTS = SlotTuning()  # what a fan-out built without its tuning gets


class Patience:
    """How long a holder may wait for its first answer before it gives its slots back:
    `SlotTuning.patience_factor` times the moving average of the answers observed, within
    [`floor_s`, `ceiling_s`] (the floor until anything was observed; by default
    `SlotTuning.patience_floor_s`)."""

    def __init__(self, *, ceiling_s: float, floor_s: float | None = None,
                 tuning: SlotTuning = DEFAULT_SLOTS) -> None:
        self.floor_s = tuning.patience_floor_s if floor_s is None else floor_s
        self.ceiling_s = max(self.floor_s, ceiling_s)
        self._factor = tuning.patience_factor
        self._weight = tuning.patience_weight
        self._average_s: float | None = None

    def observe(self, seconds: float) -> None:
        """One holder heard back after `seconds`."""
        seconds = max(0.0, seconds)
        if self._average_s is None:
            self._average_s = seconds
        else:
            self._average_s += self._weight * (seconds - self._average_s)

    @property
    def seconds(self) -> float:
        typical = self._average_s if self._average_s is not None else 0.0
        return min(self.ceiling_s, max(self.floor_s, self._factor * typical))


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
        "_on_aside",
        "_patience",
        "_started",
        "_timer",
        "heard_at",
    )

    def __init__(
        self, gates: Sequence[asyncio.Semaphore], *, patience: Patience, aside: Aside,
        on_aside: Callable[[], None] | None = None,
    ) -> None:
        self._gates: Sequence[asyncio.Semaphore] | None = gates
        self._patience = patience
        self._aside = aside
        self._on_aside = on_aside
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
        if self._on_aside is not None:
            self._on_aside()

    def _give_slots_back(self) -> None:
        gates, self._gates = self._gates, None
        for gate in reversed(gates or ()):
            gate.release()


@contextlib.asynccontextmanager
async def patient_slots(
    gates: Sequence[asyncio.Semaphore], *, patience: Patience, aside: Aside,
    on_aside: Callable[[], None] | None = None,
) -> AsyncIterator[Held]:
    """Acquire `gates` in order and lend them to the block (`Held`); `on_aside` is called if
    it steps aside."""
    acquired: list[asyncio.Semaphore] = []
    try:
        for gate in gates:
            await gate.acquire()
            acquired.append(gate)
    except BaseException:
        for gate in reversed(acquired):
            gate.release()
        raise
    held = Held(acquired, patience=patience, aside=aside, on_aside=on_aside)
    try:
        yield held
    finally:
        held.release()


def suspect_slots(concurrency: int, share: int = DEFAULT_SLOTS.suspect_slot_share,
                  ) -> tuple[int, int]:
    """(healthy slots, suspect slots) out of `concurrency`, one in `share` (at least one each)
    for the suspects (`SlotTuning.suspect_slot_share`)."""
    suspect = max(1, concurrency // share)
    return max(1, concurrency - suspect), suspect


def _nothing() -> None:
    return None


class Lanes(Generic[K]):
    """The slots of one fan-out over clusters (a round's or a save's), `concurrency` at once.

    The `suspects` (last seen unreachable) run in a small lane of their own while it has room,
    the others of them behind every healthy cluster (the caller starts them last: the gates
    are FIFO), so while they hang they hold none of the slots the healthy clusters wait for.
    The healthy lane is patient (`patient_slots`): a holder that hears nothing within the
    patience gives its slots back and waits aside. One seen unreachable since the fan-out
    began (`suspected`, asked when its turn comes) gives its slot back and waits behind the
    others. `shared`, if given, bounds several fan-outs at once (the rounds of the shards a
    process holds)."""

    def __init__(
        self, concurrency: int, *, suspects: Collection[K], ceiling_s: float,
        suspected: Callable[[K], bool] | None = None,
        shared: asyncio.Semaphore | None = None, tuning: SlotTuning = DEFAULT_SLOTS,
    ) -> None:
        self.suspects: frozenset[K] = frozenset(suspects)
        if self.suspects:
            healthy, lane = suspect_slots(concurrency, tuning.suspect_slot_share)
            self._healthy, self._lane = asyncio.Semaphore(healthy), asyncio.Semaphore(lane)
        else:
            self._healthy = self._lane = asyncio.Semaphore(concurrency)
        self._shared = [shared] if shared is not None else []
        self._suspected = suspected
        # One patience for the whole fan-out: it learns how long this fleet takes to answer.
        self.patience = Patience(ceiling_s=ceiling_s, tuning=tuning)
        self.aside = Aside(concurrency * tuning.aside_per_slot)

    @contextlib.asynccontextmanager
    async def slot(
        self, cluster: K, *, on_aside: Callable[[], None] | None = None
    ) -> AsyncIterator[Callable[[], None]]:
        """A slot for `cluster`'s work; the block calls what it is given on the cluster's
        first answer. `on_aside` is called when the cluster stops holding the healthy lane
        (it heard nothing within the patience, or it was seen unreachable when its turn
        came); a suspect is aside from the start (the caller knows: `suspects`)."""
        if cluster in self.suspects and not self._lane.locked():
            # Expected silent: their own small lane, held for their timeouts.
            async with self._lane, self._shared[0] if self._shared else contextlib.nullcontext():
                yield _nothing
            return
        gates = [self._healthy, *self._shared]
        async with patient_slots(gates, patience=self.patience, aside=self.aside,
                                 on_aside=on_aside) as held:
            if (cluster in self.suspects or self._suspected is None
                    or not self._suspected(cluster)):
                yield held.heard
                return
        # Seen unreachable since the fan-out began: behind every cluster waiting now.
        if on_aside is not None:
            on_aside()
        async with patient_slots(gates, patience=self.patience, aside=self.aside) as held:
            yield held.heard
