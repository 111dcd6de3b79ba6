"""`Lapses`: the daemon notices expired exceptions even when nothing in the database changes
(docs/design.md, "Exceptions").

An expired exception already leaves what every round and save delivers (a policy's reads carry
only those in force, `store.exceptions.exceptions_column`), and a round's plan compares the
whole spec, so the next round re-delivers the Policy without it. This task makes that a save:
at each expiry (and at least every `period_s`), on every replica, it marks the expired
exceptions lapsed at a new revision of their policy in one transaction (the policies trigger
notifies, the leader saves it at once; another replica's pass finds nothing left to lapse), and
reads the per-policy tally the metrics show (`StatusReader.exception_tally`). The operators do
not wait for any of this: each stops honouring an exception at its expiresAt by itself.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from convergerd.core.errors import ConvergerdError
from convergerd.core.exceptions import EXPIRING_SOON_S, ExceptionTally
from convergerd.core.shown import describe

log = logging.getLogger(__name__)

# The longest between two passes: a new exception's expiry, the tally's 7-day edge and the
# expired ones a round delivered since are seen within this.
PERIOD_S = 30.0
# A pass never comes sooner than this after the last (an expiry in the past, a wrong clock).
MIN_WAIT_S = 0.5


class LapseSource(Protocol):
    """What the task reads and writes (`convergerd.store.store.Store`)."""

    async def lapse_exceptions(self) -> tuple[list[tuple[str, str, int]], dt.datetime | None]:
        ...

    async def exception_tally(self, soon_s: float, /) -> Sequence[ExceptionTally]: ...


class TallySink(Protocol):
    """Where the tally goes (`convergerd.status.state.StatusState`, one of its feeders)."""

    def set_exception_tally(self, tally: Iterable[ExceptionTally], /) -> None: ...


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Lapses:
    def __init__(self, store: LapseSource, state: TallySink, *, period_s: float = PERIOD_S,
                 wall: Callable[[], dt.datetime] = _utcnow) -> None:
        self.store = store
        self.state = state
        self.period_s = period_s
        self._wall = wall

    async def once(self) -> float:
        """One pass; the seconds until the next one (the next expiry, within the period)."""
        try:
            lapsed, upcoming = await self.store.lapse_exceptions()
            self.state.set_exception_tally(await self.store.exception_tally(EXPIRING_SOON_S))
        except (ConvergerdError, OSError) as exc:
            log.warning("exceptions: reading the database failed: %s; again in %g s",
                        describe(exc), self.period_s)
            return self.period_s
        for policy, exception, revision in lapsed:
            log.info("policy %s: exception %s expired: revision %d delivers the policy "
                     "without it", policy, exception, revision,
                     extra={"policy": policy, "exception": exception})
        if upcoming is None:
            return self.period_s
        wait = (upcoming - self._wall()).total_seconds()
        return min(self.period_s, max(MIN_WAIT_S, wait))

    async def run(self) -> None:
        while True:
            wait = await self.once()
            await asyncio.sleep(wait)
