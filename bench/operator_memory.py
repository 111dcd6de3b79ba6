"""The operator's memory: figures, not a test. `convergerd operator` as deployed, in its own
process, against one simulated cluster (in this process) holding `--policies` Policies over
`--boundaries` namespaces and, per point, `--pods` pods in them (what its workload cache holds).

    .venv/bin/python bench/operator_memory.py --pods 0,10000,30000

Per point: a fresh simulator and operator; the pods and Policies are written first, then the
operator starts; once every Policy has a phase and an audit over a synced cache, the operator's
RSS (`VmRSS`) is read every 0.5 s for `--steady-s` seconds, and its peak (`VmHWM`). The
baseline (0 pods) is what the Deployment's limit needs before the cache; the growth per pod is
what the cache adds (its objects, and what listing them left on the heap). One JSON line per
point on stdout, then a Markdown table; progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convergerd import eventloop
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import PODS, POLICIES

# Run as a script, bench/ (not the repository) is on sys.path: reuse the benchmarks' pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.operator_run import (
    BOUNDARY_LABEL,
    CLUSTER,
    create_namespaces,
    operator_env,
    settled_operator,
)
from bench.rounds import fmt, log, proc_status_mb


def policy(pid: str, boundary: str) -> dict[str, Any]:
    return {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
            "metadata": {"name": f"policy-{pid}", "labels": {
                BOUNDARY_LABEL: boundary, "app.kubernetes.io/managed-by": "convergerd"}},
            "spec": {"policyId": pid, "boundary": boundary, "enabled": True, "revision": 1,
                     "rule": {"type": "ForbidLatestTag"}}}


def pod(i: int) -> dict[str, Any]:
    """A pod of a few labels and two containers (`tests/integration/test_operator_audit.py`'s
    pod at scale)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"api-7f9c-{i:06d}", "labels": {
                "app": "api", "pod-template-hash": "7f9c", "team": "a"},
                "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"}},
            "spec": {"containers": [
                {"name": "api", "image": "registry.example.com/team-a/api:1.4.2",
                 "ports": [{"containerPort": 8080}]},
                {"name": "proxy", "image": "registry.example.com/envoy:1.31"}]}}


def settled(fleet: Fleet, policies: int) -> bool:
    """Every Policy has a phase and an audit counted over a synced cache."""
    store = fleet.store(CLUSTER)
    for i in range(policies):
        status = store.get(POLICIES, None, f"policy-p{i:03d}").get("status") or {}
        if not status.get("phase") or not (status.get("audit") or {}).get("cacheSynced"):
            return False
    return True


async def point(args: argparse.Namespace, pods: int, work: Path) -> dict[str, Any]:
    async with Fleet(clusters=1, kubeconfig_path=work / f"kubeconfig-{pods}",
                     rng=random.Random(7)) as fleet:
        create_namespaces(fleet, args.boundaries)
        store = fleet.store(CLUSTER)
        for i in range(pods):
            store.create(PODS, f"team-{i % args.boundaries}", pod(i), manager="bench")
        for i in range(args.policies):
            store.create(POLICIES, None, policy(f"p{i:03d}", f"b{i % args.boundaries}"),
                         manager="bench")
        log(f"== {pods} pods, {args.policies} policies: starting convergerd operator")
        env = operator_env(fleet, {})
        for setting in args.env:
            name, _, value = setting.partition("=")
            env[name] = value
        async with settled_operator(env, work / f"operator-{pods}.log",
                                    lambda: settled(fleet, args.policies)) as (proc, ready_s):
            samples = []
            until = time.monotonic() + args.steady_s
            while time.monotonic() < until:
                samples.append(proc_status_mb(proc.pid, "VmRSS"))
                await asyncio.sleep(0.5)
            peak = proc_status_mb(proc.pid, "VmHWM")
    result = {"pods": pods, "policies": args.policies, "boundaries": args.boundaries,
              "settled_s": round(ready_s, 1), "rss_mb": round(max(samples), 1),
              "rss_min_mb": round(min(samples), 1), "peak_rss_mb": round(peak, 1)}
    print(json.dumps(result), flush=True)
    return result


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="convergerd-opmem-") as tmp:
        results = [await point(args, int(n), Path(tmp)) for n in args.pods.split(",")]
    print("\n| pods | policies | settled s | RSS MB (steady, max) | peak RSS MB |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {fmt(r['pods'])} | {r['policies']} | {r['settled_s']} | {r['rss_mb']} | "
              f"{r['peak_rss_mb']} |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--pods", default="0,10000", help="pods per point, comma-separated")
    parser.add_argument("--policies", type=int, default=20)
    parser.add_argument("--boundaries", type=int, default=4)
    parser.add_argument("--steady-s", type=float, default=15.0)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an operator setting")
    return parser.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    eventloop.run(main(parse_args()))
