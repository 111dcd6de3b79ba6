"""Simulator memory: what `convergerd sim` holds for clusters x policies stored objects.

    .venv/bin/python bench/sim_memory.py --clusters 1000 --policies 10,100

Per point: start `convergerd sim` in its own process, server-side apply every policy of
`bench/rounds.py`'s fleet to every cluster with plain aiohttp (`bare_patches`: one session per
cluster, 64 clusters x 4 requests at once), wait `--settle` seconds, then read the simulator's
`VmRSS` and `VmHWM` and its CPU seconds. The growth between two points with the same clusters
and different policies is the memory per stored object (connections and per-cluster state
cancel out). One JSON line per point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from convergerd import eventloop

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/rounds.py's pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import (
    Limits,
    Sim,
    _bare_bodies,
    _int_list,
    bare_patches,
    build_fleet,
    log,
    proc_status_mb,
)


def vm_mb(pid: int, field: str) -> float:
    """A `/proc/PID/status` size field (VmRSS, VmHWM) in MB, rounded."""
    return round(proc_status_mb(pid, field), 1)


async def point(n: int, p: int, settle: float) -> dict[str, object]:
    limits = Limits(cluster_concurrency=64, apply_concurrency=4, request_timeout_s=30.0,
                    fault_timeout_s=2.0, qps=50.0, burst=100, interval_minutes=30.0)
    log("== %d clusters x %d policies", n, p)
    with tempfile.TemporaryDirectory(prefix="convergerd-simmem-") as tmp:
        sim = Sim.start(n, Path(tmp))
        try:
            bodies = _bare_bodies(build_fleet(n, p))
            idle = vm_mb(sim.proc.pid, "VmRSS")
            cpu = sim.cpu_s()
            ok, bad, wall = await bare_patches(sim.kubeconfig, bodies, limits)
            cpu = sim.cpu_s() - cpu
            await asyncio.sleep(settle)
            return {"clusters": n, "policies": p, "objects": ok, "failed": bad,
                    "wall_s": round(wall, 1), "sim_cpu_s": round(cpu, 1),
                    "sim_cpu_ms_per_apply": round(cpu / max(ok, 1) * 1000, 3),
                    "sim_rss_idle_mb": idle, "sim_rss_mb": vm_mb(sim.proc.pid, "VmRSS"),
                    "sim_hwm_mb": vm_mb(sim.proc.pid, "VmHWM")}
        finally:
            sim.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clusters", type=_int_list, default=[1000])
    parser.add_argument("--policies", type=_int_list, default=[10, 100])
    parser.add_argument("--settle", type=float, default=3.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    for n in args.clusters:
        for p in args.policies:
            print(json.dumps(eventloop.run(point(n, p, args.settle))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
