"""A round's report holds each cluster's deliveries and readings packed (`Deliveries`,
`Readings`) and reads every one back as it was told; the report and its record's rows, made
cluster by cluster as they are written, stay within a budget of bytes per delivery (measured
with tracemalloc at 200 clusters x 100 policies, not a timing)."""

from __future__ import annotations

import datetime as dt
import tracemalloc
from collections import Counter

import pytest

from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    Audit,
    AuditSample,
    ClusterOutcome,
    Deliveries,
    Delivery,
    PhaseReading,
    Readings,
    Verification,
    audit_fields,
    verified_fields,
)
from convergerd.store.records import round_record
from tests.unit.test_state_memory import CLUSTERS, POLICIES, T0, in_sync_round, traced

C1, C2 = ClusterId("c1"), ClusterId("c2")
LATER = T0 + dt.timedelta(seconds=5)

DELIVERIES = [
    Delivery(C1, PolicyId("p1"), 3, ApplyResult.UNCHANGED, T0),
    Delivery(C1, PolicyId("p2"), 2**70, ApplyResult.UNCHANGED, T0),
    Delivery(C1, PolicyId("p3"), 4, ApplyResult.CREATED, LATER),
    Delivery(C1, PolicyId("p4"), 4, ApplyResult.FAILED, LATER, "422 Unprocessable Entity",
             "invalid", 3),
    Delivery(C2, PolicyId("p1"), 3, ApplyResult.UNCHANGED, T0),  # another cluster
    Delivery(C1, PolicyId("p1"), 3, ApplyResult.UNCHANGED, T0),  # a duplicate
]
PROBED = T0 - dt.timedelta(minutes=1)
READINGS = [
    PhaseReading(C1, PolicyId("p1"), "Enforcing", "Reconciled", "in place", 3, T0,
                 **verified_fields(Verification("True", "Denied", "denied", PROBED, PROBED))),
    PhaseReading(C1, PolicyId("p2"), "Enforcing", "Reconciled", "in place", 3, T0,
                 **verified_fields(Verification("True", "Denied", "denied", PROBED,
                                                T0 - dt.timedelta(days=1)))),
    PhaseReading(C1, PolicyId("p3"), "Pending", None, None, None, T0),
    PhaseReading(C1, PolicyId("p4"), None, None, None, None, T0,
                 **verified_fields(Verification("Unknown"))),
    PhaseReading(C1, PolicyId("p5"), "Enforcing", "Reconciled", "in place", 3, T0,
                 **audit_fields(Audit(2, T0, True, None,
                                      (AuditSample("Pod", "ns", "web", "latest"),)))),
    PhaseReading(C1, PolicyId("p6"), "Enforcing", "Reconciled", "in place", 3, T0,
                 **audit_fields(Audit(None, problem="violations: not an integer"))),
]


def test_deliveries_read_back_as_told_in_order() -> None:
    packed = Deliveries(DELIVERIES)
    assert list(packed) == DELIVERIES
    assert packed == DELIVERIES
    assert [packed[i] for i in range(len(packed))] == DELIVERIES
    assert packed[1:3] == DELIVERIES[1:3]
    assert list(packed.results()) == [d.result for d in DELIVERIES]
    assert packed.tally() == Counter(d.result for d in DELIVERIES)
    packed.append(DELIVERIES[3])
    assert packed[-1] == DELIVERIES[3]
    assert packed.tally()[DELIVERIES[3].result] == 2
    assert len(packed) == len(DELIVERIES) + 1


def test_deliveries_extended_alike_read_back_as_appended_one_by_one() -> None:
    """A cluster's unchanged deliveries, appended in one step without a `Delivery` each,
    read back, count and tally as the same deliveries appended one at a time."""
    one_by_one = Deliveries(DELIVERIES[:1])
    at_once = Deliveries(DELIVERIES[:1])
    alike = [(PolicyId(f"p{i}"), i) for i in range(5, 9)]
    for policy, revision in alike:
        one_by_one.append(Delivery(C1, policy, revision, ApplyResult.UNCHANGED, LATER))
    at_once.extend_alike(Delivery(C1, *alike[0], ApplyResult.UNCHANGED, LATER), alike)
    at_once.extend_alike(Delivery(C1, *alike[0], ApplyResult.UNCHANGED, LATER), [])
    assert at_once == list(one_by_one)
    assert at_once.tally() == one_by_one.tally() == {ApplyResult.UNCHANGED: 5}
    assert at_once.counted() == one_by_one.counted()


def test_readings_read_back_as_told_in_order() -> None:
    packed = Readings(READINGS)
    assert list(packed) == READINGS
    assert packed == READINGS
    assert [packed[i] for i in range(len(packed))] == READINGS
    assert not Readings()


def test_an_outcome_told_lists_holds_them_packed_and_compares_by_content() -> None:
    outcome = ClusterOutcome(C1, reached=True, deliveries=DELIVERIES, phases=READINGS)
    assert isinstance(outcome.deliveries, Deliveries)
    assert isinstance(outcome.phases, Readings)
    assert outcome == ClusterOutcome(C1, reached=True, deliveries=Deliveries(DELIVERIES),
                                     phases=Readings(READINGS))
    assert outcome != ClusterOutcome(C1, reached=True, deliveries=DELIVERIES[:1],
                                     phases=READINGS)


# Measured 2026-12-03 at 500 x 100 and at 200 x 100: ~135 bytes per delivery for the report
# (its readings' probe times included, which the status state shares) and ~5 more for the
# record's rows at their peak while written. The report as dataclasses (`Delivery`, `PhaseReading`,
# `Verification` each) held ~340 and the record's rows, all made before writing, ~230
# (`bench/status_memory.py` at 1,000 x 50).
BUDGET_BYTES_PER_DELIVERY = 200


@pytest.mark.timeout(600)
async def test_a_round_report_and_its_record_per_delivery_are_within_budget() -> None:
    tracemalloc.start()
    try:
        base = traced()
        report = in_sync_round(T0)
        held = traced() - base
        tracemalloc.reset_peak()
        record = await round_record(report, "test")
        rows = sum(1 for _ in record.rows())
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    deliveries = CLUSTERS * POLICIES
    print(f"report: {held / deliveries:.0f} bytes per delivery; with its record's rows "  # noqa: T201
          f"at their peak: {peak / deliveries:.0f}")
    assert rows == deliveries
    assert peak / deliveries <= BUDGET_BYTES_PER_DELIVERY
