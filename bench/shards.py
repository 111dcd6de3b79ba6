"""Shards benchmark: figures, not a test. N clusters over R `convergerd run` replicas sharing
S shards, against one simulator and one database.

    .venv/bin/python bench/shards.py --clusters 2000 --policies 10 --replicas 3 --shards 12
    .venv/bin/python bench/shards.py --clusters 10000 --policies 20 --replicas 3 --shards 12 \\
        --interval-s 120

Per run: how long until every cluster has a recorded round (the fleet covered, from the
`cluster_state` table), how the shards ended up spread (from the Leases, as `/status` shows
them), then over `--steady-s` seconds each replica's CPU seconds and RSS and the rounds it
recorded (count and mean wall time, from the `rounds` table). With `--saves K`, then K saves
of a policy covering every cluster (its rule changed in the database, triggers off, then
`POST /v1/policies/p000/apply` to the first replica), each timed to the 200, with every
replica's CPU seconds during it: with shards, the other replicas write their shards' clusters
(docs/design.md, "Saves spread over the shard holders"). Run it beside `--replicas 1
--shards 1` for the single-leader baseline. Progress on stderr, one JSON line at the end.

    .venv/bin/python bench/shards.py --clusters 10000 --policies 1 --replicas 3 --shards 12 \\
        --interval-s 600 --steady-s 0 --saves 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

# Run as a script, bench/ (not the repository) is on sys.path: reuse the benchmarks' pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.daemon import DEFAULT_SERVER, clean_env, cpu_s
from bench.rounds import Sim, _free_port, fresh_database, log, proc_status_mb
from bench.soak import fleet_doc, import_doc
from convergerd import eventloop
from convergerd.sim.fleet import member_ids

READY_S = 120.0
TOKEN = secrets.token_urlsafe(16)  # the replicas' API token
SAVE_TIMEOUT_S = 120.0


def start_daemon(identity: str, *, dsn: str, kubeconfig: Path, args: argparse.Namespace,
                 workdir: Path) -> tuple[Any, str]:
    import subprocess
    port = _free_port()
    env = {
        "CONVERGERD_DATABASE_URL": dsn, "CONVERGERD_KUBECONFIG": str(kubeconfig),
        "CONVERGERD_LEADER_ELECTION": "true", "CONVERGERD_HOME_CONTEXT": "home",
        "CONVERGERD_IDENTITY": identity, "CONVERGERD_HTTP_ADDR": f"127.0.0.1:{port}",
        "CONVERGERD_LOG_LEVEL": args.log_level, "CONVERGERD_SHARDS": str(args.shards),
        "Policies__ConvergeIntervalMinutes": repr(args.interval_s / 60),
        "CONVERGERD_API_TOKEN": TOKEN,
    }
    out = (workdir / f"{identity}.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "convergerd", "run"], env=clean_env(env),
                            stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


async def covered(dsn: str) -> tuple[int, int]:
    conn = await asyncpg.connect(dsn)
    try:
        done = await conn.fetchval(
            "SELECT count(*) FROM cluster_state WHERE last_attempt_at IS NOT NULL")
        total = await conn.fetchval("SELECT count(*) FROM clusters")
    finally:
        await conn.close()
    return int(done), int(total)


async def rounds_by_identity(dsn: str, since: float) -> dict[str, dict[str, float]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            """SELECT identity, count(*) AS n,
                      avg(extract(epoch FROM finished_at - started_at)) AS mean_s,
                      max(extract(epoch FROM finished_at - started_at)) AS max_s
               FROM rounds WHERE started_at >= to_timestamp($1) GROUP BY identity""", since)
    finally:
        await conn.close()
    return {r["identity"]: {"rounds": int(r["n"]), "mean_s": float(r["mean_s"] or 0),
                            "max_s": float(r["max_s"] or 0)} for r in rows}


async def timed_saves(dsn: str, base: str, procs: list[Any], names: list[str],
                      count: int) -> dict[str, Any]:
    """`count` saves of p000 (every cluster), each after a change of its rule."""
    took: list[float] = []
    cpu: dict[str, list[float]] = {n: [] for n in names}
    results: Counter[str] = Counter()
    conn = await asyncpg.connect(dsn)
    try:
        async with aiohttp.ClientSession() as session:
            for i in range(count):
                async with conn.transaction():
                    # No notification: the shard-0 holder would save it a second time at once.
                    await conn.execute("SET LOCAL session_replication_role = replica")
                    await conn.execute(
                        """UPDATE policies SET rule = $1::jsonb, revision = revision + 1
                           WHERE id = 'p000'""",
                        json.dumps({"type": "AllowedRegistries",
                                    "registries": [f"bench-{i}.example.com"]}))
                before = [cpu_s(p.pid) for p in procs]
                started = time.perf_counter()
                async with session.post(
                        f"{base}/v1/policies/p000/apply",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                        timeout=aiohttp.ClientTimeout(total=SAVE_TIMEOUT_S)) as resp:
                    body = await resp.read()
                took.append(time.perf_counter() - started)
                if resp.status != 200:
                    raise RuntimeError(f"save: {resp.status} {body[:500]!r}")
                found = Counter(c["result"] for c in json.loads(body)["clusters"])
                results.update(found)
                for n, p, c0 in zip(names, procs, before, strict=True):
                    cpu[n].append(round(cpu_s(p.pid) - c0, 2))
                log("save %d: %.2f s, %s, CPU by replica %s", i, took[-1], dict(found),
                    {n: v[-1] for n, v in cpu.items()})
                await asyncio.sleep(1.0)
    finally:
        await conn.close()
    ordered = sorted(took)
    return {"samples": count, "p50_s": round(ordered[len(ordered) // 2], 2),
            "max_s": round(ordered[-1], 2), "all_s": [round(t, 2) for t in took],
            "cpu_s_by_replica": cpu, "results": dict(results)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="convergerd-shards-") as tmp:
        workdir = Path(args.workdir or tmp)
        log("simulator with %d clusters", args.clusters)
        sim = Sim.start(args.clusters, workdir)
        procs: list[Any] = []
        try:
            async with fresh_database(args.database_url, "bench_shards",
                                      migrated=True) as (dsn, _name):
                await import_doc(dsn, fleet_doc(member_ids(args.clusters), args.policies))
                started = time.time()
                names = [f"replica-{i}" for i in range(args.replicas)]
                daemons = [start_daemon(n, dsn=dsn, kubeconfig=sim.kubeconfig, args=args,
                                        workdir=workdir) for n in names]
                procs = [p for p, _ in daemons]
                deadline = time.monotonic() + READY_S + 4 * args.interval_s
                while True:
                    done, total = await covered(dsn)
                    if done >= total:
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"only {done} of {total} clusters covered")
                    if any(p.poll() is not None for p in procs):
                        raise RuntimeError("a replica exited; see its log")
                    await asyncio.sleep(0.5)
                coverage_s = time.time() - started
                log("every cluster had a round %.1f s after the start", coverage_s)
                async with aiohttp.ClientSession() as session, \
                        session.get(daemons[0][1] + "/status") as resp:
                    doc = await resp.json()
                holders = Counter(s["holder"] for s in doc["shards"]["shards"])
                saves = await timed_saves(dsn, daemons[0][1], procs, names, args.saves) \
                    if args.saves else None
                steady_from = time.time()
                cpu0 = [cpu_s(p.pid) for p in procs]
                await asyncio.sleep(args.steady_s)
                cpu1 = [cpu_s(p.pid) for p in procs]
                recorded = await rounds_by_identity(dsn, steady_from)
                per_replica = {
                    n: {"cpu_s": round(c1 - c0, 2),
                        "rss_mb": round(proc_status_mb(p.pid, "VmRSS"), 1),
                        **recorded.get(n, {"rounds": 0, "mean_s": 0.0, "max_s": 0.0})}
                    for n, p, c0, c1 in zip(names, procs, cpu0, cpu1, strict=True)}
                return {"clusters": args.clusters, "policies": args.policies,
                        "replicas": args.replicas, "shards": args.shards,
                        "interval_s": args.interval_s, "coverage_s": round(coverage_s, 1),
                        "shards_by_holder": dict(holders), "steady_s": args.steady_s,
                        "per_replica": per_replica, "saves": saves}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait(30)
            sim.stop()
    raise AssertionError("unreachable")  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--policies", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--steady-s", type=float, default=120.0)
    parser.add_argument("--saves", type=int, default=0,
                        help="saves of a policy covering every cluster, timed")
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    parser.add_argument("--log-level", default="WARNING", help="the replicas' log level")
    parser.add_argument("--workdir", help="keep the replicas' logs here (default: a temporary "
                                          "directory, removed)")
    args = parser.parse_args(argv)
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    result = eventloop.run(main_async(args))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
