"""Soak: figures, not a test. The daemon's resources must stay flat over many rounds.

    .venv/bin/python bench/soak.py [--rounds 30] [--clusters 200] [--policies 5]
                                   [--database-url postgresql://postgres@127.0.0.1:5432/test]

1. start the fleet simulator in its own process (`bench/rounds.py`'s `Sim`);
2. create a fresh database on the PostgreSQL server of `--database-url`, migrate it, import
   the fleet (N clusters, P policies over two boundaries that cover every cluster);
3. run the real daemon (`runtime.Daemon.main()`, what `convergerd run` runs: leader election
   on the simulator's home cluster, the prober, the HTTP server, rounds recorded in the
   database) in this process, on a copy of the simulator's kubeconfig;
4. after every round: switch faults at random (`--fault-share` of the clusters: down, hang,
   5xx error rate, 429 with Retry-After, and the `hostile` answer modes when the simulator
   has them); with churn (default), also delete one cluster from the database (and re-add
   the one deleted before) and rotate one context's CA bundle in the kubeconfig, so the
   pruning paths and the reload-under-load path run every round;
5. print per round: RSS, open fds, asyncio tasks, database connections (`pg_stat_activity`
   for the soak database, this script's own monitoring connection excluded), and the
   daemon's own state sizes (`Daemon.sizes()`); at the end, first-after-warm-up vs last.

The database is dropped and the simulator stopped at the end (also on error).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import yaml

from convergerd import eventloop
from convergerd.config import load_settings
from convergerd.core.report import RoundReport
from convergerd.runtime import Daemon
from convergerd.sim.fleet import member_ids
from convergerd.store.importer import apply_plan, parse_import

# Run as a script, bench/ (not the repository) is on sys.path: reuse the benchmark's pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.memory import rss_mb
from bench.rounds import Sim, fresh_database, log

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
FAULTS: dict[str, dict[str, Any]] = {
    "down": {"down": True},
    "hang": {"hang": True},
    "5xx": {"errorRate": 0.5, "errorStatus": 503},
    "429": {"errorRate": 0.5, "errorStatus": 429, "retryAfterSeconds": 1},
}
HOSTILE: dict[str, dict[str, Any]] = {
    "controlChars": {"mode": "controlChars"},
    "wrongTypes": {"mode": "wrongTypes"},
    "invalidJson": {"mode": "invalidJson"},
    # Over the daemon's 16 MiB default cap, so that answers are refused (at 8 MiB, as this was,
    # they were read whole and the refusal path never ran here).
    "oversized": {"mode": "oversized", "bytes": 32 * 1024 * 1024},
    "trickle": {"mode": "trickle", "bytesPerSecond": 256},
}
RULES: tuple[dict[str, Any], ...] = (
    {"type": "ForbidLatestTag"},
    {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
    {"type": "RequiredLabels", "labels": ["team", "app"]},
)
ROUND_WAIT_S = 300.0


def fleet_doc(clusters: Sequence[str], policies: int) -> dict[str, Any]:
    return {
        "clusters": [{"id": c} for c in clusters],
        "boundaries": [{"id": f"team-{b}", "clusters": list(clusters)} for b in range(2)],
        "policies": [{"id": f"p{i:03d}", "boundary": f"team-{i % 2}",
                      "rule": RULES[i % len(RULES)]} for i in range(policies)],
    }


async def import_doc(dsn: str, doc: dict[str, Any]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await apply_plan(conn, parse_import(doc))
    finally:
        await conn.close()


# --- faults and churn ----------------------------------------------------------------------------


async def admin(sim: Sim, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.to_thread(sim.admin, method, path, body)


async def hostile_modes(sim: Sim, probe_cluster: str) -> dict[str, dict[str, Any]]:
    """The hostile modes this simulator accepts (a 400 from the faults API: not there)."""
    accepted: dict[str, dict[str, Any]] = {}
    for name, mode in HOSTILE.items():
        status, _ = await admin(sim, "POST", f"/_sim/clusters/{probe_cluster}/faults",
                                {"hostile": mode})
        if status == 200:
            accepted[name] = {"hostile": mode}
        elif status != 400:
            raise RuntimeError(f"faults API answered {status} for hostile mode {name}")
    await admin(sim, "DELETE", f"/_sim/clusters/{probe_cluster}/faults")
    if len(accepted) < len(HOSTILE):
        missing = sorted(set(HOSTILE) - set(accepted))
        log("note: this simulator does not accept hostile mode(s) %s: skipped", missing)
    return accepted


class Faulter:
    """Per round: every cluster healthy again, then `share` of them get a random fault."""

    def __init__(self, sim: Sim, clusters: Sequence[str], kinds: dict[str, dict[str, Any]],
                 share: float, rng: random.Random) -> None:
        self.sim, self.clusters, self.kinds, self.share, self.rng = (
            sim, clusters, kinds, share, rng)
        self.faulty: dict[str, str] = {}

    async def switch(self) -> dict[str, int]:
        for cluster in self.faulty:
            await admin(self.sim, "DELETE", f"/_sim/clusters/{cluster}/faults")
        chosen = self.rng.sample(list(self.clusters), int(len(self.clusters) * self.share))
        self.faulty = {c: self.rng.choice(sorted(self.kinds)) for c in chosen}
        for cluster, kind in self.faulty.items():
            status, doc = await admin(self.sim, "POST", f"/_sim/clusters/{cluster}/faults",
                                      self.kinds[kind])
            if status != 200:
                raise RuntimeError(f"faults {kind} for {cluster}: {status} {doc}")
        counts: dict[str, int] = {}
        for kind in self.faulty.values():
            counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items()))


class Churn:
    """Per round: one cluster deleted from the database (the one deleted before comes back),
    and one context's CA bundle rotated in the kubeconfig the daemon reads (written as a
    Secret update lands: a new file renamed over the old one)."""

    def __init__(self, dsn: str, kubeconfig: Path, clusters: Sequence[str],
                 rng: random.Random) -> None:
        self.dsn, self.kubeconfig, self.clusters, self.rng = dsn, kubeconfig, clusters, rng
        self.deleted: str | None = None
        self.doc: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
        self.original = {c["name"]: c["cluster"]["certificate-authority-data"]
                         for c in self.doc["clusters"]}
        self.rotations = 0

    async def step(self, policies: int) -> None:
        victim = self.rng.choice(list(self.clusters))
        conn = await asyncpg.connect(self.dsn)
        try:
            # A cluster that holds policies is deleted only once its records are dropped
            # (the database refuses otherwise): what an admin does for a cluster that is gone.
            async with conn.transaction():
                # Locked, so that a round cannot record the victim between the two deletes.
                await conn.execute("LOCK TABLE deliveries IN SHARE ROW EXCLUSIVE MODE")
                await conn.execute("DELETE FROM deliveries WHERE cluster_id = $1", victim)
                await conn.execute("DELETE FROM clusters WHERE id = $1", victim)
        finally:
            await conn.close()
        if self.deleted is not None and self.deleted != victim:
            # Re-import the whole fleet minus the victim: the boundaries take it back.
            back = [c for c in self.clusters if c != victim]
            await import_doc(self.dsn, fleet_doc(back, policies))
        self.deleted = victim
        self._rotate_ca()

    def _rotate_ca(self) -> None:
        entry = self.rng.choice(self.doc["clusters"])
        name = entry["name"]
        pem = base64.b64decode(self.original[name])
        self.rotations += 1
        if self.rotations % 2:  # the CA plus another cluster's: a rotation in progress
            other = base64.b64decode(self.original[self.rng.choice(sorted(self.original))])
            pem += other
        entry["cluster"]["certificate-authority-data"] = base64.b64encode(pem).decode()
        tmp = self.kubeconfig.with_suffix(".new")
        tmp.write_text(yaml.safe_dump(self.doc))
        tmp.replace(self.kubeconfig)


# --- figures -------------------------------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def db_connections(monitor: asyncpg.Connection, name: str) -> int:
    count = await monitor.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        name)
    return int(count)


async def next_round(daemon: Daemon, previous: RoundReport | None) -> RoundReport:
    deadline = time.monotonic() + ROUND_WAIT_S
    while daemon.last_report is previous or daemon.last_report is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no round within {ROUND_WAIT_S:g} s")
        await asyncio.sleep(0.05)
    return daemon.last_report


COLUMNS = ("round", "result", "s", "conv", "unreached", "faults", "rss_mb", "fds", "tasks",
           "db_conns", "status_clusters", "status_policy_records", "registry_clients",
           "registry_retiring", "registry_tls_contexts", "metrics_series", "prober_clusters",
           "seen_invalid")


def row(number: int, report: RoundReport, faults: dict[str, int], figures: dict[str, Any],
        sizes: dict[str, int]) -> dict[str, Any]:
    counts = report.counts()
    duration = (report.finished_at - report.started_at).total_seconds() \
        if report.finished_at else float("nan")
    return {"round": number, "result": report.result.value, "s": round(duration, 1),
            "conv": counts["converged"], "unreached": counts["unreached"],
            "faults": " ".join(f"{k}:{v}" for k, v in faults.items()) or "-",
            **figures, **sizes}


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def summary(rows: Sequence[dict[str, Any]], warmup: int) -> str:
    steady = [r for r in rows if r["round"] > warmup] or list(rows)
    lines = [f"after round {warmup} (warm-up) -> last round {rows[-1]['round']}:"]
    for col in ("rss_mb", "fds", "tasks", "db_conns", "status_clusters",
                "status_policy_records", "registry_clients", "registry_tls_contexts",
                "metrics_series", "prober_clusters"):
        values = [r[col] for r in steady]
        lines.append(f"  {col}: first {values[0]}, last {values[-1]}, "
                     f"min {min(values)}, max {max(values)}")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------------


async def soak(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    clusters = list(member_ids(args.clusters))
    log("starting the simulator (%d clusters)", args.clusters)
    sim = await asyncio.to_thread(Sim.start, args.clusters, workdir)
    try:
        database = fresh_database(args.database_url, "convergerd_soak", migrated=True)
        async with database as (dsn, name):
            await import_doc(dsn, fleet_doc(clusters, args.policies))
            kubeconfig = workdir / "daemon-kubeconfig"
            kubeconfig.write_text(sim.kubeconfig.read_text())
            kinds = {**FAULTS, **await hostile_modes(sim, clusters[0])}
            log("fault kinds: %s", sorted(kinds))
            setup = Setup(sim, dsn, name, kubeconfig, clusters, kinds)
            return await _run(args, setup, rng)
    finally:
        sim.stop()


@dataclass(frozen=True)
class Setup:
    sim: Sim
    dsn: str
    database: str
    kubeconfig: Path
    clusters: list[str]
    kinds: dict[str, dict[str, Any]]


async def _run(args: argparse.Namespace, setup: Setup, rng: random.Random
               ) -> list[dict[str, Any]]:
    sim, dsn, kubeconfig, clusters = setup.sim, setup.dsn, setup.kubeconfig, setup.clusters
    settings = load_settings({
        "CONVERGERD_DATABASE_URL": dsn,
        "CONVERGERD_KUBECONFIG": str(kubeconfig),
        "CONVERGERD_LEADER_ELECTION": "true",
        "CONVERGERD_HOME_CONTEXT": "home",
        "CONVERGERD_IDENTITY": "soak",
        "CONVERGERD_HTTP_ADDR": "127.0.0.1:0",
        "CONVERGERD_REQUEST_TIMEOUT_SECONDS": str(args.request_timeout),
        "CONVERGERD_CONNECT_TIMEOUT_SECONDS": str(args.request_timeout),
        "Policies__ConvergeIntervalMinutes": str(args.interval_s / 60),
    })
    faulter = Faulter(sim, clusters, setup.kinds, args.fault_share, rng)
    churn = Churn(dsn, kubeconfig, clusters, rng) if args.churn else None
    daemon = Daemon(settings, probe_period_s=args.probe_period)
    task = asyncio.create_task(daemon.main(), name="daemon")
    monitor = await asyncpg.connect(dsn)
    rows: list[dict[str, Any]] = []
    try:
        report = await next_round(daemon, None)  # round 0 creates the objects: not counted
        faults: dict[str, int] = {}
        for number in range(1, args.rounds + 1):
            faults = await faulter.switch()
            if churn is not None:
                await churn.step(args.policies)
            report = await next_round(daemon, report)
            figures = {"rss_mb": round(rss_mb(), 1), "fds": open_fds(),
                       "tasks": len(asyncio.all_tasks()),
                       "db_conns": await db_connections(monitor, setup.database)}
            sizes = {k: v for k, v in daemon.sizes().items() if k in COLUMNS}
            rows.append(row(number, report, faults, figures, sizes))
            print(json.dumps(rows[-1]), flush=True)
            log("round %d: %s", number, " ".join(f"{k}={v}" for k, v in rows[-1].items()))
    finally:
        await monitor.close()
        daemon.stopping.set()
        await asyncio.wait_for(task, 60)
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--policies", type=int, default=5)
    parser.add_argument("--fault-share", type=float, default=0.3,
                        help="share of the clusters given a fault each round (default 0.3)")
    parser.add_argument("--interval-s", type=float, default=6.0,
                        help="round interval; the round deadline is 0.8 of it (default 6)")
    parser.add_argument("--request-timeout", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--probe-period", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--no-churn", dest="churn", action="store_false",
                        help="no cluster deletions or CA rotations between rounds")
    parser.add_argument("--warmup", type=int, default=5,
                        help="rounds before the steady state the summary compares against")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--database-url", default=DEFAULT_SERVER,
                        help="a PostgreSQL server where a database may be created "
                             f"(default {DEFAULT_SERVER})")
    parser.add_argument("--markdown-out", type=Path, default=None)
    parser.add_argument("--log-level", default="ERROR",
                        help="the daemon's log level (default ERROR: faults are expected)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # The daemon's per-cluster warnings (every fault, every round) would bury the figures.
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="convergerd-soak-") as tmp:
        rows = eventloop.run(soak(args, Path(tmp)))
    table, tail = markdown(rows), summary(rows, args.warmup)
    print()
    print(table)
    print()
    print(tail, flush=True)
    if args.markdown_out is not None:
        args.markdown_out.write_text(f"{table}\n\n```\n{tail}\n```\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
