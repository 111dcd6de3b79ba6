"""What outlives a round: while the database is down, the newest unrecorded rounds are kept to
record later, bounded in number and in the deliveries and readings they hold together (the
newest always); once observed, a round is kept only as its summary (`last_report`), with the
same result, counts and cluster outcomes but no per-policy details."""

from __future__ import annotations

import datetime as dt

import pytest

from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    PhaseReading,
    RoundReport,
    RoundResult,
)
from convergerd.delivery.rounds import backlog_kept, details

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(("sizes", "rounds", "cap", "kept"), [
    ([], 10, 100, 0),
    ([5], 10, 100, 1),
    ([5] * 12, 10, 100, 10),  # the count bounds it
    ([30, 30, 30, 30], 10, 100, 3),  # the details bound it: the newest three
    ([10, 10, 10, 200], 10, 100, 1),  # the newest alone is over the cap: still kept
    ([200, 10, 10], 10, 100, 2),  # an older large one goes, with everything before it
    ([1_000_000, 1_000_000], 10, 2_000_000, 2),
    ([2_000_000, 2_000_000], 10, 2_000_000, 1),  # 10,000 x 100: only the newest waits
])
def test_backlog_keeps_the_newest_rounds_within_both_bounds(
    sizes: list[int], rounds: int, cap: int, kept: int
) -> None:
    assert backlog_kept(sizes, rounds=rounds, details_cap=cap) == kept


def outcome(cluster: str, *, policies: int, failed: int = 0) -> ClusterOutcome:
    cid = ClusterId(cluster)
    deliveries = [Delivery(cid, PolicyId(f"p{j}"), 1,
                           ApplyResult.FAILED if j < failed else ApplyResult.CREATED, T0)
                  for j in range(policies)]
    phases = [PhaseReading(cid, PolicyId(f"p{j}"), "Enforcing", None, None, 1, T0)
              for j in range(policies)]
    return ClusterOutcome(cid, reached=True, desired=policies, in_sync=policies - failed,
                          failed=failed, deliveries=deliveries, phases=phases)


def test_details_count_deliveries_and_readings_of_finished_and_cut_short_clusters() -> None:
    report = RoundReport(started_at=T0, clusters=[outcome("c1", policies=3)],
                         cut_short=[outcome("c2", policies=2)])
    assert details(report) == 10


def test_a_summary_keeps_what_later_readers_see_and_drops_the_details() -> None:
    report = RoundReport(
        started_at=T0, finished_at=T0 + dt.timedelta(seconds=5),
        clusters=[outcome("c1", policies=4), outcome("c2", policies=4, failed=1),
                  ClusterOutcome(ClusterId("c3"), error="401 Unauthorized",
                                 reason="unauthorized")],
        invalid=[InvalidPolicy("p-bad", "b", 2, "rule: unknown type")],
    )
    summary = report.summary()
    assert summary.result is report.result is RoundResult.PARTIAL
    assert summary.counts() == report.counts() == {
        "clusters": 3, "converged": 1, "unreached": 1, "created": 7, "updated": 0,
        "failed": 1, "invalid": 1}
    assert [(c.cluster, c.converged, c.error, c.reason, c.failed, c.desired)
            for c in summary.clusters] == [
        (c.cluster, c.converged, c.error, c.reason, c.failed, c.desired)
        for c in report.clusters]
    assert summary.invalid == report.invalid
    assert details(summary) == 0
    assert details(report) == 16  # the round's own report is left as it was
