"""What serving `/status` and `/metrics` costs the event loop of a replica that knows a large
fleet (figures, not a test).

A `StatusState` and its `Metrics` fed one in-sync round of CLUSTERS x POLICIES
(`bench/scrape.py`'s round: every policy read back with its phase and the operator's Verified
condition, each probed at its own time), then:

1. builds: the `/status` body and the `/metrics` text, each built `--builds` times on an idle
   loop (wall milliseconds, median and min);
2. load: the HTTP views served on this process's loop (`server.Views`, as `app.make_app` binds
   them, status budget lifted unless `--status-reads-per-second`), while a prober stand-in
   changes the state's version as the reachability prober does (one probe per cluster every
   10 s), `--clients` clients in another process poll `/status` back to back and
   `--metrics-every` seconds one polls `/metrics`, for `--seconds`. Printed: the share of
   wall time this process spent on CPU (its loop; the clients are another process), how late a
   50 ms timer woke (the loop's lag: what a cluster request waiting for its turn sees), and
   the answers the clients got.

    .venv/bin/python bench/serving.py                               # 10,000 x 100
    .venv/bin/python bench/serving.py --clusters 2000 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/scrape.py's round.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.scrape import round_of
from convergerd.api.server import STATUS_VIEWS, Views, server_options
from convergerd.config import STATUS_MAX_CLUSTERS_DEFAULT, load_settings
from convergerd.core.rows import ClusterStatusRows, PolicyStatusRows
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.supervise import HealthCheck

PROBE_PERIOD_S = 10.0
TICK_S = 0.05


class NoDatabase:
    """`server.StatusSource` for views that never read the database here."""

    async def ping(self) -> None:
        return None

    async def cluster_status(self, cluster_id: str, policies: object, /) -> ClusterStatusRows:
        raise NotImplementedError

    async def policy_status(self, policy_id: str, /) -> PolicyStatusRows | None:
        raise NotImplementedError


def fed(clusters: int, policies: int) -> tuple[StatusState, Metrics]:
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    report = round_of(clusters, policies, "distinct", at)
    state = StatusState(identity="bench", interval_s=300.0)
    state.set_clusters(c.cluster for c in report.clusters)
    metrics = Metrics(state=state, process_collectors=False)
    metrics.observe_round(report)
    state.observe_round(report)
    for outcome in report.clusters:  # what a round's list and a probe leave in the counters
        metrics.request_done(outcome.cluster, "list", 200, 0.02)
        metrics.request_done(outcome.cluster, "get", 200, 0.01)
    del report
    gc.collect()
    return state, metrics


def views_of(state: StatusState, metrics: Metrics, reads_per_s: float,
             max_clusters: int = STATUS_MAX_CLUSTERS_DEFAULT) -> Views:
    settings = load_settings({
        "CONVERGERD_DATABASE_URL": "postgresql://bench@127.0.0.1:1/none",
        "CONVERGERD_LEADER_ELECTION": "false", "CONVERGERD_IDENTITY": "bench",
        "CONVERGERD_STATUS_READS_PER_SECOND": str(reads_per_s),
        "CONVERGERD_STATUS_MAX_CLUSTERS": str(max_clusters),
    })
    return Views(metrics=metrics, state=state, store=NoDatabase(), settings=settings,
                 health=HealthCheck())


async def build_ms(views: Views, builds: int) -> dict[str, Any]:
    """Wall milliseconds of each build on an otherwise idle loop."""
    status, scrape = [], []
    for _ in range(builds):
        started = time.perf_counter()
        body = (await views.build_status()).body
        status.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        text = views.metrics.render()
        scrape.append((time.perf_counter() - started) * 1000)
    most = views.settings.status_max_clusters
    page = await views.status(make_mocked_request("GET", f"/status?limit={most}"))
    assert isinstance(page.body, bytes)
    return {"status_build_ms": {"median": round(statistics.median(status)),
                                "min": round(min(status))},
            "status_mb": round(len(body) / 1e6, 3),
            "status_page_mb": round(len(page.body) / 1e6, 3),
            "metrics_render_ms": {"median": round(statistics.median(scrape)),
                                  "min": round(min(scrape))},
            "metrics_mb": round(len(text) / 1e6, 1)}


async def prober(state: StatusState, stop: asyncio.Event) -> None:
    """One probe per cluster every `PROBE_PERIOD_S`, spread over the period in ticks."""
    ids = state.cluster_ids()
    per_tick = max(1, round(len(ids) * TICK_S / PROBE_PERIOD_S))
    i = 0
    while not stop.is_set():
        for _ in range(per_tick):
            state.observe_probe(ids[i % len(ids)], reachable=True, server_version="v1.31.2")
            i += 1
        await asyncio.sleep(TICK_S)


async def lateness(late: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        late.append(max(0.0, loop.time() - due))


async def load(views: Views, state: StatusState, args: argparse.Namespace) -> dict[str, Any]:
    app = web.Application()
    app.add_routes([web.get("/metrics", views.metrics_text),
                    web.get("/status", views.limited(STATUS_VIEWS[0], views.status))])
    runner = web.AppRunner(app, **server_options())
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    late: list[float] = []
    tasks = [asyncio.create_task(prober(state, stop)),
             asyncio.create_task(lateness(late, stop))]
    client = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client-of", f"http://127.0.0.1:{port}",
        "--clients", str(args.clients), "--seconds", str(args.seconds),
        "--metrics-every", str(args.metrics_every), stdout=subprocess.PIPE)
    wall, cpu = time.perf_counter(), time.process_time()
    out, _ = await client.communicate()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stop.set()
    await asyncio.gather(*tasks)
    await runner.cleanup()
    late.sort()
    return {"clients": args.clients, "metrics_every_s": args.metrics_every,
            "seconds": round(wall, 1), "loop_cpu_share": round(cpu / wall, 2),
            "timer_late_ms": {"p50": round(1000 * late[len(late) // 2]),
                              "p99": round(1000 * late[int(len(late) * 0.99)]),
                              "max": round(1000 * late[-1])},
            "answers": json.loads(out)}


async def clients_of(base: str, clients: int, seconds: float,
                     metrics_every: float) -> dict[str, Any]:
    counts: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=60)

    async def poll(session: aiohttp.ClientSession, path: str, every: float) -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                async with session.get(base + path) as resp:
                    await resp.read()
                    key = f"{path} {resp.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                key = f"{path} {type(exc).__name__}"
            counts[key] = counts.get(key, 0) + 1
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started)))

    async with aiohttp.ClientSession(timeout=timeout) as session:
        polls = [poll(session, "/status", 0.0) for _ in range(clients)]
        if metrics_every > 0:
            polls.append(poll(session, "/metrics", metrics_every))
        await asyncio.gather(*polls)
    return counts


async def main_async(args: argparse.Namespace) -> None:
    if args.client_of:
        print(json.dumps(await clients_of(args.client_of, args.clients, args.seconds,
                                          args.metrics_every)))
        return
    state, metrics = fed(args.clusters, args.policies)
    views = views_of(state, metrics, args.status_reads_per_second, args.status_max_clusters)
    print(json.dumps({"clusters": args.clusters, "policies": args.policies,
                      **await build_ms(views, args.builds)}), flush=True)
    if args.seconds > 0:
        print(json.dumps(await load(views, state, args)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--builds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--metrics-every", type=float, default=0.0,
                        help="one client polls /metrics this often (0: none)")
    parser.add_argument("--status-reads-per-second", type=float, default=1e6)
    parser.add_argument("--status-max-clusters", type=int, default=STATUS_MAX_CLUSTERS_DEFAULT,
                        help="CONVERGERD_STATUS_MAX_CLUSTERS: past it /status is a summary "
                             "(default the setting's); a larger value builds the whole document "
                             "(as before the summary existed)")
    parser.add_argument("--client-of", help=argparse.SUPPRESS)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
