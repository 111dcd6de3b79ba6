"""The periodic database sync that feeds the live status (`convergerd.status.state.StatusState`)
with what the database recorded, on the leader and the standbys alike (the metrics read that
status when scraped).

One pass: the clusters the database knows with their recorded outcomes, the last recorded round
and the invalid policies it recorded, the deletions still pending, then the per-policy records
(phases) of the clusters another replica worked on since the last pass, in one query, and the
live rollouts. A few
queries per pass whatever the number of status requests; the HTTP handlers never refresh the
status themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Protocol

from convergerd.core.errors import ConvergerdError
from convergerd.core.model import InvalidPolicy
from convergerd.core.rollout import Rollout
from convergerd.core.rows import ClusterStateRow, DeliveryRow, PendingDeletions, RoundRow
from convergerd.core.shown import describe
from convergerd.eventloop import Pacer
from convergerd.status.state import StatusState

log = logging.getLogger(__name__)

# A pass that takes longer than this is abandoned (and reported); the next one starts on time.
SYNC_TIMEOUT_S = 20.0


class SyncSource(Protocol):
    """What the sync reads (`convergerd.store.store.Store`)."""

    async def cluster_states(self) -> Sequence[ClusterStateRow]: ...
    async def last_round(self) -> RoundRow | None: ...
    async def recorded_invalid(self) -> Sequence[InvalidPolicy]: ...
    async def pending_deletions(self) -> PendingDeletions: ...
    async def deliveries_for_clusters(
        self, cluster_ids: Sequence[str], /
    ) -> Sequence[DeliveryRow]: ...
    async def live_rollouts(self) -> Sequence[Rollout]: ...


class StatusSync:
    def __init__(
        self, *, store: SyncSource, state: StatusState, timeout_s: float = SYNC_TIMEOUT_S,
        on_clusters: Callable[[Collection[str]], Awaitable[None]] | None = None,
    ) -> None:
        """`on_clusters(ids)`: told the database's cluster set each pass, so everything this
        replica keeps per cluster follows it (`Daemon._follow_database`: the status's set,
        the counters, the clients); without it, the status's set alone."""
        self.store = store
        self.state = state
        self.timeout_s = timeout_s
        self.on_clusters = on_clusters

    async def once(self) -> bool:
        """One pass; False (logged, and shown in status) when the database did not answer."""
        try:
            await asyncio.wait_for(self._pass(), self.timeout_s)
        except (TimeoutError, ConvergerdError, OSError) as exc:
            error = describe(exc) if not isinstance(exc, TimeoutError) else (
                f"the database did not answer within {self.timeout_s:g} s")
            log.warning("status sync: reading the database failed: %s", error)
            self.state.note_sync(error)
            return False
        self.state.note_sync(None)
        return True

    async def run(self, period_s: float, *, wait_first: bool = False) -> None:
        """Forever: a pass every `period_s` (the first one right away, or after one period
        with `wait_first`)."""
        if wait_first:
            await asyncio.sleep(period_s)
        while True:
            await self.once()
            await asyncio.sleep(period_s)

    async def _pass(self) -> None:
        clusters = await self.store.cluster_states()
        last_round = await self.store.last_round()
        invalid = await self.store.recorded_invalid()
        # The cluster set first, once: the records then land on exactly those clusters.
        ids = [r.cluster for r in clusters]
        if self.on_clusters is not None:
            await self.on_clusters(ids)
        else:
            self.state.set_clusters(ids)
        self.state.absorb_records(clusters, last_round, invalid)
        self.state.set_pending_deletions(await self.store.pending_deletions())
        wanted = self.state.needing_rows()
        if wanted:
            records = await self.store.deliveries_for_clusters(wanted)
            by_cluster: dict[str, list[DeliveryRow]] = {c: [] for c in wanted}
            for record in records:
                by_cluster.setdefault(record.cluster, []).append(record)
            for cluster, found in by_cluster.items():
                self.state.absorb_delivery_rows(found, cluster=cluster)
        # After the records: the rollouts' clusters per revision are counted on them, the
        # loop given back between rollouts.
        pacer = Pacer()
        for _ in self.state.absorbing_rollouts(await self.store.live_rollouts()):
            await pacer.pause()
