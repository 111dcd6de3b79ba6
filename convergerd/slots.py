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
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Generic, TypeVar

from convergerd.config import SlotTuning

K = TypeVar("K", bound=str)  # a cluster id
T = TypeVar("T")  # what a cluster's work takes

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
        _released(gates or ())


def suspect_slots(concurrency: int, share: int = DEFAULT_SLOTS.suspect_slot_share,
                  ) -> tuple[int, int]:
    """(healthy slots, suspect slots) out of `concurrency`, one in `share` (at least one each)
    for the suspects (`SlotTuning.suspect_slot_share`)."""
    suspect = max(1, concurrency // share)
    return max(1, concurrency - suspect), suspect


def _nothing() -> None:
    return None


class Lanes(Generic[K, T]):
    """The slots of one fan-out over clusters (a round's or a save's), `concurrency` at once:
    `run` takes each cluster's work in turn on one task per slot, not one task per cluster
    queued on a semaphore (at 10,000 clusters that is 10,000 tasks with their waiters alive for
    the whole fan-out, for 64 doing anything: bench/RESULTS.md, "A save on workers again").

    The `suspects` (last seen unreachable) run in a small lane of their own while it has room,
    the others of them behind every healthy cluster, so while they hang they hold none of the
    slots the healthy clusters wait for. The healthy lane is patient: a cluster that hears
    nothing within the patience (`Held`) gives its slot back (another worker takes the next
    cluster) and finishes aside. One seen unreachable since the fan-out began (`suspected`,
    asked when its turn comes) goes behind the others. `shared`, if given, bounds several
    fan-outs at once (the rounds of the shards a process holds): each cluster's work holds
    one of its slots too."""

    def __init__(
        self, concurrency: int, *, suspects: Collection[K], ceiling_s: float,
        suspected: Callable[[K], bool] | None = None,
        shared: asyncio.Semaphore | None = None, tuning: SlotTuning = DEFAULT_SLOTS,
    ) -> None:
        self.suspects: frozenset[K] = frozenset(suspects)
        if self.suspects:
            self.healthy_slots, self.lane_slots = suspect_slots(
                concurrency, tuning.suspect_slot_share)
        else:
            self.healthy_slots, self.lane_slots = concurrency, 0
        self.shared = [shared] if shared is not None else []
        self.suspected = suspected
        # One patience for the whole fan-out: it learns how long this fleet takes to answer.
        self.patience = Patience(ceiling_s=ceiling_s, tuning=tuning)
        self.aside = Aside(concurrency * tuning.aside_per_slot)

    async def run(
        self, todo: Iterable[tuple[K, T]],
        work: Callable[[K, T, Callable[[], None]], Awaitable[object]], *,
        on_aside: Callable[[K, T], None] | None = None,
    ) -> None:
        """`work(cluster, item, heard)` for each of `todo`, in its order (the suspects after
        the rest); the work calls `heard` on the cluster's first answer. `on_aside(cluster,
        item)` is called when a cluster stops holding the healthy lane (it heard nothing
        within the patience, or it was seen unreachable when its turn came); a suspect is
        aside from the start (the caller knows: `suspects`). An exception from any work
        cancels the rest (a TaskGroup's)."""
        await _Run(self, todo, work, on_aside).run()


class _Turn(Generic[K, T]):
    """One cluster's turn on a patient worker; `step_aside` is its `Held`'s `on_aside`."""

    __slots__ = ("aside", "cluster", "item", "patient", "run")

    def __init__(self, run: _Run[K, T], cluster: K, item: T, *, patient: bool) -> None:
        self.run, self.cluster, self.item, self.patient = run, cluster, item, patient
        self.aside = False

    def step_aside(self) -> None:
        self.aside = True
        self.run.worker_for_slot_given_back()
        if self.patient and self.run.on_aside is not None:
            self.run.on_aside(self.cluster, self.item)


class _Run(Generic[K, T]):
    """One `Lanes.run`: the clusters waiting for their turn, and the workers that take them."""

    def __init__(
        self, lanes: Lanes[K, T], todo: Iterable[tuple[K, T]],
        work: Callable[[K, T, Callable[[], None]], Awaitable[object]],
        on_aside: Callable[[K, T], None] | None,
    ) -> None:
        self.lanes, self.work, self.on_aside = lanes, work, on_aside
        self.healthy: deque[tuple[K, T]] = deque()
        self.suspects: deque[tuple[K, T]] = deque()
        for entry in todo:
            (self.suspects if entry[0] in lanes.suspects else self.healthy).append(entry)
        self.later: deque[tuple[K, T]] = deque()  # seen unreachable when their turn came
        self._tg = asyncio.TaskGroup()

    async def run(self) -> None:
        lanes = self.lanes
        async with self._tg:
            for _ in range(min(lanes.lane_slots, len(self.suspects))):
                self._tg.create_task(self._lane_worker())
            for _ in range(min(lanes.healthy_slots, len(self.healthy) + len(self.suspects))):
                self._tg.create_task(self._patient_worker())

    def worker_for_slot_given_back(self) -> None:
        worker = self._patient_worker()
        try:
            self._tg.create_task(worker)
        except RuntimeError:  # the fan-out is being cancelled: no more clusters to take
            worker.close()

    def _next_turn(self) -> _Turn[K, T] | None:
        suspected = self.lanes.suspected
        while self.healthy:
            cluster, item = self.healthy.popleft()
            if suspected is not None and suspected(cluster):
                if self.on_aside is not None:
                    self.on_aside(cluster, item)
                self.later.append((cluster, item))
                continue
            return _Turn(self, cluster, item, patient=True)
        for rest in (self.suspects, self.later):
            if rest:
                cluster, item = rest.popleft()
                return _Turn(self, cluster, item, patient=False)
        return None

    async def _patient_worker(self) -> None:
        lanes = self.lanes
        while self.healthy or self.suspects or self.later:
            # The turn is taken once the slot is held: a cluster seen unreachable while this
            # worker waited for the process's slots still goes behind the others.
            gates = await _acquired(lanes.shared)
            turn = self._next_turn()
            if turn is None:
                _released(gates)
                return
            held = Held(gates, patience=lanes.patience, aside=lanes.aside,
                        on_aside=turn.step_aside)
            try:
                await self.work(turn.cluster, turn.item, held.heard)
            finally:
                held.release()
            if turn.aside:
                return  # its slot went to another worker

    async def _lane_worker(self) -> None:
        # Expected silent: held for their timeouts, in their own small lane.
        while self.suspects:
            cluster, item = self.suspects.popleft()
            gates = await _acquired(self.lanes.shared)
            try:
                await self.work(cluster, item, _nothing)
            finally:
                _released(gates)


async def _acquired(gates: Sequence[asyncio.Semaphore]) -> list[asyncio.Semaphore]:
    """`gates` acquired in order; if cancelled meanwhile, those taken given back."""
    acquired: list[asyncio.Semaphore] = []
    try:
        for gate in gates:
            await gate.acquire()
            acquired.append(gate)
    except BaseException:
        _released(acquired)
        raise
    return acquired


def _released(gates: Sequence[asyncio.Semaphore]) -> None:
    for gate in reversed(gates):
        gate.release()
