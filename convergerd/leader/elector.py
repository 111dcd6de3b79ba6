"""Leader election on a coordination.k8s.io/v1 Lease, with fencing.

Not kubernetes-asyncio's `leaderelection` (wall clock, no per-call timeout, keeps leading on
network errors). The arithmetic lives in `convergerd.leader.lease`; this module does the I/O.

Safety: a leader may write only while `now < last successful renew + renew deadline`, where
the renew time is the monotonic time at which the successful renew request was *sent*. Another
replica takes the Lease only after it has seen the record unchanged for the lease duration,
which the settings check keeps longer than renew deadline + retry period + request timeout. So
the round (cancelled through `wait_lost()` / `leadership_lost()`, and each write capped at
`fence().remaining_s()`) stops before anyone else can start.

Any failure of a renewal — timeout, connection error, 409, an answer that is not a Lease, an
unexpected exception — is a failed renewal: the renew time does not move, and when the deadline
passes leadership is lost.

The loop never stops on an error, and never fails quietly: the first failure in a row is a
warning (an unexpected exception an error with its traceback), repeated every
`STUCK_AFTER_DURATIONS` lease durations while it lasts, with what to check.

Health follows Kubernetes' conventions: liveness fails only when a restart would help,
readiness when the process cannot do its part and a restart would not change it.

- `problem()` (`/healthz`): the loop itself is stuck: no attempt has finished for that long
  (each one is bounded, so only a bug gets there);
- `unreachable()` (`/readyz`): for that long it has neither led nor seen the Lease validly held
  by another replica (the home cluster does not answer, the Lease cannot be written);
- `stalled()` (`/readyz`): another holder's record has not changed for
  `lease.STALLED_AFTER_DURATIONS` of our lease durations and its claim still runs (a holder
  that never renews, a hand-written duration): no round runs until it is taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from convergerd.config import Election
from convergerd.core.errors import ConvergerdError, Fenced, ObjectRejected
from convergerd.core.report import Epoch, utc_now
from convergerd.core.shown import describe, shown
from convergerd.kube.api import LeaseApi
from convergerd.leader.lease import (
    Fence,
    LeaseFormatError,
    LeaseReading,
    LeaseRecord,
    acquire_body,
    acquire_delay,
    can_acquire,
    honoured_duration_s,
    new_lease_body,
    observe,
    release_body,
    stalled_s,
    write_budget,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
ChangeHook = Callable[[bool, str | None], None]

# The elector is unready (`/readyz` fails, the warning is repeated) after this many lease
# durations without leading or seeing another valid holder: a healthy standby sees the holder
# at least every retry period, and a dead holder is replaced within one duration. Its loop is
# stuck (`/healthz` fails) after as long without an attempt finishing: an attempt takes at
# most two request timeouts, the pause after it at most 1.2 retry periods.
STUCK_AFTER_DURATIONS = 2.0


class Leadership(Protocol):
    """The surface the runtime uses; `Elector` and `NoElection` both provide it."""

    async def run(self) -> None: ...
    def stop(self) -> None: ...
    def is_leader(self) -> bool: ...
    @property
    def leader(self) -> str | None: ...
    @property
    def epoch(self) -> Epoch | None: ...
    @property
    def transitions(self) -> int: ...
    async def wait_leading(self) -> Epoch: ...
    async def wait_lost(self, epoch: Epoch | None = None) -> None: ...
    def leadership_lost(self) -> asyncio.Event: ...
    def fence(self, epoch: Epoch | None = None) -> Fence: ...
    def poke(self) -> None: ...
    async def release(self, *, stop: bool = True) -> None: ...
    def problem(self) -> str | None: ...
    def unreachable(self) -> str | None: ...
    def stalled(self) -> str | None: ...


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


class _Term:
    """One uninterrupted stretch of leadership."""

    __slots__ = ("epoch", "last_renew_mono", "lost", "over")

    def __init__(self, epoch: Epoch, last_renew_mono: float) -> None:
        self.epoch = epoch
        self.last_renew_mono = last_renew_mono
        self.lost = asyncio.Event()
        self.over = False


class _TermFence:
    """A fence bound to one term: once that term ends it stays closed, even if this replica
    leads again later (a new round must take a new fence)."""

    def __init__(self, elector: Elector, term: _Term | None) -> None:
        self._elector = elector
        self._term = term

    def remaining_s(self) -> float:
        term = self._term
        if term is None:
            raise Fenced("this replica is not the leader")
        if term.over:
            raise Fenced(f"leadership as {term.epoch} has ended")
        budget = self._elector.budget(term)
        if budget <= 0:
            self._elector.overdue(term)
            raise Fenced(f"Lease not renewed within the renew deadline as {term.epoch}")
        return budget


class Elector:
    """Takes and keeps the Lease named in `settings` through `api`."""

    def __init__(
        self,
        api: LeaseApi,
        settings: Election,
        *,
        clock: Callable[[], float] = _loop_time,
        wall: Callable[[], dt.datetime] = utc_now,
        on_change: ChangeHook | None = None,
        rng: random.Random | None = None,
        may_acquire: Callable[[], bool] | None = None,
    ) -> None:
        """`may_acquire()`: asked before taking the Lease (never before renewing it); a shard's
        elector takes its Lease only when the fair share says so (`convergerd.leader.shards`).
        Without it, always."""
        self._api = api
        self._may_acquire = may_acquire
        self._s = settings
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._rng = rng or random.Random()
        self._term: _Term | None = None
        self._leading = asyncio.Event()
        self._stop = asyncio.Event()
        self._nudge = asyncio.Event()  # ends the pause between attempts: stop, or `poke()`
        self._lock = asyncio.Lock()  # one Lease write sequence at a time (run vs release)
        self._observed: LeaseReading | None = None
        self._holder: str | None = None
        self._changes = 0
        self._failures = 0
        self._attempt_started = -math.inf
        self._watchdog: asyncio.TimerHandle | None = None
        # Health: when the elector last led or saw another valid holder (None: not running),
        # when an attempt last finished, when the Lease was last read, when it last warned
        # about failing, and the last failure (for `unreachable()`).
        self._progress_mono: float | None = None
        self._turned_mono = -math.inf
        self._read_mono = -math.inf
        self._warned_mono = -math.inf
        self._last_error: str | None = None
        self._stall_warned: LeaseReading | None = None

    @property
    def _where(self) -> str:
        return f"{self._s.lease_namespace}/{self._s.lease_name}"

    # -- public surface ------------------------------------------------------------------------

    @property
    def identity(self) -> str:
        return self._s.identity

    def is_leader(self) -> bool:
        term = self._term
        return term is not None and not term.over and self.budget(term) > 0

    @property
    def leader(self) -> str | None:
        """The holder we last observed (ourselves while leading); None when nobody holds it."""
        return self._holder

    @property
    def epoch(self) -> Epoch | None:
        term = self._term
        return term.epoch if term is not None and not term.over else None

    @property
    def transitions(self) -> int:
        """How many times this replica gained or lost leadership."""
        return self._changes

    async def wait_leading(self) -> Epoch:
        """Return once this replica leads, with the epoch it leads as."""
        while True:
            term = self._term
            if term is not None and not term.over:
                return term.epoch
            await self._leading.wait()

    async def wait_lost(self, epoch: Epoch | None = None) -> None:
        """Return once this replica no longer leads (as `epoch`, when given). Returns at once
        when it does not lead now."""
        term = self._term
        if term is None or term.over or (epoch is not None and term.epoch != epoch):
            return
        await term.lost.wait()

    def leadership_lost(self) -> asyncio.Event:
        """Set when the current term ends (lost, overdue, released, stopped); already set when
        this replica does not lead."""
        term = self._term
        if term is None or term.over:
            done = asyncio.Event()
            done.set()
            return done
        return term.lost

    def fence(self, epoch: Epoch | None = None) -> Fence:
        """A fence for the current term (for `epoch` only, when given)."""
        term = self._term
        if term is not None and (term.over or (epoch is not None and term.epoch != epoch)):
            term = None
        return _TermFence(self, term)

    def stop(self) -> None:
        """Make `run()` return (without releasing the Lease; see `release()`)."""
        self._stop.set()
        self._nudge.set()

    def poke(self) -> None:
        """Attempt now rather than after the pause: `may_acquire()` just began to allow it."""
        self._nudge.set()

    def problem(self) -> str | None:
        """Why the elector's loop is stuck, for `/healthz` (a restart would help); None while
        it turns: running, and no attempt has finished for `STUCK_AFTER_DURATIONS` lease
        durations. A failed attempt has finished: failures are `unreachable()`."""
        if self._progress_mono is None or self._stop.is_set():
            return None
        silent_s = self._clock() - self._turned_mono
        limit_s = self._stuck_after_s
        if silent_s <= limit_s:
            return None
        return (f"leader election loop stuck: no attempt on Lease {self._where} finished for "
                f"{silent_s:.0f} s (limit {limit_s:g} s)")

    def unreachable(self) -> str | None:
        """Why this replica cannot take part in the election, for `/readyz`; None while it
        can. Running, and for `STUCK_AFTER_DURATIONS` lease durations it has neither led
        (renewed) nor seen the Lease validly held by another replica: the home cluster does not
        answer, or the Lease cannot be read or written. Nobody is known to lead; a restart
        would not change that."""
        since = self._progress_mono
        if since is None or self._stop.is_set():
            return None
        stuck_s = self._clock() - since
        limit_s = self._stuck_after_s
        if stuck_s <= limit_s:
            return None
        return (f"leader election blocked: for {stuck_s:.0f} s (limit {limit_s:g} s) this "
                f"replica has neither led nor seen Lease {self._where} held by another live "
                f"replica (is the home cluster reachable?); last error: "
                f"{self._last_error or 'none'}")

    def stalled(self) -> str | None:
        """Why no round can run under the Lease's holder, for `/readyz`; None otherwise.
        Another holder's record, read within the last lease duration, has not changed for
        `lease.STALLED_AFTER_DURATIONS` lease durations while its claim (capped at
        `lease.MAX_PEER_DURATION_FACTOR` durations) still runs: it does not renew, and nobody
        may take the Lease before the claim runs out."""
        observed = self._observed
        now = self._clock()
        if observed is None or self._stop.is_set() or now - self._read_mono > self._duration_s:
            return None
        unchanged_s = stalled_s(observed, now, self.identity, own_duration_s=self._duration_s)
        if unchanged_s is None:
            return None
        record = observed.record
        honoured = honoured_duration_s(record.duration_s, self._duration_s)
        return (f"leadership stalled: Lease {self._where} is held by {shown(record.holder)}, "
                f"whose record has not changed for {unchanged_s:.0f} s (a live holder renews "
                f"every retry period), so no round runs; its claim of "
                f"{record.duration_s or self._duration_s:g} s (honoured up to {honoured:g} s) "
                f"lets this replica take the Lease in "
                f"{observed.expires_mono(self._duration_s) - now:.0f} s")

    @property
    def _duration_s(self) -> float:
        return self._s.lease_duration_s

    @property
    def _stuck_after_s(self) -> float:
        return STUCK_AFTER_DURATIONS * self._s.lease_duration_s

    def _progressed(self) -> None:
        # Reminders count from here: a failure is repeated once per stuck period without it.
        self._progress_mono = self._warned_mono = self._clock()

    async def run(self) -> None:
        """Acquire, then renew, until `stop()`, `release()` or cancellation."""
        log.info("leader election on Lease %s as %s", self._where, self.identity)
        self._progressed()  # startup counts as progress: a grace period
        self._turned_mono = self._clock()
        try:
            while not self._stop.is_set():
                async with self._lock:
                    if self._stop.is_set():
                        break
                    await self._attempt()
                await self._pause(self._next_delay())
        finally:
            term = self._term
            if term is not None:
                self._end(term, "the elector stopped", logging.WARNING)

    async def release(self, *, stop: bool = True) -> None:
        """Stop renewing; if the Lease is ours, write an empty holder so a standby takes over at
        once. One attempt, each request bounded by the request timeout; failures are logged.

        With `stop=False` (a shard handed back) the elector goes on watching the Lease, and
        takes it again only when `may_acquire()` says so. The caller has let the rounds
        writing under this Lease finish first: the term ends here, before the write that
        frees the Lease, so no fence of it opens again."""
        if stop:
            self.stop()
        async with self._lock:  # let an in-flight renewal finish: its RV is the precondition
            term = self._term
            if term is not None:
                self._end(term, "releasing the Lease" if stop else "handing the Lease back",
                          logging.INFO)
            if self._holder != self.identity:
                return
            try:
                current = await self._call(
                    self._api.get_lease(self._s.lease_namespace, self._s.lease_name,
                                        timeout_s=self._s.request_timeout_s))
                if current is None or LeaseRecord.from_object(current).holder != self.identity:
                    return
                written = await self._call(self._api.replace_lease(
                    release_body(current, now=self._wall()), timeout_s=self._s.request_timeout_s))
            except Exception as exc:
                log.warning("could not release Lease %s: %s; a standby takes over when it "
                            "expires", self._where,
                            "timed out" if isinstance(exc, TimeoutError) else describe(exc))
                return
            record = LeaseRecord.from_object(written)
            self._observed = LeaseReading(record, self._clock())
            self._set_holder(None)
            log.info("released Lease %s (holder was %s, transitions %d)",
                     self._where, self.identity, record.transitions)

    # -- used by fences ------------------------------------------------------------------------

    def budget(self, term: _Term) -> float:
        return write_budget(term.last_renew_mono, self._s.renew_deadline_s, self._clock())

    def overdue(self, term: _Term) -> None:
        if not term.over:
            self._end(term, f"not renewed within the renew deadline "
                            f"({self._s.renew_deadline_s:g} s)", logging.WARNING)

    # -- the loop --------------------------------------------------------------------------------

    async def _pause(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._nudge.wait()
        if not self._stop.is_set():
            self._nudge.clear()

    def _next_delay(self) -> float:
        now = self._clock()
        term = self._term
        if term is not None and not term.over:
            # Renew every retry period, counted from the start of the last attempt.
            return max(0.0, self._attempt_started + self._s.retry_period_s - now)
        return acquire_delay(self._observed, now, self.identity, self._s.retry_period_s,
                             self._rng, own_duration_s=self._duration_s)

    async def _attempt(self) -> None:
        self._attempt_started = self._clock()
        term = self._term
        limit = 2 * self._s.request_timeout_s  # a read and a write
        if term is not None:
            budget = self.budget(term)
            if budget <= 0:
                self.overdue(term)
                term = None
            else:
                limit = min(limit, budget)
        try:
            async with asyncio.timeout(limit):
                await self._try_acquire_or_renew(term)
        except Exception as exc:
            self._failed(term, exc)
        else:
            if self._failures:
                log.info("Lease %s reachable again after %d failed attempts",
                         self._where, self._failures)
            self._failures = 0
        finally:
            self._turned_mono = self._clock()

    async def _try_acquire_or_renew(self, term: _Term | None) -> None:
        s = self._s
        current = await self._call(
            self._api.get_lease(s.lease_namespace, s.lease_name, timeout_s=s.request_timeout_s))
        record = LeaseRecord.from_object(current) if current is not None else None
        now = self._read_mono = self._clock()
        self._observed = observe(self._observed, record, now)
        holder = record.holder if record is not None and record.held else None
        self._set_holder(holder)
        if term is not None and holder != self.identity:
            self._end(term, f"the Lease is now held by {holder or 'nobody'}", logging.WARNING)
            term = None
        if not can_acquire(self._observed, now, self.identity,
                           own_duration_s=s.lease_duration_s):
            self._progressed()  # another replica holds it, validly: nothing is stuck
            self._warn_stalled()
            return
        if term is None and self._may_acquire is not None and not self._may_acquire():
            # Not ours to take now (the fair share gives it to another replica): deciding
            # not to lead is progress too; an unheld shard is the shard set's to report.
            self._progressed()
            return
        wall = self._wall()
        sent = self._clock()
        if current is None:
            body = new_lease_body(namespace=s.lease_namespace, name=s.lease_name,
                                  identity=self.identity, duration_s=s.lease_duration_s, now=wall)
            written = await self._call(self._api.create_lease(body, timeout_s=s.request_timeout_s))
        else:
            body = acquire_body(current, identity=self.identity, duration_s=s.lease_duration_s,
                                now=wall)
            written = await self._call(
                self._api.replace_lease(body, timeout_s=s.request_timeout_s))
        mine = LeaseRecord.from_object(written)
        if mine.holder != self.identity:
            raise LeaseFormatError(f"the Lease written back names {shown(mine.holder)} as holder")
        self._observed = LeaseReading(mine, sent)
        self._renewed(sent, mine)

    def _warn_stalled(self) -> None:
        """Once per record: a holder that stopped renewing but whose claim still runs."""
        why = self.stalled()
        if why is not None and self._stall_warned is not self._observed:
            self._stall_warned = self._observed
            log.warning("%s; check the Lease (kubectl -n %s get lease %s -o yaml): deleting it "
                        "lets the replicas elect anew", why, self._s.lease_namespace,
                        self._s.lease_name)

    async def _call(self, request: Awaitable[T]) -> T:
        """Every Lease request is bounded by the request timeout, whatever the client does."""
        async with asyncio.timeout(self._s.request_timeout_s):
            return await request

    def _renewed(self, sent: float, record: LeaseRecord) -> None:
        self._progressed()
        epoch = Epoch(self.identity, record.transitions)
        term = self._term
        if term is not None and not term.over and term.epoch == epoch:
            term.last_renew_mono = max(term.last_renew_mono, sent)
        else:
            if term is not None:
                self._end(term, f"the epoch changed to {epoch}", logging.WARNING)
            term = _Term(epoch, sent)
            if self.budget(term) <= 0:
                return  # the answer came too late to lead on
            self._term = term
            self._changes += 1
            self._leading.set()
            self._set_holder(self.identity, force=True)
            log.info("leading: acquired Lease %s as %s (transitions %d)",
                     self._where, self.identity, record.transitions)
        self._arm_watchdog(term)

    def _failed(self, term: _Term | None, exc: Exception) -> None:
        self._failures += 1
        why = "timed out" if isinstance(exc, TimeoutError) else describe(exc)
        self._last_error = why  # shown by /healthz; `describe` bounds and escapes it
        # Not ours nor a timeout: a bug, or a value nobody thought of. Never quiet.
        unexpected = not isinstance(exc, ConvergerdError | TimeoutError | LeaseFormatError)
        if term is not None and not term.over:
            left = self.budget(term)
            log.log(logging.ERROR if unexpected else logging.WARNING,
                    "renewing Lease %s failed: %s (%.1f s left to renew)",
                    self._where, why, max(0.0, left), exc_info=exc if unexpected else None)
            if left <= 0:
                self.overdue(term)
            return
        # A 409 is a race lost to another writer, usually: quiet, unless it goes on.
        conflict = isinstance(exc, ObjectRejected) and exc.status == 409
        now = self._clock()
        if (self._failures == 1 and not conflict) or now - self._warned_mono >= self._stuck_after_s:
            # The first failure in a row, then a reminder every stuck period while it lasts.
            self._warned_mono = now
            log.log(
                logging.ERROR if unexpected else logging.WARNING,
                "acquiring Lease %s failed (%d in a row): %s; this replica leads nothing until "
                "it succeeds: check that the home cluster answers and that the Lease is "
                "readable (kubectl -n %s get lease %s -o yaml); deleting the Lease lets the "
                "replicas elect anew", self._where, self._failures, why,
                self._s.lease_namespace, self._s.lease_name,
                exc_info=exc if unexpected else None)
        else:
            log.debug("acquiring Lease %s failed again (%d): %s", self._where, self._failures, why)

    def _arm_watchdog(self, term: _Term) -> None:
        """Lose leadership the moment the renew deadline passes, whatever the loop is doing."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        delay = max(0.0, self.budget(term))
        self._watchdog = asyncio.get_running_loop().call_later(delay, self._check_deadline, term)

    def _check_deadline(self, term: _Term) -> None:
        self._watchdog = None
        if term.over or self._term is not term:
            return
        if self.budget(term) <= 0:
            self.overdue(term)
        else:
            self._arm_watchdog(term)

    def _end(self, term: _Term, why: str, level: int) -> None:
        if term.over:
            return
        term.over = True
        term.lost.set()
        if self._term is term:
            self._term = None
            self._leading.clear()
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
        self._changes += 1
        log.log(level, "no longer leading: Lease %s, holder %s, transitions %d: %s",
                self._where, self.identity, term.epoch.transitions, why)
        self._notify()

    def _set_holder(self, holder: str | None, *, force: bool = False) -> None:
        if holder != self._holder or force:
            self._holder = holder
            self._notify()

    def _notify(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(self.is_leader(), self._holder)
        except Exception:
            log.exception("the leadership change hook failed")


class _OpenFence:
    def remaining_s(self) -> float:
        return math.inf


class NoElection:
    """`CONVERGERD_LEADER_ELECTION=false`: always the leader, the fence never closes, never
    stuck. Same surface as `Elector`."""

    def __init__(self, *, identity: str, on_change: ChangeHook | None = None) -> None:
        self.identity = identity
        self._on_change = on_change
        self._epoch = Epoch(identity, 0)
        self._stop = asyncio.Event()
        self._never = asyncio.Event()

    async def run(self) -> None:
        if self._on_change is not None:
            self._on_change(True, self.identity)
        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def is_leader(self) -> bool:
        return True

    @property
    def leader(self) -> str | None:
        return self.identity

    @property
    def epoch(self) -> Epoch | None:
        return self._epoch

    @property
    def transitions(self) -> int:
        return 0

    async def wait_leading(self) -> Epoch:
        return self._epoch

    async def wait_lost(self, epoch: Epoch | None = None) -> None:
        if epoch is not None and epoch != self._epoch:
            return
        await self._never.wait()

    def leadership_lost(self) -> asyncio.Event:
        return self._never

    def fence(self, epoch: Epoch | None = None) -> Fence:
        return _OpenFence()

    def poke(self) -> None:
        return None

    async def release(self, *, stop: bool = True) -> None:
        if stop:
            self._stop.set()

    def problem(self) -> str | None:
        return None

    def unreachable(self) -> str | None:
        return None

    def stalled(self) -> str | None:
        return None
