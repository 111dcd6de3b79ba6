"""The status state keeps a cluster's per-policy records compactly (a summary per cluster, per
policy only what differs from it) and reads every record back as it was told; its memory per
delivery stays within a budget (measured at 200 clusters x 100 policies). A budget of bytes,
measured with tracemalloc, not a timing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import tracemalloc

import pytest

from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    Audit,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    Verification,
    audit_fields,
    verified_fields,
)
from convergerd.status.records import PolicyRecord, PolicyRecords, row_record
from convergerd.status.state import StatusState

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
C = ClusterId("c1")


def reading(policy: str, *, phase: str | None = "Enforcing", revision: int | None = 3,
            seen: dt.datetime = T0, verified: Verification | None = None,
            audit: Audit | None = None) -> PhaseReading:
    return PhaseReading(C, PolicyId(policy), phase, "Reconciled", "in place", revision, seen,
                        **verified_fields(verified), **audit_fields(audit))


def probe(seconds: float, status: str = "True") -> Verification:
    at = T0 - dt.timedelta(seconds=seconds)
    return Verification(status, "Denied", "the probe object was denied", at, at)


SAME = PolicyRecord(3, "unchanged", T0, T0, None, None, reading("p", verified=probe(60)))
RECORDS = {
    "same-1": SAME,
    "same-2": SAME,
    "own-probe-time": PolicyRecord(3, "unchanged", T0, T0, None, None,
                                   reading("p", verified=probe(61.5))),
    "probe-since-differs": PolicyRecord(3, "unchanged", T0, T0, None, None, reading(
        "p", verified=Verification("True", "Denied", "m", T0, T0 - dt.timedelta(days=1)))),
    "other-revision": PolicyRecord(7, "updated", T0, T0, None, None,
                                   reading("p", revision=7, verified=probe(60))),
    "failed": PolicyRecord(2, "failed", T0 + dt.timedelta(seconds=1), T0 - dt.timedelta(hours=1),
                           "422 Unprocessable Entity: spec.rule", "invalid",
                           reading("p", revision=2, verified=probe(60))),
    "no-phase": PolicyRecord(3, "created", T0, T0, None, None, None),
    "phase-without-verified": PolicyRecord(3, "unchanged", T0, T0, None, None,
                                           reading("p", phase="Pending")),
    "seen-only": PolicyRecord(None, None, None, None, None, None,
                              reading("p", phase=None, revision=None)),
    "nothing": PolicyRecord(),
    "audited": PolicyRecord(3, "unchanged", T0, T0, None, None,
                            reading("p", verified=probe(60), audit=Audit(2, T0, True))),
    "audit-unreadable": PolicyRecord(3, "unchanged", T0, T0, None, None, reading(
        "p", verified=probe(60), audit=Audit(None, problem="violations: not an integer"))),
    "verified-unknown": PolicyRecord(3, "unchanged", T0, T0, None, None,
                                     reading("p", verified=Verification("Unknown"))),
}


def expected(policy: str, record: PolicyRecord) -> PolicyRecord:
    """`record` as told about `policy` (its reading names that policy)."""
    phase = record.phase
    if phase is None:
        return record
    return PolicyRecord(record.delivered_revision, record.last_result, record.last_attempt_at,
                        record.last_success_at, record.last_error, record.last_reason,
                        dataclasses.replace(phase, policy=PolicyId(policy)))


def test_every_record_reads_back_as_told_whatever_it_shares_with_the_others() -> None:
    records = PolicyRecords(C)
    told = {PolicyId(p): expected(p, r) for p, r in RECORDS.items()}
    records.repack(told)
    assert dict(records) == told
    assert sorted(records) == sorted(told)
    assert len(records) == len(told)


@pytest.mark.parametrize("policy", sorted(RECORDS))
def test_a_record_told_alone_reads_back_as_told(policy: str) -> None:
    records = PolicyRecords(C)
    records.repack({PolicyId(p): expected(p, r) for p, r in RECORDS.items()})
    pid = PolicyId(policy)
    replacement = expected(policy, RECORDS["failed"])
    records[pid] = replacement
    assert records[pid] == replacement
    del records[pid]
    assert pid not in records


def test_every_record_reads_back_as_its_row_the_rest_shared_where_it_is_the_summarys() -> None:
    records = PolicyRecords(C)
    told = {PolicyId(p): expected(p, r) for p, r in RECORDS.items()}
    records.repack(told)
    *rows, missing = records.record_rows([*told, PolicyId("never-told")])
    assert missing is None
    split = dict(zip(told, rows, strict=True))
    assert {p: row_record(row[0] + row[1], C, p) if row else None
            for p, row in split.items()} == told
    # A record differing from the others in its head alone (its probe time) shares their
    # rest: a reader judging records by it compares one object.
    rests = {p: row[1] if row else None for p, row in split.items()}
    assert rests[PolicyId("own-probe-time")] is rests[PolicyId("same-1")]
    assert rests[PolicyId("failed")] != rests[PolicyId("same-1")]


def test_a_record_read_is_a_copy_changing_it_changes_nothing_kept() -> None:
    records = PolicyRecords(C)
    records.repack({PolicyId("p1"): expected("p1", SAME)})
    records[PolicyId("p1")].last_error = "changed"
    assert records[PolicyId("p1")].last_error is None


# --- the budget -----------------------------------------------------------------------------

# 200 x 100: the bytes per delivery are the same at 1,000 x 50 and 2,000 x 100
# (`bench/status_memory.py`), and a tenth of the deliveries takes a tenth of the time.
CLUSTERS = 200
POLICIES = 100
# Measured 2026-12-03: ~170 bytes per delivery kept between rounds (the packed entry with each
# policy's own probe time, its key in the cluster's dict, the readings' tally), where the
# records as dataclasses (`PolicyRecord`, `PhaseReading`, `Verification`, each decoded string
# and time its own object) kept ~1,050: 1 GB at 10,000 x 100. The budget leaves room for
# noise and fails the old layout by far.
BUDGET_BYTES_PER_DELIVERY = 300


def fresh(text: str) -> str:
    """A string as a decoder returns it: its own object, equal to others."""
    return "".join(list(text))


def in_sync_round(at: dt.datetime) -> RoundReport:
    """An in-sync round as the engine reports it: every policy unchanged and read back with
    its phase, Ready and a Verified condition probed at its own time."""
    outcomes = []
    for i in range(CLUSTERS):
        cid = ClusterId(f"c{i:05d}")
        phases, deliveries = [], []
        for j in range(POLICIES):
            pid = PolicyId(f"p{j:03d}")
            revision = 1 + j % 7
            probed = at - dt.timedelta(seconds=60 + j * 0.731 + i / 1000)
            verified = Verification(fresh("True"), fresh("Denied"),
                                    fresh("the probe object was denied"), probed,
                                    probed + dt.timedelta(0))
            phases.append(PhaseReading(cid, PolicyId(fresh(pid)), fresh("Enforcing"),
                                       fresh("Reconciled"), fresh("in place"), revision, at,
                                       **verified_fields(verified)))
            deliveries.append(Delivery(cid, pid, revision, ApplyResult.UNCHANGED, at))
        outcomes.append(ClusterOutcome(cid, reached=True, desired=POLICIES, in_sync=POLICIES,
                                       server_version="v1.31.2", phases=phases,
                                       deliveries=deliveries))
    return RoundReport(started_at=at - dt.timedelta(seconds=30), finished_at=at,
                       epoch=Epoch("test", 1), clusters=outcomes)


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


@pytest.mark.timeout(600)
def test_status_memory_per_delivery_is_within_budget_at_200_clusters_by_100_policies() -> None:
    state = StatusState(identity="test", interval_s=300.0, clock=lambda: T0)
    state.set_clusters(f"c{i:05d}" for i in range(CLUSTERS))
    tracemalloc.start()
    try:
        base = traced()
        report = in_sync_round(T0)
        state.observe_round(report)
        del report  # what stays is what the state keeps of it
        kept = traced() - base
    finally:
        tracemalloc.stop()
    per_delivery = kept / (CLUSTERS * POLICIES)
    print(f"status state: {kept / 1e6:.1f} MB, {per_delivery:.0f} bytes per delivery")  # noqa: T201
    assert sum(len(c.policies) for c in state.clusters.values()) == CLUSTERS * POLICIES
    assert per_delivery <= BUDGET_BYTES_PER_DELIVERY
