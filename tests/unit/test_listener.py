"""The notification listener's queue, with a hand-written source and saver: one save per
waiting id, a change during a save saved again, standbys and bad payloads never save, one
sender or made-up ids cannot take the room of the others."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from convergerd.delivery.listener import Listener


@dataclass
class Counts:
    handled: dict[str, int] = field(default_factory=dict)
    connected: bool = False

    def listener_connected(self, connected: bool) -> None:
        self.connected = connected

    def listener_reconnect(self) -> None:
        raise AssertionError("no reconnection expected")

    def notification(self, handling: str) -> None:
        self.handled[handling] = self.handled.get(handling, 0) + 1


class OpenSubscription:
    def is_closed(self) -> bool:
        return False

    async def ping(self, timeout_s: float) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class Source:
    deliver: Callable[[str, int], None] | None = None

    async def subscribe(self, channel: str, on_payload: Callable[[str, int], None],
                        on_lost: Callable[[], None]) -> OpenSubscription:
        self.deliver = on_payload
        return OpenSubscription()


@dataclass
class GatedSaver:
    """Each save waits for `gate`; `started` is set when one begins."""

    saved: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def save(self, policy_id: str, *, trigger: str) -> object:
        self.started.set()
        await self.gate.wait()
        self.saved.append(policy_id)
        return None


@contextlib.asynccontextmanager
async def running(
    saver: GatedSaver, counts: Counts, *, leading: bool = True, max_pending: int = 100,
    known: frozenset[str] | None = None, max_unknown: int = 100,
) -> AsyncIterator[Callable[..., None]]:
    """Yields `notify(payload, sender=1)`."""
    source = Source()
    listener = Listener(source=source, saver=saver, leading=lambda: leading, observer=counts,
                        workers=1, max_pending=max_pending, max_unknown=max_unknown,
                        known=lambda p: known is None or p in known)
    task = asyncio.create_task(listener.run())
    while source.deliver is None:
        await asyncio.sleep(0)
    deliver = source.deliver

    def notify(payload: str, sender: int = 1) -> None:
        deliver(payload, sender)

    try:
        yield notify
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


async def test_waiting_ids_are_saved_once_and_a_change_during_a_save_again() -> None:
    saver, counts = GatedSaver(), Counts()
    async with running(saver, counts) as notify:
        notify("p-a")
        await saver.started.wait()  # p-a's save runs (and may have read the old row)
        for payload in ("p-a", "p-a", "p-b", "p-b", "p-a"):
            notify(payload)
        saver.gate.set()
        await until(lambda: len(saver.saved) == 3)
    assert saver.saved == ["p-a", "p-a", "p-b"]
    assert counts.handled == {"queued": 3, "duplicate": 3}
    assert counts.connected is False  # the listener stopped


async def test_standbys_and_bad_payloads_never_save() -> None:
    saver, counts = GatedSaver(), Counts()
    saver.gate.set()
    async with running(saver, counts, leading=False) as notify:
        notify("p-a")
        notify("")
        notify("Not_An_Id")
    assert saver.saved == []
    assert counts.handled == {"standby": 1, "invalid": 2}


async def test_beyond_the_bound_notifications_are_dropped() -> None:
    saver, counts = GatedSaver(), Counts()
    async with running(saver, counts, max_pending=2) as notify:
        notify("p-a")
        await saver.started.wait()
        for sender, payload in enumerate(("p-b", "p-c", "p-d")):
            notify(payload, sender)
        saver.gate.set()
        await until(lambda: len(saver.saved) == 3)
    assert saver.saved == ["p-a", "p-b", "p-c"]
    assert counts.handled == {"queued": 3, "overflow": 1}


async def test_one_sender_cannot_fill_the_queue() -> None:
    saver, counts = GatedSaver(), Counts()
    async with running(saver, counts, max_pending=8) as notify:
        notify("p-first", 7)
        await saver.started.wait()
        for n in range(100):  # one backend floods known ids: a quarter of the room is its
            notify(f"p-{n}", 666)
        notify("p-genuine", 42)
        saver.gate.set()
        await until(lambda: "p-genuine" in saver.saved)
    assert counts.handled["sender_overflow"] == 98
    assert saver.saved == ["p-first", "p-0", "p-1", "p-genuine"]


async def test_made_up_ids_cannot_crowd_out_known_ones() -> None:
    saver, counts = GatedSaver(), Counts()
    known = frozenset({"p-first", "p-real"})
    async with running(saver, counts, known=known, max_unknown=8) as notify:
        notify("p-first", 7)
        await saver.started.wait()
        for sender in range(10):  # ten backends, 3,000 made-up ids each
            for n in range(3_000):
                notify(f"made-up-{sender}-{n}", 1000 + sender)
        notify("p-real", 42)
        notify("p-new", 43)  # a new policy: the lane of unknown ids is full, left to the round
        saver.gate.set()
        await until(lambda: "p-real" in saver.saved)
    assert counts.handled["unknown_overflow"] == 30_000 - 8 + 1
    assert counts.handled["queued"] == 1 + 8 + 1
    assert "p-new" not in saver.saved
