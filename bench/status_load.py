"""Does status traffic slow the round? Round durations with and without 100 concurrent clients
hammering the read-only endpoints (a figure, not a test).

```
.venv/bin/python bench/status_load.py                      # 100 clusters x 10 policies
.venv/bin/python bench/status_load.py --clusters 300 --rounds 5 --clients 100
```

`convergerd sim` runs in its own process (bench/rounds.py's `Sim`); the policy database is a
fresh database on the PostgreSQL of `CONVERGERD_TEST_DATABASE_URL` (default
`postgresql://postgres@127.0.0.1:5432/postgres`), migrated, filled with the fleet, dropped at
the end. A round runs the daemon's way, on the daemon's pool (5 connections): `load_fleet`,
`run_round` (`rounds.round_env`), `record_round`, then the status state observes it; the HTTP
server (`app.make_app`, `server_options()`) serves on the same event loop, as in the daemon.

The load comes from a separate process (so its own CPU is not the round's): `--clients` tasks,
each looping over `GET /status`, `GET /v1/clusters/{id}` and `GET /v1/policies/{id}/status` on
random ids, waiting `Retry-After` when answered 429 (the daemon sheds reads past
`CONVERGERD_STATUS_READS_PER_SECOND`, `--status-reads-per-second` here). After a first
(create) round, quiet and loaded in-sync rounds alternate `--rounds` times each; the medians
and every duration are printed, one JSON line per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from convergerd import eventloop
from convergerd.api.app import make_app
from convergerd.api.server import server_options
from convergerd.config import load_settings
from convergerd.delivery.apply import Unfenced
from convergerd.delivery.converge import run_round
from convergerd.delivery.fanout import Saver, fanout_env
from convergerd.delivery.rounds import round_env
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import NoElection
from convergerd.sim.fleet import member_ids
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.importer import apply_plan, parse_import
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/rounds.py's pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import Sim, fresh_database

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
RULES: tuple[dict[str, Any], ...] = (
    {"type": "ForbidLatestTag"},
    {"type": "RequiredLabels", "labels": ["app", "team"]},
    {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
)


def log(message: str, *args: object) -> None:
    print(message % args if args else message, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fleet_doc(clusters: int, policies: int) -> dict[str, Any]:
    ids = member_ids(clusters)
    return {
        "clusters": [{"id": c} for c in ids],
        "boundaries": [{"id": "team-a", "clusters": ids}],
        "policies": [{"id": f"p{i:04d}", "boundary": "team-a", "rule": RULES[i % len(RULES)]}
                     for i in range(policies)],
    }


# --- the load (its own process) ---------------------------------------------------------------


async def client_load(base: str, clients: int, clusters: int, policies: int) -> None:
    """Until SIGTERM: `clients` loops of status requests; then one JSON line of counts."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    cluster_ids = member_ids(clusters)
    paths = ["/status"]
    counts: Counter[str] = Counter()
    rng = random.Random(1)

    async def one(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            kind = rng.randrange(3)
            if kind == 0:
                path = paths[0]
            elif kind == 1:
                path = f"/v1/clusters/{rng.choice(cluster_ids)}"
            else:
                path = f"/v1/policies/p{rng.randrange(policies):04d}/status"
            try:
                async with session.get(base + path) as resp:
                    await resp.read()
                    counts[str(resp.status)] += 1
                    retry_after = resp.headers.get("Retry-After")
            except aiohttp.ClientError:
                counts["error"] += 1
                continue
            if resp.status == 429 and retry_after is not None:
                # As a well-behaved client (and `convergerd status`) does.
                await asyncio.sleep(min(float(retry_after), 10.0))

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        print("ready", flush=True)
        await asyncio.gather(*(one(session) for _ in range(clients)))
    print(json.dumps(dict(counts)), flush=True)


class Load:
    """The load process: started before a loaded round, stopped right after it."""

    def __init__(self, base: str, args: argparse.Namespace) -> None:
        self.base = base
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0.0

    async def start(self) -> None:
        a = self.args
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--load", self.base, "--clients", str(a.clients),
            "--clusters", str(a.clusters), "--policies", str(a.policies),
            stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"the load process did not start: {line!r}")
        self.started = time.perf_counter()
        await asyncio.sleep(1.0)  # let the clients reach full concurrency before the round

    async def stop(self) -> dict[str, Any]:
        assert self.proc is not None
        assert self.proc.stdout is not None
        took = time.perf_counter() - self.started
        self.proc.send_signal(signal.SIGTERM)
        out = await asyncio.wait_for(self.proc.stdout.read(), 60)
        await self.proc.wait()
        counts: dict[str, int] = json.loads(out.decode().strip().splitlines()[-1])
        return {"requests": sum(counts.values()), "by_status": counts,
                "requests_per_s": round(sum(counts.values()) / took, 1) if took else None}


async def view_costs(base: str, clusters: int, policies: int, n: int = 10) -> dict[str, float]:
    """Median latency in ms of each view asked one at a time on a quiet daemon: what one read
    costs its event loop (the round's loop)."""
    ids = member_ids(clusters)
    paths = {"/status": ["/status"] * n,
             "/v1/clusters/{id}": [f"/v1/clusters/{ids[i % len(ids)]}" for i in range(n)],
             "/v1/policies/{id}/status": [f"/v1/policies/p{i % policies:04d}/status"
                                          for i in range(n)]}
    costs: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        for name, urls in paths.items():
            took = []
            for url in urls:
                started = time.perf_counter()
                async with session.get(base + url) as resp:
                    await resp.read()
                took.append(time.perf_counter() - started)
                await asyncio.sleep(0.6)  # under the status budget (a 1,000-cluster policy: 11)
            costs[name] = round(statistics.median(took) * 1000, 2)
    return costs


# --- the rounds -------------------------------------------------------------------------------


async def timed_round(
    store: Store, registry: ClusterRegistry, settings: Any, metrics: Metrics,
    state: StatusState,
) -> float:
    started = time.perf_counter()
    fleet = await store.load_fleet()
    env = round_env(settings, registry, NoElection(identity="bench").fence(), metrics,
                    deadline_s=settings.rounds.deadline_s)
    report = await run_round(fleet, env)
    await store.record_round(report, identity="bench")
    metrics.observe_round(report)
    state.observe_round(report)
    took = time.perf_counter() - started
    if report.error or report.counts()["failed"]:
        raise RuntimeError(f"round failed: {report.error or report.counts()}")
    return took


async def bench(args: argparse.Namespace, dsn: str, workdir: Path) -> dict[str, Any]:
    log("sim: %d clusters", args.clusters)
    sim = Sim.start(args.clusters, workdir)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await apply_plan(conn, parse_import(fleet_doc(args.clusters, args.policies)))
        finally:
            await conn.close()
        settings = load_settings({
            "CONVERGERD_DATABASE_URL": dsn, "CONVERGERD_KUBECONFIG": str(sim.kubeconfig),
            "CONVERGERD_LEADER_ELECTION": "false", "CONVERGERD_IDENTITY": "bench",
            "CONVERGERD_CLUSTER_QPS": "1000", "CONVERGERD_CLUSTER_BURST": "1000",
            "CONVERGERD_STATUS_READS_PER_SECOND": str(args.status_reads_per_second),
        })
        return await _measure(args, settings, dsn, sim)
    finally:
        sim.stop()


async def _measure(
    args: argparse.Namespace, settings: Any, dsn: str, sim: Sim
) -> dict[str, Any]:
    store = await Store.connect(dsn)  # the daemon's pool size
    state = StatusState(identity="bench", interval_s=settings.rounds.interval_s)
    metrics = Metrics(state=state, process_collectors=False)
    registry = ClusterRegistry(kubeconfig=sim.kubeconfig, access=settings.clusters,
                               identity="bench", observer=metrics)
    saver = Saver(store=store, guard_share=settings.saves.removal_guard_share,
                  env=lambda: fanout_env(settings, registry, Unfenced(), metrics))
    app = make_app(metrics=metrics, state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=saver)
    runner = web.AppRunner(app, **server_options())
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    quiet: list[float] = []
    loaded: list[float] = []
    loads: list[dict[str, Any]] = []
    costs: dict[str, float] = {}
    try:
        log("create round")
        create = await timed_round(store, registry, settings, metrics, state)
        print(json.dumps({"round": "create", "s": round(create, 3)}), flush=True)
        costs = await view_costs(f"http://127.0.0.1:{port}", args.clusters, args.policies)
        print(json.dumps({"view_ms": costs}), flush=True)
        for i in range(args.rounds):
            quiet.append(await timed_round(store, registry, settings, metrics, state))
            print(json.dumps({"round": "quiet", "n": i, "s": round(quiet[-1], 3)}), flush=True)
            load = Load(f"http://127.0.0.1:{port}", args)
            await load.start()
            try:
                loaded.append(await timed_round(store, registry, settings, metrics, state))
            finally:
                loads.append(await load.stop())
            print(json.dumps({"round": "loaded", "n": i, "s": round(loaded[-1], 3),
                              **loads[-1]}), flush=True)
    finally:
        await runner.cleanup()
        await registry.close()
        await store.close()
    return {
        "clusters": args.clusters, "policies": args.policies, "clients": args.clients,
        "view_ms": costs,
        "quiet_median_s": round(statistics.median(quiet), 3),
        "loaded_median_s": round(statistics.median(loaded), 3),
        "quiet_s": [round(x, 3) for x in quiet], "loaded_s": [round(x, 3) for x in loaded],
        "status_requests_per_s": [x["requests_per_s"] for x in loads],
        "status_answers": [x["by_status"] for x in loads],
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    server = os.environ.get("CONVERGERD_TEST_DATABASE_URL") or DEFAULT_SERVER
    async with fresh_database(server, "convergerd_bench", migrated=True) as (dsn, _name):
        with tempfile.TemporaryDirectory(prefix="convergerd-status-load-") as tmp:
            return await bench(args, dsn, Path(tmp))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--policies", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="quiet and loaded rounds, each")
    p.add_argument("--clients", type=int, default=100, help="concurrent status clients")
    p.add_argument("--status-reads-per-second", type=float, default=20.0,
                   help="the daemon's status budget (default 20, the daemon's default; a "
                        "large value such as 100000 measures it unlimited)")
    p.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)  # the load process
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load:
        eventloop.run(client_load(args.load, args.clients, args.clusters, args.policies))
        return 0
    result = eventloop.run(main_async(args))
    print(json.dumps(result), flush=True)
    print(f"\nround over {args.clusters} clusters x {args.policies} policies, median of "
          f"{args.rounds}: quiet {result['quiet_median_s']} s, with {args.clients} concurrent "
          f"status clients {result['loaded_median_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
