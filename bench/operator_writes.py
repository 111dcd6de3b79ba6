"""Status writes and INFO log lines of a quiet operator: figures, not a test (issue 35, item 5).

`convergerd operator` in its own process (from `--code`, a checkout, default this one; so the
code of an older commit can be measured against the same simulator) against one simulated
cluster (in this process) holding `--policies` Enforcing Policies of one rule type each over
`--boundaries` namespaces, nothing changing. The probe period is shortened
(`--probe-minutes`) and the figures scaled to the default one (10 minutes): after every
Policy is Enforcing, Verified and audited, and one more probe period, the simulator's request
log is read for `--periods` probe periods and the operator's log counted:

    .venv/bin/python bench/operator_writes.py --policies 100 --periods 6
    .venv/bin/python bench/operator_writes.py --code /tmp/repair-before   # main at 269e0a3

Per run one JSON line on stdout, then a Markdown row: status writes (the reconcile's
`stackship-operator` and the audit's `stackship-operator-audit`), operator INFO lines, probes
(dry-runs: one per policy per period says the operator kept up with the shortened period) and
requests, per policy per hour at the default probe period (6 periods an hour).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from convergerd import eventloop
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.operator_run import (
    BOUNDARY_LABEL,
    CLUSTER,
    create_namespaces,
    operator_env,
    settled_operator,
)
from bench.rounds import log

DEFAULT_PROBE_MINUTES = 10.0
# Rules whose probes do not get in each other's way within a boundary (each probe pod violates
# only its own policy): one of each per boundary.
RULES = ({"type": "ForbidLatestTag"},
         {"type": "RequiredLabels", "labels": ["team"]},
         {"type": "AllowedRegistries", "registries": ["registry.example.com"]})
INFO_LINE = re.compile(rb" INFO +convergerd\.operator")
STATUS_WRITE = re.compile(r"/policies/[^/?]+/status\?.*fieldManager=([^&]+)")


def policy(i: int, boundaries: int) -> dict[str, Any]:
    boundary = f"b{i % boundaries}"
    return {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
            "metadata": {"name": f"policy-p{i:03d}", "labels": {
                BOUNDARY_LABEL: boundary, "app.kubernetes.io/managed-by": "convergerd"}},
            "spec": {"policyId": f"p{i:03d}", "boundary": boundary, "enabled": True,
                     "revision": 1, "rule": RULES[(i // boundaries) % len(RULES)]}}


def settled(fleet: Fleet, policies: int) -> bool:
    """Every Policy Enforcing, Verified True, and audited over a synced cache."""
    store = fleet.store(CLUSTER)
    for i in range(policies):
        status = store.get(POLICIES, None, f"policy-p{i:03d}").get("status") or {}
        verified: dict[str, Any] = next((c for c in status.get("conditions") or []
                                         if c.get("type") == "Verified"), {})
        if (status.get("phase") != "Enforcing" or verified.get("status") != "True"
                or not (status.get("audit") or {}).get("cacheSynced")):
            return False
    return True


def last_seq(fleet: Fleet) -> int:
    requests = fleet.accounting.requests(cluster=CLUSTER)
    return requests[-1].seq if requests else 0


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    code = Path(args.code)
    if args.boundaries * len(RULES) < args.policies:
        raise SystemExit("--boundaries too few: at most 3 policies per boundary")
    async with Fleet(clusters=1, kubeconfig_path=work / "kubeconfig",
                     rng=random.Random(7)) as fleet:
        create_namespaces(fleet, args.boundaries)
        store = fleet.store(CLUSTER)
        for i in range(args.policies):
            store.create(POLICIES, None, policy(i, args.boundaries), manager="bench")
        env = operator_env(fleet, {
            "CONVERGERD_OPERATOR_PROBE_MINUTES": str(args.probe_minutes),
            "CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "1", "PYTHONPATH": str(code)})
        log_path = work / "operator.log"
        period_s = args.probe_minutes * 60
        log(f"== {code}: {args.policies} policies, probe period {period_s:g} s")
        async with settled_operator(env, log_path, lambda: settled(fleet, args.policies),
                                    cwd=code) as (_, ready_s):
            log(f"settled in {ready_s:.1f} s; one more period")
            await asyncio.sleep(period_s)
            offset = log_path.stat().st_size
            counts = await count_requests(fleet, args.periods * period_s)
            with log_path.open("rb") as f:
                f.seek(offset)
                counts["info_lines"] = sum(1 for line in f if INFO_LINE.search(line))
    per = args.policies * args.periods * DEFAULT_PROBE_MINUTES / 60  # policy x scaled hours
    result: dict[str, Any] = {"code": str(code), "policies": args.policies,
                              "periods": args.periods, "probe_period_s": period_s, **counts}
    result.update({f"{k}_per_policy_hour": round(v / per, 2) for k, v in counts.items()})
    print(json.dumps(result), flush=True)
    print("\n| code | status writes /policy/h | audit writes /policy/h | INFO lines /policy/h "
          "| probes /policy/h | requests /policy/h |")
    print("|---|---|---|---|---|---|")
    print(f"| {code.name} | " + " | ".join(
        str(result[f"{k}_per_policy_hour"])
        for k in ("status_writes", "audit_writes", "info_lines", "probes", "requests")) + " |")
    return result


async def count_requests(fleet: Fleet, duration_s: float) -> dict[str, int]:
    """The operator's requests for `duration_s` from now (Lease traffic left out): all, the
    probes (dry-runs), and the status writes of the reconcile and of the audit."""
    seq = last_seq(fleet)
    counts = dict.fromkeys(("requests", "probes", "status_writes", "audit_writes"), 0)
    managers = {"stackship-operator": "status_writes",
                "stackship-operator-audit": "audit_writes"}
    until = time.monotonic() + duration_s
    while time.monotonic() < until:  # read the ring buffer before it wraps
        await asyncio.sleep(1.0)
        for r in fleet.accounting.requests(cluster=CLUSTER, after=seq):
            seq = r.seq
            if "/leases" in r.path:
                continue
            counts["requests"] += 1
            counts["probes"] += "dryRun" in r.path
            match = STATUS_WRITE.search(r.path)
            if match and r.verb == "patch" and match.group(1) in managers:
                counts[managers[match.group(1)]] += 1
    return counts


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="convergerd-opwrites-") as tmp:
        await run(args, Path(tmp))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--code", default=str(Path(__file__).resolve().parents[1]),
                        help="the checkout whose operator runs")
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--boundaries", type=int, default=40)
    parser.add_argument("--probe-minutes", type=float, default=0.5,
                        help="the probe period the operator runs with (scaled to 10 minutes)")
    parser.add_argument("--periods", type=int, default=6, help="probe periods measured")
    args = parser.parse_args(argv)
    args.code = str(Path(args.code).resolve())
    return args


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    eventloop.run(main(parse_args()))
