"""Saves on a database notification: a module that only writes the `policies` table still gets
its change delivered at once, not at the next round.

A trigger (migration 0001) sends the policy's id on channel `convergerd_policies` after every
insert, update and delete. Every replica listens, on a connection of its own; only the replica
that leads when the notification is handled fans it out (`Saver.save(id, trigger="notify")`,
under the leader's fence), so a change fans out once, not once per replica. A notification
that arrives during a change of leader may be handled by nobody; so may one sent while a
listener reconnects: the next round delivers the change either way (rounds re-apply every
policy).

Notifications are untrusted input: PostgreSQL lets any role that can connect to the database
NOTIFY any channel, ours included, so a payload may come from anyone with a login, in any
number. What a notification can cost is bounded, and genuine ones cannot be pushed out:

- a payload that is not a valid policy id is counted and dropped;
- ids wait in a de-duplicated queue (an id already waiting is not queued twice; one being
  saved is queued again, since that save may have read the row before the change) handled by
  a few workers; beyond `max_pending` ids a notification is dropped, for the round to catch up;
- one sender (the backend process id PostgreSQL gives with each notification) may have at
  most a quarter of `max_pending` ids waiting, so one flooding connection cannot fill the
  queue;
- an id the last round did not load (`known`) is a new policy or a made-up one: at most
  `max_unknown` such ids wait at once, a quarter of them from one sender, so 30,000 made-up
  ids cannot crowd out the known policies' notifications (a new policy's notification dropped
  while that lane is full is delivered by the next round).

"An unexpected role" cannot be told apart here: a notification carries its sender's process
id, not its role (finding the role costs a query per sender, and the trigger's notifications
come from whichever role wrote the policy). Refuse unknown roles at the database (pg_hba,
CONNECT privilege); the budgets above keep a flood from any one connection to its share.

Every drop is counted in `convergerd_notifications_total{handling}`; the warnings about them
go through a `LogThrottle` (a few lines per reason a minute, then one summary line), so a
flood of 50,000 notifications writes a handful of lines.

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
from convergerd.logthrottle import LogThrottle
from convergerd.retry import Random, backoff_s

log = logging.getLogger(__name__)

CHANNEL = "convergerd_policies"
WORKERS = 4
MAX_PENDING = 10_000
# Ids no round loaded (a new policy, or made up) waiting at once: each is a quick "not found"
# save, a new policy's is delivered by the next round when it is dropped.
MAX_UNKNOWN = 100
# One sender's share of what may wait (of `max_pending`, of `max_unknown`).
SENDER_SHARE = 4
PING_PERIOD_S = 30.0
PING_TIMEOUT_S = 5.0
# Between reconnection attempts: full jitter, from half a second up to half a minute.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0


class NotifySubscription(Protocol):
    def is_closed(self) -> bool: ...
    async def ping(self, timeout_s: float) -> None: ...
    async def close(self) -> None: ...


class NotifySource(Protocol):
    """LISTEN on a channel (`convergerd.store.notify.PgNotifications`); raises
    `DatabaseUnavailable` when it cannot."""

    async def subscribe(
        self, channel: str, on_payload: Callable[[str, int], None],
        on_lost: Callable[[], None],
    ) -> NotifySubscription:
        """`on_payload(payload, sender)`: `sender` is the sending backend's process id."""
        ...


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
        known: Callable[[str], bool] = lambda _: True,
        max_unknown: int = MAX_UNKNOWN,
        ping_period_s: float = PING_PERIOD_S,
        rng: Random | None = None,
        throttle: LogThrottle | None = None,
    ) -> None:
        """`leading()`: whether this replica leads now (only then does it fan out);
        `known(id)`: whether the last round loaded that policy."""
        self._source = source
        self._saver = saver
        self._leading = leading
        self._observer = observer
        self._workers = workers
        self._max_pending = max_pending
        self._known = known
        self._max_unknown = max_unknown
        self._ping_period_s = ping_period_s
        self._rng: Random = rng or random.Random()
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._waiting = _Waiting()
        self._throttle = throttle or LogThrottle(log)

    # -- notifications ---------------------------------------------------------------------

    def on_payload(self, payload: str, sender: int = 0) -> None:
        """One notification from backend `sender` (called by the connection, never blocks)."""
        try:
            check_policy_id(payload)
        except RuleError:
            self._drop("invalid", "dropped a notification on %s from backend %d: %s is not a "
                       "policy id", CHANNEL, sender, shown(payload))
            return
        if not self._leading():
            self._observer.notification("standby")  # the leader's listener saves it
            return
        waiting = self._waiting
        if payload in waiting.sender:
            self._observer.notification("duplicate")
            return
        known = self._known(payload)
        if len(waiting.sender) >= self._max_pending:
            self._drop("overflow", "dropped the notification for policy %s: %d saves already "
                       "waiting; the next round delivers it", payload, len(waiting.sender))
            return
        if waiting.from_sender(sender) >= max(1, self._max_pending // SENDER_SHARE):
            self._drop("sender_overflow", "dropped the notification for policy %s: backend %d "
                       "has %d saves waiting, its share; the next round delivers it",
                       payload, sender, waiting.from_sender(sender))
            return
        if not known and (len(waiting.unknown) >= self._max_unknown or waiting.unknown_from(
                sender) >= max(1, self._max_unknown // SENDER_SHARE)):
            self._drop("unknown_overflow", "dropped the notification for policy %s from "
                       "backend %d: not in the last round, and %d such saves are waiting (%d "
                       "from that backend); the next round delivers it if it exists", payload,
                       sender, len(waiting.unknown), waiting.unknown_from(sender))
            return
        self._observer.notification("queued")
        waiting.add(payload, sender, known=known)
        self._queue.put_nowait(payload)

    def _drop(self, handling: str, msg: str, *args: object) -> None:
        self._observer.notification(handling)
        self._throttle.log(handling, logging.WARNING, msg, *args, extra={"channel": CHANNEL})

    async def _work(self) -> None:
        while True:
            policy_id = await self._queue.get()
            self._waiting.remove(policy_id)
            if not self._leading():
                continue  # leadership moved on: the new leader's round delivers it
            try:
                await self._saver.save(policy_id, trigger="notify")
            except DatabaseUnavailable as exc:
                # One line per notification would be a flood's: throttled.
                self._throttle.log("save_failed", logging.WARNING, "policy %s: save on "
                                   "notification failed (%s); the next round delivers it",
                                   policy_id, exc, extra={"policy": policy_id})
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


class _Waiting:
    """The ids waiting for a save: who sent each, how many each sender and the unknown ids
    hold (the budgets of `Listener.on_payload`)."""

    def __init__(self) -> None:
        self.sender: dict[str, int] = {}
        self.unknown: set[str] = set()
        self._by_sender: dict[int, int] = {}
        self._unknown_by_sender: dict[int, int] = {}

    def from_sender(self, sender: int) -> int:
        return self._by_sender.get(sender, 0)

    def unknown_from(self, sender: int) -> int:
        return self._unknown_by_sender.get(sender, 0)

    def add(self, policy_id: str, sender: int, *, known: bool) -> None:
        self.sender[policy_id] = sender
        self._by_sender[sender] = self._by_sender.get(sender, 0) + 1
        if not known:
            self.unknown.add(policy_id)
            self._unknown_by_sender[sender] = self._unknown_by_sender.get(sender, 0) + 1

    def remove(self, policy_id: str) -> None:
        sender = self.sender.pop(policy_id, None)
        if sender is None:
            return
        _decrement(self._by_sender, sender)
        if policy_id in self.unknown:
            self.unknown.discard(policy_id)
            _decrement(self._unknown_by_sender, sender)


def _decrement(counts: dict[int, int], key: int) -> None:
    """One less for `key`; gone at zero (the maps hold only senders with ids waiting)."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class ConnectionObserver(Protocol):
    def listener_connected(self, connected: bool) -> None: ...
    def listener_reconnect(self) -> None: ...


class Channel:
    """LISTEN on one channel for as long as it runs: each payload and its sender's process id
    to `on_payload` (which must not block), the connection kept (reconnected with backoff,
    pinged every `ping_period_s`).
    Notifications sent while it reconnects are lost: its users catch up by other means."""

    def __init__(
        self,
        source: NotifySource,
        channel: str,
        on_payload: Callable[[str, int], None],
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

    async def _until_lost(self, subscription: NotifySubscription, lost: asyncio.Event) -> str:
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
