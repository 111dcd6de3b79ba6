"""Simulator CPU per server-side apply of a save: `convergerd sim` alone, no daemon.

    .venv/bin/python bench/sim_save.py --clusters 2000 --saves 5

Starts `convergerd sim` in its own process, creates one Policy per cluster (server-side apply,
like a create round), then `--saves` times applies a new revision of it to every cluster (what
a save's fan-out sends: PATCH application/apply-patch+yaml, fieldManager, force), each over a
connection kept open per cluster (the daemon's warm connection), `--concurrency` clusters at
once. Per save: wall seconds and the simulator's user and system CPU seconds (from /proc), so
the simulator's cost per request is measured without the daemon's CPU in the way. (A sampling
profiler's wall-clock view misleads here: on a busy machine it charges the socket `send` that
wakes the client with the time the simulator then waits for a core.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from convergerd import eventloop

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/rounds.py's pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import Sim, _client_context, build_fleet, log
from convergerd.core.model import ClusterId
from convergerd.core.render import FIELD_MANAGER, GROUP, PLURAL, VERSION, render_policy
from convergerd.kube.client import APPLY_CONTENT_TYPE
from convergerd.kube.kubeconfig import load_kubeconfig


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="convergerd-simsave-") as tmp:
        sim = Sim.start(args.clusters, Path(tmp))
        try:
            return await _measure(sim, args)
        finally:
            sim.stop()


async def _measure(sim: Sim, args: argparse.Namespace) -> dict[str, Any]:
    fleet = build_fleet(args.clusters, 1)
    bodies = {c: render_policy(ps[0]) for c, ps in fleet.desired_by_cluster().items()}
    config = load_kubeconfig(sim.kubeconfig)
    contexts: dict[bytes | None, ssl.SSLContext] = {}
    sessions: dict[ClusterId, tuple[aiohttp.ClientSession, str, dict[str, str]]] = {}
    query = {"fieldManager": FIELD_MANAGER, "force": "true"}
    for cluster in bodies:
        cred = config.credentials(cluster)
        if cred.ca_pem not in contexts:
            contexts[cred.ca_pem] = _client_context(cred.ca_pem)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, ssl=contexts[cred.ca_pem],
                                           keepalive_timeout=600),
            trust_env=False, timeout=aiohttp.ClientTimeout(total=60))
        url = f"{cred.server}/apis/{GROUP}/{VERSION}/{PLURAL}/{bodies[cluster]['metadata']['name']}"
        headers = {"Authorization": f"Bearer {cred.token}", "Content-Type": APPLY_CONTENT_TYPE,
                   "Accept": "application/json", "User-Agent": "convergerd/bench (sim-save)"}
        sessions[cluster] = (session, url, headers)
    gate = asyncio.Semaphore(args.concurrency)

    async def apply(cluster: ClusterId, revision: int) -> int:
        session, url, headers = sessions[cluster]
        body = bodies[cluster]
        body["spec"]["revision"] = revision
        async with gate, session.patch(url, data=json.dumps(body).encode(), headers=headers,
                                       params=query) as resp:
            await resp.read()
            return resp.status

    async def fan_out(revision: int) -> tuple[float, float, dict[int, int]]:
        (user, system), started = _cpu(sim.proc.pid), time.perf_counter()
        codes = await asyncio.gather(*(apply(c, revision) for c in bodies))
        wall = time.perf_counter() - started
        user2, system2 = _cpu(sim.proc.pid)
        cpu = user2 - user + system2 - system
        log("  sim user %.2f s, system %.2f s", user2 - user, system2 - system)
        counts: dict[int, int] = {}
        for code in codes:
            counts[code] = counts.get(code, 0) + 1
        return wall, cpu, counts

    try:
        wall, cpu, codes = await fan_out(1)
        log("create: %.2f s, sim CPU %.2f s, %s", wall, cpu, codes)
        walls, cpus = [], []
        for i in range(args.saves):
            wall, cpu, codes = await fan_out(2 + i)
            walls.append(wall)
            cpus.append(cpu)
            log("save %d: %.2f s, sim CPU %.2f s (%.3f ms per apply), %s", i, wall, cpu,
                cpu / args.clusters * 1000, codes)
            await asyncio.sleep(args.pause)
    finally:
        await asyncio.gather(*(s.close() for s, _, _ in sessions.values()))
    return {"clusters": args.clusters, "saves": args.saves, "concurrency": args.concurrency,
            "wall_s": [round(w, 2) for w in walls], "sim_cpu_s": [round(c, 2) for c in cpus],
            "sim_cpu_ms_per_apply": round(statistics.median(cpus) / args.clusters * 1000, 3),
            "loadavg_1m": os.getloadavg()[0]}


def _cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--pause", type=float, default=1.0, metavar="SECONDS")
    args = parser.parse_args(argv)
    print(json.dumps(eventloop.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
