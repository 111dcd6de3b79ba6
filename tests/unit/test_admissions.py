"""What the operator reports beside the phase — the mode in force (`status.enforcementAction`),
the API server's admission counts (`status.admission`), the audit's excepted objects
(`status.audit.excepted`) — read back with the phases: decoded at the edge with bounds (a
malformed `status.admission` is unknown counts with the problem said, never a broken phase),
shown per cluster beside the phase, rolled up per policy (the policy's view, `/status`, the
metrics: per policy, never per policy and cluster), and kept up to date as readings change."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from convergerd.cli.status import render_policy, render_status
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.plan import MAX_ADMISSIONS, ListedPolicy
from convergerd.core.report import ClusterOutcome, Epoch, PhaseReading, RoundReport
from convergerd.status.admissions import PolicyAdmissions, admission_tally
from convergerd.status.document import snapshot
from convergerd.status.metrics import Metrics
from convergerd.status.phases import ADMISSION_STALE_PERIODS
from convergerd.status.state import StatusState
from convergerd.status.views import policy_admission_view, record_view

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)
INTERVAL = 300.0
PROBE = 600.0
SINCE = "2026-12-03T10:00:00Z"
READ_AT = "2026-12-03T11:59:30Z"

GOOD = {"denied": 0, "warned": 3, "audited": 3, "since": SINCE, "readAt": READ_AT,
        "revision": 4, "lastHour": {"denied": 0, "warned": 1, "audited": 1, "since": SINCE},
        "resets": 1, "probesExcluded": 2,
        "note": "an API server's counters started again (a restart)"}


def policy_object(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "policy-p1", "resourceVersion": "7"},
            "spec": {"policyId": "p1", "revision": 4},
            "status": {"phase": "Enforcing", **status}}


def listed(**status: Any) -> ListedPolicy:
    return ListedPolicy.from_object(policy_object(**status))


# --- the edge --------------------------------------------------------------------------------


def test_the_mode_and_the_counts_are_read_beside_the_phase() -> None:
    found = listed(enforcementAction="Warn", admission=GOOD)
    assert (found.phase, found.enforcement_action) == ("Enforcing", "Warn")
    assert (found.admission_denied, found.admission_warned, found.admission_audited) == (0, 3, 3)
    assert (found.admission_last_hour_denied, found.admission_last_hour_warned,
            found.admission_last_hour_audited) == (0, 1, 1)
    assert found.admission_since == dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
    assert found.admission_read_at == dt.datetime(2026, 12, 3, 11, 59, 30, tzinfo=dt.UTC)
    assert (found.admission_revision, found.admission_resets) == (4, 1)
    assert found.admission_note == GOOD["note"]
    assert found.admission_problem is None


def test_no_admission_and_no_mode_are_none_not_unknown() -> None:
    found = listed()
    assert found.enforcement_action is None
    assert found.admission_read_at is None
    assert found.admission_problem is None
    assert found.audit_excepted is None


@pytest.mark.parametrize(("admission", "problem"), [
    ([1], "status.admission: expected an object"),
    (GOOD | {"warned": "3"}, "status.admission.warned: expected an integer"),
    (GOOD | {"denied": -1}, "status.admission.denied: expected an integer from 0"),
    (GOOD | {"audited": MAX_ADMISSIONS + 1}, "status.admission.audited: expected an integer"),
    (GOOD | {"lastHour": {"denied": 0, "warned": 1}}, "status.admission.lastHour.audited: "
                                                      "missing"),
    (GOOD | {"lastHour": "1h"}, "status.admission.lastHour: expected an object"),
    ({k: v for k, v in GOOD.items() if k != "readAt"}, "status.admission.readAt: missing"),
    (GOOD | {"since": "yesterday"}, "status.admission.since: expected an RFC 3339 time"),
    (GOOD | {"resets": True}, "status.admission.resets: expected an integer"),
    (GOOD | {"note": 7}, "status.admission.note: expected a string"),
])
def test_malformed_counts_are_unknown_with_the_problem_and_the_phase_stands(
        admission: object, problem: str) -> None:
    found = listed(enforcementAction="Deny", admission=admission)
    assert (found.phase, found.ready_reason, found.enforcement_action) == (
        "Enforcing", None, "Deny")
    assert found.admission_problem is not None
    assert found.admission_problem.startswith(problem), found.admission_problem
    assert found.admission_denied is None
    assert found.admission_read_at is None


def test_a_mode_of_the_wrong_type_is_a_malformed_phase_and_nothing_else_is_read() -> None:
    found = listed(enforcementAction=["Deny"], admission=GOOD)
    assert (found.phase, found.ready_reason) == ("Unknown", "Malformed")
    assert found.enforcement_action is None
    assert found.admission_warned is None


def test_a_long_mode_is_capped_and_shown_as_read() -> None:
    found = listed(enforcementAction="Dryrun" * 100)
    assert found.enforcement_action is not None
    assert found.enforcement_action.startswith("Dryrun")
    assert len(found.enforcement_action) < 200


AUDIT = {"violations": 1, "auditedAt": "2026-12-03T11:59:00Z", "cacheSynced": True}


def test_excepted_is_read_with_the_audit_and_a_bad_one_makes_the_audit_unknown() -> None:
    assert listed(audit=AUDIT | {"excepted": 2}).audit_excepted == 2
    assert listed(audit=AUDIT).audit_excepted is None  # no exception in force
    bad = listed(audit=AUDIT | {"excepted": "2"})
    assert bad.audit is not None
    assert bad.audit.violations is None
    assert bad.audit.problem is not None
    assert "status.audit.excepted" in bad.audit.problem
    assert bad.audit_excepted is None
    assert bad.phase == "Enforcing"


# --- the views and the roll-ups -------------------------------------------------------------


def reading(cluster: str, policy: str, mode: str | None, counts: tuple[int, ...] | None = None,
            *, excepted: int | None = None, problem: str | None = None,
            read_at: dt.datetime = T0) -> PhaseReading:
    figures: dict[str, Any] = {}
    if counts is not None:
        d, w, a, hd, hw, ha = counts
        figures = {"admission_denied": d, "admission_warned": w, "admission_audited": a,
                   "admission_last_hour_denied": hd, "admission_last_hour_warned": hw,
                   "admission_last_hour_audited": ha, "admission_read_at": read_at,
                   "admission_since": T0 - dt.timedelta(hours=2), "admission_revision": 4,
                   "admission_resets": 0}
    elif problem is not None:
        figures = {"admission_problem": problem}
    return PhaseReading(ClusterId(cluster), PolicyId(policy), "Enforcing", "Reconciled", "ok",
                        4, T0, enforcement_action=mode, audit_excepted=excepted, **figures)


def round_of(*outcomes: tuple[str, list[PhaseReading]]) -> RoundReport:
    return RoundReport(started_at=T0 - dt.timedelta(seconds=5), finished_at=T0,
                       epoch=Epoch("test", 1), clusters=[
                           ClusterOutcome(ClusterId(c), reached=True, desired=len(r),
                                          in_sync=len(r), phases=r) for c, r in outcomes])


@pytest.fixture
def state() -> StatusState:
    """Three clusters: `warned` in Warn on c1 and c2 (counts on both), still Deny on c3 (a
    save not there yet), its counts unreadable there; `quiet` Deny everywhere, nothing
    counted."""
    s = StatusState(identity="test", interval_s=INTERVAL, probe_period_s=PROBE,
                    clock=lambda: T0)
    s.set_clusters(["c1", "c2", "c3"])
    s.observe_round(round_of(
        ("c1", [reading("c1", "warned", "Warn", (0, 3, 3, 0, 1, 1), excepted=2),
                reading("c1", "quiet", "Deny", (0, 0, 0, 0, 0, 0))]),
        ("c2", [reading("c2", "warned", "Warn", (0, 5, 5, 0, 0, 0)),
                reading("c2", "quiet", "Deny", (0, 0, 0, 0, 0, 0))]),
        ("c3", [reading("c3", "warned", "Deny", problem="status.admission: bad"),
                reading("c3", "quiet", "Deny")]),
    ))
    return s


def views(state: StatusState, policy: str) -> list[dict[str, Any]]:
    return [record_view(state.clusters[ClusterId(c)].policies[PolicyId(policy)], T0, INTERVAL,
                        probe_period_s=PROBE) for c in ("c1", "c2", "c3")]


def test_each_cluster_shows_the_mode_beside_the_phase_and_its_counts(state: StatusState) -> None:
    c1, _c2, c3 = views(state, "warned")
    assert (c1["phase"], c1["enforcement_action"]) == ("Enforcing", "Warn")
    assert (c3["phase"], c3["enforcement_action"]) == ("Enforcing", "Deny")
    assert c1["admission"] == {
        "denied": 0, "warned": 3, "audited": 3,
        "last_hour": {"denied": 0, "warned": 1, "audited": 1}, "revision": 4,
        "since": "2026-12-03T10:00:00Z", "read_at": "2026-12-03T12:00:00Z", "stale": False,
        "resets": 0, "note": None, "problem": None}
    assert c3["admission"]["warned"] is None
    assert c3["admission"]["problem"] == "status.admission: bad"
    assert views(state, "quiet")[2]["admission"] is None  # none read there


def test_the_policy_s_fleet_total_sums_the_clusters_that_can_say_and_counts_modes(
        state: StatusState) -> None:
    assert policy_admission_view(views(state, "warned")) == {
        "denied": 0, "warned": 8, "audited": 8,
        "last_hour": {"denied": 0, "warned": 1, "audited": 1},
        "clusters_counted": 2, "clusters_unknown": 1, "clusters_stale": 0,
        "clusters_with_resets": 0,
        "clusters_by_enforcement": {"Deny": 1, "Warn": 2, "Audit": 0, "other": 0}}


def test_counts_not_rewritten_for_five_probe_periods_are_stale() -> None:
    old = T0 - dt.timedelta(seconds=ADMISSION_STALE_PERIODS * PROBE + 1)
    s = StatusState(identity="test", interval_s=INTERVAL, probe_period_s=PROBE,
                    clock=lambda: T0)
    s.set_clusters(["c1"])
    s.observe_round(round_of(("c1", [reading("c1", "p", "Warn", (0, 1, 1, 0, 0, 0),
                                             read_at=old)])))
    view = record_view(s.clusters[ClusterId("c1")].policies[PolicyId("p")], T0, INTERVAL,
                       probe_period_s=PROBE)
    assert view["admission"]["stale"] is True


def test_status_shows_the_modes_per_cluster_and_the_policies_admission_counted(
        state: StatusState) -> None:
    doc = snapshot(state, T0)
    by_id = {c["id"]: c for c in doc["clusters"]}
    assert by_id["c1"]["enforcement"] == {"Warn": 1, "Deny": 1}
    assert by_id["c3"]["enforcement"] == {"Deny": 2}
    assert by_id["c1"]["admission"] == {
        "denied": 0, "warned": 3, "audited": 3,
        "last_hour": {"denied": 0, "warned": 1, "audited": 1},
        "policies_counted": 2, "unknown": 0, "excepted": 2}
    assert by_id["c3"]["admission"]["unknown"] == 1
    fleet = doc["admission"]
    assert (fleet["denied"], fleet["warned"], fleet["audited"]) == (0, 8, 8)
    assert [p["id"] for p in fleet["policies"]] == ["warned"]  # quiet: Deny, nothing counted
    assert fleet["policies"][0]["clusters_by_enforcement"] == {
        "Deny": 1, "Warn": 2, "Audit": 0, "other": 0}
    assert fleet["policies"][0]["excepted"] == 2


def metric_values(state: StatusState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = Metrics(state=state, process_collectors=False).render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("convergerd_policy_") and "policy" in s.labels}


def test_metrics_are_per_policy_fleet_totals(state: StatusState) -> None:
    values = metric_values(state)
    assert values[("convergerd_policy_admissions",
                   (("action", "warn"), ("policy", "warned")))] == 8
    assert values[("convergerd_policy_admissions",
                   (("action", "deny"), ("policy", "quiet")))] == 0
    assert values[("convergerd_policy_admissions_last_hour",
                   (("action", "audit"), ("policy", "warned")))] == 1
    assert values[("convergerd_policy_clusters_by_enforcement",
                   (("enforcement", "Warn"), ("policy", "warned")))] == 2
    assert values[("convergerd_policy_clusters_by_enforcement",
                   (("enforcement", "Deny"), ("policy", "warned")))] == 1
    assert values[("convergerd_policy_clusters_by_enforcement",
                   (("enforcement", "Deny"), ("policy", "quiet")))] == 3
    assert values[("convergerd_policy_audit_excepted", (("policy", "warned"),))] == 2
    assert ("convergerd_policy_audit_excepted", (("policy", "quiet"),)) not in values
    assert all("cluster" not in dict(labels) for _, labels in values)


def test_the_totals_follow_a_new_round_and_a_cluster_removed(state: StatusState) -> None:
    # c3 takes the save: Warn there too, one warning counted.
    state.observe_round(round_of(("c3", [reading("c3", "warned", "Warn", (0, 1, 1, 0, 1, 1)),
                                         reading("c3", "quiet", "Deny")])))
    totals = state.admission_totals[PolicyId("warned")]
    assert (totals.warned, totals.clusters_by_enforcement["Warn"],
            totals.clusters_by_enforcement["Deny"]) == (9, 3, 0)
    state.set_clusters(["c2", "c3"])
    totals = state.admission_totals[PolicyId("warned")]
    assert (totals.warned, totals.excepted, totals.clusters_by_enforcement["Warn"]) == (
        6, None, 2)
    state.set_clusters([])
    assert dict(state.admission_totals) == {}


def test_the_totals_kept_up_to_date_equal_the_totals_counted_anew() -> None:
    """Random clusters' tallies replaced in random order: the running sums are what summing
    the tallies in place gives."""
    rng = random.Random(35)
    modes = ["Deny", "Warn", "Audit", "Dryrun", None]
    kept: dict[str, Any] = {}
    totals = PolicyAdmissions()
    for step in range(300):
        cluster = f"c{rng.randrange(6)}"
        readings = [reading(cluster, f"p{j}", rng.choice(modes),
                            rng.choice([None, tuple(rng.randrange(3) for _ in range(6))]),
                            excepted=rng.choice([None, 0, 4]))
                    for j in range(rng.randrange(5))]
        tally = admission_tally(readings)
        totals.change(kept.get(cluster, admission_tally([])), tally)
        kept[cluster] = tally
        fresh = PolicyAdmissions()
        for t in kept.values():
            fresh.change(admission_tally([]), t)
        assert dict(totals) == dict(fresh), step


def test_a_reading_read_back_from_the_database_carries_every_field() -> None:
    """What the state keeps of a reading is what it was told (the record is made from the
    same table: tests/unit/test_facts.py covers the columns)."""
    r = reading("c1", "p", "Audit", (1, 2, 3, 4, 5, 6), excepted=7)
    s = StatusState(identity="test", interval_s=INTERVAL, clock=lambda: T0)
    s.set_clusters(["c1"])
    s.observe_round(round_of(("c1", [r])))
    kept = s.clusters[ClusterId("c1")].policies[PolicyId("p")].phase
    assert kept == dataclasses.replace(r)


# --- convergerd status -----------------------------------------------------------------------


def test_convergerd_status_shows_the_modes_beside_the_phases_and_the_policies_counts(
        state: StatusState) -> None:
    text = render_status(snapshot(state, T0))
    header = next(line for line in text.splitlines() if line.startswith("CLUSTER"))
    assert header.split()[header.split().index("PHASES") + 1] == "MODES"
    c1 = next(line for line in text.splitlines() if line.startswith("c1 "))
    assert "Enforcing=2  Deny=1 Warn=1" in c1
    assert ("  warned: warned=8 audited=8 (last hour warned=1 audited=1); in force as "
            "Deny=1 Warn=2; excepted 2") in text.splitlines()


def test_convergerd_status_policy_shows_each_cluster_s_phase_mode_and_counts(
        state: StatusState) -> None:
    clusters = [{"cluster": c, **v} for c, v in zip(("c1", "c2", "c3"), views(state, "warned"),
                                                    strict=True)]
    doc = {"policy": {"id": "warned", "boundary": "team-b", "revision": 4,
                      "enforcement": "Warn", "enabled": True},
           "admission": policy_admission_view(clusters), "clusters": clusters}
    lines = render_policy(doc).splitlines()
    assert lines[0].startswith("policy warned of boundary team-b at ?: revision 4, saved as "
                               "Warn, enabled")
    assert lines[1] == ("admission over 2 clusters counting (since each one's revision): "
                        "warned=8 audited=8; last hour warned=1 audited=1; in force as "
                        "Deny=1 Warn=2; 1 UNREADABLE")
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    assert rows["c1"][:6] == ["c1", "4", "Enforcing", "Warn", "-", "warned=3"]
    assert rows["c3"][:6] == ["c3", "4", "Enforcing", "Deny", "-", "?"]
