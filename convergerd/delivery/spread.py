"""A save spread over the shard holders, coordinated through PostgreSQL only.

Why: a save costs the process that writes it CPU per cluster, nearly all of it in the HTTP
client and TLS, whatever we arrange; at 10,000 clusters one core's share of that is seconds
(the figures and how they moved: bench/RESULTS.md, "Figures once quoted in the code"). With
`CONVERGERD_SHARDS` > 1 several replicas hold the fleet's shards, so each can write its own.

The replica that took a save (the *requester*, `Peers.fan_out`) splits its clusters by shard
(`core.spread.split`). It writes the clusters of the shards it holds, each under that shard's
Lease, and those of shards no live member holds, as a standby writes (no Lease; the
resourceVersion preconditions of `fanout`). For every shard another live member holds it writes
one *part* into the database (`store.parts`: request, parts, items) and notifies channel
`convergerd_saves`. It waits for the parts, woken by "done" notifications and polling every
`SpreadTuning.poll_s`, at most `SpreadTuning.peer_share` of the save deadline; then every
cluster without a usable result (`core.spread.leftover`: its part not done, or refused by the
peer's fence) is written by the requester itself, as a standby, within what is left of the
deadline. A dead, frozen or slow holder therefore never loses a cluster, and the answer lists
every cluster. The requester records the whole save (deliveries, `round_id` NULL) and checks for
a newer revision after it, exactly as without peers (`fanout.Saver`), then deletes the request.

The *holder* side (`Peers.run`) claims the parts asked of it, on a notification or every
`SpreadTuning.poll_s`: those of shards it holds now, to write; the others it declines at once
(done without results, so the requester need not wait). It writes a part only when the policy's
row still has the request's revision (else it declines: the requester's check after the fan-out
saves the newer one), under the shard's Lease (`ShardSet.fence`), within what is left of the
request's share of the deadline on the database's clock, so its last write is sent before the
requester writes the left-over clusters and checks the revision. Everything read from these rows
is untrusted and decoded (`core.spread`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from convergerd.config import SpreadTuning
from convergerd.core.errors import DatabaseRejected, DatabaseUnavailable
from convergerd.core.model import ClusterId, Policy, PolicyId, RuleError, check_policy_id
from convergerd.core.report import ClusterResult
from convergerd.core.save import Work
from convergerd.core.shards import shard_of
from convergerd.core.shown import shown
from convergerd.core.spread import (
    CHANNEL,
    PART,
    Claimed,
    Part,
    Spread,
    leftover,
    parse_payload,
    split,
    work_item,
)
from convergerd.delivery.apply import StopFence
from convergerd.delivery.fanout import FanoutEnv, save_work, summary
from convergerd.delivery.listener import Channel, NotifySource
from convergerd.leader.lease import Fence
from convergerd.leader.shards import ShardView
from convergerd.logthrottle import LogThrottle

log = logging.getLogger(__name__)

DEFAULT_SPREAD = SpreadTuning()  # what a `Peers` built without its tuning gets


class PartStore(Protocol):
    """What a spread save reads and writes (`convergerd.store.store.Store`)."""

    async def post_save_parts(self, policy_id: str, revision: int, requested_by: str,
                              asked: Sequence[Part], wait_s: float, /) -> int: ...
    async def save_parts_done(self, request_id: int, asked: int, /) -> frozenset[int]: ...
    async def save_part_results(self, request_id: int, limit: int, /) -> list[ClusterResult]:
        ...
    async def end_save_parts(self, request_id: int, /) -> None: ...
    async def claim_save_parts(self, identity: str, held: Sequence[int], limit: int, /
                               ) -> list[Claimed]: ...
    async def save_part_items(self, request_id: int, shard: int, limit: int, /
                              ) -> list[tuple[object, object, object]]: ...
    async def finish_save_part(self, identity: str, request_id: int, shard: int,
                               done: Sequence[ClusterResult], /) -> None: ...
    async def current_policy(self, policy_id: PolicyId, /) -> Policy | None: ...


class Holding(Protocol):
    """The shards as this replica holds and sees them (`convergerd.leader.shards.ShardSet`)."""

    shards: int
    identity: str

    def view(self) -> ShardView: ...
    def fence(self, k: int) -> Fence:
        """The fence of this replica's current term on shard k (closed when not held)."""
        ...


class Peers:
    """Both sides of a spread save: `fan_out` for the requester (`fanout.SavePeers`), `run` for
    the holder (a supervised task of the daemon)."""

    def __init__(
        self,
        *,
        store: PartStore,
        holding: Holding,
        env: Callable[[], FanoutEnv],
        source: NotifySource,
        stopping: asyncio.Event,
        tuning: SpreadTuning = DEFAULT_SPREAD,
    ) -> None:
        """`env`: what the holder's writes run with (`fanout.fanout_env`; its fence is
        replaced by the shard's)."""
        self._store = store
        self._holding = holding
        self._env = env
        self._source = source
        self._stopping = stopping
        self._share = tuning.peer_share
        self._poll_s = tuning.poll_s
        self._max_claimed = tuning.max_claimed
        self._max_part_items = tuning.max_part_items
        self._waiting: dict[int, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._parts: set[asyncio.Task[None]] = set()
        self._throttle = LogThrottle(log)  # anyone who can connect can NOTIFY our channel

    def _fence(self, k: int) -> Fence:
        return StopFence(self._holding.fence(k), self._stopping)

    # -- the requester -----------------------------------------------------------------------

    async def fan_out(self, policy: Policy, work: Sequence[Work], env: FanoutEnv) -> Spread | None:
        view = self._holding.view()
        shards, identity = self._holding.shards, self._holding.identity
        found = split(work, shards=shards, identity=identity, holders=view.holders,
                      members=view.members)
        if not found.parts:
            return None
        deadline = env.calls.clock() + env.deadline_s
        wait_s = env.deadline_s * self._share
        try:
            request_id = await self._store.post_save_parts(
                policy.id, policy.revision, identity, found.parts, wait_s)
        except (DatabaseUnavailable, DatabaseRejected) as exc:
            log.warning("policy %s: could not ask the other shard holders (%s); writing every "
                        "cluster here", policy.id, exc, extra={"policy": policy.id})
            return None
        # Started after the parts were written: never before they expire on the database.
        wait_until = env.calls.clock() + wait_s
        fences = {k: self._fence(k) for k in found.here}

        def fence_of(cluster: ClusterId) -> Fence | None:
            return fences.get(shard_of(cluster, shards))  # None: unheld, as a standby

        mine = [w for ws in found.here.values() for w in ws] + list(found.unheld)
        here = asyncio.create_task(save_work(policy, mine, env, fence_of=fence_of,
                                             deadline=deadline), name="save: this replica's part")
        try:
            done = await self._wait(request_id, len(found.parts), wait_until)
            asked = sum(len(p.work) for p in found.parts)
            try:
                answered = await self._store.save_part_results(request_id, asked)
            except (DatabaseUnavailable, DatabaseRejected) as exc:
                log.warning("policy %s: could not read the other shard holders' results (%s);"
                            " writing their clusters here", policy.id, exc,
                            extra={"policy": policy.id})
                answered = []
            used, left = leftover(found.parts, done, answered)
            rest = await save_work(policy, left, env, deadline=deadline) if left else []
            results = sorted([*await here, *used, *rest], key=lambda r: (r.cluster, r.action))
        finally:
            here.cancel()
            with contextlib.suppress(DatabaseUnavailable, DatabaseRejected):
                await self._store.end_save_parts(request_id)
        late = sorted({p.holder for p in found.parts if p.shard not in done})
        log.info("policy %s revision %d: %d of %d clusters done by the other shard holders "
                 "(%d parts), %d left over to this replica%s", policy.id, policy.revision,
                 len(used), len(results), len(found.parts), len(left),
                 f" (not done in time: {', '.join(late)})" if late else "",
                 extra={"policy": policy.id, "fanout_by_peers": len(used),
                        "fanout_left_over": len(left)})
        return Spread(results, by_peers=len(used), parts=len(found.parts))

    async def _wait(self, request_id: int, parts: int, until: float) -> frozenset[int]:
        """The shards whose part is done: all of them, or those done by `until` (loop time)."""
        loop = asyncio.get_running_loop()
        woken = self._waiting[request_id] = asyncio.Event()
        done: frozenset[int] = frozenset()
        try:
            while True:
                woken.clear()
                with contextlib.suppress(DatabaseUnavailable, DatabaseRejected):
                    done = await self._store.save_parts_done(request_id, parts)
                left_s = until - loop.time()
                if len(done) >= parts or left_s <= 0:
                    return done
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self._poll_s, left_s)):
                        await woken.wait()
        finally:
            del self._waiting[request_id]

    # -- the holder --------------------------------------------------------------------------

    def on_payload(self, payload: str, sender: int = 0) -> None:
        """One notification on `CHANNEL` from backend `sender` (never blocks)."""
        parsed = parse_payload(payload)
        if parsed is None:
            self._throttle.log("invalid", logging.WARNING, "dropped a notification on %s from "
                               "backend %d: %s", CHANNEL, sender, shown(payload),
                               extra={"channel": CHANNEL})
            return
        kind, request_id = parsed
        if kind == PART:
            self._wake.set()
        elif (woken := self._waiting.get(request_id)) is not None:
            woken.set()

    async def run(self) -> None:
        """Forever: listen on `CHANNEL`, claim the parts asked of this replica and write them."""
        channel = Channel(self._source, CHANNEL, self.on_payload)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(channel.run(), name="save parts listener")
                tg.create_task(self._serve(), name="save parts")
        finally:
            # Parts being written end with the daemon (their requesters write them).
            for task in self._parts:
                task.cancel()
            await asyncio.gather(*self._parts, return_exceptions=True)

    async def _serve(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            await self.claim_once()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_s):
                    await self._wake.wait()

    async def claim_once(self) -> int:
        """Claim what is asked of this replica now and start writing it; how many parts."""
        held = sorted(self._holding.view().held)
        try:
            claimed = await self._store.claim_save_parts(self._holding.identity, held,
                                                         self._max_claimed)
        except (DatabaseUnavailable, DatabaseRejected) as exc:
            log.debug("could not look for save parts: %s", exc)
            return 0
        # The part's time counts from its claim (`remaining_s` was read then).
        claimed_at = asyncio.get_running_loop().time()
        for part in claimed:
            until = claimed_at + max(0.0, part.remaining_s)
            task = asyncio.create_task(self._write(part, until),
                                       name=f"save part {part.request_id}")
            self._parts.add(task)
            task.add_done_callback(self._parts.discard)
        return len(claimed)

    async def _write(self, part: Claimed, until: float) -> None:
        try:
            results = await self._results(part, until)
            await self._store.finish_save_part(self._holding.identity, part.request_id,
                                               part.shard, results)
        except (DatabaseUnavailable, DatabaseRejected) as exc:
            # The requester writes the part itself once its share of the deadline passed.
            log.warning("save part %d (shard %d): %s", part.request_id, part.shard, exc,
                        extra={"shard": part.shard})
        except Exception:
            log.exception("save part %d (shard %d): unexpected error", part.request_id,
                          part.shard, extra={"shard": part.shard})

    async def _results(self, part: Claimed, until: float) -> list[ClusterResult]:
        """The part's clusters written by `until` (loop time); no results (declined) when the
        policy is not the revision asked for any more, or not deliverable."""
        try:
            check_policy_id(part.policy_id)
        except RuleError:
            log.warning("declined save part %d: %s is not a policy id", part.request_id,
                        shown(part.policy_id))
            return []
        policy_id = PolicyId(part.policy_id)
        policy = await self._store.current_policy(policy_id)
        if policy is None or policy.revision != part.revision:
            log.info("policy %s: declined shard %d's part of the save of revision %d: the "
                     "database holds %s", policy_id, part.shard, part.revision,
                     "no deliverable revision of it (gone, being deleted or invalid)"
                     if policy is None else f"revision {policy.revision}",
                     extra={"policy": policy_id, "shard": part.shard})
            return []
        rows = await self._store.save_part_items(part.request_id, part.shard,
                                                    self._max_part_items)
        shards = self._holding.shards
        work = [w for row in rows
                if (w := work_item(*row, shard=part.shard, shards=shards)) is not None]
        env = dataclasses.replace(self._env(), fence=self._fence(part.shard))
        deadline = min(until, env.calls.clock() + env.deadline_s)
        results = await save_work(policy, work, env, deadline=deadline)
        log.info("policy %s revision %d: wrote shard %d's part of a save: %s", policy_id,
                 part.revision, part.shard, summary(results),
                 extra={"policy": policy_id, "shard": part.shard})
        return results
