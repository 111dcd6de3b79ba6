"""Slots given back by holders that hear nothing (`convergerd.slots`), on fake time: a holder
as the prober holds one (`Held` over a semaphore), and a fan-out's workers (`Lanes.run`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from convergerd.config import SlotTuning
from convergerd.slots import Aside, Held, Lanes, Patience

PATIENCE_FACTOR = SlotTuning().patience_factor

pytestmark = pytest.mark.looptime


def test_patience_is_a_multiple_of_the_typical_answer_within_its_bounds() -> None:
    patience = Patience(floor_s=1.0, ceiling_s=5.0)
    assert patience.seconds == 1.0  # nothing seen yet: the floor
    patience.observe(0.01)
    assert patience.seconds == 1.0  # fast answers: still the floor
    for _ in range(200):
        patience.observe(0.5)  # a loaded loop: answers take half a second
    assert patience.seconds == pytest.approx(PATIENCE_FACTOR * 0.5, rel=0.01)
    for _ in range(200):
        patience.observe(30.0)
    assert patience.seconds == 5.0  # never past the ceiling (the request timeout)


async def test_a_holder_that_hears_nothing_gives_its_slots_back_after_the_patience() -> None:
    gate = asyncio.Semaphore(1)
    aside = Aside(10)
    loop = asyncio.get_running_loop()
    start = loop.time()
    second_got_it: list[float] = []

    async def silent() -> None:
        async with patient_slots([gate], patience=Patience(floor_s=1.0, ceiling_s=5.0),
                                 aside=aside):
            await asyncio.sleep(5.0)  # waits its timeout out

    async def next_in_line() -> None:
        async with gate:
            second_got_it.append(loop.time() - start)

    first = asyncio.create_task(silent())
    await asyncio.sleep(0)
    await next_in_line()
    assert second_got_it == [pytest.approx(1.0)]  # not 5.0
    assert (aside.count, aside.total) == (1, 1)
    await first
    assert aside.count == 0
    assert await free_slots(gate) == 1  # given back once, not twice


async def test_a_holder_that_heard_back_keeps_its_slots_and_teaches_the_patience() -> None:
    gate = asyncio.Semaphore(1)
    patience = Patience(floor_s=0.1, ceiling_s=5.0)
    aside = Aside(10)
    async with patient_slots([gate], patience=patience, aside=aside) as held:
        await asyncio.sleep(0.05)
        held.heard()
        await asyncio.sleep(3.0)  # long work after its answer: it is not hung
        assert gate.locked()
    assert aside.total == 0
    assert patience.seconds == pytest.approx(PATIENCE_FACTOR * 0.05)


async def test_a_slow_fleet_teaches_the_patience_from_those_that_stepped_aside() -> None:
    """Every answer takes 1.5 s, over the 1 s floor: the first holder steps aside, but its
    answer, when it comes, raises the patience to 4 x 1.5 s, so the holders after it keep their
    slots: the work in flight stays at the slot and that one, not the slot plus a full aside."""
    gate = asyncio.Semaphore(1)
    aside = Aside(4)
    patience = Patience(floor_s=1.0, ceiling_s=10.0)
    inside = 0
    most = 0

    async def slow() -> None:
        nonlocal inside, most
        async with patient_slots([gate], patience=patience, aside=aside) as held:
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(1.5)
            held.heard()
            inside -= 1

    await asyncio.gather(*(slow() for _ in range(10)))
    assert aside.total == 1
    assert most == 2
    assert patience.seconds > 1.5


async def test_with_the_aside_full_a_silent_holder_keeps_its_slots_until_there_is_room() -> None:
    gate = asyncio.Semaphore(2)
    aside = Aside(1)
    patience = Patience(floor_s=1.0, ceiling_s=5.0)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def silent(for_s: float) -> None:
        async with patient_slots([gate], patience=patience, aside=aside):
            await asyncio.sleep(for_s)

    one = asyncio.create_task(silent(2.5))
    two = asyncio.create_task(silent(10.0))
    await asyncio.sleep(1.5)
    assert aside.count == 1  # one stepped aside...
    assert await free_slots(gate) == 1  # ...and gave its slot back
    async with gate:  # the other holds its slot until the first leaves the aside (at 2.5 s)
        pass
    assert loop.time() - start == pytest.approx(1.5)
    await one
    await asyncio.sleep(0.6)  # the second asks again at 2 s and 3 s: room at 3 s
    assert aside.count == 1
    assert await free_slots(gate) == 2
    await two


@contextlib.asynccontextmanager
async def patient_slots(gates: Sequence[asyncio.Semaphore], *, patience: Patience,
                        aside: Aside) -> AsyncIterator[Held]:
    """`gates` taken, then lent as the prober lends its slot (`status.probe`)."""
    for gate in gates:
        await gate.acquire()
    held = Held(gates, patience=patience, aside=aside)
    try:
        yield held
    finally:
        held.release()


# --- a fan-out's workers (`Lanes.run`) -------------------------------------------------------

TUNING = SlotTuning(patience_floor_s=1.0, aside_per_slot=4)


def lanes(concurrency: int, *, suspects: Sequence[str] = (),
          suspected: Callable[[str], bool] | None = None,
          shared: asyncio.Semaphore | None = None) -> Lanes[str, float | None]:
    return Lanes(concurrency, suspects=suspects, ceiling_s=5.0, suspected=suspected,
                 shared=shared, tuning=TUNING)


class Clusters:
    """Clusters that answer after their `answer_s` (None: silent for 5 s, then done), noting
    when each started and how many were in flight at most."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.started: dict[str, float] = {}
        self.inside = self.most = 0

    async def work(self, cluster: str, answer_s: float | None,
                   heard: Callable[[], None]) -> None:
        self.started[cluster] = self.loop.time() - self.start
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            if answer_s is None:
                await asyncio.sleep(5.0)
                return
            await asyncio.sleep(answer_s)
            heard()
        finally:
            self.inside -= 1


async def test_a_fan_out_runs_each_cluster_in_order_with_at_most_its_slots_at_once() -> None:
    seen = Clusters()
    await lanes(3).run([(f"c{i}", 0.5) for i in range(9)], seen.work)
    assert seen.most == 3
    assert list(seen.started) == [f"c{i}" for i in range(9)]
    assert seen.started["c8"] == pytest.approx(1.0)  # three waves of half a second


async def test_a_silent_cluster_gives_its_slot_to_the_next_and_finishes_aside() -> None:
    seen = Clusters()
    fan_out = lanes(1)
    gave: list[str] = []
    await fan_out.run([("silent", None), ("next", 0.1), ("last", 0.1)], seen.work,
                      on_aside=lambda cluster, _: gave.append(cluster))
    assert seen.started["next"] == pytest.approx(1.0)  # the patience's floor, not 5 s
    assert seen.started["last"] == pytest.approx(1.1)  # one worker still: the slot, not two
    assert gave == ["silent"]
    assert (fan_out.aside.count, fan_out.aside.total) == (0, 1)


async def test_suspects_hang_in_their_own_lane_and_the_rest_behind_every_healthy_one() -> None:
    """8 slots: one for the suspects' lane, 7 for the rest. 3 hung suspects: one in the lane
    from the start, the two others after the 14 healthy clusters (two waves of 0.5 s)."""
    seen = Clusters()
    hung = ["h0", "h1", "h2"]
    healthy = [f"c{i:02}" for i in range(14)]
    asides: list[str] = []
    await lanes(8, suspects=hung).run(
        [(c, None) for c in hung] + [(c, 0.5) for c in healthy], seen.work,
        on_aside=lambda cluster, _: asides.append(cluster))
    assert seen.started["h0"] == 0.0
    assert max(seen.started[c] for c in healthy) == pytest.approx(0.5)
    assert seen.started["h1"] == seen.started["h2"] == pytest.approx(1.0)
    assert asides == []  # a suspect is aside from the start: the caller knows


async def test_a_cluster_seen_unreachable_when_its_turn_comes_goes_behind_the_others() -> None:
    seen = Clusters()
    down = {"b"}
    asides: list[str] = []
    await lanes(1, suspected=down.__contains__).run(
        [("a", 0.1), ("b", 0.1), ("c", 0.1)], seen.work,
        on_aside=lambda cluster, _: asides.append(cluster))
    assert list(seen.started) == ["a", "c", "b"]  # run once, last
    assert asides == ["b"]


async def test_a_cluster_seen_unreachable_while_the_process_slots_are_full_goes_behind(
) -> None:
    """Its turn comes when a slot is held: seen unreachable while the worker waited for the
    process's slots (another shard's round held them), it goes behind the others."""
    shared = asyncio.Semaphore(1)
    await shared.acquire()  # another round holds the process's only slot
    seen = Clusters()
    down: set[str] = set()
    fan_out = asyncio.create_task(lanes(1, suspected=down.__contains__, shared=shared).run(
        [("a", 0.1), ("b", 0.1)], seen.work))
    await asyncio.sleep(1.0)
    down.add("a")
    shared.release()
    await fan_out
    assert list(seen.started) == ["b", "a"]


async def test_a_shared_gate_bounds_two_fan_outs_at_once() -> None:
    shared = asyncio.Semaphore(3)
    seen = Clusters()
    one, two = lanes(3, shared=shared), lanes(3, shared=shared)
    await asyncio.gather(one.run([(f"a{i}", 0.5) for i in range(6)], seen.work),
                         two.run([(f"b{i}", 0.5) for i in range(6)], seen.work))
    assert seen.most == 3
    assert await free_slots(shared) == 3


async def test_a_failing_cluster_cancels_the_others_and_every_slot_comes_back() -> None:
    shared = asyncio.Semaphore(4)
    seen = Clusters()

    async def work(cluster: str, answer_s: float | None, heard: Callable[[], None]) -> None:
        if cluster == "bad":
            raise RuntimeError("bad answer")
        await seen.work(cluster, answer_s, heard)

    with pytest.raises(ExceptionGroup) as caught:
        await lanes(4, shared=shared).run([("a", None), ("b", None), ("bad", 0.0)], work)
    assert caught.group_contains(RuntimeError)
    assert seen.inside == 0
    assert await free_slots(shared) == 4


async def free_slots(gate: asyncio.Semaphore) -> int:
    """How many slots `gate` has free now (taken and given back at once)."""
    taken = 0
    while not gate.locked():
        await gate.acquire()
        taken += 1
    for _ in range(taken):
        gate.release()
    return taken

