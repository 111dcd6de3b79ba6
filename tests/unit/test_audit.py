"""The operator's audit (`status.audit`) read back with the phases: decoded at the edge with
bounds (anything malformed is an unknown audit, never a broken phase), rolled up per cluster and
per policy by the status state, exposed as metrics without a per-policy label, and shown by
`convergerd status`."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from convergerd.cli.status import render_status
from convergerd.core.decode import (
    MAX_LABEL_VALUE_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
)
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.plan import MAX_AUDIT_VIOLATIONS, ListedPolicy, audit
from convergerd.core.report import (
    Audit,
    AuditSample,
    ClusterOutcome,
    PhaseReading,
    RoundReport,
    audit_fields,
)
from convergerd.status.document import audit_sample_view, cluster_audit_view, snapshot
from convergerd.status.metrics import Metrics
from convergerd.status.phases import AUDIT_STALE_PERIODS
from convergerd.status.state import StatusState
from convergerd.status.views import policy_audit_view, record_view
from tests.strategies import JSON_VALUES
from tests.unit.test_decode import safe

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
INTERVAL = 300.0
PROBE = 600.0


def policy_object(status: object) -> dict[str, Any]:
    return {"metadata": {"name": "policy-p1", "resourceVersion": "7"},
            "spec": {"policyId": "p1"},
            "status": {"phase": "Enforcing", "audit": status}}


GOOD = {"violations": 3, "auditedAt": "2026-12-03T11:59:00Z", "cacheSynced": True,
        "sample": [{"kind": "Pod", "namespace": "team-a-web", "name": "api-7f9c",
                    "message": "image uses tag latest"}]}


def test_a_well_formed_audit_is_read_with_its_sample() -> None:
    found = ListedPolicy.from_object(policy_object(GOOD))
    assert found.phase == "Enforcing"
    assert found.audit == Audit(3, dt.datetime(2026, 12, 3, 11, 59, tzinfo=dt.UTC), True, None,
                                (AuditSample("Pod", "team-a-web", "api-7f9c",
                                             "image uses tag latest"),))


def test_an_incomplete_audit_is_read_as_not_synced() -> None:
    """The operator judged only part of the boundary (issue 33): the count may be partial."""
    found = ListedPolicy.from_object(policy_object(GOOD | {"incomplete": {
        "skipped": 2, "reason": "at its budget", "objects": [], "biggestNamespaces": ["b"]}}))
    assert found.audit is not None
    assert found.audit.violations == 3
    assert not found.audit.synced


def test_no_audit_is_none_not_unknown() -> None:
    obj = policy_object(None)
    del obj["status"]["audit"]
    assert ListedPolicy.from_object(obj).audit is None


@pytest.mark.parametrize(("change", "field"), [
    ({"violations": -1}, "status.audit.violations"),
    ({"violations": MAX_AUDIT_VIOLATIONS + 1}, "status.audit.violations"),
    ({"violations": True}, "status.audit.violations"),
    ({"violations": "3"}, "status.audit.violations"),
    ({"violations": None}, "status.audit.violations: missing"),
    ({"auditedAt": "yesterday"}, "status.audit.auditedAt"),
    ({"cacheSynced": "yes"}, "status.audit.cacheSynced"),
    ({"sample": [{"kind": "Pod"}] * 6}, "at most 5"),
    ({"sample": [{"kind": "Pod", "name": 7}]}, "status.audit.sample[0].name"),
    ({"sample": ["Pod/x"]}, "status.audit.sample[0]"),
    ({"sample": {"kind": "Pod"}}, "status.audit.sample"),
])
def test_a_malformed_audit_is_unknown_naming_the_field_and_the_phase_stays(
    change: dict[str, Any], field: str
) -> None:
    found = ListedPolicy.from_object(policy_object({**GOOD, **change}))
    assert found.phase == "Enforcing"  # the phase reading is not broken by the audit
    assert found.ready_reason is None
    assert found.audit is not None
    assert found.audit.violations is None
    assert field in (found.audit.problem or "")


def test_an_audit_that_is_not_an_object_is_unknown() -> None:
    found = ListedPolicy.from_object(policy_object([1, 2]))
    assert found.phase == "Enforcing"
    assert found.audit is not None
    assert found.audit.violations is None


def test_audit_strings_are_capped_and_cleaned() -> None:
    long = "x" * 10_000 + "\x00\n"
    found = audit({**GOOD, "sample": [{"kind": long, "namespace": long, "name": long,
                                       "message": long}]})
    (sample,) = found.sample
    assert len(sample.kind) <= MAX_REASON_CHARS
    assert sample.namespace is not None
    assert len(sample.namespace) <= MAX_LABEL_VALUE_CHARS
    assert len(sample.name) <= MAX_NAME_CHARS
    assert sample.message is not None
    assert len(sample.message) <= MAX_MESSAGE_CHARS
    assert all(safe(t) for t in (sample.kind, sample.namespace, sample.name, sample.message))


AUDIT_LIKE = st.fixed_dictionaries({}, optional={
    "violations": JSON_VALUES | st.integers(-5, 2 * MAX_AUDIT_VIOLATIONS),
    # Times at the ends of what RFC 3339 writes (year 0 and 9999), cut short, and garbage.
    "auditedAt": JSON_VALUES | st.sampled_from([
        "2026-12-03T12:00:00Z", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:60Z", "2026-12-03T12:0",
        "+275760-09-13T00:00:00Z"]),
    "cacheSynced": JSON_VALUES,
    "sample": st.lists(st.fixed_dictionaries({}, optional={
        k: JSON_VALUES | st.text() for k in ("kind", "namespace", "name", "message")})
        | JSON_VALUES, max_size=7) | JSON_VALUES,
}) | JSON_VALUES


@given(AUDIT_LIKE)
def test_any_audit_body_is_a_bounded_audit_or_unknown_never_an_exception(body: Any) -> None:
    found = ListedPolicy.from_object(policy_object(body))
    assert found.phase == "Enforcing"
    a = found.audit
    if body is None:
        assert a is None
        return
    assert a is not None
    if a.violations is None:
        assert a.problem
        assert safe(a.problem)
        assert len(a.problem) <= MAX_MESSAGE_CHARS
        assert a.sample == ()
        return
    assert type(a.violations) is int
    assert 0 <= a.violations <= MAX_AUDIT_VIOLATIONS
    assert a.audited_at is not None
    assert type(a.synced) is bool
    assert len(a.sample) <= 5
    for s in a.sample:
        assert s.kind
        assert s.name
        assert safe(s.kind)
        assert safe(s.name)
    # What the status API makes of it is JSON of bounded parts, whatever came in.
    r = PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, T0,
                     **audit_fields(a))
    view = record_view(_record(r), T0, INTERVAL)["audit"]
    assert view["state"] in ("current", "unsynced", "stale", "unknown")


def _record(r: PhaseReading) -> Any:
    from convergerd.status.records import PolicyRecord
    record = PolicyRecord()
    record.phase = r
    return record


# ---------------------------------------------------------------------------------------------
# The roll-up: state, metrics, the CLI


def _audited(cluster: str, policy: str, violations: int | None, *, at: dt.datetime = T0,
             synced: bool = True, sample: tuple[AuditSample, ...] = ()) -> PhaseReading:
    found = (Audit(violations, at - dt.timedelta(seconds=30), synced, None, sample)
             if violations is not None else Audit(None, problem="status.audit: expected ..."))
    return PhaseReading(ClusterId(cluster), PolicyId(policy), "Enforcing", None, None, 1, at,
                        **audit_fields(found))


def _round(at: dt.datetime, **clusters: list[PhaseReading]) -> RoundReport:
    return RoundReport(started_at=at, finished_at=at, clusters=[
        ClusterOutcome(ClusterId(c), reached=True, desired=len(r), in_sync=len(r), phases=r)
        for c, r in clusters.items()])


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


def _pod(name: str) -> AuditSample:
    return AuditSample("Pod", "team-a", name, "image uses tag latest")


@pytest.fixture
def fleet() -> tuple[StatusState, Clock]:
    clock = Clock()
    state = StatusState(identity="r", interval_s=INTERVAL, clock=clock, probe_period_s=PROBE)
    state.set_clusters(["c1", "c2", "c3", "c4"])
    state.observe_round(_round(
        T0,
        c1=[_audited("c1", "p1", 3, sample=(_pod("a"), _pod("b"), _pod("c"))),
            _audited("c1", "p2", 0)],
        c2=[_audited("c2", "p1", 4, sample=tuple(_pod(f"x{i}") for i in range(4))),
            _audited("c2", "p2", 2, synced=False)],
        c3=[_audited("c3", "p1", None), _audited("c3", "p2", 0)],
        c4=[PhaseReading(ClusterId("c4"), PolicyId("p1"), "Enforcing", None, None, 1, T0)],
    ))
    return state, clock


def test_per_cluster_sums_and_fleet_totals_per_policy(fleet: tuple[StatusState, Clock]) -> None:
    state, _clock = fleet
    doc = snapshot(state)
    audits = {c["id"]: c["audit"] for c in doc["clusters"]}
    assert audits["c1"] == {"violations": 3, "policies_with_violations": 1,
                            "policies_audited": 2, "unknown": 0, "unsynced": False}
    assert audits["c2"]["violations"] == 6
    assert audits["c2"]["unsynced"] is True
    assert audits["c3"] == {"violations": 0, "policies_with_violations": 0,
                            "policies_audited": 2, "unknown": 1, "unsynced": True}
    assert audits["c4"] is None  # an operator that does not audit: nothing, not zero
    assert doc["audit"] == {
        "violations": 9, "clusters_audited": 3, "clusters_with_violations": 2,
        "unsynced_clusters": 2, "policies_with_violations": 2,
        "policies": [{"id": "p1", "violations": 7, "clusters": 2},
                     {"id": "p2", "violations": 2, "clusters": 1}]}


def test_samples_are_kept_per_policy_five_at_most_and_only_while_counted(
    fleet: tuple[StatusState, Clock],
) -> None:
    state, clock = fleet
    sample = audit_sample_view(state, "p1")
    assert len(sample) == 5
    assert [s["cluster"] for s in sample] == ["c2"] * 4 + ["c1"]  # the cluster read last first
    # No reading keeps its sample: per policy and cluster only the count is held.
    assert all(r.audit is None or r.audit.sample == ()
               for c in state.clusters.values() for r in c.readings())
    clock.now = T0 + dt.timedelta(seconds=60)
    state.observe_round(_round(clock.now, c2=[_audited("c2", "p1", 0, at=clock.now)]))
    assert [s["name"] for s in audit_sample_view(state, "p1")] == ["a"]  # c1's, still counted
    state.retain_policies(["p2"])
    assert audit_sample_view(state, "p1") == []


def test_a_policy_view_gives_per_cluster_counts_and_a_total(
    fleet: tuple[StatusState, Clock],
) -> None:
    state, _clock = fleet
    now = state.clock()
    views = [record_view(state.clusters[ClusterId(c)].policies[PolicyId("p1")], now, INTERVAL,
                         probe_period_s=PROBE)["audit"] for c in ("c1", "c2", "c3", "c4")]
    assert [v and v["violations"] for v in views] == [3, 4, None, None]
    assert views[2] is not None
    assert views[2]["state"] == "unknown"
    total = policy_audit_view(views, audit_sample_view(state, "p1"))
    assert {k: v for k, v in total.items() if k != "sample"} == {
        "violations": 7, "clusters_audited": 3, "clusters_with_violations": 2,
        "clusters_unknown": 1, "clusters_not_current": 1, "excepted": None}


def test_an_audit_goes_stale_when_the_operator_stops_auditing(
    fleet: tuple[StatusState, Clock],
) -> None:
    state, clock = fleet
    # Read every interval, but auditedAt never moves: AUDIT_STALE_PERIODS probe periods later
    # (the operator rewrites an unchanged audit's time only at its heartbeat) it is stale.
    last = int(AUDIT_STALE_PERIODS * PROBE / 60) + 5
    for minutes in range(5, last + 1, 5):
        clock.now = T0 + dt.timedelta(minutes=minutes)
        state.observe_round(_round(clock.now, c1=[
            PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, clock.now,
                         **audit_fields(Audit(3, T0, True)))]))
    view = record_view(state.clusters[ClusterId("c1")].policies[PolicyId("p1")], clock.now,
                       INTERVAL, probe_period_s=PROBE)["audit"]
    assert view["state"] == "stale"
    assert view["violations"] == 3
    summary = cluster_audit_view(state, state.clusters[ClusterId("c1")], clock.now)
    assert summary is not None
    assert summary["unsynced"] is True


def test_an_audit_dated_after_its_reading_is_not_believed() -> None:
    future = T0 + dt.timedelta(hours=1)
    r = PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, T0,
                     **audit_fields(Audit(5, future, True)))
    view = record_view(_record(r), T0, INTERVAL)["audit"]
    assert view["violations"] is None
    assert view["state"] == "unknown"
    assert "after the reading" in view["problem"]


def test_metrics_per_cluster_and_fleet_never_per_policy(fleet: tuple[StatusState, Clock]) -> None:
    state, _clock = fleet
    text = Metrics(state=state, process_collectors=False).render().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("convergerd_audit_violations", (("cluster", "c1"),))] == 3
    assert samples[("convergerd_audit_violations", (("cluster", "c2"),))] == 6
    assert samples[("convergerd_audit_violations", (("cluster", "c3"),))] == 0
    assert ("convergerd_audit_violations", (("cluster", "c4"),)) not in samples
    assert samples[("convergerd_audit_clusters_with_violations", ())] == 2
    assert samples[("convergerd_audit_unsynced_clusters", ())] == 2
    assert not any("policy" in dict(labels) for _name, labels in samples)


def test_the_status_table_has_a_violations_column_and_per_policy_totals(
    fleet: tuple[StatusState, Clock],
) -> None:
    state, _clock = fleet
    text = render_status(snapshot(state), addr="http://x")
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("CLUSTER"))
    assert "VIOLATIONS" in header
    col = header.index("VIOLATIONS")
    cells = {line.split()[0]: line[col:].split("  ")[0].strip()
             for line in lines if re.match(r"c\d ", line)}
    assert cells == {"c1": "3", "c2": "6 UNSYNCED", "c3": "0 UNKNOWN=1 UNSYNCED", "c4": "-"}
    assert "existing workloads the policies would deny (operator audit): 9 on 2 of 3" in text
    assert "  p1: 7 on 2 clusters" in lines
    assert "  p2: 2 on 1 cluster" in lines


def test_hostile_status_documents_do_not_break_the_violations_column() -> None:
    for audit_doc in (None, "x", {"violations": "9"}, {"violations": True},
                      {"violations": 2, "unknown": 2, "policies_audited": 2}):
        text = render_status({"clusters": [{"id": "c1", "audit": audit_doc}],
                              "audit": {"clusters_audited": 1, "policies": ["x", {"id": 7}]}})
        assert "VIOLATIONS" in text


def test_the_table_lists_the_ten_worst_policies_and_says_how_many_more() -> None:
    policies = [{"id": f"p{i:02d}", "violations": 100 - i, "clusters": 1} for i in range(12)]
    text = render_status({"clusters": [{"id": "c1", "audit": {
        "violations": 1000, "unknown": 0, "policies_audited": 12, "unsynced": False}}],
        "audit": {"violations": 1000, "clusters_audited": 1, "clusters_with_violations": 1,
                  "unsynced_clusters": 0, "policies_with_violations": 12,
                  "policies": policies}})
    lines = text.splitlines()
    assert "  p00: 100 on 1 cluster" in lines
    assert "  p09: 91 on 1 cluster" in lines
    assert "  p10: 90 on 1 cluster" not in lines
    assert any(line.startswith("  and 2 more policies") for line in lines)
