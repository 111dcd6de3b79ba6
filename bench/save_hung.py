"""A save's answer time with a share of the fleet hung, against the same save with none hung.

    .venv/bin/python bench/save_hung.py --clusters 500,2000 --hung-share 0.1 --repeats 3

Starts `convergerd sim` in its own process and saves one policy through the daemon's own
`fanout.Saver` (the HTTP handler's engine: `fanout_env` over a `ClusterRegistry` on the
simulator's kubeconfig, the daemon's default limits) with an in-memory store in place of the
database: every save is a new revision, written at once on every cluster (no read first). Per
point, alternately, a save with none hung and a save with every `1/share`-th cluster hung (the
simulator's `hang` fault: the connection accepted, no answer until the request timeout), so
both see the same load on a shared machine. Measured: seconds until `Saver.save` answers (what
the HTTP client waits for), the clusters answered and the clusters listed as still pending.
No prober runs: hung clusters are not known beforehand (no suspects), the worst case;
`--suspects` tells the save they are seen unreachable, as the prober would after 1.5 periods.

Output: one JSON line per save on stdout and a Markdown table at the end; progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from convergerd import eventloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import Limits, Sim, _default, log, warm_up
from convergerd.core.model import ClusterId, PolicyId, PolicyRow
from convergerd.core.removal import Current, Target
from convergerd.core.report import Delivery
from convergerd.core.rollout import Staged, Start
from convergerd.delivery.fanout import Saver, fanout_env
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import NoElection
from convergerd.sim.fleet import member_ids
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState

POLICY = "p-save"
RULE = {"type": "RequiredLabels", "labels": ["team"]}


class MemoryStore:
    """What `Saver` reads and records, in memory: one policy, covering every cluster."""

    def __init__(self, clusters: Sequence[str]) -> None:
        self.scope = frozenset(ClusterId(c) for c in clusters)
        self.revision = 0
        self.recorded = 0

    async def save_target(self, policy_id: str, /) -> Target | None:
        row = PolicyRow(id=policy_id, boundary="team-0", rule=RULE, enabled=True,
                        revision=self.revision)
        return Target(row=row, deleting=False, boundary_exists=True, scope=self.scope,
                      holders=self.scope)

    async def begin_deletion(self, policy_id: str, /) -> Target | None:
        return None

    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str], /) -> bool:
        return True

    async def record_deliveries(self, deliveries: Sequence[Delivery], /) -> None:
        self.recorded += len(deliveries)

    async def forget_deliveries(self, policy_id: str, clusters: Sequence[str], /) -> None:
        return None

    async def current(self, policy_ids: Sequence[PolicyId], /) -> dict[PolicyId, Current]:
        return {}

    async def start_rollout(self, policy_id: str, revision: int, *, by: str,
                            already_delivered: bool, now: bool = False) -> Start:
        return Start()  # no rollout strategies here: every save goes everywhere at once

    async def staged_rollout(self, policy_id: str, /) -> Staged | None:
        return None


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in args.clusters:
        with tempfile.TemporaryDirectory(prefix="convergerd-savehung-") as tmp:
            sim = Sim.start(n, Path(tmp))
            try:
                out += await _point(sim, n, args)
            finally:
                sim.stop()
    return out


async def _point(sim: Sim, n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    limits = Limits(
        cluster_concurrency=int(_default("cluster_concurrency")),
        apply_concurrency=int(_default("apply_concurrency")),
        request_timeout_s=args.request_timeout, fault_timeout_s=args.request_timeout,
        qps=float(_default("cluster_qps")), burst=int(_default("cluster_burst")),
        interval_minutes=float(_default("interval_minutes")), fault_rounds=False)
    settings = limits.settings(sim.kubeconfig)
    state = StatusState(identity="bench", interval_s=settings.rounds.interval_s)
    metrics = Metrics(state=state, process_collectors=False)
    registry = ClusterRegistry(kubeconfig=sim.kubeconfig, access=settings.clusters,
                               identity="bench", observer=metrics)
    ids = member_ids(n)
    store = MemoryStore(ids)
    fence = NoElection(identity="bench").fence()
    step = max(1, round(1 / args.hung_share))
    hung = ids[step - 1 :: step]
    seen_down: set[str] = set()  # with --suspects: the hung ones, as the prober would see them
    # Without --suspects, called as before the `suspected` argument existed (before figures).
    extra: dict[str, Any] = {"suspected": seen_down.__contains__} if args.suspects else {}
    saver = Saver(store=store,
                  env=lambda: fanout_env(settings, registry, fence, metrics, **extra),
                  guard_share=settings.saves.removal_guard_share)
    rows: list[dict[str, Any]] = []
    try:
        await warm_up(sim.kubeconfig, ids, limits)
        store.revision += 1
        await saver.save(POLICY)  # creates the object everywhere; connections warm
        for i in range(args.repeats):
            for label, faulty in (("none hung", []), (f"{len(hung)} hung", hung)):
                for c in faulty:
                    sim.set_faults(c, {"hang": True})
                seen_down.update(faulty)
                store.revision += 1
                started = time.perf_counter()
                report = await saver.save(POLICY)
                answer = time.perf_counter() - started
                results = Counter(r.result.value for r in report.results)
                await _settle(saver)
                for c in faulty:
                    sim.set_faults(c, None)
                seen_down.clear()
                row = {"clusters": n, "hung": len(faulty), "suspects": args.suspects, "repeat": i,
                       "answer_s": round(answer, 3), "results": dict(results),
                       "request_timeout_s": args.request_timeout,
                       "loadavg_1m": round(os.getloadavg()[0], 2),
                       "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
                log("%d clusters, %s: answered in %.2f s: %s", n, label, answer, dict(results))
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        await registry.close()
    return rows


async def _settle(saver: Saver) -> None:
    """Let the writes still going after the answer (if the saver has any) finish, so the next
    save starts on a quiet fleet."""
    drain = getattr(saver, "drain", None)
    if drain is not None:
        await drain()


def table(rows: Sequence[dict[str, Any]]) -> str:
    by: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        by.setdefault((r["clusters"], r["hung"]), []).append(r["answer_s"])
    lines = ["| clusters | hung | saves | answer median s | answer max s |",
             "|---:|---:|---:|---:|---:|"]
    for (n, h), walls in sorted(by.items()):
        lines.append(f"| {n:,} | {h:,} | {len(walls)} | {statistics.median(walls):.2f} | "
                     f"{max(walls):.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clusters", type=lambda s: [int(x) for x in s.split(",")],
                        default=[500, 2000])
    parser.add_argument("--hung-share", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--suspects", action="store_true",
                        help="the hung clusters known unreachable before the save (as the "
                        "prober sees them after 1.5 periods); default: not known")
    parser.add_argument("--request-timeout", type=float,
                        default=float(_default("request_timeout_s")), metavar="SECONDS")
    args = parser.parse_args(argv)
    rows = eventloop.run(run(args))
    print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
