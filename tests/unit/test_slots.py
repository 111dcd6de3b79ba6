"""Slots given back by holders that hear nothing (`convergerd.slots`), on fake time."""

from __future__ import annotations

import asyncio

import pytest

from convergerd.config import SlotTuning
from convergerd.slots import Aside, Patience, patient_slots

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


async def test_cancelled_while_acquiring_a_later_gate_gives_the_earlier_back() -> None:
    first, second = asyncio.Semaphore(1), asyncio.Semaphore(1)
    await second.acquire()
    task = asyncio.create_task(_hold([first, second]))
    await asyncio.sleep(1.0)
    assert first.locked()  # it holds the first while it waits for the second
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not first.locked()


async def _hold(gates: list[asyncio.Semaphore]) -> None:
    async with patient_slots(gates, patience=Patience(floor_s=1.0, ceiling_s=5.0),
                             aside=Aside(1)):
        await asyncio.sleep(100.0)


async def free_slots(gate: asyncio.Semaphore) -> int:
    """How many slots `gate` has free now (taken and given back at once)."""
    taken = 0
    while not gate.locked():
        await gate.acquire()
        taken += 1
    for _ in range(taken):
        gate.release()
    return taken
