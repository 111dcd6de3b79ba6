"""Metrics: the documented names, labels and types exactly (docs/design.md, "Status and
metrics"), read back from the exposition text. Fed as the daemon feeds them: a round's report
to the status and the counters, everything else to the status alone, which the gauges read."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from convergerd.core.model import ClusterId, InvalidPolicy, PolicyId
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    Verification,
    verified_fields,
)
from convergerd.core.rollout import Rollout, State, parse_strategy
from convergerd.core.rows import ClusterStateRow, DeliveryRow
from convergerd.status.document import snapshot
from convergerd.status.metrics import FanoutMetrics, Metrics, ReadinessMetrics
from convergerd.status.phases import VERIFIED_STALE_PERIODS
from convergerd.status.state import StatusState
from convergerd.supervise import HealthCheck

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
INTERVAL = 300.0

# docs/design.md, "Status and metrics": family name (as the parser reports it) -> (type, labels)
SPEC = {
    "convergerd_cluster_lag_seconds": ("gauge", {"cluster"}),
    "convergerd_cluster_last_success_timestamp_seconds": ("gauge", {"cluster"}),
    "convergerd_cluster_up": ("gauge", {"cluster"}),
    "convergerd_cluster_out_of_sync_policies": ("gauge", {"cluster"}),
    "convergerd_apply_failures": ("counter", {"cluster", "reason"}),
    "convergerd_applies": ("counter", {"cluster", "result"}),
    "convergerd_policy_phase": ("gauge", {"cluster", "phase"}),
    "convergerd_policy_verification": ("gauge", {"cluster", "result"}),
    "convergerd_round_duration_seconds": ("histogram", set()),
    "convergerd_rounds": ("counter", {"result"}),
    "convergerd_is_leader": ("gauge", set()),
    "convergerd_leader_transitions": ("counter", set()),
    "convergerd_invalid_policies": ("gauge", set()),
}


class WallClock:
    def __init__(self) -> None:
        self.now = T0.timestamp()

    def __call__(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.now, dt.UTC)


class Replica:
    """A status and its metrics, fed as the daemon feeds them."""

    def __init__(self, clock: WallClock, clusters: list[str] | None = None, *,
                 probe_period_s: float = 600.0, keep: tuple[str, ...] = ()) -> None:
        self.state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=clock,
                                 probe_period_s=probe_period_s, keep=keep)
        if clusters is not None:
            self.state.set_clusters(clusters)
        self.metrics = Metrics(state=self.state, process_collectors=False)

    def observe_round(self, report: RoundReport) -> None:
        """As the round loop does: counted, and what it found to the status."""
        self.metrics.observe_round(report)
        self.state.observe_round(report)

    def set_clusters(self, clusters: list[str]) -> None:
        """As `Daemon._follow_database` does."""
        self.state.set_clusters(clusters)
        self.metrics.follow_clusters()

    def render(self) -> bytes:
        return self.metrics.render()


def parse(metrics: Replica | Metrics) -> dict[str, tuple[str, list[Sample]]]:
    text = metrics.render().decode()
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}


def value(metrics: Replica | Metrics, sample: str, **labels: str) -> float | None:
    for _type, samples in parse(metrics).values():
        for s in samples:
            if s.name == sample and s.labels == labels:
                return float(s.value)
    return None


def outcome(cluster: str, **kwargs: object) -> ClusterOutcome:
    return ClusterOutcome(ClusterId(cluster), **kwargs)  # type: ignore[arg-type]


def round_at(at: dt.datetime, *clusters: ClusterOutcome, seconds: float = 42) -> RoundReport:
    return RoundReport(started_at=at - dt.timedelta(seconds=seconds), finished_at=at,
                       epoch=Epoch("rep-a", 1), clusters=list(clusters))


def delivery(cluster: str, policy: str, result: ApplyResult, reason: str | None = None
             ) -> Delivery:
    return Delivery(ClusterId(cluster), PolicyId(policy), 1, result, T0,
                    error="rejected" if reason else None, reason=reason)


@pytest.fixture
def clock() -> WallClock:
    return WallClock()


@pytest.fixture
def metrics(clock: WallClock) -> Replica:
    m = Replica(clock, ["c1", "c2"])
    m.state.observe_probe("c1", reachable=True)
    m.state.observe_probe("c2", reachable=False)
    m.observe_round(round_at(T0, outcome(
        "c1", reached=True, desired=2, in_sync=2,
        phases=[PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, T0,
                             enforcement_action="Deny", audit_excepted=0)],
        deliveries=[delivery("c1", "p1", ApplyResult.CREATED),
                    delivery("c1", "p2", ApplyResult.UNCHANGED)],
    )))
    return m


def test_every_spec_metric_has_its_exact_name_type_and_labels(metrics: Replica) -> None:
    families = parse(metrics)
    for name, (kind, labels) in SPEC.items():
        assert name in families, name
        found_kind, samples = families[name]
        assert found_kind == kind, name
        assert samples, f"{name} has no samples"
        for sample in samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample.labels)


def test_counters_are_exposed_with_total_and_without_created(metrics: Replica) -> None:
    text = metrics.render().decode()
    for name in ("convergerd_applies_total", "convergerd_apply_failures_total",
                 "convergerd_rounds_total", "convergerd_leader_transitions_total"):
        assert f"\n{name}" in text
    assert "_created" not in text


# Fleet totals per policy (allowed: never per policy and cluster).
PER_POLICY = {"convergerd_policy_admissions", "convergerd_policy_admissions_last_hour",
              "convergerd_policy_clusters_by_enforcement", "convergerd_policy_audit_excepted"}


def test_no_per_policy_label_but_fleet_totals_and_never_policy_by_cluster(
        metrics: Replica) -> None:
    families = parse(metrics)
    assert set(families) >= PER_POLICY  # p1 is read back in a mode
    for name, (_kind, samples) in families.items():
        for sample in samples:
            if name in PER_POLICY:
                assert "cluster" not in sample.labels, sample
                continue
            assert not {"policy", "policy_id", "name"} & set(sample.labels), sample
            assert "p1" not in sample.labels.values()


def test_lag_is_true_at_scrape_time(metrics: Replica, clock: WallClock) -> None:
    assert value(metrics, "convergerd_cluster_lag_seconds", cluster="c1") == 0
    assert value(metrics, "convergerd_cluster_last_success_timestamp_seconds",
                 cluster="c1") == T0.timestamp()
    clock.now += 3600  # no round ran in between
    assert value(metrics, "convergerd_cluster_lag_seconds", cluster="c1") == 3600


def test_a_cluster_that_never_converged_lags_since_it_became_known(
    metrics: Replica, clock: WallClock
) -> None:
    clock.now += 90
    assert value(metrics, "convergerd_cluster_lag_seconds", cluster="c2") == 90
    assert value(metrics, "convergerd_cluster_last_success_timestamp_seconds",
                 cluster="c2") is None


def recorded(cluster: str, last_success: dt.datetime) -> ClusterStateRow:
    """A cluster's row as the database holds it (read by the status sync)."""
    return ClusterStateRow(cluster=ClusterId(cluster), reachable=None, last_attempt_at=None,
                           last_success_at=last_success, last_reached_at=None,
                           last_error=None, last_reason=None, desired=0, in_sync=0, failed=0,
                           server_version=None, round_id=None)


def test_seeded_last_success_from_the_database(clock: WallClock) -> None:
    m = Replica(clock, ["c1"])
    m.state.absorb_records([recorded("c1", T0 - dt.timedelta(hours=2))], None, [])
    assert value(m, "convergerd_cluster_lag_seconds", cluster="c1") == 7200
    m.state.absorb_records([recorded("c1", T0 - dt.timedelta(hours=3))], None, [])  # older
    assert value(m, "convergerd_cluster_lag_seconds", cluster="c1") == 7200


def test_known_clusters_have_zero_counters_from_the_start(clock: WallClock) -> None:
    m = Replica(clock, ["c9"])
    for result in ("created", "updated", "unchanged", "failed"):
        assert value(m, "convergerd_applies_total", cluster="c9", result=result) == 0
    for reason in ("connect_error", "timeout", "crd_missing", "unauthorized", "forbidden"):
        assert value(m, "convergerd_apply_failures_total", cluster="c9", reason=reason) == 0
    assert value(m, "convergerd_retries_total", cluster="c9", reason="connect_error") == 0
    for result in ("ok", "partial", "failed"):
        assert value(m, "convergerd_rounds_total", result=result) == 0
    m.set_clusters([])
    assert value(m, "convergerd_applies_total", cluster="c9", result="created") is None


def test_round_counts(metrics: Replica) -> None:
    assert value(metrics, "convergerd_applies_total", cluster="c1", result="created") == 1
    assert value(metrics, "convergerd_applies_total", cluster="c1", result="unchanged") == 1
    assert value(metrics, "convergerd_rounds_total", result="ok") == 1
    assert value(metrics, "convergerd_round_duration_seconds_count") == 1
    assert value(metrics, "convergerd_round_duration_seconds_sum") == 42
    assert value(metrics, "convergerd_round_duration_seconds_bucket", le="60.0") == 1
    assert value(metrics, "convergerd_round_duration_seconds_bucket", le="30.0") == 0
    assert value(metrics, "convergerd_cluster_out_of_sync_policies", cluster="c1") == 0


def test_failures_by_reason_object_and_cluster_level(metrics: Replica) -> None:
    metrics.observe_round(round_at(
        T0,
        outcome("c1", reached=True, desired=2, in_sync=1, failed=1,
                deliveries=[delivery("c1", "p1", ApplyResult.FAILED, reason="invalid"),
                            delivery("c1", "p2", ApplyResult.UNCHANGED)]),
        outcome("c2", reached=False, desired=2, error="connect timeout", reason="timeout"),
    ))
    assert value(metrics, "convergerd_apply_failures_total", cluster="c1", reason="invalid") == 1
    assert value(metrics, "convergerd_apply_failures_total", cluster="c2",
                 reason="timeout") == 1
    assert value(metrics, "convergerd_applies_total", cluster="c1", result="failed") == 1
    assert value(metrics, "convergerd_cluster_up", cluster="c2") == 0
    assert value(metrics, "convergerd_cluster_out_of_sync_policies", cluster="c2") == 2
    assert value(metrics, "convergerd_rounds_total", result="failed") == 1


def test_phases_per_cluster_and_stale_after_two_intervals(
    metrics: Replica, clock: WallClock
) -> None:
    assert value(metrics, "convergerd_policy_phase", cluster="c1", phase="Enforcing") == 1
    assert value(metrics, "convergerd_policy_phase", cluster="c1", phase="Stale") == 0
    clock.now += 2 * INTERVAL + 1
    assert value(metrics, "convergerd_policy_phase", cluster="c1", phase="Enforcing") == 0
    assert value(metrics, "convergerd_policy_phase", cluster="c1", phase="Stale") == 1


def test_verification_per_cluster_admitted_counted_and_stale_unverified(
    clock: WallClock
) -> None:
    m = Replica(clock, ["c1"])

    def reading(pid: str, verified: Verification | None) -> PhaseReading:
        return PhaseReading(ClusterId("c1"), PolicyId(pid), "Enforcing", None, None, 1, T0,
                            **verified_fields(verified))

    m.observe_round(round_at(T0, outcome("c1", reached=True, desired=5, in_sync=5, phases=[
        reading("p1", Verification("True", "Denied", None, T0)),
        reading("p2", Verification("False", "Admitted")),
        reading("p3", Verification("False", "NoBoundaryNamespace")),
        reading("p4", Verification("Unknown", "Pending")),
        reading("p5", None),
    ])))
    got = {r: value(m, "convergerd_policy_verification", cluster="c1", result=r)
           for r in ("verified", "admitted", "unverified", "stale")}
    assert got == {"verified": 1, "admitted": 1, "unverified": 3, "stale": 0}
    clock.now += 2 * INTERVAL + 1  # not read back for two intervals: nothing is known now
    assert value(m, "convergerd_policy_verification", cluster="c1", result="admitted") == 0
    assert value(m, "convergerd_policy_verification", cluster="c1", result="unverified") == 5


def test_verified_forged_in_the_future_is_unverified_and_an_old_probe_is_stale(
    clock: WallClock
) -> None:
    """Issue 17, item 9: a Verified True with lastProbeTime 9999-... is not counted verified,
    and a probe older than `VERIFIED_STALE_PERIODS` probe periods (a dead operator) counts as
    `stale`; an admitted probe stays admitted (nothing has shown enforcement since)."""
    probe_period = 600.0
    m = Replica(clock, ["c1"], probe_period_s=probe_period)
    forged = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)

    def results() -> dict[str, float | None]:
        return {r: value(m, "convergerd_policy_verification", cluster="c1", result=r)
                for r in ("verified", "admitted", "unverified", "stale")}

    def round_with_probes_at(seen: dt.datetime, probed: dt.datetime) -> None:
        m.observe_round(round_at(seen, outcome("c1", reached=True, desired=3, in_sync=3, phases=[
            PhaseReading(ClusterId("c1"), PolicyId("forged"), "Enforcing", None, None, 1, seen,
                         **verified_fields(Verification("True", "Denied", "denied", forged,
                                                          forged))),
            PhaseReading(ClusterId("c1"), PolicyId("ok"), "Enforcing", None, None, 1, seen,
                         **verified_fields(Verification("True", "Denied", "denied", probed,
                                                          probed))),
            PhaseReading(ClusterId("c1"), PolicyId("bad"), "Enforcing", None, None, 1, seen,
                         **verified_fields(Verification("False", "Admitted", "ADMITTED", probed,
                                                          probed))),
        ])))

    round_with_probes_at(T0, T0)
    assert results() == {"verified": 1, "admitted": 1, "unverified": 1, "stale": 0}
    # The operator stops probing; rounds go on reading the same conditions.
    seen = T0 + dt.timedelta(seconds=VERIFIED_STALE_PERIODS * probe_period + 1)
    clock.now = seen.timestamp()
    round_with_probes_at(seen, T0)
    assert results() == {"verified": 0, "admitted": 1, "unverified": 1, "stale": 1}


def test_unsupported_clusters_by_version(clock: WallClock) -> None:
    m = Replica(clock)
    for name in ("a", "b"):
        m.observe_round(round_at(T0, outcome(
            name, reached=True, server_version="v1.29.8",
            phases=[PhaseReading(ClusterId(name), PolicyId("p"), "Unsupported", None, None, 1,
                                 T0)])))
    assert value(m, "convergerd_unsupported_clusters", version="v1.29.8") == 2


def test_leader_and_transitions(metrics: Replica) -> None:
    # What the elector tells the status (its on_change hook).
    metrics.state.set_leader(False, "rep-b")  # first observation: no transition
    assert value(metrics, "convergerd_leader_transitions_total") == 0
    metrics.state.set_leader(True, "rep-a")
    metrics.state.set_leader(True, "rep-a")
    assert value(metrics, "convergerd_is_leader") == 1
    assert value(metrics, "convergerd_leader_transitions_total") == 1
    metrics.state.set_leader(False, None)
    assert value(metrics, "convergerd_is_leader") == 0
    assert value(metrics, "convergerd_leader_transitions_total") == 2


def test_invalid_policies_gauge(metrics: Replica) -> None:
    r = round_at(T0)
    r.invalid = [InvalidPolicy("X", "b", 1, "bad id")]
    metrics.observe_round(r)
    assert value(metrics, "convergerd_invalid_policies") == 1


def test_request_observer(metrics: Replica) -> None:
    metrics.metrics.request_done("c1", "apply", 200, 0.3)
    metrics.metrics.request_done("c1", "list", None, 5.0)
    metrics.metrics.retry("c1", "throttled")
    assert value(metrics, "convergerd_cluster_requests_total", cluster="c1", verb="apply",
                 code="200") == 1
    assert value(metrics, "convergerd_cluster_requests_total", cluster="c1", verb="list",
                 code="none") == 1
    assert value(metrics, "convergerd_retries_total", cluster="c1", reason="throttled") == 1
    assert value(metrics, "convergerd_apply_duration_seconds_count", cluster="c1") == 1
    assert value(metrics, "convergerd_apply_duration_seconds_bucket", cluster="c1",
                 le="0.25") == 0


def test_on_call_extras(metrics: Replica) -> None:
    metrics.metrics.set_loop_lag(0.25)
    assert value(metrics, "convergerd_event_loop_lag_seconds") == 0.25
    assert value(metrics, "convergerd_build_info", version=metrics.metrics.version) == 1
    assert value(metrics, "convergerd_round_interval_seconds") == INTERVAL
    assert value(metrics, "convergerd_last_round_timestamp_seconds") == T0.timestamp()


def test_own_registry_per_instance(clock: WallClock) -> None:
    a = Replica(clock, ["only-a"])
    b = Replica(clock, ["only-b"])
    assert b"only-a" not in b.render()
    assert b"only-b" not in a.render()


def test_a_round_that_could_not_run_keeps_the_invalid_policies_gauge(metrics: Replica) -> None:
    r = round_at(T0)
    r.invalid = [InvalidPolicy("X", "b", 1, "bad id")]
    metrics.observe_round(r)
    # The database went away: the round saw no policies at all, so it cannot say none are invalid.
    metrics.observe_round(RoundReport(started_at=T0, finished_at=T0, epoch=Epoch("rep-a", 1),
                                      error="database unavailable: lost the database"))
    assert value(metrics, "convergerd_invalid_policies") == 1
    cancelled = RoundReport(started_at=T0, finished_at=T0, epoch=Epoch("rep-a", 1),
                            cancelled=True, error="grace period over")
    metrics.observe_round(cancelled)
    assert value(metrics, "convergerd_invalid_policies") == 1


def test_insecure_clusters_gauge_is_1_only_for_them_and_pruned_with_the_cluster(
    clock: WallClock,
) -> None:
    m = Replica(clock, ["c1", "c2"])
    # What the cluster registry tells, for every client it opens.
    m.state.set_insecure("c1", True)
    m.state.set_insecure("c2", False)
    assert parse(m)["convergerd_cluster_insecure"][0] == "gauge"
    assert value(m, "convergerd_cluster_insecure", cluster="c1") == 1
    assert value(m, "convergerd_cluster_insecure", cluster="c2") is None
    m.set_clusters(["c2"])  # c1 left the fleet
    assert value(m, "convergerd_cluster_insecure", cluster="c1") is None
    m.state.set_insecure("c2", True)
    m.state.set_insecure("c2", False)  # its kubeconfig was fixed
    assert value(m, "convergerd_cluster_insecure", cluster="c2") is None


def test_removed_clusters_lose_their_series_and_late_observations_do_not_bring_them_back(
    clock: WallClock,
) -> None:
    m = Replica(clock, keep=("home",))
    m.set_clusters(["c1", "c2"])
    m.metrics.request_done("home", "update", 200, 0.01)  # the Lease, not a fleet member
    m.observe_round(round_at(T0, outcome("c2", reached=True, desired=1, in_sync=1,
                                         deliveries=[delivery("c2", "p1", ApplyResult.CREATED)])))
    m.metrics.request_done("c2", "apply", 201, 0.1)
    grown = m.metrics.sizes()

    m.set_clusters(["c1"])
    # In flight when c2 was deleted: a probe, a request, a retry, a recorded success.
    m.state.observe_probe("c2", reachable=True)
    m.metrics.request_done("c2", "version", 200, 0.01)
    m.metrics.retry("c2", "throttled")
    m.state.absorb_cluster_rows([recorded("c2", T0)])
    m.state.set_insecure("c2", True)
    m.observe_round(round_at(T0, outcome("c2", reached=True)))

    assert 'cluster="c2"' not in m.render().decode()
    assert m.metrics.sizes()["clusters"] == 1
    assert m.metrics.sizes()["series"] < grown["series"]
    assert value(m, "convergerd_cluster_requests_total", cluster="home", verb="update",
                 code="200") == 1
    m.set_clusters(["c1", "c2"])  # back again: zeroed, counted from now on
    assert value(m, "convergerd_applies_total", cluster="c2", result="created") == 0


def test_a_standby_exports_what_its_status_shows_from_the_database(clock: WallClock) -> None:
    """One owner: the gauges read the status, so a standby's are the leader's recorded results,
    as its /status shows them (alerts and the dashboard use the leader's series only)."""
    m = Replica(clock, ["c1"])
    m.state.absorb_cluster_rows([ClusterStateRow(
        cluster=ClusterId("c1"), reachable=False, last_attempt_at=T0, last_success_at=None,
        last_reached_at=None, last_error="down", last_reason="timeout", desired=3, in_sync=1,
        failed=0, server_version="v1.30.1", round_id=7)])
    m.state.absorb_delivery_rows([DeliveryRow(
        "p1", "c1", 1, ApplyResult.UNCHANGED, T0, T0, None, None, 0, 7, PhaseReading(
            ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, T0,
            verified_status="False", verified_reason="Admitted", verified_message="m",
            verified_probed_at=T0))], cluster="c1")
    m.state.set_leader(False, "rep-b")
    assert value(m, "convergerd_cluster_up", cluster="c1") == 0
    assert value(m, "convergerd_cluster_out_of_sync_policies", cluster="c1") == 2
    assert value(m, "convergerd_cluster_server_info", cluster="c1", version="v1.30.1") == 1
    assert value(m, "convergerd_policy_phase", cluster="c1", phase="Enforcing") == 1
    assert value(m, "convergerd_policy_verification", cluster="c1", result="admitted") == 1
    assert value(m, "convergerd_is_leader") == 0
    assert value(m, "convergerd_applies_total", cluster="c1", result="unchanged") == 0


def test_the_gauges_agree_with_status(clock: WallClock) -> None:
    """Per cluster, the phase and verification gauges count what /status counts."""
    m = Replica(clock, ["c1", "c2"])

    def probed(status: str, reason: str, minutes_ago: float) -> Verification:
        at = T0 - dt.timedelta(minutes=minutes_ago)
        return Verification(status, reason, "m", at, at)

    old = T0 - dt.timedelta(seconds=3 * INTERVAL)
    m.observe_round(round_at(T0, outcome("c1", reached=True, desired=5, in_sync=5, phases=[
        PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, T0,
                     **verified_fields(probed("True", "Denied", 1))),
        PhaseReading(ClusterId("c1"), PolicyId("p2"), "Enforcing", None, None, 1, T0,
                     **verified_fields(probed("True", "Denied", 30))),
        PhaseReading(ClusterId("c1"), PolicyId("p3"), "Inert", None, None, 1, T0,
                     **verified_fields(probed("False", "Admitted", 1))),
        PhaseReading(ClusterId("c1"), PolicyId("p4"), "Weird", None, None, 1, T0),
        PhaseReading(ClusterId("c1"), PolicyId("p5"), "Error", None, None, 1, T0,
                     **verified_fields(probed("Unknown", "Pending", 1))),
    ]), outcome("c2", reached=True, desired=1, in_sync=1, phases=[
        PhaseReading(ClusterId("c2"), PolicyId("p1"), "Enforcing", None, None, 1, old,
                     **verified_fields(probed("True", "Denied", 1)))])))
    for _ in range(2):
        for cluster in snapshot(m.state)["clusters"]:
            name = cluster["id"]
            phases = {p: value(m, "convergerd_policy_phase", cluster=name, phase=p)
                      for p in ("Enforcing", "Inert", "Unsupported", "Error", "Unknown",
                                "Stale")}
            assert {p: n for p, n in phases.items() if n} == cluster["phases"], name
            seen = cluster["verification"]
            assert {r: value(m, "convergerd_policy_verification", cluster=name, result=r)
                    for r in ("verified", "admitted", "unverified", "stale")} == {
                "verified": seen["verified"], "admitted": seen["admitted"],
                "unverified": seen["not_verified"] + seen["unknown"], "stale": seen["stale"]}
        clock.now += 2 * INTERVAL + 1  # and once everything aged


def test_shards_one_shard_is_the_leader(metrics: Replica) -> None:
    """With one shard (the default) the leader holds shard 0: the shard metrics say so too."""
    assert value(metrics, "convergerd_shards_held") == 0
    metrics.state.set_leader(True, "rep-a")
    assert value(metrics, "convergerd_shards_held") == 1
    assert value(metrics, "convergerd_shard_holder", shard="0", holder="rep-a") == 1
    assert value(metrics, "convergerd_shard_last_round_timestamp_seconds",
                 shard="0") == T0.timestamp()
    assert value(metrics, "convergerd_orphan_clusters") == 0


def test_shards_holders_last_rounds_and_orphans(clock: WallClock) -> None:
    from convergerd.core.shards import shard_of
    clusters = [f"c{i}" for i in range(8)]
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=clock, shards=3)
    state.set_clusters(clusters)
    m = Metrics(state=state, process_collectors=False)
    state.set_shards(holders=["rep-a", "", "rep-b"], held=[0], members=["rep-a", "rep-b"],
                     share=2)
    assert value(m, "convergerd_shards_held") == 1
    assert value(m, "convergerd_shard_holder", shard="1", holder="") == 1
    assert value(m, "convergerd_shard_holder", shard="2", holder="rep-b") == 1
    # Rounds finished on shard 0's and 2's clusters, as the database recorded them.
    done = [c for c in clusters if shard_of(c, 3) != 1]
    state.absorb_cluster_rows([ClusterStateRow(
        cluster=ClusterId(c), reachable=True, last_attempt_at=T0, last_success_at=T0,
        last_reached_at=T0, last_error=None, last_reason=None, desired=0, in_sync=0,
        failed=0, server_version=None, round_id=1) for c in done])
    assert value(m, "convergerd_shard_last_round_timestamp_seconds", shard="1") is None
    assert value(m, "convergerd_shard_last_round_timestamp_seconds",
                 shard="2") == T0.timestamp()
    assert value(m, "convergerd_orphan_clusters") == 0
    clock.now += 2 * INTERVAL + 1  # shard 1 never had a round; the others not since T0
    assert value(m, "convergerd_orphan_clusters") == len(clusters)
    doc = snapshot(state)
    assert doc["shards"]["orphan_clusters"] == len(clusters)
    by_id = {c["id"]: c for c in doc["clusters"]}
    assert all(by_id[c]["shard"] == shard_of(c, 3) and by_id[c]["orphaned"] for c in clusters)
    assert {by_id[c]["holder"] for c in clusters if shard_of(c, 3) == 1} <= {None}


def test_the_exposition_is_prometheus_clients_as_the_state_and_counters_change(
    clock: WallClock
) -> None:
    """`render` writes its own families itself (and keeps unchanged parts between scrapes):
    byte for byte what prometheus_client's `generate_latest` writes of the same registry, with
    label values to escape, every kind of family, and after every kind of change."""
    odd = 'v1.30.0-"rc"\\x\nnext'
    m = Replica(clock, ["c1", "c2", "c3"], probe_period_s=600.0)
    fanout = FanoutMetrics()
    m.metrics.register(fanout)
    fanout.fanout_done("save", "api", "ok", 0.3)

    def same() -> None:
        assert m.render() == generate_latest(m.metrics.registry)

    same()
    m.state.observe_probe("c2", reachable=False)
    m.state.observe_probe("c3", reachable=True, server_version=odd)
    m.state.set_insecure("c1", True)
    m.state.set_invalid([("X", "bad id")])
    m.state.set_shards(holders=["rep-a"], held=[0], members=["rep-a"], share=1)
    m.observe_round(round_at(T0, outcome(
        "c1", reached=True, desired=3, in_sync=2, server_version="v1.29.0", phases=[
            PhaseReading(ClusterId("c1"), PolicyId("p1"), "Unsupported", None, None, 1, T0),
            PhaseReading(ClusterId("c1"), PolicyId("p2"), "Enforcing", None, None, 1, T0,
                         **verified_fields(Verification("True", "Denied", "m", T0, T0))),
            PhaseReading(ClusterId("c1"), PolicyId("p3"), "Enforcing", None, None, 1, T0,
                         **verified_fields(Verification("False", "Admitted", "m", T0, T0)))],
        deliveries=[delivery("c1", "p1", ApplyResult.CREATED),
                    delivery("c1", "p3", ApplyResult.FAILED, "odd reason")])))
    m.metrics.request_done("c1", "apply", 200, 0.3)
    m.metrics.request_done("c3", "list", None, 5.0)
    m.metrics.retry("c1", "throttled")
    m.metrics.record_refused("data")
    m.metrics.status_read_shed("/status")
    m.metrics.set_loop_lag(0.125)
    same()
    same()  # kept parts
    clock.now += 700  # readings and probes age: phases turn Stale
    same()
    m.metrics.request_done("c2", "get", 500, 0.1)  # one counter moves
    same()
    m.set_clusters(["c1", "c2"])  # c3's series go
    m.set_clusters(["c1", "c2", "c4"])  # and a new cluster's come, at zero
    same()
    m.set_clusters(["c1", "c2", "c5"])  # as many series, as many counted, other names
    same()


def test_unready_gauge_follows_the_readiness_checks_and_the_database_sync(clock: WallClock) -> None:
    """Every reason exists at 0 while ready (an alert tells ready from not scraped); the
    elector's checks are asked at scrape time, the database's state comes from the sync."""
    replica = Replica(clock)
    health = HealthCheck()
    problem: dict[str, str | None] = {"lease_unreachable": None, "lease_stalled": None}
    health.ready_check("lease_unreachable", lambda: problem["lease_unreachable"])
    health.ready_check("lease_stalled", lambda: problem["lease_stalled"])
    replica.metrics.register(ReadinessMetrics(health.not_ready, replica.state))

    def unready() -> dict[str, float | None]:
        return {r: value(replica, "convergerd_unready", reason=r)
                for r in ("lease_unreachable", "lease_stalled", "database")}

    assert unready() == {"lease_unreachable": 0, "lease_stalled": 0, "database": 0}
    problem["lease_stalled"] = "leadership stalled: ..."
    replica.state.note_sync("the database did not answer")
    assert unready() == {"lease_unreachable": 0, "lease_stalled": 1, "database": 1}
    problem["lease_stalled"] = None
    problem["lease_unreachable"] = "leader election blocked: ..."
    replica.state.note_sync(None)
    assert unready() == {"lease_unreachable": 1, "lease_stalled": 0, "database": 0}


def test_live_rollouts_carry_their_policy_and_nothing_else_does(
    metrics: Replica, clock: WallClock
) -> None:
    """Per-policy labels only while a policy has a rollout in progress: its wave, its state
    (one series per live state), its clusters per revision kind, and approval overdue after
    CONVERGERD_ROLLOUT_APPROVAL_ALERT_MINUTES."""
    strategy = parse_strategy({"id": "careful", "waves": [
        {"name": "canary", "selector": {"ring": "canary"}}, {"name": "rest", "fraction": 1.0}]})
    # c1 reports revision 1 of p1 (the fixture's round): "old" for a rollout of revision 2.
    waiting = Rollout(1, PolicyId("p1"), 2, 1, strategy, State.WAITING_APPROVAL, wave=1,
                      updated_at=T0)
    metrics.state.absorb_rollouts([waiting])
    assert value(metrics, "convergerd_rollout_wave", policy="p1") == 1
    assert {s: value(metrics, "convergerd_rollout_state", policy="p1", state=s)
            for s in ("progressing", "waiting_approval", "paused", "halted")} == {
        "progressing": 0, "waiting_approval": 1, "paused": 0, "halted": 0}
    assert value(metrics, "convergerd_rollout_clusters", policy="p1", revision_kind="new") == 0
    assert value(metrics, "convergerd_rollout_clusters", policy="p1", revision_kind="old") == 1
    assert value(metrics, "convergerd_rollout_approval_overdue", policy="p1") == 0
    clock.now += 3601  # past the default 60 minutes
    assert value(metrics, "convergerd_rollout_approval_overdue", policy="p1") == 1
    # /status shows it the same way.
    assert snapshot(metrics.state)["rollouts"] == [{
        "policy": "p1", "id": 1, "to_revision": 2, "from_revision": 1, "strategy": "careful",
        "state": "waiting_approval",
        "wave": {"index": 1, "name": "rest", "of": 2, "warn_step": False},
        "gate": "approval", "reason": None, "since": "2026-01-01T12:00:00Z",
        "clusters": {"new": 0, "old": 1}}]
    # The rollout ends: the policy's series go.
    metrics.state.absorb_rollouts([])
    test_no_per_policy_label_but_fleet_totals_and_never_policy_by_cluster(metrics)
    assert value(metrics, "convergerd_rollout_halts_total", on_halt="revert") == 0
    metrics.metrics.rollout_halted("revert")
    assert value(metrics, "convergerd_rollout_halts_total", on_halt="revert") == 1
