"""The shards as this replica sees them (`ShardsSeen`: each shard's holder, those held here, the
members and this replica's share, as the shard set last told the state; with one shard, the
leader holds it), and what the views and the metrics both reckon from the clusters' recorded
rounds: each shard's last round, the orphaned clusters. Pure: time is passed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from convergerd.core.model import ClusterId
from convergerd.core.shards import orphaned, shard_of
from convergerd.status.cluster import ClusterFacts


@dataclass(frozen=True, slots=True)
class ShardsSeen:
    count: int  # CONVERGERD_SHARDS
    holders: tuple[str, ...]  # per shard, the live holder seen ("" when free or expired)
    held: frozenset[int]  # the shards this replica holds
    members: tuple[str, ...]  # the replicas sharing the shards
    share: int | None  # how many shards this replica should hold (None: not reckoned yet)

    def of(self, cluster: str) -> int:
        """The cluster's shard (0 with one shard: no sha256 per cluster per view)."""
        return 0 if self.count == 1 else shard_of(cluster, self.count)


def orphans(clusters: Iterable[ClusterFacts], now: dt.datetime,
            interval_s: float) -> list[ClusterId]:
    """The clusters without a finished round for more than two intervals."""
    return [c.id for c in clusters if orphaned(c.since_round_s(now), interval_s)]


def last_rounds(clusters: Iterable[ClusterFacts], seen: ShardsSeen) -> dict[int, dt.datetime]:
    """Per shard with a recorded round, when its last round finished: the latest round end on
    any of its clusters (from the database records, so the same on every replica)."""
    last: dict[int, dt.datetime] = {}
    for c in clusters:
        if c.last_attempt_at is None:
            continue
        k = seen.of(c.id)
        if k not in last or c.last_attempt_at > last[k]:
            last[k] = c.last_attempt_at
    return last
