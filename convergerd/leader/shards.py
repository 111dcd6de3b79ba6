"""The shard set: the one leadership model. One fenced `Elector` per shard Lease and, with more
than one shard, a membership Lease and the fair share.

`CONVERGERD_SHARDS` = S shards, each a `Shard`: its Lease, its elector and fence, its round lock
and the process's cluster slots; a round loop runs on one shard. "The leader" is the holder of
shard 0 (`ShardSet.leader`): it fans notifications out, fences saves, and is what `/status`
and `convergerd_is_leader` call the leader.

With S = 1 (the default) the one shard is the Lease users configure (`CONVERGERD_LEASE_NAME`),
and there is nothing to share: its elector takes the Lease whenever it is free (`NoElection`
with `CONVERGERD_LEADER_ELECTION=false`), no Lease is listed, no membership Lease is written,
and what status shows of the holder is the elector's own reading, as a single Lease always was.

With S > 1, shard k is the Lease `convergerd-shard-<k>`, each with exactly the single Lease's
elector and fencing (a replica that lost a shard's Lease writes nothing to that shard's
clusters after its renew deadline). What is added is *which* shards a replica tries to take:

- every replica renews its own membership Lease `convergerd-member-<identity>` (an elector
  nobody contends), so a replica that holds no shard yet is still counted;
- every retry period it lists the Leases of its namespace (one request), judges each the way
  the elector does (live while its record changed within its duration, on our monotonic
  clock), and computes the shard plan (`core.shards.plan_shards`): the shards it may take (free
  or expired ones, up to its fair share) and the ones it holds above its share;
- a shard's elector acquires only shards in that plan (`may_acquire`), renews what it holds
  whatever the plan says, and a shard above the share is handed back: its running round
  finishes first (the shard's round lock), then the term ends and the Lease is written free.

Two replicas never both hold a shard: taking it is the elector's compare-and-swap on the
Lease's resourceVersion, exactly as with one Lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from convergerd.config import Election
from convergerd.core.errors import ConvergerdError
from convergerd.core.shards import (
    MEMBER_LEASE_PREFIX,
    ShardPlan,
    member_lease_name,
    plan_shards,
    shard_lease,
    shard_lease_name,
)
from convergerd.core.shown import describe
from convergerd.kube.api import KubeObject, LeaseListApi
from convergerd.leader.elector import STUCK_AFTER_DURATIONS, Elector, Leadership, NoElection
from convergerd.leader.lease import Fence, LeaseFormatError, LeaseReading, LeaseRecord, observe

log = logging.getLogger(__name__)

# "The leader" is the holder of this shard, whatever the number of shards, so exactly one
# replica is the leader: it fans notifications out and fences saves under this shard's Lease,
# and status and `convergerd_is_leader` name it (`ShardSet.leader`, `ShardView.leading`).
LEADER_SHARD = 0
# A plan pass timed for a foreign Lease's expiry runs this long after it (clock granularity).
EXPIRY_MARGIN_S = 0.01


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


@dataclass(frozen=True, slots=True, eq=False)
class Shard:
    """One shard, as its round loop works on it."""

    index: int
    count: int  # the shards of the fleet (`CONVERGERD_SHARDS`)
    lease: str  # its Lease's name (for messages)
    elector: Leadership  # its term, fence and health
    # Held while a round runs on the shard; a hand-back waits for it.
    round_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Shared by the rounds of every shard of the process, so `CONVERGERD_CLUSTER_CONCURRENCY`
    # bounds them together; None with one shard (its round's own are the process's).
    slots: asyncio.Semaphore | None = None

    @property
    def number(self) -> int | None:
        """The shard's number in messages; None with one shard (there is nothing to tell)."""
        return self.index if self.count > 1 else None


@dataclass(frozen=True, slots=True)
class ShardView:
    """What this replica knows of the shards, for status and metrics."""

    identity: str
    holders: tuple[str, ...]  # per shard: the live holder seen, "" when free or expired
    held: frozenset[int]  # the shards this replica leads now
    members: tuple[str, ...]  # the live replicas counted by the last plan
    share: int | None  # this replica's fair share (None before the first plan, one shard, `once`)

    @property
    def leading(self) -> bool:
        """Whether this replica is the leader (the holder of `LEADER_SHARD`)."""
        return LEADER_SHARD in self.held

    @property
    def leader(self) -> str | None:
        """The leader this replica sees; None when nobody holds `LEADER_SHARD`."""
        return self.holders[LEADER_SHARD] or None


ViewHook = Callable[[ShardView], None]


def live_holder(observed: LeaseReading | None, now_mono: float, own_duration_s: float) -> str:
    """The holder of a Lease as observed, or "" when nobody holds it or its record did not
    change within its duration, capped (the elector's rule: `lease.can_acquire`). The same for
    shard and membership Leases: a dead member that wrote a huge duration stops counting
    after `lease.MAX_PEER_DURATION_FACTOR` of our durations."""
    if observed is None or not observed.record.held:
        return ""
    if now_mono >= observed.expires_mono(own_duration_s):
        return ""
    return observed.record.holder


def live_member(observed: LeaseReading | None, now_mono: float, own_duration_s: float) -> str:
    """The replica a membership Lease says is alive, or "": its record must have changed
    within our own lease duration, whatever duration it claims. Every replica renews its
    membership each retry period, so a live one always does; a record written once with a huge
    duration (a dead replica's, or a forged one) would otherwise be counted for up to
    `lease.MAX_PEER_DURATION_FACTOR` of our durations, shrinking our share so that we hand back
    shards nobody takes."""
    if observed is None or now_mono >= observed.since_mono + own_duration_s:
        return ""
    return live_holder(observed, now_mono, own_duration_s)


class ShardSet:
    """`run()` keeps the shard electors going and, with more than one shard, the membership
    Lease and the plan."""

    def __init__(
        self,
        api: LeaseListApi | None,
        settings: Election,
        *,
        once: bool = False,
        clock: Callable[[], float] = _loop_time,
        on_change: ViewHook | None = None,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        """`api`: the home cluster's Leases; None only with leader election off (one shard,
        always held). `once`: a `convergerd once` run takes every shard it can (no share, no
        membership) and hands back none. `slots`: the process's cluster slots, shared by the
        shards' rounds (with more than one shard)."""
        self._api = api
        self._s = settings
        self._once = once
        self._clock = clock
        self._on_change = on_change
        self.shards = settings.shards
        self.identity = settings.identity
        # Only with more than one shard is there a share to plan, so a list and a membership.
        self._planning = self.shards > 1 and not once
        self.each = tuple(
            Shard(index=k, count=self.shards, elector=self._elector(k), slots=slots,
                  lease=shard_lease(k, shards=self.shards, single=settings.lease_name))
            for k in range(self.shards))
        self.member: Elector | None = None
        if self._planning:
            assert api is not None
            self.member = Elector(
                api, dataclasses.replace(settings, lease_name=member_lease_name(self.identity)),
                clock=clock)
        self._wanted: set[int] = set() if self._planning else set(range(self.shards))
        self._observed: dict[str, LeaseReading] = {}
        self._renewing: set[str] = set()  # membership Leases seen renewed while observed
        self._holders: list[str] = [""] * self.shards
        self._plan: ShardPlan | None = None
        self._handing: dict[int, asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        self._listed_mono: float | None = None  # last successful list (None: not running)
        self._list_failures = 0
        self._last_error: str | None = None

    def _elector(self, k: int) -> Leadership:
        changed = functools.partial(self._elector_changed, k)
        if not self._s.enabled:  # the config allows it with one shard only
            assert self.shards == 1
            return NoElection(identity=self.identity, on_change=changed)
        assert self._api is not None
        lease = shard_lease(k, shards=self.shards, single=self._s.lease_name)
        # One shard is taken whenever its Lease is free: there is no share to wait for.
        may_acquire = functools.partial(self._may_take, k) if self.shards > 1 else None
        return Elector(self._api, dataclasses.replace(self._s, lease_name=lease),
                       clock=self._clock, may_acquire=may_acquire, on_change=changed)

    # -- surface -------------------------------------------------------------------------------

    @property
    def leader(self) -> Shard:
        """The shard whose holder is "the leader" (`LEADER_SHARD`)."""
        return self.each[LEADER_SHARD]

    @property
    def electors(self) -> list[Leadership]:
        return [shard.elector for shard in self.each]

    @property
    def round_locks(self) -> list[asyncio.Lock]:
        return [shard.round_lock for shard in self.each]

    def held(self) -> frozenset[int]:
        return frozenset(k for k, e in enumerate(self.electors) if e.is_leader())

    def fence(self, k: int) -> Fence:
        """The fence of this replica's current term on shard k (closed when it holds none)."""
        return self.electors[k].fence()

    def view(self) -> ShardView:
        held = self.held()
        # A listed Lease still naming us without a term here is free to take again; without a
        # list the elector's reading is all there is, shown as it reads.
        holders = tuple(self.identity if k in held else
                        ("" if h == self.identity and self.shards > 1 else h)
                        for k, h in enumerate(self._holders))
        return ShardView(
            identity=self.identity, holders=holders, held=held,
            members=self._plan.members if self._plan is not None else (self.identity,),
            share=self._plan.share if self._plan is not None else None,
        )

    def problem(self) -> str | None:
        """For `/healthz`: an elector's loop is stuck (a restart would help)."""
        return _first(e.problem for e in self._everyone())

    def unreachable(self) -> str | None:
        """For `/readyz`: the Leases could not be listed for two lease durations (the plan
        stands still: no orphan is taken), or an elector cannot take part in its election."""
        since = self._listed_mono
        if since is not None and not self._stop.is_set():
            stuck_s = self._clock() - since
            limit_s = STUCK_AFTER_DURATIONS * self._s.lease_duration_s
            if stuck_s > limit_s:
                return (f"shard set blocked: the Leases in {self._s.lease_namespace} could not "
                        f"be listed for {stuck_s:.0f} s (limit {limit_s:g} s): "
                        f"{self._last_error or 'no answer'}")
        return _first(e.unreachable for e in self._everyone())

    def stalled(self) -> str | None:
        """For `/readyz`: a shard's Lease is held by someone who does not renew it
        (`Elector.stalled`); its clusters get no round until the claim runs out."""
        return _first(e.stalled for e in self._everyone())

    def _everyone(self) -> list[Leadership]:
        return [*self.electors, *([self.member] if self.member else [])]

    def stop(self) -> None:
        self._stop.set()
        for elector in self.electors:
            elector.stop()
        if self.member is not None:
            self.member.stop()

    async def release(self) -> None:
        """Release every shard held (its round has been stopped by the caller) and the
        membership, at once: the others take the shards over without waiting for expiry."""
        self._stop.set()
        for task in self._handing.values():
            task.cancel()
        await asyncio.gather(*(e.release() for e in self._everyone()), return_exceptions=True)

    async def run(self) -> None:
        if self.shards > 1:
            log.info("shards: %d Leases convergerd-shard-0..%d in %s, as %s%s", self.shards,
                     self.shards - 1, self._s.lease_namespace, self.identity,
                     " (once: every shard it can take)" if self._once else "")
        if self._planning:
            self._listed_mono = self._clock()
        async with asyncio.TaskGroup() as tg:
            for k, elector in enumerate(self.electors):
                tg.create_task(elector.run(), name=f"elector shard {k}")
            if self.member is not None:
                tg.create_task(self.member.run(), name="elector membership")
                tg.create_task(self._planner(), name="shard plan")
            await self._stop.wait()
            self.stop()

    # -- the plan ------------------------------------------------------------------------------

    def _may_take(self, k: int) -> bool:
        return k in self._wanted and not self._stop.is_set()

    async def _planner(self) -> None:
        assert self.member is not None
        # Counted by the others before taking anything: otherwise each replica starting at
        # once would see itself alone and take every free shard, only to hand most back.
        await self.member.wait_leading()
        await self._pause(self._s.retry_period_s)
        while not self._stop.is_set():
            await self.plan_once()
            await self._pause(self._next_pass_s())

    async def plan_once(self) -> ShardPlan | None:
        """One pass: list, judge, plan, start hand-backs. None when the list failed."""
        s = self._s
        assert self._api is not None  # a plan is made with more than one shard only
        try:
            async with asyncio.timeout(s.request_timeout_s):
                items = await self._api.list_leases(s.lease_namespace,
                                                    timeout_s=s.request_timeout_s)
        except (ConvergerdError, TimeoutError, OSError) as exc:
            self._list_failures += 1
            self._last_error = "timed out" if isinstance(exc, TimeoutError) else describe(exc)
            if self._list_failures == 1:
                log.warning("shards: listing the Leases in %s failed: %s; holding what this "
                            "replica holds, taking nothing new until it works",
                            s.lease_namespace, self._last_error)
            self._wanted = set()
            self._notify()
            return None
        if self._list_failures:
            log.info("shards: Leases listed again after %d failures", self._list_failures)
        self._list_failures = 0
        now = self._clock()
        self._listed_mono = now
        members = self._judge(items, now)
        holders = list(self._holders)
        held = self.held()
        for k in range(self.shards):
            if holders[k] == self.identity and k not in held:
                holders[k] = ""  # ours on the server but no term here: free to take again
            if k in held:
                holders[k] = self.identity
        found = plan_shards(shards=self.shards, identity=self.identity, members=members,
                     holders=holders)
        if self._plan is None or (found.share, found.members) != (self._plan.share,
                                                                 self._plan.members):
            log.info("shards: %d live replicas %s: this replica's share is %d (holds %d)",
                     len(found.members), ", ".join(found.members), found.share, len(held),
                     extra={"shard_share": found.share, "shards_held": len(held)})
        self._plan = found
        added = set(found.take) - self._wanted
        self._wanted = set(found.take)
        for k in sorted(added):
            self.electors[k].poke()  # a free shard is taken now, not after the pause
        for k in found.release:
            if k not in self._handing:
                self._handing[k] = asyncio.create_task(self._hand_back(k),
                                                       name=f"hand back shard {k}")
        self._notify()
        return found

    def _judge(self, items: list[KubeObject], now: float) -> set[str]:
        """Update the observations from one list; the live members' identities."""
        shard_names = {shard_lease_name(k): k for k in range(self.shards)}
        seen: dict[str, LeaseReading] = {}
        members: set[str] = set()
        # A member counts once we saw its record change (a live replica renews every retry
        # period; a record written once, however long it claims, is no replica: counted, it
        # would shrink our share and we would hand back shards nobody takes).
        renewing = set(self._renewing)
        own_s = self._s.lease_duration_s
        for item in items:
            meta = item.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str):
                continue
            is_member = name.startswith(MEMBER_LEASE_PREFIX)
            if name not in shard_names and not is_member:
                continue
            try:
                record = LeaseRecord.from_object(item)
            except LeaseFormatError:
                continue  # a Lease nobody can hold as it stands: counts as free
            previous = self._observed.get(name)
            observed = observe(previous, record, now)
            assert observed is not None
            seen[name] = observed
            if is_member and previous is not None and observed is not previous:
                renewing.add(name)
            member = live_member(observed, now, own_s) if name in renewing else ""
            if member:
                members.add(member)
        self._observed = seen
        self._renewing = renewing & seen.keys()
        self._holders = [live_holder(seen.get(shard_lease_name(k)), now, own_s)
                         for k in range(self.shards)]
        return members

    def _next_pass_s(self) -> float:
        """A retry period, or less when a Lease held by another replica expires sooner: its
        shards (or its membership) are then free at once, not up to a retry period later."""
        delay = self._s.retry_period_s
        now = self._clock()
        for observed in self._observed.values():
            record = observed.record
            if record.held and record.holder != self.identity:
                expires = observed.expires_mono(self._s.lease_duration_s)
                if expires > now:
                    delay = min(delay, expires - now + EXPIRY_MARGIN_S)
        return delay

    async def _hand_back(self, k: int) -> None:
        """Finish the shard's running round, then release its Lease (the elector goes on
        watching it). Skipped when the plan changed its mind meanwhile."""
        try:
            async with self.round_locks[k]:
                found = self._plan
                if found is None or k not in found.release or not self.electors[k].is_leader():
                    return
                log.info("shards: handing back shard %d (share %d, holding %d)", k,
                         found.share, len(self.held()))
                await self.electors[k].release(stop=False)
        finally:
            self._handing.pop(k, None)
            self._notify()

    # -- plumbing ------------------------------------------------------------------------------

    def _elector_changed(self, k: int, is_leader: bool, holder: str | None) -> None:
        # With a list, other holders come from it, judged for expiry; the elector tells only
        # about this replica (its reads name a dead holder until the record is replaced).
        # With one shard (no list), the elector's reading is what this replica knows.
        if self.shards == 1:
            self._holders[k] = holder or ""
        elif is_leader:
            self._holders[k] = self.identity
        elif self._holders[k] == self.identity:
            self._holders[k] = ""
        self._notify()

    def _notify(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(self.view())
        except Exception:
            log.exception("the shard change hook failed")

    async def _pause(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, delay_s)):
                await self._stop.wait()


def _first(checks: Iterable[Callable[[], str | None]]) -> str | None:
    """The first problem the checks find (one line in a probe's answer), None if none."""
    for check in checks:
        found = check()
        if found is not None:
            return found
    return None


def unheld(view: ShardView) -> list[int]:
    """The shards nobody holds, as this replica sees them."""
    return [k for k, h in enumerate(view.holders) if not h]

