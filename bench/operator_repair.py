"""How fast tampering is repaired: figures, not a test (issue 35, item 4).

`convergerd operator` in its own process, as deployed (default probe period: the periodic pass
is 10 minutes away, so only the watch can be what repairs), against one simulated cluster (in
this process) holding `--policies` Enforcing Policies. Once every one is Verified, `--tries`
times each: the binding of one Policy (a different one each try) is deleted, or its
`validationActions` edited to `[Warn]` by another field manager (as `kubectl edit`), and from
the simulator's request log:

- repaired: from the change to the end of the operator's apply of the binding;
- verified: from the change to the end of the status write that made `Verified` True again
  (the operator first writes what it found enforced, `Admitted`, then re-probes at once).

    .venv/bin/python bench/operator_repair.py --policies 100 --tries 20

One JSON line per kind of change, then a Markdown table (median and max, ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convergerd import eventloop
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES, VALIDATING_ADMISSION_POLICY_BINDINGS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.operator_run import CLUSTER, create_namespaces, operator_env, settled_operator
from bench.operator_writes import last_seq, policy, settled
from bench.rounds import log

TRY_TIMEOUT_S = 30.0


def verified(fleet: Fleet, name: str) -> dict[str, Any]:
    status = fleet.store(CLUSTER).get(POLICIES, None, name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Verified"), {})


def tamper(fleet: Fleet, kind: str, pid: str) -> None:
    store = fleet.store(CLUSTER)
    name = f"stackship-{pid}"
    if kind == "delete":
        store.delete(VALIDATING_ADMISSION_POLICY_BINDINGS, None, name)
    else:
        store.patch(VALIDATING_ADMISSION_POLICY_BINDINGS, None, name,
                    json.dumps({"spec": {"validationActions": ["Warn"]}}).encode(),
                    content_type="application/merge-patch+json", manager="kubectl-edit",
                    force=None)


async def one_try(fleet: Fleet, kind: str, pid: str) -> tuple[float, float]:
    """(repaired, verified) in seconds after the change."""
    name = f"policy-{pid}"
    seq = last_seq(fleet)
    before = verified(fleet, name)
    at = time.time()
    tamper(fleet, kind, pid)
    deadline = time.monotonic() + TRY_TIMEOUT_S
    while True:
        now = verified(fleet, name)
        if (now.get("status") == "True"
                and now.get("lastTransitionTime", "") >= before.get("lastTransitionTime", "")
                and now.get("lastProbeTime") != before.get("lastProbeTime")):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{kind} of {pid}: not verified again within {TRY_TIMEOUT_S} s")
        await asyncio.sleep(0.01)
    requests = fleet.accounting.requests(cluster=CLUSTER, after=seq)
    binding = f"validatingadmissionpolicybindings/stackship-{pid}?"
    applied = [r for r in requests if binding in r.path and r.verb == "patch"]
    written = [r for r in requests if f"policies/{name}/status?" in r.path
               and "fieldManager=stackship-operator&" in r.path + "&"]
    if not applied or len(written) < 2:
        raise RuntimeError(f"{kind} of {pid}: no repair or no two status writes in the log")

    def done(r: Any) -> float:
        return float(r.time + r.duration_ms / 1000 - at)

    return done(applied[0]), done(written[-1])


async def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    async with Fleet(clusters=1, kubeconfig_path=work / "kubeconfig",
                     rng=random.Random(7)) as fleet:
        create_namespaces(fleet, args.boundaries)
        store = fleet.store(CLUSTER)
        for i in range(args.policies):
            store.create(POLICIES, None, policy(i, args.boundaries), manager="bench")
        env = operator_env(fleet, {"CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "1"})
        results = []
        async with settled_operator(env, work / "operator.log",
                                    lambda: settled(fleet, args.policies)):
            await asyncio.sleep(2.0)  # the audits' first writes done
            for kind in ("delete", "edit"):
                times = [await one_try(fleet, kind, f"p{i % args.policies:03d}")
                         for i in range(args.tries)]
                repaired = [t[0] * 1000 for t in times]
                again = [t[1] * 1000 for t in times]
                result = {"change": kind, "policies": args.policies, "tries": args.tries,
                          "repaired_ms_median": round(statistics.median(repaired), 1),
                          "repaired_ms_max": round(max(repaired), 1),
                          "verified_ms_median": round(statistics.median(again), 1),
                          "verified_ms_max": round(max(again), 1)}
                print(json.dumps(result), flush=True)
                results.append(result)
                log(f"{kind}: done")
    print("\n| change | policies | tries | repaired ms (median / max) | Verified True again ms "
          "(median / max) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['change']} | {r['policies']} | {r['tries']} | {r['repaired_ms_median']} / "
              f"{r['repaired_ms_max']} | {r['verified_ms_median']} / {r['verified_ms_max']} |")
    return results


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="convergerd-oprepair-") as tmp:
        await run(args, Path(tmp))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--boundaries", type=int, default=40)
    parser.add_argument("--tries", type=int, default=20)
    return parser.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    eventloop.run(main(parse_args()))
