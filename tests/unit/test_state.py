"""StatusState and its pure helpers: staleness, worst-first order, roll-ups, merging."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.facts import RECORD_ROW
from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId
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
from convergerd.core.rows import ClusterStateRow, DeliveryRow
from convergerd.status.cluster import ClusterState
from convergerd.status.document import snapshot
from convergerd.status.listing import worst_first_key
from convergerd.status.phases import (
    STALE,
    VERIFIED_STALE_PERIODS,
    audit_state,
    heartbeat_after_s,
    is_stale,
    normalize_phase,
    tally,
    tally_counts,
    verification_of,
)
from convergerd.status.records import PolicyRecord, merge_records
from convergerd.status.state import StatusState
from convergerd.status.views import record_view, unsupported_rollup

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
INTERVAL = 300.0


class Clock:
    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def reading(cluster: str, policy: str, phase: str | None, at: dt.datetime,
            revision: int = 1) -> PhaseReading:
    return PhaseReading(ClusterId(cluster), PolicyId(policy), phase, None, None, revision, at)


def outcome(cluster: str, *, reached: bool = True, desired: int = 1, in_sync: int = 1,
            error: str | None = None, phases: list[PhaseReading] | None = None,
            deliveries: list[Delivery] | None = None, version: str | None = None
            ) -> ClusterOutcome:
    return ClusterOutcome(ClusterId(cluster), reached=reached, desired=desired, in_sync=in_sync,
                          error=error, reason="crd_missing" if error else None,
                          server_version=version, phases=phases or [],
                          deliveries=deliveries or [])


def report(at: dt.datetime, *clusters: ClusterOutcome) -> RoundReport:
    return RoundReport(started_at=at - dt.timedelta(seconds=5), finished_at=at,
                       epoch=Epoch("rep-a", 1), clusters=list(clusters))


# -- pure helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "stale"), [(0, False), (600, False), (600.001, True), (9999, True)])
def test_a_phase_is_stale_after_two_intervals(age: float, stale: bool) -> None:
    assert is_stale(T0, T0 + dt.timedelta(seconds=age), INTERVAL) is stale


@pytest.mark.parametrize(("raw", "shown"), [
    ("Enforcing", "Enforcing"), ("Inert", "Inert"), ("Unsupported", "Unsupported"),
    ("Error", "Error"), (None, "Unknown"), ("Pending", "Unknown"), ("enforcing", "Unknown"),
])
def test_phases_are_normalised(raw: str | None, shown: str) -> None:
    assert normalize_phase(raw) == shown


def test_phase_counts_put_stale_readings_under_stale() -> None:
    now = T0 + dt.timedelta(seconds=700)
    readings = [
        reading("c1", "p1", "Enforcing", now),
        reading("c1", "p2", "Enforcing", T0),  # 700 s old: stale
        reading("c1", "p3", None, now),
        reading("c1", "p4", "Error", now),
    ]
    counted = tally_counts(tally(readings), now.timestamp(), INTERVAL, verified_stale_s=1200)
    assert counted.shown == {"Enforcing": 1, "Error": 1, STALE: 1, "Unknown": 1}


READINGS = st.lists(st.tuples(
    st.sampled_from(["Enforcing", "Inert", "Unsupported", None]),
    st.integers(0, 2000),  # seen, seconds after T0
    st.sampled_from(["True", "False", None]),
    st.one_of(st.none(), st.integers(-1500, 2100)),  # probed, seconds after T0
), max_size=12)


@given(READINGS, st.lists(st.integers(0, 5000), min_size=1, max_size=12))
def test_cluster_counts_kept_between_asks_are_the_counts_made_anew(
    found: list[tuple[str | None, int, str | None, int | None]], asks: list[int]
) -> None:
    """`ClusterState.counts` keeps its counts while they hold: asked at any times, in any
    order, the same as counting the readings anew."""
    readings = []
    for i, (phase, seen, status, probed) in enumerate(found):
        at = T0 + dt.timedelta(seconds=seen)
        probe = None if probed is None else T0 + dt.timedelta(seconds=probed)
        verified = None if status is None else Verification(
            status, "Admitted" if i % 3 == 0 else "Denied", "m", probe, probe)
        readings.append(PhaseReading(ClusterId("c1"), PolicyId(f"p{i}"), phase, None, None, 1,
                                     at, **verified_fields(verified)))
    cluster = ClusterState(ClusterId("c1"), known_since=T0)
    cluster.phase_tally = tally(readings)
    for ask in asks:
        now = (T0 + dt.timedelta(seconds=ask)).timestamp()
        kept = cluster.counts(now, INTERVAL, 600.0)
        anew = tally_counts(cluster.phase_tally, now, INTERVAL, verified_stale_s=600.0)
        assert (kept.phases, kept.verification) == (anew.phases, anew.verification)


def test_worst_first_order() -> None:
    clusters = [
        ("fine-lagging", True, False, 900.0),
        ("fine", True, False, 10.0),
        ("failing", True, True, 5.0),
        ("never-checked", None, False, 50.0),
        ("down-long", False, True, 5000.0),
        ("down", False, True, 100.0),
    ]
    order = sorted(clusters, key=lambda c: worst_first_key(
        cluster=c[0], reachable=c[1], failing=c[2], lag_s=c[3]))
    assert [c[0] for c in order] == [
        "down-long", "down", "never-checked", "failing", "fine-lagging", "fine"]


def test_unsupported_rollup_by_version() -> None:
    assert unsupported_rollup([("c3", "v1.29.4"), ("c1", "v1.29.4"), ("c2", "v1.28.0"),
                               ("c9", None)]) == {
        "unknown": ["c9"], "v1.28.0": ["c2"], "v1.29.4": ["c1", "c3"]}


# -- the live state ------------------------------------------------------------------------------


def test_round_updates_clusters_and_lag_grows_without_rounds() -> None:
    clock = Clock()
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=clock)
    state.set_clusters(["c1", "c2"])
    state.observe_round(report(
        T0, outcome("c1", phases=[reading("c1", "p1", "Enforcing", T0)]),
        outcome("c2", reached=False, in_sync=0, error="connect timeout"),
    ))
    clock.advance(3600)
    doc = snapshot(state)
    by_id = {c["id"]: c for c in doc["clusters"]}
    assert [c["id"] for c in doc["clusters"]] == ["c2", "c1"]  # unreached first
    assert by_id["c1"]["lag_seconds"] == 3600  # true now, though no round ran since
    assert by_id["c1"]["last_success_at"] == "2026-01-01T12:00:00Z"
    assert by_id["c2"]["lag_seconds"] == 3600  # never converged: since it became known
    assert by_id["c2"]["last_error"] == "connect timeout"
    assert by_id["c2"]["reachable"] is False
    assert by_id["c1"]["phases"] == {STALE: 1}  # an hour without a fresh reading
    assert doc["last_round"]["result"] == "partial"
    assert doc["last_round"]["leader"] == "rep-a"


def test_unreached_cluster_keeps_its_old_phases_which_become_stale() -> None:
    clock = Clock()
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=clock)
    state.observe_round(report(T0, outcome("c1", phases=[reading("c1", "p1", "Enforcing", T0)])))
    clock.advance(400)
    state.observe_round(report(clock.now, outcome("c1", reached=False, in_sync=0,
                                                  error="connect timeout")))
    record = state.clusters[ClusterId("c1")].policies[PolicyId("p1")]
    view = record_view(record, clock.now, INTERVAL)
    assert (view["phase"], view["stale"], view["age_seconds"]) == ("Enforcing", False, 400)
    clock.advance(300)
    view = record_view(record, clock.now, INTERVAL)
    assert (view["phase"], view["stale"], view["age_seconds"]) == ("Enforcing", True, 700)


def test_a_policy_gone_from_the_listing_loses_its_phase() -> None:
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    state.observe_round(report(T0, outcome("c1", phases=[reading("c1", "p1", "Enforcing", T0)])))
    state.observe_round(report(T0, outcome("c1", desired=0, in_sync=0, phases=[])))
    assert state.clusters[ClusterId("c1")].policies[PolicyId("p1")].phase is None


def test_probe_marks_a_cluster_down_between_rounds() -> None:
    clock = Clock()
    state = StatusState(identity="r", interval_s=INTERVAL, clock=clock)
    state.observe_round(report(T0, outcome("c1")))
    state.observe_probe("c1", reachable=False, error="no answer within 5 s")
    summary = snapshot(state)["clusters"][0]
    assert summary["reachable"] is False
    assert summary["last_error"] == "no answer within 5 s"
    state.observe_probe("c1", reachable=True, server_version="v1.31.0")
    summary = snapshot(state)["clusters"][0]
    assert (summary["reachable"], summary["last_error"]) == (True, None)
    assert summary["server_version"] == "v1.31.0"


def test_unsupported_clusters_roll_up_by_version() -> None:
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    state.observe_round(report(
        T0,
        outcome("old1", version="v1.29.2", phases=[reading("old1", "p", "Unsupported", T0)]),
        outcome("old2", version="v1.29.2", phases=[reading("old2", "p", "Unsupported", T0)]),
        outcome("new", version="v1.31.0", phases=[reading("new", "p", "Enforcing", T0)]),
    ))
    assert snapshot(state)["unsupported_by_version"] == {"v1.29.2": ["old1", "old2"]}


def test_invalid_policies_come_from_the_round() -> None:
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    r = report(T0)
    r.invalid = [InvalidPolicy("Bad_Id", "team-a", 3, "id: not a DNS label")]
    state.observe_round(r)
    assert snapshot(state)["invalid_policies"] == [
        {"id": "Bad_Id", "reason": "id: not a DNS label"}]


def test_leader_as_the_elector_told_it_and_since_when() -> None:
    clock = Clock()
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=clock)
    state.set_leader(False, "rep-b")
    assert snapshot(state)["leader"] == {"is_leader": False, "holder": "rep-b",
                                          "since": "2026-01-01T12:00:00Z"}
    version = state.version
    clock.now += dt.timedelta(seconds=30)
    state.set_leader(False, "rep-b")  # told again, nothing changed: same view
    assert state.version == version
    state.set_leader(True, "rep-a")
    assert state.version > version
    assert snapshot(state)["leader"] == {"is_leader": True, "holder": "rep-a",
                                          "since": "2026-01-01T12:00:30Z"}


# -- merging the database's records (standbys) ---------------------------------------------------


def test_verified_per_policy_and_counted_per_cluster() -> None:
    clock = Clock()
    state = StatusState(identity="r", interval_s=INTERVAL, clock=clock)
    probed = T0 - dt.timedelta(seconds=30)

    def checked(policy: str, verified: Verification | None) -> PhaseReading:
        return PhaseReading(ClusterId("c1"), PolicyId(policy), "Enforcing", None, None, 1, T0,
                            **verified_fields(verified))

    state.observe_round(report(T0, outcome("c1", desired=5, in_sync=5, phases=[
        checked("p1", Verification("True", "Denied", "denied", probed, probed)),
        checked("p2", Verification("False", "Admitted", "ADMITTED", probed, probed)),
        checked("p3", Verification("False", "NoBoundaryNamespace")),
        checked("p4", Verification("Unknown", "Pending")),
        checked("p5", None),
    ])))
    [c1] = snapshot(state)["clusters"]
    assert c1["verification"] == {"verified": 1, "admitted": 1, "not_verified": 1, "stale": 0,
                                  "unknown": 2}
    record = state.clusters[ClusterId("c1")].policies[PolicyId("p2")]
    assert record_view(record, clock.now, INTERVAL)["verified"] == {
        "status": "False", "reason": "Admitted", "message": "ADMITTED",
        "probed_at": "2026-01-01T11:59:30Z", "since": "2026-01-01T11:59:30Z",
        "verification": "admitted", "stale": False, "untrusted": None}
    assert record_view(state.clusters[ClusterId("c1")].policies[PolicyId("p5")], clock.now,
                       INTERVAL)["verified"] is None
    clock.advance(2 * INTERVAL + 1)  # stale: nothing is known now
    [c1] = snapshot(state)["clusters"]
    assert c1["verification"] == {"verified": 0, "admitted": 0, "not_verified": 0, "stale": 0,
                                  "unknown": 5}


def test_a_verified_from_the_future_is_not_trusted_and_an_old_probe_is_stale() -> None:
    """Issue 17, item 9: Verified True with lastProbeTime 9999-... (forged) counts as
    not_verified and says why; a probe older than `VERIFIED_STALE_PERIODS` of the operators'
    probe periods (a dead operator) is `stale` in the counts and the policy view, though rounds
    still read it."""
    clock = Clock()
    period = 600.0
    state = StatusState(identity="r", interval_s=INTERVAL, clock=clock, probe_period_s=period)
    forged = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
    probed = clock.now

    def round_at(seen: dt.datetime) -> None:
        state.observe_round(report(seen, outcome("c1", desired=2, in_sync=2, phases=[
            PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, seen,
                         **verified_fields(Verification("True", "Denied", "denied", forged,
                                                          probed))),
            PhaseReading(ClusterId("c1"), PolicyId("p2"), "Enforcing", None, None, 1, seen,
                         **verified_fields(Verification("True", "Denied", "denied", probed,
                                                          probed))),
        ])))

    round_at(clock.now)
    [c1] = snapshot(state)["clusters"]
    assert (c1["verification"]["verified"], c1["verification"]["not_verified"]) == (1, 1)
    view = record_view(state.clusters[ClusterId("c1")].policies[PolicyId("p1")], clock.now,
                       INTERVAL, probe_period_s=period)["verified"]
    assert view["verification"] == "not_verified"
    assert "in the future" in view["untrusted"]

    clock.advance(VERIFIED_STALE_PERIODS * period + 1)
    round_at(clock.now)  # read again, fresh, but the operator has not probed since
    [c1] = snapshot(state)["clusters"]
    assert c1["verification"] == {"verified": 0, "admitted": 0, "not_verified": 1, "stale": 1,
                                  "unknown": 0}
    view = record_view(state.clusters[ClusterId("c1")].policies[PolicyId("p2")], clock.now,
                       INTERVAL, probe_period_s=period)["verified"]
    assert (view["status"], view["verification"], view["stale"]) == ("True", "stale", True)
    assert snapshot(state)["verified_stale_after_seconds"] == VERIFIED_STALE_PERIODS * period


def test_a_standby_shows_the_verified_condition_from_the_database_row() -> None:
    state = StatusState(identity="standby", interval_s=INTERVAL, clock=Clock())
    state.absorb_delivery_rows([DeliveryRow(
        "p1", "c1", 1, ApplyResult.UNCHANGED, T0, T0, None, None, 0, 7, PhaseReading(
            ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, T0,
            verified_status="False", verified_reason="Admitted", verified_message="m",
            verified_probed_at=T0, verified_since=None))])
    [c1] = snapshot(state)["clusters"]
    assert c1["verification"]["admitted"] == 1
    view = record_view(state.clusters[ClusterId("c1")].policies[PolicyId("p1")], T0, INTERVAL)
    assert view["verified"]["probed_at"] == "2026-01-01T12:00:00Z"


def test_standby_takes_the_database_rows() -> None:
    clock = Clock(T0 + dt.timedelta(seconds=60))
    state = StatusState(identity="standby", interval_s=INTERVAL, clock=clock)
    state.absorb_cluster_rows([
        ClusterStateRow(ClusterId("c1"), True, T0, T0, None, None, None, 3, 3, 0, "v1.31.0", None),
        ClusterStateRow(ClusterId("c2"), False, T0, None, None, "401 Unauthorized",
                        "unauthorized", 3, 0, 0, None, None),
    ])
    doc = snapshot(state)
    assert [c["id"] for c in doc["clusters"]] == ["c2", "c1"]
    c1 = doc["clusters"][1]
    assert (c1["lag_seconds"], c1["desired"], c1["in_sync"]) == (60, 3, 3)
    assert doc["clusters"][0]["last_error"] == "401 Unauthorized"


def test_older_database_rows_do_not_overwrite_fresher_observations() -> None:
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    later = T0 + dt.timedelta(seconds=10)
    state.observe_round(report(later, outcome("c1", reached=False, in_sync=0, error="down")))
    state.absorb_cluster_rows([
        ClusterStateRow(ClusterId("c1"), True, T0, T0, None, None, None, 1, 1, 0, None, None)])
    c1 = state.clusters[ClusterId("c1")]
    assert (c1.reachable, c1.last_error, c1.last_success_at) == (False, "down", T0)


def test_merge_records_takes_the_newer_delivery_and_the_newer_phase() -> None:
    mine = PolicyRecord(last_result="failed", last_attempt_at=T0 + dt.timedelta(seconds=9),
                        last_error="422 Invalid")
    stored = PolicyRecord(delivered_revision=4, last_result="updated", last_attempt_at=T0,
                          last_success_at=T0,
                          phase=reading("c1", "p", "Enforcing", T0 + dt.timedelta(seconds=1)))
    merged = merge_records(mine, stored)
    assert merged.last_result == "failed"
    assert merged.last_error == "422 Invalid"
    assert merged.delivered_revision == 4  # the failed apply delivered nothing
    assert merged.phase is not None
    assert merged.phase.phase == "Enforcing"


def test_records_of_deleted_policies_are_dropped_unless_still_read_back() -> None:
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    deliveries = [Delivery(ClusterId("c1"), PolicyId(p), 1, ApplyResult.CREATED, T0)
                  for p in ("p1", "p2", "p3")]
    state.observe_round(RoundReport(started_at=T0, finished_at=T0, clusters=[
        outcome("c1", desired=3, in_sync=3, deliveries=deliveries,
                phases=[reading("c1", "p3", "Enforcing", T0)]),
    ]))
    assert len(state.clusters[ClusterId("c1")].policies) == 3

    state.retain_policies(["p1"])  # p2 and p3 deleted; p3's object is still in the cluster

    assert sorted(state.clusters[ClusterId("c1")].policies) == ["p1", "p3"]


# -- the database's clusters only ----------------------------------------------------------------


def test_a_deleted_cluster_is_not_brought_back_by_a_late_observation() -> None:
    """A probe or a round in flight when a cluster was deleted reports after the database's
    set no longer has it: dropped, so neither status nor the metrics show it again."""
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=Clock(), keep=["home"])
    state.set_clusters(["c1", "c2"])
    state.set_insecure("c2", True)
    state.set_clusters(["c1"])
    state.observe_probe("c2", reachable=True, server_version="v1.31.0")
    state.observe_round(report(T0, outcome("c2")))
    state.set_insecure("c2", True)
    assert state.cluster_ids() == ["c1"]
    assert [c["id"] for c in snapshot(state)["clusters"]] == ["c1"]
    assert state.insecure == set()
    # The home cluster (the Lease) is no member, but what its client is told stays.
    state.set_insecure("home", True)
    state.set_clusters(["c1"])
    assert state.insecure == {"home"}
    assert state.cluster_ids() == ["c1"]


def test_leadership_changes_are_counted_after_the_first_one_told() -> None:
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=Clock())
    state.set_leader(False, None)  # the first word: no change yet
    state.set_leader(False, None)
    assert state.leader().changes == 0
    state.set_leader(True, "rep-a")
    state.set_leader(True, "rep-a", Epoch("rep-a", 2))  # a new term, same (leading, holder)
    state.set_leader(False, "rep-b")
    assert state.leader().changes == 2


def test_a_round_cut_before_a_cluster_answered_leaves_its_reachability_as_it_was() -> None:
    """At 10,000 clusters a first round is cut by its deadline before most clusters' turn
    came: they must not show down (`convergerd_cluster_up 0`) nor go to the suspects' lane
    of the next round; a cluster that did not answer its own request still shows down."""
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    state.observe_probe("c1", reachable=True, server_version="v1.31.0")
    state.observe_probe("c2", reachable=True, server_version="v1.31.0")
    cut = ClusterOutcome(ClusterId("c1"), reached=False, desired=1, reason="deadline",
                         error="round deadline reached before this cluster finished")
    hung = ClusterOutcome(ClusterId("c2"), reached=False, desired=1, reason="timeout",
                          error="list: no answer within 5 s")
    state.observe_round(report(T0, cut, hung))
    c1, c2 = state.clusters[ClusterId("c1")], state.clusters[ClusterId("c2")]
    assert c1.reachable is True
    assert c1.last_error == "round deadline reached before this cluster finished"
    assert not c1.caught_up  # its work is left: the next round starts it first
    assert c2.reachable is False


@pytest.mark.parametrize(("probe_period", "interval"), [(600.0, 300.0), (60.0, 30.0)])
def test_an_operator_that_probes_but_writes_only_its_heartbeat_is_never_stale(
    probe_period: float, interval: float
) -> None:
    """Issue 35, item 5: the operator probes every period but rewrites an unchanged verdict's
    probe time (and auditedAt) only at the heartbeat; read every round (the defaults, and the
    demo's 1-minute probes and 30-second rounds), a live operator's policies stay `verified`
    and their audits `current`, and one that stops is `stale` after VERIFIED_STALE_PERIODS."""
    heartbeat = heartbeat_after_s(probe_period)
    written = probe = last_round = T0
    read = written  # the probe time the last round read
    step_s = probe_period / 10 + 1  # probes come a little late, and drift
    for step in range(400):  # about forty periods
        now = T0 + dt.timedelta(seconds=step * step_s)
        if now >= probe + dt.timedelta(seconds=probe_period):
            probe = now
            if (probe - written).total_seconds() >= heartbeat:
                written = probe
        if (now - last_round).total_seconds() >= interval:
            last_round, read = now, written
        r = PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1,
                         last_round,
                         **verified_fields(Verification("True", "Denied", "m", read, T0)),
                         **audit_fields(Audit(0, read, True)))
        assert verification_of(r, (now - last_round).total_seconds(), interval, now=now,
                               probe_period_s=probe_period) == "verified", now
        assert audit_state(r, now, interval, probe_period_s=probe_period) == "current", now
    dead = written + dt.timedelta(seconds=VERIFIED_STALE_PERIODS * probe_period + 1)
    r = PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, dead,
                     **verified_fields(Verification("True", "Denied", "m", written, T0)),
                     **audit_fields(Audit(0, written, True)))
    assert verification_of(r, 0.0, interval, now=dead, probe_period_s=probe_period) == "stale"
    assert audit_state(r, dead, interval, probe_period_s=probe_period) == "stale"


def test_a_records_fields_read_alone_are_the_records_and_the_held_revision() -> None:
    """`ClusterFacts.record_values` (what a rollout's gates read, a few fields of thousands of
    records) gives what the whole record holds; `revision_held` the reported revision, else
    the delivered one."""
    state = StatusState(identity="r", interval_s=INTERVAL, clock=Clock())
    state.observe_round(report(T0, outcome(
        "c1", desired=3, in_sync=3,
        phases=[reading("c1", "p1", "Enforcing", T0, revision=4),
                reading("c1", "p2", "Error", T0, revision=2)],
        deliveries=[Delivery(ClusterId("c1"), PolicyId(p), 4, ApplyResult.UNCHANGED, T0)
                    for p in ("p1", "p2", "p3")])))
    facts = state.clusters[ClusterId("c1")]
    names = ("phase", "revision", "seen_at", "last_result", "delivered_revision")
    positions = [RECORD_ROW.index(n) for n in names]
    for pid in ("p1", "p2", "p3"):
        record = facts.policies[PolicyId(pid)]
        phase = record.phase
        assert facts.record_values(PolicyId(pid), positions) == (
            phase.phase if phase else None, phase.revision if phase else None,
            phase.seen_at if phase else None, record.last_result, record.delivered_revision)
    assert facts.record_values(PolicyId("p9"), positions) is None
    packed = state._clusters[ClusterId("c1")].policies  # the owner's packed records
    assert [packed.revision_held(PolicyId(p)) for p in ("p1", "p2", "p3", "p9")] == [
        4, 2, 4, None]
