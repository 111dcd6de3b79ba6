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

Which write that was is read from the Policy's versions through a watch in the simulator: the
condition's times are whole seconds, so two tries of one Policy within a second (few
policies) looked alike to them. A `Verified` never written anything but True is an error (the
change would have been mended unseen).

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
from convergerd.sim.store import Watcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.operator_run import CLUSTER, create_namespaces, operator_env, settled_operator
from bench.operator_writes import last_seq, policy, settled
from bench.rounds import log

TRY_TIMEOUT_S = 30.0


def verified(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Verified"), {})


def reconciled(status: dict[str, Any]) -> dict[str, Any]:
    """What the operator's reconcile writes of a Policy's status: the audit's and the admission
    counts' writes (their own field managers) leave it as it was."""
    return {k: v for k, v in status.items() if k not in ("audit", "admission")}


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


async def verified_again(watcher: Watcher, status: dict[str, Any], what: str) -> int:
    """How many of the reconcile's status writes it took (watched from before the change,
    `status` then) until `Verified` was True after having been something else.

    Every version is seen, however close together (the condition's times are whole seconds:
    two tries of one Policy within a second look alike to them). A `Verified` never written
    anything but True is an error: the change would have been mended unseen."""
    deadline = time.monotonic() + TRY_TIMEOUT_S
    last, writes, shown = reconciled(status), 0, False
    while (left := deadline - time.monotonic()) > 0:
        event = await watcher.next(left)
        if event is None or event["type"] != "MODIFIED":
            continue
        now = reconciled(event["object"].get("status") or {})
        if now == last:
            continue
        last, writes = now, writes + 1
        if verified(now).get("status") != "True":
            shown = True
        elif shown:
            return writes
    raise RuntimeError(f"{what}: " + ("not verified again" if shown else "Verified never "
                                      "written other than True") + f" within {TRY_TIMEOUT_S} s")


async def one_try(fleet: Fleet, kind: str, pid: str) -> tuple[float, float]:
    """(repaired, verified) in seconds after the change."""
    name, what = f"policy-{pid}", f"{kind} of {pid}"
    store = fleet.store(CLUSTER)
    seq = last_seq(fleet)
    watcher = store.watch(POLICIES, None, resource_version=str(store.resource_version),
                          field_selector=f"metadata.name={name}")
    try:
        status = store.get(POLICIES, None, name).get("status") or {}
        at = time.time()
        tamper(fleet, kind, pid)
        writes = await verified_again(watcher, status, what)
    finally:
        watcher.close()
    binding = f"validatingadmissionpolicybindings/stackship-{pid}?"

    def ours(r: Any) -> bool:
        return "fieldManager=stackship-operator&" in r.path + "&"

    deadline = time.monotonic() + TRY_TIMEOUT_S
    while True:  # a request is logged once answered: the watch may hear of its write first
        requests = fleet.accounting.requests(cluster=CLUSTER, after=seq)
        applied = [r for r in requests if binding in r.path and r.verb == "patch" and ours(r)]
        written = [r for r in requests if f"policies/{name}/status?" in r.path and ours(r)]
        if applied and len(written) >= writes:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no repair, or not {writes} status writes, in the log")
        await asyncio.sleep(0.01)

    def done(r: Any) -> float:
        return float(r.time + r.duration_ms / 1000 - at)

    return done(applied[0]), done(written[writes - 1])


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
