"""What one Prometheus scrape costs a replica that knows a large fleet (figures, not a test).

A `StatusState` fed one in-sync round of CLUSTERS x POLICIES (every policy read back with its
phase and the operator's Verified condition, one admitted per cluster), its `Metrics`, then
`--scrapes` scrapes: `collect()` alone (the families, what convergerd computes) and
`render()` (plus prometheus_client's text formatting, what `/metrics` serves). CPU seconds of
this process, so a busy machine skews the wall times more than these; compare runs made under
the same load.

`--probe-times distinct` gives every policy's last probe its own time (the worst case for the
precounted readings, `ClusterState.phase_tally`); `seconds` spreads them over a few seconds
at the second resolution a lastProbeTime has, as one probe pass of an operator does.

`--operator-status` adds what an operator writes beside the phase (issue 35): the mode in
force (a tenth of the policies in Warn) and admission's counts (the Warn ones counting
warnings), which the state tallies per cluster and per policy over the fleet as it observes
the round, and the scrape writes as per-policy series.

    .venv/bin/python bench/scrape.py                                  # 10,000 x 100
    .venv/bin/python bench/scrape.py --operator-status
    .venv/bin/python bench/scrape.py --clusters 1000 --probe-times seconds
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from convergerd.core.model import ClusterId, PolicyId
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
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState


def operator_status(j: int, at: dt.datetime) -> dict[str, Any]:
    """What an operator of issue 35 writes beside the phase of the `j`th policy."""
    warned = j % 7 if j % 10 == 0 else 0
    return {"enforcement_action": "Warn" if j % 10 == 0 else "Deny",
            "admission_denied": 0, "admission_warned": warned, "admission_audited": warned,
            "admission_last_hour_denied": 0, "admission_last_hour_warned": 0,
            "admission_last_hour_audited": 0, "admission_since": at, "admission_read_at": at,
            "admission_revision": 1, "admission_resets": 0}


def round_of(clusters: int, policies: int, probe_times: str, at: dt.datetime, *,
             status: bool = False) -> RoundReport:
    outcomes = []
    for i in range(clusters):
        cid = ClusterId(f"c{i:05d}")
        phases, deliveries = [], []
        for j in range(policies):
            pid = PolicyId(f"p{j:03d}")
            ago = (60 + j * 0.731 + i % 1000 / 1000 if probe_times == "distinct"
                   else 60 + j // 20)
            probed = at - dt.timedelta(seconds=ago)
            verified = (Verification("False", "Admitted", "m", probed, probed) if j == 7
                        else Verification("True", "Denied", "m", probed, probed))
            phases.append(PhaseReading(cid, pid, "Enforcing" if j % 50 else "Inert", "r", "m",
                                       1, at, **verified_fields(verified),
                                       **(operator_status(j, at) if status else {})))
            deliveries.append(Delivery(cid, pid, 1, ApplyResult.UNCHANGED, at))
        outcomes.append(ClusterOutcome(cid, reached=True, desired=policies, in_sync=policies,
                                       server_version="v1.31.2", phases=phases,
                                       deliveries=deliveries))
    return RoundReport(started_at=at - dt.timedelta(seconds=60), finished_at=at,
                       epoch=Epoch("bench", 1), clusters=outcomes)


def cpu_s(work: Callable[[], object], times: int) -> list[float]:
    spent = []
    for _ in range(times):
        started = time.process_time()
        work()
        spent.append(time.process_time() - started)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--probe-times", choices=["distinct", "seconds"], default="distinct")
    parser.add_argument("--operator-status", action="store_true",
                        help="the mode and admission counts beside the phase")
    args = parser.parse_args()
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    report = round_of(args.clusters, args.policies, args.probe_times, at,
                      status=args.operator_status)
    state = StatusState(identity="bench", interval_s=300.0)
    state.set_clusters(c.cluster for c in report.clusters)
    metrics = Metrics(state=state, process_collectors=False)
    started = time.process_time()
    metrics.observe_round(report)  # as the round loop does: counted, and into the status
    state.observe_round(report)
    observed = time.process_time() - started
    del report
    gc.collect()
    collect = cpu_s(lambda: list(metrics.collect()), args.scrapes)
    size = len(metrics.render())
    render = cpu_s(metrics.render, args.scrapes)
    print(f"{args.clusters} clusters x {args.policies} policies, {args.probe_times} probe "
          f"times{', operator status' if args.operator_status else ''}: round observed in "
          f"{observed:.2f} s CPU; per scrape ({size / 1e6:.1f} MB), "
          f"collect() median {statistics.median(collect):.2f} s (min {min(collect):.2f}), "
          f"render() median {statistics.median(render):.2f} s (min {min(render):.2f})")


if __name__ == "__main__":
    main()
