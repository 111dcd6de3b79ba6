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

`--operator-status` gives every Policy what an operator of issue 35 writes beside the phase:
`status.enforcementAction` (a tenth in Warn), `status.audit` (a few violating; `auditedAt` at
each policy's own heartbeat) and `status.admission` (most counts 0, the Warn ones with
warnings; `since` shared by groups of policies saved together, `readAt` at one of the last
hour's 30-second reads, each policy's own).

    .venv/bin/python bench/status_memory.py --clusters 2000 --policies 50
    .venv/bin/python bench/status_memory.py --clusters 2000 --policies 100 --operator-status
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import gc
import json
import sys
import tracemalloc

from convergerd.core.decode import parse_json
from convergerd.core.facts import READING_NAMES
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.plan import ListedPolicy
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    audit_fields,
    verified_fields,
)
from convergerd.status.state import StatusState
from convergerd.store.records import round_record

MB = 1e6


def stamp_of(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def operator_status(j: int, revision: int, at: dt.datetime, cluster: int) -> dict[str, object]:
    """What an operator writes beside the phase of the `j`th policy (see the module's doc):
    each cluster's operator at its own times."""
    warn = j % 10 == 0
    warned = j % 7 if warn else 0
    at = at.replace(second=0) - dt.timedelta(seconds=cluster % 997)
    since = stamp_of(at - dt.timedelta(days=1, hours=j // 20))
    return {
        "enforcementAction": "Warn" if warn else "Deny",
        "audit": {"violations": 2 if j % 25 == 0 else 0, "cacheSynced": True,
                  "auditedAt": stamp_of(at - dt.timedelta(seconds=j * 17 % 1800))},
        "admission": {"denied": 0, "warned": warned, "audited": warned, "since": since,
                      "readAt": stamp_of(at - dt.timedelta(seconds=30 * (j % 60))),
                      "revision": revision,
                      "lastHour": {"denied": 0, "warned": 0, "audited": 0, "since": since},
                      "resets": 0, "probesExcluded": 0},
    }


def policy_object(policy: str, revision: int, probed: dt.datetime, *,
                  extra: dict[str, object] | None = None) -> dict[str, object]:
    """A managed Policy as the operator leaves it: Enforcing, Ready, Verified (and `extra` in
    its status)."""
    stamp = stamp_of(probed)
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
             "lastTransitionTime": stamp}], **(extra or {})},
    }


# The listed Policy's fields a reading takes by name (as `converge._phases` passes them on).
_BY_NAME = tuple(f.name for f in dataclasses.fields(ListedPolicy)
                 if f.name in READING_NAMES and f.name not in (
                     "phase", "ready_reason", "ready_message"))


def cluster_outcome(cluster: int, policies: int, at: dt.datetime, *,
                    status: bool = False) -> ClusterOutcome:
    cid = ClusterId(f"c{cluster:05d}")
    page = json.dumps({"items": [
        policy_object(f"p{j:03d}", 1 + j % 7,
                      at - dt.timedelta(seconds=60 + j * 0.731 + cluster % 1000 / 1000),
                      extra=operator_status(j, 1 + j % 7, at, cluster) if status else None)
        for j in range(policies)]}).encode()
    observed = [ListedPolicy.from_object(o) for o in parse_json(page, "a list")["items"]]
    phases = []
    deliveries = []
    for o in observed:
        pid = PolicyId(sys.intern(o.name.removeprefix("policy-")))  # as `converge._phases`
        revision = 1 + int(pid[1:]) % 7
        phases.append(PhaseReading(cid, pid, o.phase, o.ready_reason, o.ready_message,
                                   revision, at, **verified_fields(o.verified),
                                   **audit_fields(o.audit),
                                   **{n: getattr(o, n) for n in _BY_NAME}))
        deliveries.append(Delivery(cid, PolicyId(str(pid)), revision, ApplyResult.UNCHANGED, at))
    return ClusterOutcome(cid, reached=True, desired=policies, in_sync=policies,
                          server_version="v1.31.2", phases=phases, deliveries=deliveries)


def round_of(clusters: int, policies: int, at: dt.datetime, *,
             status: bool = False) -> RoundReport:
    return RoundReport(started_at=at - dt.timedelta(seconds=30), finished_at=at,
                       epoch=Epoch("bench", 1),
                       clusters=[cluster_outcome(i, policies, at, status=status)
                                 for i in range(clusters)])


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
    parser.add_argument("--operator-status", action="store_true",
                        help="the mode, audit and admission counts beside the phase")
    args = parser.parse_args()
    deliveries = args.clusters * args.policies
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    tracemalloc.start()
    state = StatusState(identity="bench", interval_s=300.0, clock=lambda: at)
    state.set_clusters(f"c{i:05d}" for i in range(args.clusters))
    base = traced()
    first = round_of(args.clusters, args.policies, at, status=args.operator_status)
    report_bytes = traced() - base
    state.observe_round(first)
    both = traced()
    record_bytes = asyncio.run(record_peak(first)) - both
    del first
    kept_1 = traced() - base
    tracemalloc.reset_peak()
    start_2 = traced()
    second = round_of(args.clusters, args.policies, at + dt.timedelta(seconds=300),
                      status=args.operator_status)
    state.observe_round(second)
    peak_2 = tracemalloc.get_traced_memory()[1] - start_2
    del second
    kept_2 = traced() - base
    tracemalloc.stop()
    per = 1 / deliveries
    print(json.dumps({
        "clusters": args.clusters, "policies": args.policies,
        "operator_status": args.operator_status,
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
