"""The log line of a save or a deletion: counts by result, only the failures named, bounded
whatever the fleet's size (a save to 100 clusters logged 2,386 characters naming each, to
10,000 about 250 KB). Driven through `Saver` with small fakes at its Protocol boundaries."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from convergerd.core.errors import ClusterUnreachable
from convergerd.core.model import ClusterId, PolicyId, PolicyRow
from convergerd.core.removal import Current, Target
from convergerd.core.report import MAX_NAMED_CLUSTERS, Delivery, FanoutStatus
from convergerd.core.rollout import Staged, Start
from convergerd.delivery.apply import ClusterCalls, Unfenced
from convergerd.delivery.fanout import FanoutEnv, Saver
from convergerd.kube.api import Applied, KubeObject, ObjectList

T = TypeVar("T")
CLUSTERS = 10_000
# Cluster ids are DNS labels of at most 63 characters, reasons our own slugs: the line stays
# near the counts plus MAX_NAMED_CLUSTERS names, whatever the number of clusters.
MAX_LINE_CHARS = 1_500


def cluster_id(i: int) -> ClusterId:
    return ClusterId(f"c{i:05d}")


@dataclass
class FakeCluster:
    """A cluster holding nothing: every apply creates; `down` ones refuse the connection."""

    cluster: ClusterId
    down: bool

    async def get_policy(self, name: str, *, timeout_s: float) -> KubeObject | None:
        self._reach()
        return None

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        self._reach()
        return ObjectList(items=[], resource_version="1", requests=1)

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        self._reach()
        return Applied(object=body, created=True)

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        self._reach()
        return True

    async def server_version(self, *, timeout_s: float) -> str:
        self._reach()
        return "v1.32.0"

    def _reach(self) -> None:
        if self.down:
            raise ClusterUnreachable("connection refused", reason="connect_error")


@dataclass
class FakeClusters:
    down: frozenset[ClusterId]

    def get(self, cluster: ClusterId) -> FakeCluster:
        return FakeCluster(cluster, cluster in self.down)


@dataclass
class FakeStore:
    """One policy of boundary `b`, covering `scope`; what is recorded is kept."""

    scope: frozenset[ClusterId]
    recorded: list[Delivery] = field(default_factory=list)

    def _target(self) -> Target:
        row = PolicyRow("p-latest", "b", {"type": "ForbidLatestTag"}, enabled=True, revision=1)
        return Target(row=row, deleting=False, boundary_exists=True, scope=self.scope,
                      holders=self.scope)

    async def save_target(self, policy_id: str, /) -> Target | None:
        return self._target()

    async def begin_deletion(self, policy_id: str, /) -> Target | None:
        return self._target()

    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str], /) -> bool:
        return True

    async def record_deliveries(self, deliveries: Sequence[Delivery], /) -> None:
        self.recorded.extend(deliveries)

    async def forget_deliveries(self, policy_id: str, clusters: Sequence[str], /) -> None:
        pass

    async def current(self, policy_ids: Sequence[PolicyId], /) -> dict[PolicyId, Current]:
        return {}  # never a newer revision here

    async def start_rollout(self, policy_id: str, revision: int, *, by: str,
                            already_delivered: bool, now: bool = False) -> Start:
        return Start()  # no rollout strategies here: every save goes everywhere at once

    async def staged_rollout(self, policy_id: str, /) -> Staged | None:
        return None


async def once(fn: Callable[[], Awaitable[T]], *, cluster: str, deadline: float) -> T:
    """A retrier that tries once (the retry policy is not what is tested here)."""
    return await fn()


def saver(clusters: int, down: int) -> Saver:
    ids = [cluster_id(i) for i in range(clusters)]
    fakes = FakeClusters(frozenset(ids[:down]))
    loop = asyncio.get_running_loop()
    calls = ClusterCalls(retrier=once, request_timeout_s=5, clock=loop.time,
                         wall=lambda: dt.datetime.now(dt.UTC))
    env = FanoutEnv(clusters=fakes, calls=calls, fence=Unfenced(), deadline_s=60,
                    concurrency=1_000)
    return Saver(store=FakeStore(frozenset(ids)), env=lambda: env, guard_share=0.5)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "convergerd.delivery.fanout" and r.levelno == level]


async def test_a_save_over_many_clusters_logs_counts_and_names_only_the_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = 25
    caplog.set_level(logging.INFO, logger="convergerd.delivery.fanout")
    report = await saver(CLUSTERS, down=failing).save("p-latest")
    assert report.status is FanoutStatus.PARTIAL
    [line] = lines(caplog, logging.INFO)
    assert len(line) <= MAX_LINE_CHARS, line
    assert line.startswith(f"policy p-latest revision 1 saved (api): {CLUSTERS} clusters: "
                           f"apply created {CLUSTERS - failing}, apply failed {failing}; "
                           "failed: c00000 apply (connect_error), c00001 apply (connect_error)")
    assert line.endswith(f" and {failing - MAX_NAMED_CLUSTERS} more")
    named = {cluster_id(i) for i in range(CLUSTERS) if cluster_id(i) in line}
    assert named == {cluster_id(i) for i in range(MAX_NAMED_CLUSTERS)}  # failures only


async def test_a_save_with_no_failure_names_no_cluster(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="convergerd.delivery.fanout")
    await saver(3, down=0).save("p-latest")
    assert lines(caplog, logging.INFO) == [
        "policy p-latest revision 1 saved (api): 3 clusters: apply created 3"]


async def test_a_refused_deletion_names_at_most_the_bounded_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="convergerd.delivery.fanout")
    report = await saver(CLUSTERS, down=CLUSTERS // 2).delete("p-latest")
    assert report.status is FanoutStatus.REFUSED
    [line] = lines(caplog, logging.WARNING)
    assert len(line) <= MAX_LINE_CHARS, line
    assert line.startswith(f"policy p-latest not deleted: {CLUSTERS // 2} cluster(s) still "
                           "hold it: c00000 remove (connect_error), ")
    assert line.endswith(f" and {CLUSTERS // 2 - MAX_NAMED_CLUSTERS} more")
