"""Where a replica's memory goes per delivery (figures, not a test): a round's report, and the
status state (`StatusState`) that keeps what later readers need of it.

Builds in-sync rounds of CLUSTERS x POLICIES the way the round engine does (each cluster's
list answer decoded from JSON and read with `ListedPolicy.from_object`, so every reading has its
own strings and times, as in the daemon; one `Delivery` per policy; every policy read back
with its phase, Ready and the operator's Verified condition, each probed at its own time),
and measures with tracemalloc:

- the report of one round (what `RoundLoop` builds, records, then drops);
- the status state after one round is observed, and after a second one (the first report
  gone): what stays between rounds;
- the peak while the second round is observed with both reports alive (what keeping the
  previous report would cost);
- the record `store.records.round_record` makes of a report, at its peak while its rows are
  made as a writing makes them (cluster by cluster, as they are copied; alive with the
  report while it is written).

    .venv/bin/python bench/status_memory.py --clusters 2000 --policies 50
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import sys
import tracemalloc

from convergerd.core.decode import parse_json
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.plan import ListedPolicy
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    verified_fields,
)
from convergerd.status.state import StatusState
from convergerd.store.records import round_record

MB = 1e6


def policy_object(policy: str, revision: int, probed: dt.datetime) -> dict[str, object]:
    """A managed Policy as the operator leaves it: Enforcing, Ready, Verified."""
    stamp = probed.isoformat().replace("+00:00", "Z")
    return {
        "metadata": {"name": f"policy-{policy}", "resourceVersion": "12345", "generation": 1,
                     "labels": {"app.kubernetes.io/managed-by": "convergerd",
                                "convergerd.io/revision": str(revision)}},
        "spec": {"rule": {"type": "ForbidLatestTag"}, "revision": revision},
        "status": {"phase": "Enforcing", "observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled",
             "message": "ValidatingAdmissionPolicy and binding in place"},
            {"type": "Verified", "status": "True", "reason": "Denied",
             "message": "the probe object was denied", "lastProbeTime": stamp,
             "lastTransitionTime": stamp}]},
    }


def cluster_outcome(cluster: int, policies: int, at: dt.datetime) -> ClusterOutcome:
    cid = ClusterId(f"c{cluster:05d}")
    page = json.dumps({"items": [
        policy_object(f"p{j:03d}", 1 + j % 7,
                      at - dt.timedelta(seconds=60 + j * 0.731 + cluster % 1000 / 1000))
        for j in range(policies)]}).encode()
    observed = [ListedPolicy.from_object(o) for o in parse_json(page, "a list")["items"]]
    phases = []
    deliveries = []
    for o in observed:
        pid = PolicyId(sys.intern(o.name.removeprefix("policy-")))  # as `converge._phases`
        revision = 1 + int(pid[1:]) % 7
        phases.append(PhaseReading(cid, pid, o.phase, o.ready_reason, o.ready_message,
                                   revision, at, **verified_fields(o.verified)))
        deliveries.append(Delivery(cid, PolicyId(str(pid)), revision, ApplyResult.UNCHANGED, at))
    return ClusterOutcome(cid, reached=True, desired=policies, in_sync=policies,
                          server_version="v1.31.2", phases=phases, deliveries=deliveries)


def round_of(clusters: int, policies: int, at: dt.datetime) -> RoundReport:
    return RoundReport(started_at=at - dt.timedelta(seconds=30), finished_at=at,
                       epoch=Epoch("bench", 1),
                       clusters=[cluster_outcome(i, policies, at) for i in range(clusters)])


def traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


async def record_peak(report: RoundReport) -> int:
    """The traced peak while `report`'s record is built and its rows made as a writing makes
    them, on a running loop as in the daemon (a record handed out of `asyncio.run` showed a
    transient peak of ~1,500 bytes per delivery that the daemon does not have)."""
    tracemalloc.reset_peak()
    record = await round_record(report, "bench")
    for _row in record.rows():
        pass
    return tracemalloc.get_traced_memory()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--policies", type=int, default=50)
    args = parser.parse_args()
    deliveries = args.clusters * args.policies
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    tracemalloc.start()
    state = StatusState(identity="bench", interval_s=300.0, clock=lambda: at)
    state.set_clusters(f"c{i:05d}" for i in range(args.clusters))
    base = traced()
    first = round_of(args.clusters, args.policies, at)
    report_bytes = traced() - base
    state.observe_round(first)
    both = traced()
    record_bytes = asyncio.run(record_peak(first)) - both
    del first
    kept_1 = traced() - base
    tracemalloc.reset_peak()
    start_2 = traced()
    second = round_of(args.clusters, args.policies, at + dt.timedelta(seconds=300))
    state.observe_round(second)
    peak_2 = tracemalloc.get_traced_memory()[1] - start_2
    del second
    kept_2 = traced() - base
    tracemalloc.stop()
    per = 1 / deliveries
    print(json.dumps({
        "clusters": args.clusters, "policies": args.policies,
        "report_mb": round(report_bytes / MB, 1),
        "report_bytes_per_delivery": round(report_bytes * per),
        "record_mb": round(record_bytes / MB, 1),
        "record_bytes_per_delivery": round(record_bytes * per),
        "report_and_state_after_round_1_mb": round((both - base) / MB, 1),
        "state_after_round_1_mb": round(kept_1 / MB, 1),
        "state_after_round_2_mb": round(kept_2 / MB, 1),
        "state_bytes_per_delivery": round(kept_2 * per),
        "round_2_peak_above_state_mb": round(peak_2 / MB, 1),
        "at_10000x100_report_mb": round(report_bytes * per * 1e6 / MB),
        "at_10000x100_state_mb": round(kept_2 * per * 1e6 / MB),
    }))


if __name__ == "__main__":
    main()
