"""The round's log line tells clusters it could not reach from clusters its deadline came
before (issue 34: a first round at 10,000 x 100 logged "1098 converged, 8838 unreached" while
`/status` and `convergerd_cluster_up` rightly said they answered)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

import pytest

from convergerd.config import load_settings
from convergerd.core.errors import DEADLINE_REASON
from convergerd.core.model import ClusterId, Fleet
from convergerd.core.report import ClusterOutcome, RoundReport
from convergerd.delivery.rounds import RoundLoop
from convergerd.kube.api import PolicyApi
from convergerd.leader.elector import NoElection
from convergerd.leader.shards import Shard
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState

AT = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class NoStore:
    async def load_fleet(self) -> Fleet:
        return Fleet(clusters=[], boundaries={}, policies=[], invalid=[])

    async def record_round(self, report: RoundReport, *, identity: str) -> int:
        return 1


class NoClusters:
    async def refresh(self) -> bool:
        return False

    def get(self, cluster: ClusterId) -> PolicyApi:
        raise AssertionError("no cluster is asked")


async def follow(*_: Any, **__: Any) -> None:
    return None


def outcome(cluster: str, *, reached: bool, reason: str | None = None) -> ClusterOutcome:
    found = ClusterOutcome(cluster=ClusterId(cluster), desired=0)
    found.reached = reached
    found.reason = reason
    found.error = None if reason is None else f"{reason}: ..."
    return found


async def test_clusters_the_deadline_came_before_are_not_counted_unreached(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = load_settings({})
    state = StatusState(identity="me", interval_s=settings.rounds.interval_s)
    shard = Shard(index=0, count=1, lease=settings.election.lease_name,
                  elector=NoElection(identity="me"))
    loop = RoundLoop(settings=settings, store=NoStore(), clusters=NoClusters(), shard=shard,
                     metrics=Metrics(state=state), state=state, stopping=asyncio.Event(),
                     identity="me", follow=follow)
    report = RoundReport(started_at=AT, finished_at=AT + dt.timedelta(seconds=3), clusters=[
        outcome("c1", reached=True),
        outcome("c2", reached=False, reason="unreachable"),
        outcome("c3", reached=False, reason=DEADLINE_REASON),
        outcome("c4", reached=False, reason=DEADLINE_REASON),
    ])
    caplog.set_level(logging.INFO, logger="convergerd.delivery.rounds")

    await loop._observe(report)

    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert "4 clusters, 1 converged, 1 unreached, 2 not reached before the deadline;" in line
