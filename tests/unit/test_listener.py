"""The notification listener's queue, with a hand-written source and saver: one save per
waiting id, a change during a save saved again, standbys and bad payloads never save."""

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
    deliver: Callable[[str], None] | None = None

    async def subscribe(self, channel: str, on_payload: Callable[[str], None],
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
    saver: GatedSaver, counts: Counts, *, leading: bool = True, max_pending: int = 100
) -> AsyncIterator[Callable[[str], None]]:
    source = Source()
    listener = Listener(source=source, saver=saver, leading=lambda: leading, observer=counts,
                        workers=1, max_pending=max_pending)
    task = asyncio.create_task(listener.run())
    while source.deliver is None:
        await asyncio.sleep(0)
    try:
        yield source.deliver
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
        for payload in ("p-b", "p-c", "p-d"):
            notify(payload)
        saver.gate.set()
        await until(lambda: len(saver.saved) == 3)
    assert saver.saved == ["p-a", "p-b", "p-c"]
    assert counts.handled == {"queued": 3, "overflow": 1}
