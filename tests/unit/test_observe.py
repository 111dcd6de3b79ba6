"""Observing a round: the round loop's way (`rounds.observe_round`) lets other tasks run while
a large round is observed, and what they read meanwhile is each cluster before or after the
round, never half of it, with the fleet's last round switched at the end. What a round leaves
per policy is what each delivery and reading says (the newer delivery wins, a failure keeps
the last success), and the phases are counted as reading them one by one counts them."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from convergerd.core.facts import OWN_PROBED_AT
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    Audit,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    Readings,
    RoundReport,
    Verification,
    audit_fields,
    verified_fields,
)
from convergerd.delivery.rounds import observe_round
from convergerd.status.document import snapshot
from convergerd.status.metrics import Metrics
from convergerd.status.phases import audit_tally, audit_tally_grouped, tally, tally_grouped
from convergerd.status.state import StatusState

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
CLUSTERS = 40
POLICIES = 20


def in_sync_round(at: dt.datetime) -> RoundReport:
    outcomes = []
    for i in range(CLUSTERS):
        cid = ClusterId(f"c{i:03d}")
        probed = at - dt.timedelta(seconds=60 + i)
        outcomes.append(ClusterOutcome(
            cid, reached=True, desired=POLICIES, in_sync=POLICIES,
            deliveries=[Delivery(cid, PolicyId(f"p{j}"), 1, ApplyResult.UNCHANGED, at)
                        for j in range(POLICIES)],
            phases=[PhaseReading(cid, PolicyId(f"p{j}"), "Enforcing", "Reconciled", "ok", 1, at,
                                 **verified_fields(Verification("True", "Denied", "denied",
                                                                probed, probed)))
                    for j in range(POLICIES)]))
    return RoundReport(started_at=at - dt.timedelta(seconds=30), finished_at=at,
                       epoch=Epoch("test", 1), clusters=outcomes)


def replica() -> tuple[StatusState, Metrics]:
    state = StatusState(identity="test", interval_s=300.0, clock=lambda: T0)
    state.set_clusters(f"c{i:03d}" for i in range(CLUSTERS))
    return state, Metrics(state=state, process_collectors=False)


def round_of_cluster(state: StatusState, cluster: str) -> set[dt.datetime | None]:
    """When the rounds a cluster's state and each of its records say last worked on it."""
    live = state.clusters[ClusterId(cluster)]
    return {live.last_attempt_at} | {r.last_attempt_at for r in live.policies.values()}


async def test_other_tasks_run_while_a_round_is_observed_and_see_whole_clusters() -> None:
    state, metrics = replica()
    first, second = T0, T0 + dt.timedelta(seconds=300)
    await observe_round(in_sync_round(first), metrics=metrics, state=state)
    version = state.version
    seen: list[tuple[int, dt.datetime | None, int]] = []  # (clusters at the new round, ...)
    observing = asyncio.create_task(observe_round(in_sync_round(second), metrics=metrics,
                                                  state=state, slice_s=0.0))
    while not observing.done():
        rounds = [round_of_cluster(state, f"c{i:03d}") for i in range(CLUSTERS)]
        assert all(len(r) == 1 for r in rounds)  # a cluster is never half observed
        last = state.last_round
        seen.append((sum(r == {second} for r in rounds),
                     last.finished_at if last is not None else None, state.version))
        await asyncio.sleep(0)
    await observing
    midway = [s for s in seen if 0 < s[0] < CLUSTERS]
    assert midway, "no other task ran while the round was observed"
    assert all(finished == first for _, finished, _ in midway)  # switched at the end only
    assert [s[2] for s in seen] == sorted(s[2] for s in seen)
    assert state.version > max(s[2] for s in seen) > version  # a reader rebuilds after
    assert state.last_round is not None
    assert state.last_round.finished_at == second
    assert all(round_of_cluster(state, f"c{i:03d}") == {second} for i in range(CLUSTERS))


async def test_a_round_observed_in_slices_leaves_what_one_observed_at_once_leaves() -> None:
    sliced, sliced_metrics = replica()
    at_once, at_once_metrics = replica()
    for k in range(2):
        report = in_sync_round(T0 + dt.timedelta(seconds=300 * k))
        await observe_round(report, metrics=sliced_metrics, state=sliced, slice_s=0.0)
        at_once_metrics.observe_round(report)
        at_once.observe_round(report)
    assert snapshot(sliced) == snapshot(at_once)
    assert sliced_metrics.render() == at_once_metrics.render()


def test_the_newer_delivery_wins_and_a_failure_keeps_the_last_success() -> None:
    state, _ = replica()
    c, p1, p2, p3 = ClusterId("c000"), PolicyId("p1"), PolicyId("p2"), PolicyId("p3")
    t1, t2 = T0, T0 + dt.timedelta(seconds=300)

    def round_at(at: dt.datetime, *deliveries: Delivery) -> RoundReport:
        return RoundReport(started_at=at, finished_at=at, clusters=[ClusterOutcome(
            c, reached=True, desired=3, in_sync=3, deliveries=deliveries)])

    state.observe_round(round_at(t1, Delivery(c, p1, 1, ApplyResult.CREATED, t1),
                                 Delivery(c, p2, 1, ApplyResult.CREATED, t2),
                                 Delivery(c, p3, 1, ApplyResult.CREATED, t1)))
    state.observe_round(round_at(
        t2, Delivery(c, p1, 2, ApplyResult.FAILED, t2, "422", "invalid"),
        Delivery(c, p2, 2, ApplyResult.UPDATED, t1),  # older than what is known
        Delivery(c, p3, 2, ApplyResult.UPDATED, t2),
        Delivery(c, p3, 3, ApplyResult.FAILED, t2, "409", "conflict")))  # then failed
    records = state.clusters[c].policies
    assert (records[p1].last_result, records[p1].delivered_revision, records[p1].last_error,
            records[p1].last_attempt_at, records[p1].last_success_at) == (
        "failed", 1, "422", t2, t1)
    assert (records[p2].last_result, records[p2].delivered_revision) == ("created", 1)
    assert (records[p3].last_result, records[p3].delivered_revision, records[p3].last_reason,
            records[p3].last_success_at) == ("failed", 2, "conflict", t2)


def verified(status: str, reason: str | None, probed_s: float | None) -> Verification:
    at = None if probed_s is None else T0 + dt.timedelta(seconds=probed_s)
    return Verification(status, reason, None, at, at)


@pytest.mark.parametrize("found", [
    None, verified("True", "Denied", -60), verified("True", "Denied", -6000),
    verified("True", "Denied", 600), verified("True", "Denied", None),
    verified("False", "Admitted", -60), verified("False", "Admitted", 600),
    verified("Unknown", None, -60), verified("False", "NoBoundaryNamespace", None),
])
@pytest.mark.parametrize("audit", [None, Audit(3, T0, True), Audit(None, problem="bad"),
                                   Audit(2, T0 + dt.timedelta(hours=1), False)])
def test_grouped_readings_count_as_each_reading_counts(found: Verification | None,
                                                       audit: Audit | None) -> None:
    readings = Readings()
    # Probe times around the reading (some in its future), grouped by all the rest.
    for j, shift in enumerate((0, 1, -30, 61, 3600, -86400)):
        v = found
        if v is not None and v.probed_at is not None:
            at = v.probed_at + dt.timedelta(seconds=shift)
            v = Verification(v.status, v.reason, v.message, at, at)
        for phase in ("Enforcing", "Error"):
            readings.append(PhaseReading(ClusterId("c"), PolicyId(f"p{j}-{phase}"), phase,
                                         None, None, 1, T0, **verified_fields(v),
                                         **audit_fields(audit)))
    groups: dict[int, tuple[PhaseReading, list[dt.datetime | None], list[PolicyId]]] = {}
    for policy, own, stand_in in readings.shared():
        group = groups.setdefault(id(stand_in), (stand_in, [], []))
        group[1].append(own[OWN_PROBED_AT])
        group[2].append(policy)
    assert len(groups) == 2  # one per phase
    assert tally_grouped((r, p) for r, p, _ in groups.values()) == tally(readings)
    assert audit_tally_grouped((r, ps) for r, _, ps in groups.values()) == audit_tally(readings)
