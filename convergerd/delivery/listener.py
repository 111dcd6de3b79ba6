"""Saves on a database notification: a module that only writes the `policies` table still gets
its change delivered at once, not at the next round.

A trigger (migration 0001) sends the policy's id on channel `convergerd_policies` after every
insert, update and delete. Every replica listens, on a connection of its own; only the replica
that leads when the notification is handled fans it out (`Saver.save(id, trigger="notify")`,
under the leader's fence), so a change fans out once, not once per replica. A notification
that arrives during a change of leader may be handled by nobody; so may one sent while a
listener reconnects: the next round delivers the change either way (rounds re-apply every
policy).

Notifications are untrusted input: a payload that is not a valid policy id is logged (escaped,
shortened) and dropped. Ids wait in a de-duplicated queue (an id already waiting is not queued
twice; one being saved is queued again, since that save may have read the row before the
change) handled by a few workers; beyond `max_pending` ids a notification is dropped with a
warning, for the round to catch up.

A lost connection is logged, shown by `convergerd_notify_listener_connected` (0), and
reconnected with backoff (`retry.backoff_s`); each reconnection counts in
`convergerd_notify_listener_reconnects_total`. A ping every `ping_period_s` finds a connection
that died without the client noticing (a half-open TCP connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Protocol

from convergerd.core.errors import DatabaseUnavailable
from convergerd.core.model import RuleError, check_policy_id
from convergerd.core.shown import shown
from convergerd.retry import Random, backoff_s

log = logging.getLogger(__name__)

CHANNEL = "convergerd_policies"
WORKERS = 4
MAX_PENDING = 10_000
PING_PERIOD_S = 30.0
PING_TIMEOUT_S = 5.0
# Between reconnection attempts: full jitter, from half a second up to half a minute.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0


class Subscription(Protocol):
    def is_closed(self) -> bool: ...
    async def ping(self, timeout_s: float) -> None: ...
    async def close(self) -> None: ...


class NotifySource(Protocol):
    """LISTEN on a channel (`convergerd.store.notify.PgNotifications`); raises
    `DatabaseUnavailable` when it cannot."""

    async def subscribe(
        self, channel: str, on_payload: Callable[[str], None], on_lost: Callable[[], None]
    ) -> Subscription: ...


class NotifySaver(Protocol):
    async def save(self, policy_id: str, *, trigger: str) -> object: ...


class ListenerObserver(Protocol):
    def listener_connected(self, connected: bool) -> None: ...
    def listener_reconnect(self) -> None: ...
    def notification(self, handling: str) -> None: ...


class Listener:
    def __init__(
        self,
        *,
        source: NotifySource,
        saver: NotifySaver,
        leading: Callable[[], bool],
        observer: ListenerObserver,
        workers: int = WORKERS,
        max_pending: int = MAX_PENDING,
        ping_period_s: float = PING_PERIOD_S,
        rng: Random | None = None,
    ) -> None:
        """`leading()`: whether this replica leads now (only then does it fan out)."""
        self._source = source
        self._saver = saver
        self._leading = leading
        self._observer = observer
        self._workers = workers
        self._max_pending = max_pending
        self._ping_period_s = ping_period_s
        self._rng: Random = rng or random.Random()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._pending: set[str] = set()

    # -- notifications ---------------------------------------------------------------------

    def on_payload(self, payload: str) -> None:
        """One notification (called by the connection, never blocks)."""
        try:
            check_policy_id(payload)
        except RuleError:
            self._observer.notification("invalid")
            log.warning("dropped a notification on %s: %s is not a policy id", CHANNEL,
                        shown(payload), extra={"channel": CHANNEL})
            return
        if not self._leading():
            self._observer.notification("standby")  # the leader's listener saves it
            return
        if payload in self._pending:
            self._observer.notification("duplicate")
            return
        if len(self._pending) >= self._max_pending:
            self._observer.notification("overflow")
            log.warning("dropped the notification for policy %s: %d saves already waiting; "
                        "the next round delivers it", payload, len(self._pending),
                        extra={"policy": payload})
            return
        self._observer.notification("queued")
        self._pending.add(payload)
        self._queue.put_nowait(payload)

    async def _work(self) -> None:
        while True:
            policy_id = await self._queue.get()
            self._pending.discard(policy_id)
            if not self._leading():
                continue  # leadership moved on: the new leader's round delivers it
            try:
                await self._saver.save(policy_id, trigger="notify")
            except DatabaseUnavailable as exc:
                log.warning("policy %s: save on notification failed (%s); the next round "
                            "delivers it", policy_id, exc, extra={"policy": policy_id})
            except Exception:
                # One bad save fails alone, never the listener.
                log.exception("policy %s: unexpected error saving on notification", policy_id,
                              extra={"policy": policy_id})

    # -- the connection --------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: listen, hand notifications to the workers, reconnect when the connection
        is lost."""
        channel = Channel(self._source, CHANNEL, self.on_payload, observer=self._observer,
                          ping_period_s=self._ping_period_s, rng=self._rng)
        async with asyncio.TaskGroup() as tg:
            for n in range(self._workers):
                tg.create_task(self._work(), name=f"notify worker {n}")
            tg.create_task(channel.run(), name="notify listener")


class ConnectionObserver(Protocol):
    def listener_connected(self, connected: bool) -> None: ...
    def listener_reconnect(self) -> None: ...


class Channel:
    """LISTEN on one channel for as long as it runs: each payload to `on_payload` (which must
    not block), the connection kept (reconnected with backoff, pinged every `ping_period_s`).
    Notifications sent while it reconnects are lost: its users catch up by other means."""

    def __init__(
        self,
        source: NotifySource,
        channel: str,
        on_payload: Callable[[str], None],
        *,
        observer: ConnectionObserver | None = None,
        ping_period_s: float = PING_PERIOD_S,
        rng: Random | None = None,
    ) -> None:
        self._source = source
        self._channel = channel
        self._on_payload = on_payload
        self._observer = observer
        self._ping_period_s = ping_period_s
        self._rng: Random = rng or random.Random()

    def _connected(self, connected: bool) -> None:
        if self._observer is not None:
            self._observer.listener_connected(connected)

    async def run(self) -> None:
        channel = self._channel
        failures = 0
        connected_before = False
        while True:
            lost = asyncio.Event()
            try:
                subscription = await self._source.subscribe(channel, self._on_payload, lost.set)
            except DatabaseUnavailable as exc:
                failures += 1
                wait = backoff_s(failures, base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S, rng=self._rng)
                log.warning("notification listener on %s cannot connect (%s); retrying in "
                            "%.1f s", channel, exc, wait, extra={"channel": channel})
                await asyncio.sleep(wait)
                continue
            if connected_before:
                if self._observer is not None:
                    self._observer.listener_reconnect()
                log.info("notification listener on %s reconnected; what was notified meanwhile"
                         " is caught up otherwise", channel, extra={"channel": channel})
            connected_before = True
            failures = 0
            self._connected(True)
            try:
                why = await self._until_lost(subscription, lost)
            finally:
                self._connected(False)
                with contextlib.suppress(Exception):
                    await subscription.close()
            log.warning("notification listener on %s lost its connection (%s); reconnecting",
                        channel, why, extra={"channel": channel})
            failures = 1
            await asyncio.sleep(
                backoff_s(failures, base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S, rng=self._rng))

    async def _until_lost(self, subscription: Subscription, lost: asyncio.Event) -> str:
        """Wait until the connection is gone (told, or found by a ping); say why."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._ping_period_s):
                    await lost.wait()
            if lost.is_set() or subscription.is_closed():
                return "connection closed"
            try:
                await subscription.ping(PING_TIMEOUT_S)
            except DatabaseUnavailable as exc:
                return str(exc)
