"""The Grafana dashboard loads, every panel queries something, and every metric that the
dashboard and the alert rules query is one the daemon (or, for `convergerd_operator_*`, the
in-cluster operator) really exports (read back from `Metrics.render()` and
`OperatorMetrics.render()`, not from a list kept by hand)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from convergerd.core.exceptions import ExceptionTally
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    Audit,
    ClusterOutcome,
    Delivery,
    PhaseReading,
    RoundReport,
    audit_fields,
)
from convergerd.core.rollout import Rollout, State, parse_strategy
from convergerd.operator.metrics import OperatorMetrics
from convergerd.status.metrics import Metrics, ReadinessMetrics
from convergerd.status.state import StatusState

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "convergerd.json"
RULES = ROOT / "deploy" / "prometheus" / "convergerd-rules.yaml"

# A metric name in PromQL; `_bucket/_sum/_count/_total` stay on: they are series names, and the
# exposition's sample names carry them too.
METRIC_NAME = re.compile(r"\bconvergerd_[a-z_]+\b")

# The documented metrics (docs/design.md, "Status and metrics"), as sample names a query would
# use (counters with _total, histograms by bucket).
SPEC_SERIES = {
    "convergerd_cluster_lag_seconds",
    "convergerd_cluster_last_success_timestamp_seconds",
    "convergerd_cluster_up",
    "convergerd_cluster_out_of_sync_policies",
    "convergerd_apply_failures_total",
    "convergerd_applies_total",
    "convergerd_policy_phase",
    "convergerd_policy_verification",
    "convergerd_round_duration_seconds_bucket",
    "convergerd_round_duration_seconds_sum",
    "convergerd_round_duration_seconds_count",
    "convergerd_rounds_total",
    "convergerd_is_leader",
    "convergerd_leader_transitions_total",
    "convergerd_invalid_policies",
}

Obj = dict[str, Any]


def load_dashboard() -> Obj:
    dashboard: Obj = json.loads(DASHBOARD.read_text())
    return dashboard


def all_panels(panels: list[Obj]) -> Iterator[Obj]:
    """Every panel, including those folded into collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries() -> list[str]:
    dashboard = load_dashboard()
    exprs = [t["expr"] for p in all_panels(dashboard["panels"]) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def rule_queries() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def names_in(exprs: list[str]) -> set[str]:
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def exported_series() -> set[str]:
    """Sample names of a daemon that has seen one of everything: a round over a cluster with
    deliveries, phases and a failure, probes, requests, retries, leadership and a rollout."""
    t0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    state = StatusState(identity="convergerd-a", interval_s=300.0,
                        clock=lambda: t0 + dt.timedelta(seconds=60))
    state.set_clusters(["c0001", "c0002"])
    metrics = Metrics(state=state, process_collectors=False)
    metrics.register(ReadinessMetrics(lambda: [], state))  # as the daemon registers it
    state.set_leader(True, "convergerd-a")
    state.set_leader(False, "convergerd-b")
    state.observe_probe("c0002", reachable=False)
    metrics.request_done("c0001", "apply", 200, 0.05)
    metrics.retry("c0001", "throttled")
    metrics.set_loop_lag(0.01)
    c1, pid = ClusterId("c0001"), PolicyId("p-regs")
    report = RoundReport(
        started_at=t0, finished_at=t0 + dt.timedelta(seconds=3),
        clusters=[
            ClusterOutcome(
                cluster=c1, reached=True, desired=1, in_sync=1, server_version="v1.29.4",
                deliveries=[Delivery(c1, pid, 3, ApplyResult.CREATED, t0)],
                phases=[PhaseReading(c1, pid, "Unsupported", None, None, 3, t0,
                                     **audit_fields(Audit(2, t0, synced=True)),
                                     enforcement_action="Warn")],
            ),
            ClusterOutcome(cluster=ClusterId("c0002"), error="connect timeout",
                           reason="unreachable"),
        ],
    )
    metrics.observe_round(report)  # as the round loop does: counted, and into the status
    state.observe_round(report)
    state.set_exception_tally([ExceptionTally("p-regs", 2, 1, 1)])
    strategy = parse_strategy({"id": "careful", "waves": [{"name": "all", "fraction": 1.0}]})
    state.absorb_rollouts([Rollout(1, pid, 4, 3, strategy, State.WAITING_APPROVAL,
                                   updated_at=t0)])  # a live rollout, as the sync reads it
    text = metrics.render().decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def operator_series() -> set[str]:
    """Sample names of the in-cluster operator's registry."""
    text = OperatorMetrics().render().decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("convergerd_operator_")}


# -- the dashboard itself ------------------------------------------------------------------


def test_dashboard_loads_with_datasource_and_cluster_variables() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "convergerd"
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    cluster = variables["cluster"]
    assert cluster["query"]["query"] == "label_values(convergerd_cluster_up, cluster)"
    assert cluster["includeAll"] is True


def test_every_panel_has_a_query_on_the_chosen_datasource() -> None:
    panels = list(all_panels(load_dashboard()["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        targets = panel.get("targets", [])
        assert targets, f"panel {panel['title']!r} has no target"
        for target in targets:
            assert target["expr"].strip(), f"panel {panel['title']!r}: empty expr"
            assert METRIC_NAME.search(target["expr"]), panel["title"]


@pytest.mark.parametrize("series", sorted(SPEC_SERIES - {
    "convergerd_cluster_last_success_timestamp_seconds",  # shown as "Last converged" / age
    "convergerd_round_duration_seconds_sum",
}))
def test_dashboard_shows_every_spec_metric(series: str) -> None:
    assert series in names_in(dashboard_queries())


# -- every queried name exists ---------------------------------------------------------------


def test_the_daemon_exports_every_spec_series() -> None:
    missing = SPEC_SERIES - exported_series()
    assert not missing, f"documented series not exported: {sorted(missing)}"


@pytest.mark.parametrize("source", ["dashboard", "alert rules"])
def test_every_queried_metric_is_exported(source: str) -> None:
    exprs = dashboard_queries() if source == "dashboard" else rule_queries()
    used = names_in(exprs)
    assert used, f"no convergerd_ metric found in the {source}"
    unknown = used - exported_series() - operator_series()
    assert not unknown, f"the {source} query metrics nothing exports: {sorted(unknown)}"



def test_name_extraction_keeps_series_suffixes() -> None:
    expr = ("histogram_quantile(0.9, sum by (le) (rate(convergerd_round_duration_seconds_bucket"
            '{job="convergerd"}[5m]))) and on () convergerd_rounds_total > 0')
    assert names_in([expr]) == {
        "convergerd_round_duration_seconds_bucket", "convergerd_rounds_total"}
