"""Memory benchmark: what the daemon's process holds after a round, and what the prober costs.

    .venv/bin/python bench/memory.py [--clusters 100,1000] [--policies 10] [--apply-concurrency 4]

Per point, with the daemon's wiring (`ClusterRegistry` over the simulator's kubeconfig,
`rounds.round_env`, `Metrics` as observer; pieces of `bench/rounds.py`):

1. start `convergerd sim` in its own process, create every cluster's store (untimed, throwaway
   sessions), note this process's RSS (`VmRSS`, current, not the peak);
2. `create` round, then RSS and open TCP sockets right after it and again `--settle` seconds later;
3. the reachability prober (`convergerd.status.probe.Prober`) over every cluster, `--probe-passes`
   passes `--probe-period` seconds apart (the daemon's 10 s by default): CPU seconds, TLS
   handshakes, probes sent and probes skipped (the cluster answered a round's request within
   the period) of each pass;
4. `in-sync` round, then RSS and sockets right after it and `--settle` seconds later, then
   one more probe pass (`probe after in-sync`).

Every record also has the simulator's current RSS (`sim_rss_mb`, `VmRSS` of its process).
`--budget-mb-per-cluster X` exits 1 when this process's RSS growth per cluster, `--settle`
seconds after the in-sync round, is above X (the memory test runs it so).

TLS handshakes are counted from the shared SSL contexts (`SSLContext.session_stats()`), so they
are the client's own. One JSON line per measurement on stdout, then a Markdown table.

`--keepalive-override NAME=SECONDS` sets a `convergerd.kube.client` keep-alive constant before
any client exists: an experiment knob for this script only (the daemon has no such setting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import convergerd.kube.client as kube_client
from convergerd import eventloop
from convergerd.kube.kubeconfig import load_kubeconfig
from convergerd.kube.registry import ClusterRegistry
from convergerd.status.metrics import Metrics
from convergerd.status.probe import Answers, Prober
from convergerd.status.state import StatusState

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/rounds.py's pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import (
    Limits,
    Sim,
    _default,
    _int_list,
    build_fleet,
    log,
    proc_status_mb,
    timed_round,
    warm_up,
)


def rss_mb() -> float:
    """This process's current resident set (not the peak)."""
    return proc_status_mb("self", "VmRSS")


def sim_rss_mb(sim: Sim) -> float:
    """The simulator's current resident set."""
    return round(proc_status_mb(sim.proc.pid, "VmRSS"), 1)


def open_sockets() -> int:
    """File descriptors of this process that are sockets (the loop's self-pipe included)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


class _Sink:
    """The prober's state sink: nothing kept."""

    def observe_probe(self, cluster: str, **_: Any) -> None:
        pass


def _contexts(
    registry: ClusterRegistry, kubeconfig: Path, ids: Sequence[str]
) -> list[ssl.SSLContext]:
    config = load_kubeconfig(kubeconfig)
    seen: dict[int, ssl.SSLContext] = {}
    for cluster in ids:
        ctx = registry.tls.context_for(config.credentials(cluster))
        if ctx is not None:
            seen[id(ctx)] = ctx
    return list(seen.values())


def handshakes(contexts: Sequence[ssl.SSLContext]) -> int:
    return sum(int(ctx.session_stats()["connect"]) for ctx in contexts)


def emit(record: dict[str, Any], out: list[dict[str, Any]]) -> None:
    out.append(record)
    print(json.dumps(record), flush=True)


async def point(
    n: int, p: int, *, limits: Limits, args: argparse.Namespace, workdir: Path,
    out: list[dict[str, Any]],
) -> None:
    log("== %d clusters x %d policies", n, p)
    sim = Sim.start(n, workdir)
    try:
        fleet = build_fleet(n, p)
        ids = [c.id for c in fleet.clusters]
        settings = limits.settings(sim.kubeconfig)
        state = StatusState(identity="bench", interval_s=settings.rounds.interval_s)
        metrics = Metrics(state=state, process_collectors=False)
        answers = Answers(metrics)  # as the daemon wires it: the prober skips answered clusters
        registry = ClusterRegistry(kubeconfig=sim.kubeconfig, access=settings.clusters,
                                   identity="bench", observer=answers)
        try:
            await warm_up(sim.kubeconfig, ids, limits)
            contexts = _contexts(registry, sim.kubeconfig, ids)
            base_rss, base_sockets = rss_mb(), open_sockets()
            common = {"clusters": n, "policies": p,
                      "apply_concurrency": limits.apply_concurrency,
                      "base_rss_mb": round(base_rss, 1)}

            async def after_round(name: str) -> None:
                hs = handshakes(contexts)
                report, wall, cpu = await timed_round(fleet, settings, registry, metrics)
                counts = report.counts()
                if counts["converged"] != n:
                    raise RuntimeError(f"{name} round: {counts}")
                right_after = {"rss_mb": round(rss_mb(), 1),
                               "sockets": open_sockets() - base_sockets}
                await asyncio.sleep(args.settle)
                settled = {"rss_mb": round(rss_mb(), 1),
                           "sockets": open_sockets() - base_sockets}
                emit({"bench": name, **common, "wall_s": round(wall, 2),
                      "cpu_s": round(cpu, 2), "created": counts["created"],
                      "handshakes": handshakes(contexts) - hs,
                      "after": right_after, f"after_{args.settle:g}s": settled,
                      "settled_mb_per_cluster": round((settled["rss_mb"] - base_rss) / n, 3),
                      "sim_rss_mb": sim_rss_mb(sim),
                      "loadavg_1m": round(os.getloadavg()[0], 2)}, out)

            await after_round("create")

            prober = Prober(clusters=lambda: {c: registry.get(c) for c in ids},
                            state=_Sink(), period_s=args.probe_period,
                            timeout_s=limits.request_timeout_s, answers=answers)
            loop = asyncio.get_running_loop()

            async def probe_pass(name: object) -> None:
                started = loop.time()
                hs, cpu, skipped = handshakes(contexts), time.process_time(), prober.skipped
                reached = await prober.probe_once()
                cpu = time.process_time() - cpu
                emit({"bench": "probe", **common, "pass": name,
                      "wall_s": round(loop.time() - started, 2), "cpu_s": round(cpu, 3),
                      "reached": sum(reached.values()), "skipped": prober.skipped - skipped,
                      "handshakes": handshakes(contexts) - hs,
                      "rss_mb": round(rss_mb(), 1), "sockets": open_sockets() - base_sockets,
                      "loadavg_1m": round(os.getloadavg()[0], 2)}, out)

            for i in range(args.probe_passes):
                started = loop.time()
                await probe_pass(i + 1)
                await asyncio.sleep(max(0.0, started + args.probe_period - loop.time()))

            await after_round("in-sync")
            if args.probe_passes:
                await probe_pass("after in-sync")
        finally:
            await registry.close()
    finally:
        sim.stop()


def markdown(results: Sequence[dict[str, Any]], settle: float) -> str:
    key = f"after_{settle:g}s"
    rows = [
        f"| bench | clusters | apply conc. | wall s | CPU s | TLS handshakes | RSS MB before | "
        f"RSS MB right after | sockets right after | RSS MB {settle:g} s later | "
        f"sockets {settle:g} s later | sim RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r["bench"] == "probe":
            rows.append(
                f"| probe pass {r['pass']} ({r['skipped']:,} skipped) | {r['clusters']:,} | "
                f"{r['apply_concurrency']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                f"{r['handshakes']:,} | {r['base_rss_mb']:,.1f} | {r['rss_mb']:,.1f} | "
                f"{r['sockets']:,} | | | |"
            )
            continue
        rows.append(
            f"| {r['bench']} | {r['clusters']:,} | {r['apply_concurrency']} | "
            f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['handshakes']:,} | "
            f"{r['base_rss_mb']:,.1f} | {r['after']['rss_mb']:,.1f} | "
            f"{r['after']['sockets']:,} | {r[key]['rss_mb']:,.1f} | {r[key]['sockets']:,} | "
            f"{r['sim_rss_mb']:,.1f} |"
        )
    return "\n".join(rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clusters", type=_int_list, default=[100, 1000])
    parser.add_argument("--policies", type=_int_list, default=[10])
    parser.add_argument("--cluster-concurrency", type=int,
                        default=int(_default("cluster_concurrency")))
    parser.add_argument("--apply-concurrency", type=int, default=int(_default("apply_concurrency")))
    parser.add_argument("--settle", type=float, default=5.0, metavar="SECONDS",
                        help="wait this long after a round before reading RSS again (default 5)")
    parser.add_argument("--probe-passes", type=int, default=3)
    parser.add_argument("--probe-period", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between probe passes (the daemon's default: 10)")
    parser.add_argument("--budget-mb-per-cluster", type=float, default=None, metavar="MB",
                        help="exit 1 if RSS growth per cluster after the in-sync round is above")
    parser.add_argument("--stdlib-loop", action="store_true",
                        help="run on asyncio's own loop (256 KiB TLS read buffers), not "
                             "convergerd.eventloop's (32 KiB): for comparison")
    parser.add_argument("--keepalive-override", action="append", default=[],
                        metavar="NAME=SECONDS",
                        help="set convergerd.kube.client.NAME (experiments only)")
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    for override in args.keepalive_override:
        name, _, value = override.partition("=")
        if not hasattr(kube_client, name):
            raise SystemExit(f"convergerd.kube.client has no {name}")
        setattr(kube_client, name, float(value))
    limits = Limits(
        cluster_concurrency=args.cluster_concurrency, apply_concurrency=args.apply_concurrency,
        request_timeout_s=float(_default("request_timeout_s")), fault_timeout_s=2.0,
        qps=float(_default("cluster_qps")), burst=int(_default("cluster_burst")),
        interval_minutes=30.0,
    )
    results: list[dict[str, Any]] = []
    for n in sorted(set(args.clusters)):
        for p in sorted(set(args.policies)):
            with tempfile.TemporaryDirectory(prefix="convergerd-membench-") as tmp:
                await point(n, p, limits=limits, args=args, workdir=Path(tmp), out=results)
    print()
    print(markdown(results, args.settle), flush=True)
    return results


def over_budget(results: Sequence[dict[str, Any]], budget: float) -> list[str]:
    """The in-sync measurements whose RSS growth per cluster is above `budget` MB."""
    return [
        f"{r['clusters']} x {r['policies']}: {r['settled_mb_per_cluster']} MB per cluster "
        f"after the in-sync round, budget {budget} MB"
        for r in results
        if r["bench"] == "in-sync" and r["settled_mb_per_cluster"] > budget
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stdlib_loop:
        eventloop.tune_gc()  # the same collector as the processes: only the loop differs
        results = asyncio.run(main_async(args))
    else:
        results = eventloop.run(main_async(args))
    if args.budget_mb_per_cluster is not None:
        failed = over_budget(results, args.budget_mb_per_cluster)
        for line in failed:
            print(f"OVER BUDGET: {line}", file=sys.stderr)
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
