"""Whole-daemon benchmark: figures, not a test. `convergerd run` as platform teams run it.

    .venv/bin/python bench/daemon.py --points 200x20 --in-sync-rounds 3 --interval-s 20
    .venv/bin/python bench/daemon.py --points 2000x50@45,10000x100@180 --save-points 5000,10000
    .venv/bin/python bench/daemon.py --save-points 5000,10000 --saves 10
    .venv/bin/python bench/daemon.py --points 10000x100@180 --rollouts 20

`bench/rounds.py` measures the round engine in its own process. This measures the process a
platform team deploys, which also records every round in PostgreSQL, keeps the status, probes
every cluster, renews its Lease and serves HTTP. Per point (N clusters x P policies, round
interval I), each part a separate process:

1. `convergerd sim` (`bench/rounds.py`'s `Sim`), or `--sim-processes` of them, each serving
   a slice of the fleet, with one merged kubeconfig;
2. a fresh database on `--database-url`'s server, `convergerd migrate`, `convergerd import`
   of the fleet (`bench/soak.py`'s `fleet_doc`: two boundaries that cover every cluster);
3. `convergerd run` with leader election on the simulator's home cluster, the HTTP server and
   an API token, configured through its environment like a Deployment;
4. rounds, each read from the `rounds` table: `create` (until nothing is left to create),
   `--in-sync-rounds` in-sync rounds, one in-sync round with `--status-clients` clients
   polling `/status` (a separate process, honouring Retry-After), one round with
   `--hung-share` of the clusters hung. Per round: wall time (the row's started/finished),
   how long after `finished_at` the row appeared (recording), the daemon's CPU seconds from
   the round's start until its row appeared (`/proc/PID/stat`, everything the process did in
   that time), the simulator's CPU, the daemon's RSS and peak (VmRSS/VmHWM), the daemon's
   idle CPU between rounds (prober, Lease, status sync), rows written (`pg_stat_user_tables`
   inserts + updates + deletes of the bench database) and WAL bytes (`pg_current_wal_lsn()`:
   the whole server; and, with `pg_walinspect`, the records that touch the bench database);
5. detection: one healthy cluster set `down`, the time until the daemon shows it unreached
   (`--down-probes` clusters, one after another). Polled on `/v1/clusters/{id}`, whose
   `reachable` is what `convergerd_cluster_up` reads: a `/metrics` page at 10,000 clusters
   is too big to poll twice a second without the polling being the load. One scrape then
   confirms `convergerd_cluster_up{cluster=...} 0`;
6. saves: once `/status` counts no cluster unreached (the hung and the downed ones found
   again by the prober), `--saves` times, a policy's rule changed in the database and
   `POST /v1/policies/{id}/apply`, timed to the 200 (the boundary covers every cluster), with
   the daemon's and the simulator's CPU seconds meanwhile;
7. rollouts (`--rollouts N`, off by default: then the fleet document has no labels and no
   strategy): the import gave `--rollout-canary-share` of the clusters a `ring: canary` label
   and the strategy `ROLLOUT_STRATEGY` (canary by label, half, the rest after approval, a
   day's bake). After a round passed over (detection and saves ran meanwhile), one in-sync
   round without rollouts (the baseline: its idle CPU is a quiet window), then the last N
   policies (never p000) get a new rule and the strategy in the database, written as
   module-policies writes them (triggers on: the revision is kept, the leader notified), and
   `POST /v1/policies/{id}/apply`: N rollouts start, each writing its canary. The round after
   the saves, then `--rollout-rounds` in-sync rounds with the rollouts in force, as every
   round (their idle CPU includes the gate job's passes every
   `CONVERGERD_ROLLOUT_GATE_SECONDS`, its placements re-read every minute and the status
   sync's counts). Then `GET /v1/rollouts` (how many live, state, wave, the gate holding
   them), the gate job's log lines (it logs no pass, no metric times one: its cost is the
   idle CPU added), RSS and peak against the memory limit of the overlay docs/operations.md
   sizes the fleet with (`deploy/base` up to 1,000 x 100, `deploy/large-fleet` up to
   10,000 x 100). The simulator runs no operator, so no canary ever reports a phase: the
   rollouts wait at their canary wave (`delivering`) and the gate job judges every canary
   cluster at each look.

`--pin` gives the daemon a core of its own (CPU 0) and the simulator(s) the other (CPU 1;
PostgreSQL and this bench stay unpinned): with the clusters on the same cores, every figure
includes their CPU competing with the daemon's, which a deployment's clusters do not.

`--save-points N,...` adds, after the points, save-latency points: N clusters, one policy that
covers them all, one create round, then the saves (no other phase, no round meanwhile).

Rows and WAL of a round are the deltas between two snapshots taken `--settle` seconds after
consecutive rounds were recorded: PostgreSQL (15+) flushes a backend's table statistics within
10 s of it going idle, so `--interval-s` must leave that much room after each round. WAL is
server-wide: nothing else should use the server during a run (`wal_db` counts only this
database's records, so it is right even when something else does).

One JSON line per measurement on stdout, then Markdown tables; progress on stderr. The
daemon's log goes to a file in the work directory (`--keep-workdir` keeps it).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import datetime as dt
import json
import os
import platform
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml

from convergerd import eventloop
from convergerd.sim.fleet import member_ids

# Run as a script, bench/ (not the repository) is on sys.path: reuse the benchmarks' pieces.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import Sim, _free_port, _git_commit, fmt, fresh_database, log, proc_status_mb
from bench.soak import fleet_doc

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_POINTS = "200x20"
DAEMON_READY_TIMEOUT_S = 60.0
DAEMON_STOP_TIMEOUT_S = 60.0  # over the daemon's 20 s grace period
SAMPLE_PERIOD_S = 0.1
ROUND_POLL_S = 0.1
DETECT_POLL_S = 0.5
DOWN_DETECT_TIMEOUT_S = 120.0
# The prober probes a cluster silent pass after pass less and less often: its recovery is seen
# within six periods (60 s by default).
REACHED_TIMEOUT_S = 120.0
SAVE_TIMEOUT_S = 300.0
# A save point's round interval: no round after the create round while the saves run.
SAVE_POINT_INTERVAL_S = 900.0
CHANGED_RULE_PREFIX = "registry-"
# `--rollouts`: the strategy of the rollouts (imported, set on N policies at their save). The
# simulator runs no operator, so no cluster ever reports a phase: each rollout waits at its
# canary wave ("delivering"), judged at every look of the gate job; the day's bake and the
# approval before `rest` would hold it there too were its canary to report.
ROLLOUT_STRATEGY: dict[str, Any] = {
    "id": "bench-waves", "bakeSeconds": 86400, "approval": ["rest"],
    "waves": [{"name": "canary", "selector": {"ring": "canary"}},
              {"name": "half", "fraction": 0.5}, {"name": "rest", "fraction": 1.0}]}
ROLLOUT_RULE_PREFIX = "rollout-"
DEFAULT_GATE_PERIOD_S = 10.0  # CONVERGERD_ROLLOUT_GATE_SECONDS's default
# The memory budget: the limit of the overlay docs/operations.md ("Sizing") gives a fleet up to
# (clusters, policies); the limit is the peak RSS measured x 1.3, rounded up to 256 MiB.
MEMORY_OVERLAYS = (("deploy/base", 1000, 100), ("deploy/large-fleet", 10_000, 100))
SIZING_HEADROOM = 1.3
ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
# 10,000 contexts: the C parser and emitter when PyYAML has them.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
MB = 1024 * 1024


# --- the daemon process ------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (NaN once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / TICK


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment without any convergerd setting (a developer's own must not leak into
    the daemon under test), plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONVERGERD_", "Policies__"))}
    return {**env, **extra}


def convergerd(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "convergerd", *args], env=clean_env(env),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"convergerd {args[0]} exited {done.returncode}: {done.stderr[-2000:]}")


@dataclass
class Daemon:
    """`convergerd run` in its own process, configured through its environment."""

    proc: subprocess.Popen[bytes]
    base: str
    token: str
    log_path: Path
    samples_t: list[float] = field(default_factory=list)  # wall clock (time.time())
    samples_cpu: list[float] = field(default_factory=list)
    sim_cpu: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, *, dsn: str, kubeconfig: Path, interval_s: float, workdir: Path,
              extra: dict[str, str]) -> Daemon:
        port = _free_port()
        token = secrets.token_hex(16)
        token_file = workdir / "api-token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        env = {
            "CONVERGERD_DATABASE_URL": dsn,
            "CONVERGERD_KUBECONFIG": str(kubeconfig),
            "CONVERGERD_LEADER_ELECTION": "true",
            "CONVERGERD_HOME_CONTEXT": "home",
            "CONVERGERD_IDENTITY": "bench",
            "CONVERGERD_HTTP_ADDR": f"127.0.0.1:{port}",
            "CONVERGERD_API_TOKEN_FILE": str(token_file),
            "Policies__ConvergeIntervalMinutes": repr(interval_s / 60),
            **extra,
        }
        log_path = workdir / "daemon.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "convergerd", "run"],
                                    env=clean_env(env), stdout=out, stderr=subprocess.STDOUT)
        return cls(proc, f"http://127.0.0.1:{port}", token, log_path)

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while True:  # bounded by the deadline
            self.check_alive()
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(self.base + "/healthz") as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"daemon not healthy after {DAEMON_READY_TIMEOUT_S:g} s")
            await asyncio.sleep(0.2)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"convergerd run exited with {self.proc.returncode}:\n{tail}")

    async def sample(self, sim: Sims) -> None:
        """Until cancelled: CPU of the daemon and the simulator every SAMPLE_PERIOD_S."""
        while True:  # until cancelled
            self.record_sample(sim)
            await asyncio.sleep(SAMPLE_PERIOD_S)

    def record_sample(self, sim: Sims) -> None:
        self.samples_t.append(time.time())
        self.samples_cpu.append(cpu_s(self.proc.pid))
        self.sim_cpu.append(sim.cpu_s())

    def cpu_between(self, start: float, end: float, *, sim: bool = False) -> float:
        """CPU seconds used between two wall-clock times, from the samples around them."""
        values = self.sim_cpu if sim else self.samples_cpu
        i = max(0, bisect.bisect_right(self.samples_t, start) - 1)
        j = min(len(values) - 1, bisect.bisect_left(self.samples_t, end))
        return values[j] - values[i]

    def rss_mb(self) -> tuple[float, float]:
        return proc_status_mb(self.proc.pid, "VmRSS"), proc_status_mb(self.proc.pid, "VmHWM")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DAEMON_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log("the daemon did not stop within %g s: killed", DAEMON_STOP_TIMEOUT_S)
                self.proc.kill()
                self.proc.wait()


# --- the simulators ----------------------------------------------------------------------------


@dataclass
class Sims:
    """The fleet over one or more `convergerd sim` processes. Cluster ids are the fleet's
    (c0001..cN); process k serves a slice under its own ids, so the merged kubeconfig renames
    its contexts (the servers' URLs stay what that process wrote). The home cluster is the
    first process's."""

    sims: list[Sim]
    kubeconfig: Path
    where: dict[str, tuple[Sim, str]]  # fleet id -> (its process, its id there)

    @classmethod
    def start(cls, clusters: int, processes: int, workdir: Path) -> Sims:
        sizes = [clusters // processes + (k < clusters % processes) for k in range(processes)]
        sims: list[Sim] = []
        try:
            for k, size in enumerate(sizes):
                (workdir / f"sim{k}").mkdir()
                sims.append(Sim.start(size, workdir / f"sim{k}"))
            return cls._merged(sims, clusters, workdir / "kubeconfig")
        except BaseException:
            for sim in sims:
                sim.stop()
            raise

    @classmethod
    def _merged(cls, sims: list[Sim], clusters: int, path: Path) -> Sims:
        fleet_ids = iter(member_ids(clusters))
        where: dict[str, tuple[Sim, str]] = {}
        merged: dict[str, Any] = {}
        for k, sim in enumerate(sims):
            doc = yaml.load(sim.kubeconfig.read_text(), Loader=YAML_LOADER)  # noqa: S506 - safe
            names = {"home": "home"} if k == 0 else {}
            for entry in doc["contexts"]:
                if entry["name"] != "home":
                    names[entry["name"]] = next(fleet_ids)
                    where[names[entry["name"]]] = (sim, entry["name"])
            for key in ("clusters", "users", "contexts"):
                doc[key] = [e for e in doc[key] if e["name"] in names]
                for e in doc[key]:
                    e["name"] = names[e["name"]]
            for e in doc["contexts"]:
                e["context"] = {"cluster": e["name"], "user": e["name"]}
            if not merged:
                merged = doc
            else:
                for key in ("clusters", "users", "contexts"):
                    merged[key].extend(doc[key])
        path.write_text(yaml.dump(merged, Dumper=YAML_DUMPER, sort_keys=False))
        path.chmod(0o600)
        return cls(sims, path, where)

    def cpu_s(self) -> float:
        return sum(sim.cpu_s() for sim in self.sims)

    def peak_rss_mb(self) -> float:
        return sum(sim.peak_rss_mb() for sim in self.sims)

    async def set_faults(self, clusters: Sequence[str], faults: dict[str, Any] | None) -> None:
        for c in clusters:
            sim, local = self.where[c]
            path = f"/_sim/clusters/{local}/faults"
            status, doc = await asyncio.to_thread(
                sim.admin, *(("DELETE", path) if faults is None else ("POST", path, faults)))
            if status != 200:
                raise RuntimeError(f"simulator faults for {c} ({local}): {status} {doc}")

    def stop(self) -> None:
        for sim in self.sims:
            sim.stop()


@dataclass(frozen=True)
class DbSnapshot:
    rows: int  # inserts + updates + deletes over the bench database's tables
    lsn: str
    checkpoints: int  # the server's, so far: each makes the next change of a page log it whole
    at: float


class Monitor:
    """The bench's own connection to the bench database: rounds, statistics, WAL."""

    def __init__(self, conn: asyncpg.Connection, walinspect: bool) -> None:
        self.conn = conn
        self.walinspect = walinspect
        self.oid = 0

    @classmethod
    async def connect(cls, dsn: str, *, walinspect: bool) -> Monitor:
        conn = await asyncpg.connect(dsn)
        monitor = cls(conn, walinspect)
        monitor.oid = int(await conn.fetchval(
            "SELECT oid FROM pg_database WHERE datname = current_database()"))
        if walinspect:
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
                # Checkpoints (CREATE/DROP DATABASE force one) recycle WAL segments before
                # the window is read: a slot keeps them. Temporary: dropped with this
                # connection, however the bench ends, so it cannot hold WAL forever.
                await conn.execute(
                    "SELECT pg_create_physical_replication_slot($1, true, true)",
                    f"convergerd_benchd_{os.getpid()}")
            except asyncpg.PostgresError as exc:
                log("note: no pg_walinspect or slot (%s): WAL of this database not separated",
                    exc)
                monitor.walinspect = False
        return monitor

    async def snapshot(self) -> DbSnapshot:
        row = await self.conn.fetchrow(
            """SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) AS rows,
                      pg_current_wal_flush_lsn()::text AS lsn,
                      (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
                          AS checkpoints
               FROM pg_stat_user_tables""")
        assert row is not None
        return DbSnapshot(int(row["rows"]), row["lsn"], int(row["checkpoints"]), time.time())

    async def wal_bytes(self, a: DbSnapshot, b: DbSnapshot) -> int:
        return int(await self.conn.fetchval(
            "SELECT $2::text::pg_lsn - $1::text::pg_lsn", a.lsn, b.lsn))

    async def wal_db_bytes(self, a: DbSnapshot, b: DbSnapshot) -> tuple[int, int] | None:
        """Bytes of the WAL records between two snapshots that touch a block of this
        database (commit records, which touch none, are left out: a few dozen bytes each),
        and how many of them are full-page images (the first change of a page after a
        checkpoint)."""
        if not self.walinspect:
            return None
        if a.lsn == b.lsn:
            return 0, 0
        row = await self.conn.fetchrow(
            """SELECT coalesce(sum(record_length), 0) AS bytes,
                      coalesce(sum(fpi_length), 0) AS fpi
               FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
               WHERE block_ref LIKE $3::text""",
            a.lsn, b.lsn, f"%rel %/{self.oid}/%")
        assert row is not None
        # What the slot keeps from now on: the next window only.
        await self.conn.execute("SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
                                f"convergerd_benchd_{os.getpid()}", b.lsn)
        return int(row["bytes"]), int(row["fpi"])

    async def rounds_after(self, last_id: int) -> list[asyncpg.Record]:
        return list(await self.conn.fetch(
            """SELECT id, started_at, finished_at, result, counts::text AS counts
               FROM rounds WHERE id > $1 ORDER BY id""", last_id))

    async def healthy_done_s(self, round_id: int, faulty: Sequence[str]) -> float | None:
        """When the round's last healthy cluster finished, from the round's start: the
        healthy clusters' part of the round (each one's listing time plus its own duration)."""
        try:
            value = await self.conn.fetchval(
                """SELECT extract(epoch FROM max(s.listed_at
                                                + make_interval(secs => s.duration_s))
                                            - r.started_at)
                   FROM cluster_state s JOIN rounds r ON r.id = s.round_id
                   WHERE s.round_id = $1 AND NOT (s.cluster_id = ANY($2::text[]))
                   GROUP BY r.started_at""",
                round_id, list(faulty))
        except asyncpg.PostgresError:
            return None
        return None if value is None else float(value)

    async def healthy_max_s(self, round_id: int, faulty: Sequence[str]) -> float | None:
        """The slowest healthy cluster's own time in a round (None when the schema has no
        such record)."""
        try:
            value = await self.conn.fetchval(
                """SELECT max(duration_s) FROM cluster_state
                   WHERE round_id = $1 AND NOT (cluster_id = ANY($2::text[]))""",
                round_id, list(faulty))
        except asyncpg.PostgresError:
            return None
        return None if value is None else float(value)


# --- the status load (its own process) ---------------------------------------------------------


async def status_load(base: str, clients: int) -> None:
    """Until SIGTERM: `clients` loops of GET /status, each waiting out a 429's Retry-After as
    `convergerd status` does; then one JSON line of latencies and counts."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ok: list[float] = []
    shed: list[float] = []
    counts: Counter[str] = Counter()

    async def one(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                async with session.get(base + "/status") as resp:
                    await resp.read()
                    retry_after = resp.headers.get("Retry-After")
            except aiohttp.ClientError:
                counts["error"] += 1
                await asyncio.sleep(0.1)
                continue
            took = time.perf_counter() - started
            counts[str(resp.status)] += 1
            (ok if resp.status == 200 else shed).append(took)
            if resp.status == 429 and retry_after is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(float(retry_after), 10.0))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        print("ready", flush=True)
        await asyncio.gather(*(one(session) for _ in range(clients)))
    print(json.dumps({"counts": dict(counts), **percentiles_ms(ok, "ok"),
                      **percentiles_ms(shed, "shed")}), flush=True)


def percentiles_ms(values: Sequence[float], prefix: str) -> dict[str, Any]:
    if not values:
        return {f"{prefix}_n": 0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {f"{prefix}_n": len(ordered),
            f"{prefix}_p50_ms": round(statistics.median(ordered) * 1000, 1),
            f"{prefix}_p99_ms": round(p99 * 1000, 1),
            f"{prefix}_max_ms": round(ordered[-1] * 1000, 1)}


class StatusLoad:
    def __init__(self, base: str, clients: int) -> None:
        self.base, self.clients = base, clients
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0.0

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--status-load", self.base,
            "--status-clients", str(self.clients), stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"the status load did not start: {line!r}")
        self.started = time.perf_counter()

    async def stop(self) -> dict[str, Any]:
        if self.proc is None or self.proc.returncode is not None:
            return {}
        assert self.proc.stdout is not None
        took = time.perf_counter() - self.started
        self.proc.send_signal(signal.SIGTERM)
        out = await asyncio.wait_for(self.proc.stdout.read(), 60)
        await self.proc.wait()
        doc: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        doc["requests_per_s"] = round(sum(doc["counts"].values()) / took, 1) if took else None
        return doc


# --- measurements ------------------------------------------------------------------------------


@dataclass
class Measurement:
    bench: str
    clusters: int
    policies: int
    fields: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"bench": self.bench, "clusters": self.clusters, "policies": self.policies,
                **self.fields, "loadavg_1m": round(os.getloadavg()[0], 2)}


def emit(m: Measurement, out: list[Measurement]) -> None:
    out.append(m)
    print(json.dumps(m.as_json()), flush=True)


@dataclass(frozen=True)
class Point:
    clusters: int
    policies: int
    interval_s: float
    saves_only: bool = False  # a `--save-points` point: one create round, then the saves


@dataclass
class Run:
    """One point's processes and what has been observed so far."""

    point: Point
    args: argparse.Namespace
    sim: Sims
    daemon: Daemon
    monitor: Monitor
    session: aiohttp.ClientSession
    clusters: list[str]
    out: list[Measurement]
    last_round: int = 0
    last_seen: float = 0.0  # when the last round's row appeared (wall clock)
    last_started: float = 0.0
    snap: DbSnapshot | None = None
    overlapped: bool = False  # the last window took in the next round's record

    async def next_round(self, timeout_s: float) -> tuple[asyncpg.Record, float]:
        """The next recorded round, and when its row appeared."""
        deadline = time.monotonic() + timeout_s
        while True:  # bounded by the deadline
            self.daemon.check_alive()
            rows = await self.monitor.rounds_after(self.last_round)
            if rows:
                self.daemon.record_sample(self.sim)
                return rows[0], time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no round recorded within {timeout_s:g} s")
            await asyncio.sleep(ROUND_POLL_S)

    async def measure_round(self, bench: str, extra: dict[str, Any] | None = None
                            ) -> tuple[Measurement, asyncpg.Record]:
        p = self.point
        row, seen = await self.next_round(p.interval_s * 3 + 600)
        rss, peak = self.daemon.rss_mb()
        started = row["started_at"].timestamp()
        finished = row["finished_at"].timestamp() if row["finished_at"] else seen
        idle: float | None = None
        if self.last_seen and started > self.last_seen:
            idle = self.daemon.cpu_between(self.last_seen, started) / (started - self.last_seen)
        # Rows and WAL: the statistics of this round's record reach pg_stat within 10 s.
        await asyncio.sleep(self.args.settle)
        snap = await self.monitor.snapshot()
        assert self.snap is not None
        rows = snap.rows - self.snap.rows
        wal = await self.monitor.wal_bytes(self.snap, snap)
        wal_db = await self.monitor.wal_db_bytes(self.snap, snap)
        wal_db_bytes, wal_db_fpi = wal_db if wal_db is not None else (None, None)
        counts: dict[str, int] = json.loads(row["counts"])
        fields: dict[str, Any] = {
            "round_id": row["id"], "result": row["result"],
            "wall_s": round(finished - started, 3),
            "record_s": round(max(0.0, seen - finished), 2),
            "daemon_cpu_s": round(self.daemon.cpu_between(started, seen), 2),
            "sim_cpu_s": round(self.daemon.cpu_between(started, seen, sim=True), 2),
            "idle_cpu_pct": None if idle is None else round(idle * 100, 1),
            "rss_mb": round(rss, 1), "peak_rss_mb": round(peak, 1),
            "sim_peak_rss_mb": round(self.sim.peak_rss_mb(), 1),
            "rows_written": rows, "wal_bytes": wal, "wal_db_bytes": wal_db_bytes,
            "wal_db_fpi_bytes": wal_db_fpi, "checkpoints": snap.checkpoints - self.snap.checkpoints,
            **{k: counts.get(k) for k in ("converged", "unreached", "created", "updated",
                                          "failed")},
            **(extra or {}),
        }
        if self.overlapped:
            fields["overlap"] = "rows and WAL partly in the previous round's (overlap)"
        self.overlapped = bool(await self.monitor.rounds_after(row["id"]))
        if self.overlapped:
            fields["overlap"] = ("the next round was recorded before the statistics were read: "
                                 "rows and WAL partly its")
        self.last_round, self.last_seen, self.last_started = row["id"], seen, started
        self.snap = snap
        m = Measurement(bench, p.clusters, p.policies, fields)
        emit(m, self.out)
        log("round %d %s: %s", row["id"], bench, json.dumps(fields))
        return m, row

    async def quiet_for(self, seconds: float) -> None:
        """Return when no round is due for `seconds` (a round starts one interval after the
        last one started), waiting for the next round to be recorded if one is. Rounds that
        overrun their interval leave no quiet time: then after a few, go ahead anyway."""
        for _ in range(3):
            row = await self.monitor.conn.fetchrow(
                "SELECT id, started_at FROM rounds ORDER BY id DESC LIMIT 1")
            assert row is not None
            if time.time() + seconds < row["started_at"].timestamp() + self.point.interval_s:
                return
            while not await self.monitor.rounds_after(row["id"]):
                self.daemon.check_alive()
                await asyncio.sleep(ROUND_POLL_S)

    async def catch_up(self) -> None:
        """Measure from the next round on: the rounds recorded since the last measured one
        (they ran during detection and the saves) are passed over, their rows and WAL too.
        Waits for one more round to be recorded, unmeasured, and takes its place: the next
        round's idle CPU is counted from when its row appeared, as every round's."""
        latest = int(await self.monitor.conn.fetchval("SELECT coalesce(max(id), 0) FROM rounds"))
        self.last_round = latest
        row, seen = await self.next_round(self.point.interval_s * 3 + 600)
        await asyncio.sleep(self.args.settle)
        self.snap = await self.monitor.snapshot()
        self.last_round, self.last_seen = row["id"], seen
        self.last_started, self.overlapped = row["started_at"].timestamp(), False
        log("round %d passed over (the rounds since round %d are not measured)", row["id"],
            latest)

    async def wait_until_next_round_near(self, lead_s: float) -> None:
        """Sleep until `lead_s` before the next round is due (one interval after the last
        one started)."""
        due = self.last_started + self.point.interval_s - lead_s
        await asyncio.sleep(max(0.0, due - time.time()))


async def cluster_up(run: Run, cluster: str) -> float | None:
    """`convergerd_cluster_up` of `cluster` in one `/metrics` scrape (None: not there)."""
    async with run.session.get(run.daemon.base + "/metrics") as resp:
        text = await resp.text()
    match = re.search(rf'^convergerd_cluster_up\{{[^}}]*cluster="{re.escape(cluster)}"[^}}]*\}}'
                      r" (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def reachable(run: Run, cluster: str) -> bool | None:
    """The daemon's `reachable` for `cluster` (`/v1/clusters/{id}`), what the metric reads."""
    headers = {"Authorization": f"Bearer {run.daemon.token}"}
    async with run.session.get(f"{run.daemon.base}/v1/clusters/{cluster}",
                               headers=headers) as resp:
        doc = await resp.json() if resp.status == 200 else {}
    value = doc.get("cluster", {}).get("reachable")
    return value if isinstance(value, bool) else None


async def detect_down(run: Run, cluster: str) -> tuple[float, float]:
    """Seconds from setting `cluster` down to the daemon showing it unreached, and to a
    `/metrics` scrape showing `convergerd_cluster_up` 0 for it (the text is reused for up to
    ten times what it cost to write, so it may lag the state by that)."""
    await run.sim.set_faults([cluster], {"down": True})
    started = time.perf_counter()
    shown: float | None = None
    try:
        while True:  # bounded by the deadline
            run.daemon.check_alive()
            if shown is None and await reachable(run, cluster) is False:
                shown = time.perf_counter() - started
            if shown is not None and await cluster_up(run, cluster) == 0:
                return shown, time.perf_counter() - started
            if time.perf_counter() - started > DOWN_DETECT_TIMEOUT_S:
                raise TimeoutError(f"{cluster} not seen down within {DOWN_DETECT_TIMEOUT_S:g} s")
            await asyncio.sleep(DETECT_POLL_S)
    finally:
        await run.sim.set_faults([cluster], None)


async def change_rule(run: Run, policy: str, n: int, *, notify: bool) -> None:
    """A new rule for `policy`, as module-policies writes it. Without `notify` the row is
    written with triggers off (so no notification makes the leader fan it out a second time,
    concurrently with the API's save) and the revision raised here, as the trigger would."""
    rule = {"type": "AllowedRegistries",
            "registries": [f"{CHANGED_RULE_PREFIX}{n}.example.com", "ghcr.io/stackship"]}
    conn = run.monitor.conn
    async with conn.transaction():
        if not notify:
            await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(
            """UPDATE policies SET rule = $2::jsonb, revision = revision + 1, updated_at = now()
               WHERE id = $1""", policy, json.dumps(rule))


async def save(run: Run, policy: str) -> tuple[float, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {run.daemon.token}"}
    started = time.perf_counter()
    async with run.session.post(f"{run.daemon.base}/v1/policies/{policy}/apply",
                                headers=headers,
                                timeout=aiohttp.ClientTimeout(total=SAVE_TIMEOUT_S)) as resp:
        body = await resp.read()
    took = time.perf_counter() - started
    if resp.status != 200:
        raise RuntimeError(f"save {policy}: {resp.status} {body[:500]!r}")
    doc: dict[str, Any] = json.loads(body)
    return took, doc


# --- one point ---------------------------------------------------------------------------------


def pin(daemon_pid: int, sim: Sims) -> None:
    """The daemon on CPU 0, the simulators on the others (`--pin`)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    os.sched_setaffinity(daemon_pid, {cpus[0]})
    for one in sim.sims:
        os.sched_setaffinity(one.proc.pid, set(cpus[1:]))
    log("pinned: the daemon on CPU %d, the simulator(s) on %s", cpus[0], cpus[1:])


async def bench_point(point: Point, args: argparse.Namespace, out: list[Measurement],
                      workdir: Path) -> None:
    n, p = point.clusters, point.policies
    log("== %d clusters x %d policies, interval %g s: starting %d simulator process(es)", n, p,
        point.interval_s, args.sim_processes)
    async with contextlib.AsyncExitStack() as stack:
        sim = await asyncio.to_thread(Sims.start, n, args.sim_processes, workdir)
        stack.callback(sim.stop)
        dsn, _name = await stack.enter_async_context(
            fresh_database(args.database_url, "convergerd_benchd", migrated=False))
        clusters = member_ids(n)
        fleet = workdir / "fleet.yaml"
        doc = fleet_doc(clusters, p)
        if args.rollouts > 0 and not point.saves_only:
            doc = rollout_fleet(doc, clusters, args.rollout_canary_share)
        fleet.write_text(yaml.safe_dump(doc))
        env = {"CONVERGERD_DATABASE_URL": dsn, "CONVERGERD_IMPORT_MAX_BYTES": str(256 * MB)}
        log("migrate, import")
        await asyncio.to_thread(convergerd, "migrate", env=env)
        await asyncio.to_thread(convergerd, "import", str(fleet), env=env)
        monitor = await Monitor.connect(dsn, walinspect=args.walinspect)
        stack.push_async_callback(monitor.conn.close)
        session = await stack.enter_async_context(aiohttp.ClientSession())
        kubeconfig = workdir / "daemon-kubeconfig"
        kubeconfig.write_text(sim.kubeconfig.read_text())
        snap = await monitor.snapshot()  # before the daemon: its startup counts to round 1
        extra = dict(kv.split("=", 1) for kv in args.env)
        log("starting convergerd run")
        daemon = Daemon.start(dsn=dsn, kubeconfig=kubeconfig, interval_s=point.interval_s,
                              workdir=workdir, extra=extra)
        stack.callback(daemon.stop)
        if args.keep_workdir:
            log("daemon log: %s", daemon.log_path)
        if args.pin:
            pin(daemon.proc.pid, sim)
        sampler = asyncio.create_task(daemon.sample(sim), name="sampler")
        stack.callback(sampler.cancel)
        await daemon.wait_ready(session)
        run = Run(point, args, sim, daemon, monitor, session, clusters, out, snap=snap)
        await _phases(run)


async def _phases(run: Run) -> None:
    args = run.args
    if run.point.saves_only:
        await _create(run)
        await _saves(run)
        return
    await _create_and_in_sync(run)
    if args.status_clients > 0:
        await _status_round(run)
    if args.hung_share > 0:
        await _hung_round(run)
    if args.down_probes > 0:
        await _down_detection(run)
    if args.saves > 0:
        await _saves(run)
    if args.rollouts > 0:
        await _rollouts(run)


async def _create(run: Run) -> None:
    """Create rounds until one converges everything (a round cut by its deadline leaves the
    rest to the next)."""
    args, n = run.args, run.point.clusters
    for i in range(args.max_create_rounds):
        m, _row = await run.measure_round("create" if i == 0 else "create (continued)")
        if m.fields["result"] == "ok" and m.fields["converged"] == n:
            return
    raise RuntimeError(f"not in sync after {args.max_create_rounds} rounds")


async def _create_and_in_sync(run: Run) -> None:
    args, n = run.args, run.point.clusters
    await _create(run)
    for _ in range(args.in_sync_rounds):
        m, _row = await run.measure_round("in-sync")
        if m.fields["created"] or m.fields["updated"] or m.fields["converged"] != n:
            log("warning: an in-sync round applied or did not converge: %s", m.fields)


async def _status_round(run: Run) -> None:
    """An in-sync round with clients polling /status from a second before it starts until
    it is recorded."""
    clients = run.args.status_clients
    await run.wait_until_next_round_near(lead_s=1.0)
    load = StatusLoad(run.daemon.base, clients)
    await load.start()
    try:
        m, _row = await run.measure_round(f"in-sync, {clients} /status clients")
    finally:
        doc = await load.stop()
    emit(Measurement("/status", run.point.clusters, run.point.policies, {
        "clients": clients, "round_id": m.fields["round_id"], **doc}), run.out)


async def _hung_round(run: Run) -> None:
    n = run.point.clusters
    step = max(1, round(1 / run.args.hung_share))
    hung = run.clusters[step - 1::step]
    await run.sim.set_faults(hung, {"hang": True})
    try:
        m, row = await run.measure_round(f"hung {len(hung) / n:.0%}", {"hung": len(hung)})
    finally:
        await run.sim.set_faults(hung, None)
    m.fields["healthy_max_s"] = await run.monitor.healthy_max_s(row["id"], hung)
    m.fields["healthy_done_s"] = await run.monitor.healthy_done_s(row["id"], hung)
    # The degraded fleet against the healthy one: the last in-sync round's wall time.
    in_sync = [o.fields["wall_s"] for o in run.out
               if o.bench.startswith("in-sync") and o.clusters == n and "wall_s" in o.fields]
    m.fields["in_sync_wall_s"] = in_sync[-1] if in_sync else None
    log("hung round: healthy clusters done after %s s, the slowest in %s s of its own "
        "(in-sync round %s s)", m.fields["healthy_done_s"], m.fields["healthy_max_s"],
        m.fields["in_sync_wall_s"])


async def _down_detection(run: Run) -> None:
    n, probes = run.point.clusters, run.args.down_probes
    took, shown = [], []
    for cluster in run.clusters[:: max(1, n // probes)][:probes]:
        at = dt.datetime.now(dt.UTC)
        in_status, in_metrics = await detect_down(run, cluster)
        took.append(in_metrics)
        shown.append(in_status)
        # The wall clock too, to find the moment in the daemon's log (--keep-workdir).
        log("%s set down at %s, unreached in the status after %.1f s, cluster_up 0 after %.1f s",
            cluster, f"{at:%H:%M:%S.%f}"[:-3], in_status, in_metrics)
    emit(Measurement("down detection", n, run.point.policies, {
        "samples": len(took), **percentiles_s(took),
        "status_s": [round(v, 2) for v in shown]}), run.out)


async def all_reached(run: Run) -> float:
    """Seconds until `/status` counts no cluster unreached. After the hung round and the
    down detection, the clusters hung or set down stay unreached in the daemon's view until the
    prober finds them again (a cluster silent pass after pass is probed less often: up to six
    periods), and a save meanwhile writes them in the suspects' lane and answers without
    them (`pending`): fewer clusters written for the same CPU."""
    headers = {"Authorization": f"Bearer {run.daemon.token}"}
    started = time.perf_counter()
    while True:  # bounded by the deadline
        run.daemon.check_alive()
        async with run.session.get(run.daemon.base + "/status", headers=headers) as resp:
            doc = await resp.json() if resp.status == 200 else {}
        if doc.get("fleet", {}).get("unreached") == 0:
            return time.perf_counter() - started
        if time.perf_counter() - started > REACHED_TIMEOUT_S:
            raise TimeoutError(f"clusters still unreached after {REACHED_TIMEOUT_S:g} s")
        await asyncio.sleep(DETECT_POLL_S)


async def _saves(run: Run) -> None:
    args = run.args
    policy = "p000"  # its boundary covers every cluster (fleet_doc)
    # A save over a fleet seen healthy: its CPU per cluster written is then comparable.
    waited = await all_reached(run)
    log("every cluster seen reached again after %.1f s; saving", waited)
    took: list[float] = []
    daemon_cpu: list[float] = []
    sim_cpu: list[float] = []
    written: list[int] = []  # clusters created or updated, per save
    results: Counter[str] = Counter()
    for i in range(args.saves):
        await run.quiet_for(min(run.point.interval_s / 2, max(3.0, 2 * max(took, default=0))))
        await change_rule(run, policy, i, notify=args.save_notify)
        run.daemon.record_sample(run.sim)
        started = time.time()
        seconds, doc = await save(run, policy)
        ended = time.time()
        run.daemon.record_sample(run.sim)
        took.append(seconds)
        daemon_cpu.append(run.daemon.cpu_between(started, ended))
        sim_cpu.append(run.daemon.cpu_between(started, ended, sim=True))
        found = Counter(c["result"] for c in doc["clusters"])
        results.update(found)
        written.append(found["created"] + found["updated"])
        log("save %d: %.2f s, %s, %s (daemon CPU %.2f s, simulator CPU %.2f s)", i, seconds,
            doc["status"], dict(found), daemon_cpu[-1], sim_cpu[-1])
        await asyncio.sleep(args.save_pause)
    emit(Measurement("save", run.point.clusters, run.point.policies, {
        "samples": len(took), "notify": args.save_notify, **percentiles_s(took),
        "daemon_cpu_s": round(statistics.median(daemon_cpu), 2),
        "sim_cpu_s": round(statistics.median(sim_cpu), 2),
        # CPU per cluster written: comparable when some saves were cut by the deadline.
        "daemon_cpu_ms_per_write": _per_write_ms(daemon_cpu, written),
        "sim_cpu_ms_per_write": _per_write_ms(sim_cpu, written),
        "all_daemon_cpu_s": [round(v, 2) for v in daemon_cpu],
        "sim_processes": args.sim_processes,
        "results": dict(results)}), run.out)


# --- rollouts in progress (`--rollouts`) ----------------------------------------------------------


def canary_of(clusters: Sequence[str], share: float) -> list[str]:
    """Every 1/`share`-th cluster, at least one: the clusters labelled `ring: canary`."""
    step = max(1, round(1 / share))
    return list(clusters[step - 1::step]) or list(clusters[:1])


def rollout_fleet(doc: dict[str, Any], clusters: Sequence[str], canary_share: float
                  ) -> dict[str, Any]:
    """The fleet document with a `ring: canary` label on `canary_of` the clusters and the
    rollouts' strategy; no policy names it yet (a policy with a strategy and no rollout is left
    alone by rounds: the create round would create nothing of it)."""
    canary = set(canary_of(clusters, canary_share))
    return {**doc,
            "clusters": [{"id": c, "labels": {"ring": "canary"}} if c in canary else {"id": c}
                         for c in clusters],
            "rolloutStrategies": [ROLLOUT_STRATEGY]}


def rollout_policies(policies: int, rollouts: int) -> list[str]:
    """The policies whose saves start the rollouts: the last `rollouts` ones (never p000, whose
    timed saves wrote its rule with triggers off, so its revisions were not kept)."""
    return [f"p{j:03d}" for j in range(policies - rollouts, policies)]


async def stage_rollout(run: Run, policy: str, n: int) -> None:
    """A new rule for `policy` and the rollouts' strategy, written as module-policies writes a
    policy (triggers on: the revision is kept, which a rollout's waves are delivered from, and
    the leader is notified: its save and the API's meet, one starts the rollout, the other
    follows it)."""
    rule = {"type": "AllowedRegistries",
            "registries": [f"{ROLLOUT_RULE_PREFIX}{n}.example.com", "ghcr.io/stackship"]}
    await run.monitor.conn.execute(
        """UPDATE policies SET rule = $2::jsonb, rollout_strategy = $3,
                  revision = revision + 1, updated_at = now()
           WHERE id = $1""", policy, json.dumps(rule), ROLLOUT_STRATEGY["id"])


async def live_rollouts(run: Run) -> list[dict[str, Any]]:
    """`GET /v1/rollouts` (a status view: a 429 is waited out as its Retry-After says)."""
    headers = {"Authorization": f"Bearer {run.daemon.token}"}
    for _ in range(10):
        async with run.session.get(f"{run.daemon.base}/v1/rollouts", headers=headers) as resp:
            if resp.status == 429:
                await asyncio.sleep(min(10.0, float(resp.headers.get("Retry-After", "1"))))
                continue
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET /v1/rollouts: {resp.status} {body[:500]!r}")
        found: list[dict[str, Any]] = json.loads(body)["rollouts"]
        return found
    raise RuntimeError("GET /v1/rollouts: still 429 after 10 tries")


def memory_budget(clusters: int, policies: int) -> tuple[str, int] | None:
    """The overlay sized for this fleet and its memory limit in MiB (None: past 10,000 x 100,
    not measured)."""
    for overlay, most_clusters, most_policies in MEMORY_OVERLAYS:
        if clusters <= most_clusters and policies <= most_policies:
            text = (ROOT / overlay / "deployment.yaml").read_text(encoding="utf-8")
            limits = [int(v) for v in re.findall(r"^\s*memory:\s*(\d+)Mi\s*$", text, re.M)]
            return (overlay, max(limits)) if limits else None
    return None


def gate_period_s(args: argparse.Namespace) -> float:
    for kv in args.env:
        name, value = kv.split("=", 1)
        if name == "CONVERGERD_ROLLOUT_GATE_SECONDS":
            return float(value)
    return DEFAULT_GATE_PERIOD_S


def gate_log_lines(log_path: Path, since: int) -> Counter[str]:
    """What the gate job logged after byte `since` of the daemon's log: transitions, waits
    written, failed passes (it logs nothing per pass, and no metric times one)."""
    with log_path.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return Counter({
        "moved": len(re.findall(r"rollout \d+ of policy \S+ \(revision", text)),
        "moved_meanwhile": text.count("moved by another writer meanwhile"),
        "pass_failed": text.count("rollout gates: pass failed"),
        "pass_stopped": text.count("rollout gates: no longer leading"),
    })


async def _rollouts(run: Run) -> None:
    """`--rollouts N` in progress: a baseline in-sync round, then N policies saved with the
    strategy (N rollouts start, each writing its canary wave), the round after the saves, and
    `--rollout-rounds` in-sync rounds with the rollouts in force; then the rollouts as
    `GET /v1/rollouts` shows them, the gate job's log lines, RSS against the memory budget."""
    args, n, p = run.args, run.point.clusters, run.point.policies
    count = args.rollouts
    policies = rollout_policies(p, count)
    await run.catch_up()
    base, _row = await run.measure_round("in-sync, no rollouts")
    log_from = run.daemon.log_path.stat().st_size
    took: list[float] = []
    results: Counter[str] = Counter()
    run.daemon.record_sample(run.sim)
    started = time.time()
    for i, policy in enumerate(policies):
        await stage_rollout(run, policy, i)
        seconds, doc = await save(run, policy)
        took.append(seconds)
        found = Counter(c["result"] for c in doc["clusters"])
        results.update(found)
        log("rollout save of %s: %.2f s, %s, %s", policy, seconds, doc["status"], dict(found))
    ended = time.time()
    run.daemon.record_sample(run.sim)
    starting, _row = await run.measure_round(f"in-sync, {count} rollouts starting")
    rounds = []
    for _ in range(args.rollout_rounds):
        m, _row = await run.measure_round(f"in-sync, {count} rollouts in progress")
        rounds.append(m)
        if m.fields["created"] or m.fields["updated"] or m.fields["converged"] != n:
            log("warning: a round with rollouts in progress applied or did not converge: %s",
                m.fields)
    found_rollouts = await live_rollouts(run)
    mine = [r for r in found_rollouts if r["policy"] in policies]
    rss, peak = run.daemon.rss_mb()
    budget = memory_budget(n, p)
    idle_with = [m.fields["idle_cpu_pct"] for m in rounds if m.fields["idle_cpu_pct"] is not None]
    idle_without = base.fields["idle_cpu_pct"]
    idle_with_pct = round(statistics.mean(idle_with), 1) if idle_with else None
    with_cpu = [m.fields["daemon_cpu_s"] for m in rounds]
    with_wall = [m.fields["wall_s"] for m in rounds]
    fields: dict[str, Any] = {
        "rollouts": count, "live": len(mine),
        "states": dict(Counter(r["state"] for r in mine)),
        "waves": dict(Counter(f"{r['wave']['index']} {r['wave']['name']}" for r in mine)),
        "gates": dict(Counter(str(r["gate"]) for r in mine)),
        "reason": mine[0]["reason"] if mine else None,
        "canary_clusters": len(canary_of(run.clusters, args.rollout_canary_share)),
        "gate_period_s": gate_period_s(args),
        "save": {**percentiles_s(took), "results": dict(results),
                 "daemon_cpu_s": round(run.daemon.cpu_between(started, ended), 2)},
        "baseline_round_id": base.fields["round_id"],
        "starting_round_id": starting.fields["round_id"],
        "idle_cpu_pct_without": idle_without, "idle_cpu_pct_with": idle_with_pct,
        "idle_cpu_pp_added": (None if idle_without is None or idle_with_pct is None
                              else round(idle_with_pct - idle_without, 1)),
        "round_daemon_cpu_s_without": base.fields["daemon_cpu_s"],
        "round_daemon_cpu_s_with": round(statistics.mean(with_cpu), 2) if with_cpu else None,
        "round_wall_s_without": base.fields["wall_s"],
        "round_wall_s_with": round(statistics.mean(with_wall), 3) if with_wall else None,
        "rows_without": base.fields["rows_written"],
        "rows_with": [m.fields["rows_written"] for m in rounds],
        "rss_mb_without": base.fields["rss_mb"], "rss_mb": round(rss, 1),
        "peak_rss_mb": round(peak, 1),
        "budget": None if budget is None else {
            "overlay": budget[0], "limit_mib": budget[1],
            "sized_for_peak_mib": round(budget[1] / SIZING_HEADROOM),
            "peak_share_of_limit": round(peak / budget[1], 3)},
        "gate_log": dict(gate_log_lines(run.daemon.log_path, log_from)),
    }
    if len(mine) != count:
        log("warning: %d of %d rollouts live: %s", len(mine), count, found_rollouts)
    emit(Measurement("rollouts", n, p, fields), run.out)
    log("rollouts: %s", json.dumps(fields))


def _per_write_ms(cpu_s: Sequence[float], written: Sequence[int]) -> float | None:
    return round(sum(cpu_s) / sum(written) * 1000, 3) if sum(written) else None


def percentiles_s(values: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_s": round(statistics.median(ordered), 2), "p99_s": round(p99, 2),
            "max_s": round(ordered[-1], 2), "all_s": [round(v, 2) for v in values]}


# --- tables ------------------------------------------------------------------------------------


def _mb(value: int | None) -> str:
    return "" if value is None else f"{value / MB:,.1f}"


def markdown(results: Sequence[Measurement]) -> str:
    rounds = [
        "| round | clusters | policies | wall s | record s | daemon CPU s | sim CPU s | "
        "idle CPU % | RSS MB | peak RSS MB | rows written | WAL MB | WAL MB (this db) | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    other = ["| measurement | clusters | policies | P50 | P99 | max | notes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for m in results:
        f = m.fields
        if "wall_s" in f:
            notes = [f"{f['result']}: {f['converged']} converged, {f['unreached']} unreached, "
                     f"{f['created']} created, {f['updated']} updated"]
            if f.get("wal_db_fpi_bytes"):
                notes.append(f"{_mb(f['wal_db_fpi_bytes'])} MB of it full pages, "
                             f"{f['checkpoints']} checkpoint(s)")
            if f.get("healthy_done_s") is not None:
                notes.append(f"healthy clusters done after {f['healthy_done_s']:.2f} s")
            if f.get("healthy_max_s") is not None:
                notes.append(f"slowest healthy cluster {f['healthy_max_s']:.2f} s")
            if f.get("in_sync_wall_s") is not None:
                notes.append(f"in-sync round before it {f['in_sync_wall_s']:.2f} s")
            if f.get("overlap"):
                notes.append(f["overlap"])
            rounds.append(
                f"| {m.bench} | {fmt(m.clusters)} | {fmt(m.policies)} | "
                f"{fmt(f['wall_s'], 2)} | {fmt(f['record_s'], 2)} | "
                f"{fmt(f['daemon_cpu_s'], 2)} | {fmt(f['sim_cpu_s'], 2)} | "
                f"{fmt(f['idle_cpu_pct'])} | {fmt(f['rss_mb'])} | {fmt(f['peak_rss_mb'])} | "
                f"{fmt(f['rows_written'])} | {_mb(f['wal_bytes'])} | {_mb(f['wal_db_bytes'])} | "
                f"{'; '.join(notes)} |")
        elif m.bench == "/status":
            c = f.get("counts", {})
            other.append(
                f"| /status, 200s | {fmt(m.clusters)} | {fmt(m.policies)} | "
                f"{fmt(f.get('ok_p50_ms'))} ms | {fmt(f.get('ok_p99_ms'))} ms | "
                f"{fmt(f.get('ok_max_ms'))} ms | {f['clients']} clients during round "
                f"{f['round_id']}: {c.get('200', 0):,} x 200, {c.get('429', 0):,} x 429 "
                f"(P50 {fmt(f.get('shed_p50_ms'))} ms), {c.get('error', 0)} errors, "
                f"{fmt(f.get('requests_per_s'))} req/s |")
        elif m.bench == "rollouts":
            other.append(
                f"| {m.bench}: the saves that started them | {fmt(m.clusters)} | "
                f"{fmt(m.policies)} | {fmt(f['save']['p50_s'], 2)} s | "
                f"{fmt(f['save']['p99_s'], 2)} s | {fmt(f['save']['max_s'], 2)} s | "
                f"{rollout_note(f)} |")
        else:
            note = f"{f['samples']} samples"
            if m.bench == "save":
                note += (f"; median CPU per save: daemon {f['daemon_cpu_s']:.2f} s, "
                         f"simulator ({f['sim_processes']} process(es)) {f['sim_cpu_s']:.2f} s"
                         f"; per cluster written: daemon {fmt(f['daemon_cpu_ms_per_write'], 3)}"
                         f" ms, simulator {fmt(f['sim_cpu_ms_per_write'], 3)} ms"
                         f"; results {f['results']}; "
                         + ("notification on too" if f["notify"] else "API only"))
            other.append(
                f"| {m.bench} | {fmt(m.clusters)} | {fmt(m.policies)} | "
                f"{fmt(f['p50_s'], 2)} s | {fmt(f['p99_s'], 2)} s | {fmt(f['max_s'], 2)} s | "
                f"{note} |")
    return "\n".join(rounds) + "\n\n" + "\n".join(other)


def rollout_note(f: dict[str, Any]) -> str:
    """The rollouts' row's notes: where they are, what they added, memory against the budget."""
    where = ", ".join(f"{k} {v}" for k, v in f["states"].items()) or "none"
    added = f["idle_cpu_pp_added"]
    notes = [
        f"{f['live']} of {f['rollouts']} live ({where}; wave "
        + ", ".join(f"{k}: {v}" for k, v in f["waves"].items())
        + f"; held by {', '.join(f['gates'])}), canary {fmt(f['canary_clusters'])} clusters, "
        f"gate every {f['gate_period_s']:g} s",
        f"idle CPU {fmt(f['idle_cpu_pct_without'])}% without, {fmt(f['idle_cpu_pct_with'])}% "
        f"with ({'?' if added is None else format(added, '+.1f')} points)",
        f"in-sync round daemon CPU {fmt(f['round_daemon_cpu_s_without'], 2)} s without, "
        f"{fmt(f['round_daemon_cpu_s_with'], 2)} s with; wall "
        f"{fmt(f['round_wall_s_without'], 2)} s, {fmt(f['round_wall_s_with'], 2)} s",
        f"RSS {fmt(f['rss_mb_without'])} -> {fmt(f['rss_mb'])} MB, peak {fmt(f['peak_rss_mb'])} MB",
    ]
    b = f["budget"]
    if b is not None:
        notes.append(f"budget: {b['overlay']}'s limit {b['limit_mib']:,} MiB (sized for a peak "
                     f"of {b['sized_for_peak_mib']:,}), peak {b['peak_share_of_limit']:.0%} of it")
    logged = {k: v for k, v in f["gate_log"].items() if v}
    notes.append(f"gate job logged {logged or 'nothing'}")
    notes.append(f"saves' results {f['save']['results']}, daemon CPU {f['save']['daemon_cpu_s']} s")
    return "; ".join(notes)


def header(args: argparse.Namespace) -> str:
    return (
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {_git_commit()}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}; "
        f"`convergerd run`, the simulator, PostgreSQL and this bench as separate processes on "
        f"the same machine; the daemon's settings are its defaults but the round interval"
        + (f" plus {', '.join(args.env)}" if args.env else "") + "."
    )


# --- the command -------------------------------------------------------------------------------


def _points(text: str, default_interval: float) -> list[Point]:
    points = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)x(\d+)(?:@(\d+(?:\.\d+)?))?\s*", item)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise argparse.ArgumentTypeError(
                f"expected CLUSTERSxPOLICIES[@INTERVAL_S], got {item!r}")
        interval = float(m.group(3)) if m.group(3) else default_interval
        points.append(Point(int(m.group(1)), int(m.group(2)), interval))
    return points


def _save_points(text: str, interval_s: float) -> list[Point]:
    points = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        if not item.isdigit() or int(item) < 1:
            raise argparse.ArgumentTypeError(f"--save-points: expected CLUSTERS, got {item!r}")
        points.append(Point(int(item), 1, interval_s, saves_only=True))
    return points


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--points", default=None,
                        help="CLUSTERSxPOLICIES[@INTERVAL_S], comma-separated "
                             f"(default {DEFAULT_POINTS}, none with --save-points)")
    parser.add_argument("--save-points", default="", metavar="CLUSTERS,...",
                        help="after the points, save-latency points: per fleet size one "
                             "policy covering every cluster, one create round, then --saves "
                             "timed saves (e.g. 5000,10000)")
    parser.add_argument("--save-interval-s", type=float, default=SAVE_POINT_INTERVAL_S,
                        help="the round interval of save points (default "
                             f"{SAVE_POINT_INTERVAL_S:g}: no round while the saves run; shorter "
                             "lets a create round cut short continue sooner)")
    parser.add_argument("--interval-s", type=float, default=45.0,
                        help="round interval of points without @INTERVAL_S (default 45); must "
                             "leave --settle seconds after each round")
    parser.add_argument("--in-sync-rounds", type=int, default=3)
    parser.add_argument("--sim-processes", type=int, default=1, metavar="K",
                        help="split the fleet over K simulator processes (when one simulator "
                             "is the bottleneck and there are cores for more)")
    parser.add_argument("--pin", action="store_true",
                        help="the daemon on a core of its own, the simulator(s) on the others "
                             "(the clusters' CPU no longer competes with the daemon's)")
    parser.add_argument("--max-create-rounds", type=int, default=10,
                        help="rounds cut by their deadline before giving up on being in sync")
    parser.add_argument("--status-clients", type=int, default=20,
                        help="clients polling /status during one more in-sync round (0: none)")
    parser.add_argument("--hung-share", type=float, default=0.1,
                        help="share of the clusters hung in the degraded round (0: none)")
    parser.add_argument("--down-probes", type=int, default=3,
                        help="clusters set down, one at a time, to time detection (0: none)")
    parser.add_argument("--saves", type=int, default=5, help="timed saves (0: none)")
    parser.add_argument("--save-pause", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--save-notify", action="store_true",
                        help="write the changed rule with the notification trigger on: the "
                             "leader fans it out too, concurrently with the API's save")
    parser.add_argument("--rollouts", type=int, default=0, metavar="N",
                        help="at the end of each point, N policies saved with a strategy in "
                             "waves: N rollouts in progress, then in-sync rounds, idle CPU, "
                             "RSS against the memory budget, the rollouts' states (0: none)")
    parser.add_argument("--rollout-rounds", type=int, default=2, metavar="K",
                        help="in-sync rounds measured with the rollouts in progress (default 2)")
    parser.add_argument("--rollout-canary-share", type=float, default=0.01, metavar="SHARE",
                        help="share of the clusters labelled ring: canary, the first wave "
                             "the gate job judges at every look (default 0.01)")
    parser.add_argument("--settle", type=float, default=11.0, metavar="SECONDS",
                        help="wait after a round is recorded before reading the statistics "
                             "(PostgreSQL flushes them within 10 s; default 11)")
    parser.add_argument("--no-walinspect", dest="walinspect", action="store_false",
                        help="do not separate this database's WAL with pg_walinspect")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a daemon setting, e.g. CONVERGERD_PROBE_PERIOD_SECONDS=20")
    parser.add_argument("--database-url", default=DEFAULT_SERVER,
                        help="a PostgreSQL server where a database may be created "
                             f"(default {DEFAULT_SERVER})")
    parser.add_argument("--keep-workdir", action="store_true",
                        help="keep the work directory (the daemon's and simulator's logs)")
    parser.add_argument("--markdown-out", type=Path, default=None)
    parser.add_argument("--status-load", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.status_load is None:
        try:
            points = args.points or ("" if args.save_points else DEFAULT_POINTS)
            args.point_list = ((_points(points, args.interval_s) if points else [])
                               + _save_points(args.save_points, args.save_interval_s))
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        bad = [kv for kv in args.env if "=" not in kv]
        if bad:
            parser.error(f"--env expects NAME=VALUE, got {bad}")
        if args.rollouts < 0 or args.rollout_rounds < 1:
            parser.error("--rollouts must be 0 or more, --rollout-rounds 1 or more")
        if not 0 < args.rollout_canary_share <= 1:
            parser.error("--rollout-canary-share must be in (0, 1]")
        few = [pt for pt in args.point_list if not pt.saves_only and pt.policies <= args.rollouts]
        if few:
            parser.error(f"--rollouts {args.rollouts} needs more policies per point (p000 is "
                         f"not one of them): {few[0].clusters}x{few[0].policies}")
    return args


async def main_async(args: argparse.Namespace) -> list[Measurement]:
    results: list[Measurement] = []
    for point in args.point_list:
        if args.keep_workdir:
            workdir = Path(tempfile.mkdtemp(prefix="convergerd-benchd-"))
            await bench_point(point, args, results, workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="convergerd-benchd-") as tmp:
                await bench_point(point, args, results, Path(tmp))
    return results


def _terminate(signum: int, _frame: object) -> None:
    # Unwind like Ctrl-C, so every `finally` runs: daemon, simulator and database go.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.status_load is not None:
        eventloop.run(status_load(args.status_load, args.status_clients))
        return 0
    # Both unwind at once from wherever the loop is (not asyncio.Runner's cancel-first SIGINT
    # handler, whose cancellation was seen lost here); a background job may start with SIGINT
    # ignored: Ctrl-C / kill -INT should still stop us.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    results = eventloop.run(main_async(args))
    table = markdown(results)
    print()
    print(table, flush=True)
    if args.markdown_out is not None:
        args.markdown_out.write_text(f"{header(args)}\n\n{table}\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
