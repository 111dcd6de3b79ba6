"""Round benchmark: figures, not a test.

    .venv/bin/python bench/rounds.py [--clusters 10,100,1000] [--policies 10,100] [--quick]

For every (clusters, policies) point of the matrix, in one run:

1. start the fleet simulator in its own process (`convergerd sim`), wait on its admin API;
2. build a `Fleet` in memory (no database): N clusters, P delivered policies spread over a
   few boundaries that each cover every cluster, mixed rule types, plus one control-plane
   policy per boundary that must never reach a cluster;
3. `create`: a first round through the daemon's own wiring (`ClusterRegistry` over the sim's
   kubeconfig, `call_with_retries`, `NoElection().fence()`, `rounds.round_env` limits,
   `Metrics` as the request observer) that creates N x P objects;
4. `in-sync`: the same round again; zero writes and exactly one list per cluster are checked
   (from the simulator's `/_sim/stats`), the run fails otherwise;
5. `down-10%` and `hang-10%`: an in-sync round with every tenth cluster down / hung and a
   short request timeout, against the healthy in-sync round;
6. `bare-aiohttp`: the ceiling - the same number of server-side-apply PATCH requests, same
   bodies (other names), same TLS, same concurrency, sent by plain aiohttp to the same
   simulator; `ratio` = convergerd create applies/s / bare PATCH/s;
7. stop the simulator (also on error).

One JSON line per measurement on stdout, then a Markdown table. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime as dt
import gc
import json
import os
import platform
import pstats
import resource
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from convergerd import eventloop
from convergerd.config import SETTINGS_BY_KEY, Settings, load_settings
from convergerd.core.model import (
    Boundary,
    BoundaryId,
    Cluster,
    ClusterId,
    Fleet,
    Policy,
    PolicyId,
    parse_rule,
)
from convergerd.core.render import (
    FIELD_MANAGER,
    GROUP,
    MANAGED_BY_LABEL,
    PLURAL,
    VERSION,
    render_policy,
)
from convergerd.core.report import RoundReport
from convergerd.core.rollout import Rollout, Staged, State, parse_strategy, placements_for
from convergerd.delivery.converge import run_round
from convergerd.delivery.rounds import round_env
from convergerd.kube.client import APPLY_CONTENT_TYPE
from convergerd.kube.kubeconfig import load_kubeconfig
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import NoElection
from convergerd.sim.fleet import member_ids
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState

BOUNDARIES = 4
FAULT_SHARE = 10  # every tenth cluster
SIM_READY_TIMEOUT_S = 120.0
SIM_STOP_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 0.05
ADMIN_TIMEOUT_S = 30.0
BARE_LABEL_VALUE = "bench-bare"  # the ceiling's objects stay out of the round's list
MB = 1024 * 1024


def log(message: str, *args: object) -> None:
    print(message % args if args else message, file=sys.stderr, flush=True)


# --- the simulator process ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sim:
    """`convergerd sim` in its own process; loopback only."""

    proc: subprocess.Popen[bytes]
    admin_url: str
    kubeconfig: Path
    log_path: Path

    @classmethod
    def start(cls, clusters: int, workdir: Path) -> Sim:
        port = _free_port()
        kubeconfig = workdir / "kubeconfig"
        log_path = workdir / "sim.log"
        args = [
            sys.executable, "-m", "convergerd", "sim",
            "--clusters", str(clusters),
            "--listen", f"127.0.0.1:{port}",
            "--kubeconfig-out", str(kubeconfig),
        ]
        with log_path.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        sim = cls(proc, f"http://127.0.0.1:{port}", kubeconfig, log_path)
        try:
            sim._wait_ready()
        except BaseException:
            sim.stop()
            raise
        return sim

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + SIM_READY_TIMEOUT_S
        while True:  # bounded by the deadline
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sim exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            with contextlib.suppress(OSError):
                status, _ = self.admin("GET", "/_sim/healthz")
                if status == 200 and self.kubeconfig.exists():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"sim not ready after {SIM_READY_TIMEOUT_S:g} s")
            time.sleep(POLL_INTERVAL_S)

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        # Always the http://127.0.0.1 address built above.
        req = urllib.request.Request(self.admin_url + path, data=data, method=method)  # noqa: S310
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=ADMIN_TIMEOUT_S) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def stats(self) -> dict[str, dict[str, int]]:
        status, doc = self.admin("GET", "/_sim/stats")
        if status != 200:
            raise RuntimeError(f"/_sim/stats answered {status}: {doc}")
        clusters: dict[str, dict[str, int]] = doc["clusters"]
        return clusters

    def reset_stats(self) -> None:
        self.admin("DELETE", "/_sim/stats")

    def set_faults(self, cluster: str, faults: dict[str, Any] | None) -> None:
        path = f"/_sim/clusters/{cluster}/faults"
        status, doc = self.admin("DELETE", path) if faults is None else self.admin(
            "POST", path, faults
        )
        if status != 200:
            raise RuntimeError(f"faults for {cluster}: {status} {doc}")

    def peak_rss_mb(self) -> float:
        return proc_status_mb(self.proc.pid, "VmHWM")

    def cpu_s(self) -> float:
        """User + system CPU seconds the simulator has used so far."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        # After "(comm)": state is field 3, utime and stime are fields 14 and 15.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(SIM_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proc_status_mb(pid: int | str, field: str) -> float:
    """A size field of `/proc/PID/status` (`VmRSS`, `VmHWM`; `pid` may be "self") in MB; NaN
    when the process is gone or has no such field."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / MB
    return float("nan")


def _rss(sim: Sim) -> dict[str, float]:
    return {
        "bench_rss_mb": round(bench_peak_rss_mb(), 1),
        "sim_rss_mb": round(sim.peak_rss_mb(), 1),
    }


def bench_peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux; the peak of the whole run so far (the matrix ascends).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


# --- a database of its own (soak, status load, the whole daemon) -------------------------------


@contextlib.asynccontextmanager
async def fresh_database(server_dsn: str, prefix: str, *, migrated: bool
                         ) -> AsyncIterator[tuple[str, str]]:
    """A new database `<prefix>_<pid>_<hex>` on the server, migrated or empty, dropped
    afterwards whatever happens: (its dsn, its name)."""
    from convergerd.store.schema import migrate

    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(server_dsn, timeout=10)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        dsn = urllib.parse.urlunsplit(urllib.parse.urlsplit(server_dsn)._replace(path="/" + name))
        if migrated:
            await migrate(dsn)
        yield dsn, name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


# --- the fleet, in memory ----------------------------------------------------------------------

_RULES: tuple[dict[str, Any], ...] = (
    {"type": "ForbidLatestTag"},
    {"type": "AllowedRegistries", "registries": ["registry.example.com", "ghcr.io/stackship"]},
    {"type": "RequiredLabels", "labels": ["team", "app.kubernetes.io/name"]},
)


def build_fleet(clusters: int, policies: int) -> Fleet:
    """`clusters` member clusters; `policies` delivered policies, each cluster covered by all
    of them (boundary i % BOUNDARIES covers every cluster), rule types mixed; plus one
    `AllowedComputePlans` policy per boundary, which a round must never deliver."""
    ids = frozenset(ClusterId(c) for c in member_ids(clusters))
    boundaries = {
        BoundaryId(f"team-{b}"): Boundary(BoundaryId(f"team-{b}"), ids) for b in range(BOUNDARIES)
    }
    names = list(boundaries)
    delivered = [
        Policy(
            id=PolicyId(f"p{i:04d}"),
            boundary=names[i % len(names)],
            rule=parse_rule(_RULES[i % len(_RULES)]),
            enabled=i % 7 != 0,
            revision=1,
        )
        for i in range(policies)
    ]
    plans = [
        Policy(
            id=PolicyId(f"plans-{b}"),
            boundary=b,
            rule=parse_rule({"type": "AllowedComputePlans", "plans": ["standard"]}),
            enabled=True,
            revision=1,
        )
        for b in names
    ]
    return Fleet(
        clusters=[Cluster(c) for c in sorted(ids)],
        boundaries=boundaries,
        policies=delivered + plans,
        invalid=[],
    )


# Three waves by fraction; the bench's rollouts are in the second, so a cluster is due the new
# revision (10% + 40% of them) or the one before.
_BENCH_STRATEGY = parse_strategy({"id": "bench", "waves": [
    {"name": "canary", "fraction": 0.1}, {"name": "half", "fraction": 0.5},
    {"name": "rest", "fraction": 1.0}]})


def with_rollouts(fleet: Fleet, count: int) -> Fleet:
    """`fleet` with its first `count` delivered policies at revision 2 under a rollout in its
    second wave (`core.rollout`, as `store.rollouts` builds it for a round): each cluster due
    revision 2 or revision 1."""
    if count <= 0:
        return fleet
    delivered = [p for p in fleet.policies if p.rule.delivered]
    chosen = {p.id for p in delivered[:count]}
    policies = [dataclasses.replace(p, revision=2) if p.id in chosen else p
                for p in fleet.policies]
    staged: dict[PolicyId, dict[ClusterId, Policy | None]] = {}
    ids = [c.id for c in fleet.clusters]
    for policy in policies:
        if policy.id not in chosen:
            continue
        rollout = Rollout(id=len(staged) + 1, policy=policy.id, to_revision=2, from_revision=1,
                          strategy=_BENCH_STRATEGY, state=State.PROGRESSING, wave=1)
        placements = placements_for(_BENCH_STRATEGY, ids, lambda _c: {}, lambda _c: 1)
        contents = {1: dataclasses.replace(policy, revision=1), 2: policy}
        staged[policy.id] = Staged(rollout, placements, contents).policies()
    return dataclasses.replace(fleet, policies=policies, staged=staged)


# --- the product's round, wired like the daemon ------------------------------------------------


@dataclass(frozen=True)
class Limits:
    cluster_concurrency: int
    apply_concurrency: int
    request_timeout_s: float
    fault_timeout_s: float
    qps: float
    burst: int
    interval_minutes: float
    fault_rounds: bool = True  # the down/hang rounds and the bare-aiohttp ceiling after in-sync
    rollouts: int = 0  # policies delivered per cluster by a rollout (`with_rollouts`)

    def settings(self, kubeconfig: Path, *, request_timeout_s: float | None = None) -> Settings:
        flags = {
            "kubeconfig": str(kubeconfig),
            "leader_election": "false",
            "identity": "bench",
            "cluster_concurrency": str(self.cluster_concurrency),
            "apply_concurrency": str(self.apply_concurrency),
            "request_timeout_s": str(request_timeout_s or self.request_timeout_s),
            "cluster_qps": str(self.qps),
            "cluster_burst": str(self.burst),
            "interval_minutes": str(self.interval_minutes),
        }
        return load_settings({}, flags)


@dataclass
class Measurement:
    bench: str
    clusters: int
    policies: int
    wall_s: float
    fields: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "bench": self.bench,
            "clusters": self.clusters,
            "policies": self.policies,
            "wall_s": round(self.wall_s, 3),
            **self.fields,
            # Other work on the machine skews wall times: keep the load next to the figure.
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }


class GcTime:
    """A `gc.callbacks` hook: seconds spent in garbage collections, and how many were full."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info.get("generation") == 2  # the oldest generation


# The garbage collections of the last `timed_round` (seconds, full ones), for its record.
LAST_GC: dict[str, Any] = {}


async def timed_round(
    fleet: Fleet, settings: Settings, registry: ClusterRegistry, metrics: Metrics,
    profile: Path | None = None,
) -> tuple[RoundReport, float, float]:
    """The report, wall seconds, and this process's CPU seconds of one round."""
    env = round_env(
        settings, registry, NoElection(identity="bench").fence(), metrics,
        deadline_s=settings.rounds.deadline_s,
    )
    profiler = cProfile.Profile() if profile is not None else None
    collections = GcTime()
    started, cpu = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    gc.callbacks.append(collections)
    try:
        report = await run_round(fleet, env)
    finally:
        gc.callbacks.remove(collections)
        if profiler is not None:
            profiler.disable()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    LAST_GC.update(gc_s=round(collections.seconds, 2), gc_full=collections.full)
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
        _print_hotspots(profile)
    return report, wall, cpu


def _print_hotspots(path: Path, top: int = 25) -> None:
    """The profile's top functions by own time, and convergerd's own by cumulative time."""
    with contextlib.redirect_stdout(sys.stderr):
        log("--- profile %s: top %d by own time", path, top)
        pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)
        log("--- profile %s: convergerd's own code by cumulative time", path)
        pstats.Stats(str(path)).sort_stats("cumulative").print_stats(r"convergerd/", top)


def _report_fields(report: RoundReport) -> dict[str, Any]:
    counts = report.counts()
    return {k: counts[k] for k in ("converged", "unreached", "created", "updated", "failed")}


def _request_fields(
    stats: dict[str, dict[str, int]], clusters: Sequence[str]
) -> dict[str, Any]:
    n = max(1, len(clusters))
    lists = sum(stats[c]["list"] for c in clusters)
    patches = sum(stats[c]["patch"] for c in clusters)
    total = sum(stats[c]["total"] for c in clusters)
    return {
        "requests": total,
        "requests_per_cluster": round(total / n, 3),
        "lists_per_cluster": round(lists / n, 3),
        "patches": patches,
    }


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(f"benchmark check failed: {message}")


# --- the ceiling: bare aiohttp -----------------------------------------------------------------


def _client_context(ca_pem: bytes | None) -> ssl.SSLContext:
    """What convergerd's shared contexts are: TLS >= 1.2, HTTP/1.1, verify against the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    if ca_pem is not None:
        ctx.load_verify_locations(cadata=ca_pem.decode("ascii"))
    return ctx


def _bare_bodies(fleet: Fleet) -> dict[ClusterId, list[dict[str, Any]]]:
    """The round's apply bodies for each cluster, renamed and relabelled so the ceiling
    creates new objects of the same size the round's list never sees."""
    out: dict[ClusterId, list[dict[str, Any]]] = {}
    for cluster, policies in fleet.desired_by_cluster().items():
        bodies = []
        for policy in policies:
            body = render_policy(policy)
            body["metadata"]["name"] = "bare-" + body["metadata"]["name"]
            body["metadata"]["labels"][MANAGED_BY_LABEL] = BARE_LABEL_VALUE
            bodies.append(body)
        out[cluster] = bodies
    return out


async def bare_patches(
    kubeconfig: Path, bodies: dict[ClusterId, list[dict[str, Any]]], limits: Limits
) -> tuple[int, int, float]:
    """PATCH (server-side apply) every body with plain aiohttp: one session per cluster,
    `cluster_concurrency` clusters and `apply_concurrency` requests per cluster at once.
    Returns (answers 2xx, other answers, seconds)."""
    config = load_kubeconfig(kubeconfig)
    contexts: dict[bytes | None, ssl.SSLContext] = {}
    creds = {c: config.credentials(c) for c in bodies}
    for cred in creds.values():
        if cred.ca_pem not in contexts:
            contexts[cred.ca_pem] = _client_context(cred.ca_pem)
    gate = asyncio.Semaphore(limits.cluster_concurrency)
    ok = bad = 0
    query = {"fieldManager": FIELD_MANAGER, "force": "true"}
    timeout = aiohttp.ClientTimeout(total=limits.request_timeout_s)

    async def one_cluster(cluster: ClusterId) -> None:
        nonlocal ok, bad
        cred = creds[cluster]
        base = f"{cred.server}/apis/{GROUP}/{VERSION}/{PLURAL}/"
        headers = {
            "Authorization": f"Bearer {cred.token}",
            "Content-Type": APPLY_CONTENT_TYPE,
            "Accept": "application/json",
            "User-Agent": "bench-bare-aiohttp",
        }
        todo = iter(bodies[cluster])
        async with gate:
            connector = aiohttp.TCPConnector(
                limit=limits.apply_concurrency + 2, ssl=contexts[cred.ca_pem]
            )
            async with aiohttp.ClientSession(
                connector=connector, trust_env=False, timeout=timeout
            ) as session:

                async def worker() -> None:
                    nonlocal ok, bad
                    for body in todo:  # shared iterator: each body sent once
                        url = base + body["metadata"]["name"]
                        data = json.dumps(body).encode()
                        async with session.patch(
                            url, data=data, headers=headers, params=query
                        ) as resp:
                            await resp.read()
                            if resp.status < 300:
                                ok += 1
                            else:
                                bad += 1

                await asyncio.gather(*(worker() for _ in range(limits.apply_concurrency)))

    started = time.perf_counter()
    await asyncio.gather(*(one_cluster(c) for c in bodies))
    return ok, bad, time.perf_counter() - started


async def warm_up(kubeconfig: Path, clusters: Sequence[str], limits: Limits) -> None:
    """One list of Policy objects per cluster in a throwaway session (untimed)."""
    config = load_kubeconfig(kubeconfig)
    gate = asyncio.Semaphore(limits.cluster_concurrency)
    contexts: dict[bytes | None, ssl.SSLContext] = {}

    async def one(cluster: str) -> None:
        cred = config.credentials(cluster)
        ctx = contexts.get(cred.ca_pem) or contexts.setdefault(
            cred.ca_pem, _client_context(cred.ca_pem)
        )
        url = f"{cred.server}/apis/{GROUP}/{VERSION}/{PLURAL}"
        async with (
            gate,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx), trust_env=False,
                timeout=aiohttp.ClientTimeout(total=limits.request_timeout_s),
            ) as session,
            session.get(url, headers={"Authorization": f"Bearer {cred.token}"}) as resp,
        ):
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"warm-up list on {cluster}: {resp.status}")

    await asyncio.gather(*(one(c) for c in clusters))


# --- one matrix point --------------------------------------------------------------------------


def emit(m: Measurement, out: list[Measurement]) -> None:
    out.append(m)
    print(json.dumps(m.as_json()), flush=True)


async def bench_point(
    clusters: int, policies: int, *, limits: Limits, workdir: Path, out: list[Measurement],
    profile_dir: Path | None,
) -> None:
    log("== %d clusters x %d policies: starting the simulator", clusters, policies)
    sim = Sim.start(clusters, workdir)
    try:
        await _bench_point(
            sim, clusters, policies, limits=limits, out=out, profile_dir=profile_dir
        )
    finally:
        sim.stop()


async def _bench_point(
    sim: Sim, clusters: int, policies: int, *, limits: Limits, out: list[Measurement],
    profile_dir: Path | None,
) -> None:
    fleet = with_rollouts(build_fleet(clusters, policies), limits.rollouts)
    ids = [c.id for c in fleet.clusters]
    settings = limits.settings(sim.kubeconfig)
    state = StatusState(identity="bench", interval_s=settings.rounds.interval_s)
    metrics = Metrics(state=state, process_collectors=False)  # the requests' observer
    registry = ClusterRegistry(
        kubeconfig=sim.kubeconfig, access=settings.clusters, identity="bench", observer=metrics
    )
    n, p = clusters, policies

    def profile(name: str) -> Path | None:
        return profile_dir / f"{n}x{p}-{name}.pstats" if profile_dir is not None else None

    try:
        # The simulator builds a cluster's store on first use: do that untimed, with plain
        # aiohttp, so neither the round nor the ceiling pays for it.
        await warm_up(sim.kubeconfig, ids, limits)

        # (a) the first round: creates everything.
        sim.reset_stats()
        sim_cpu = sim.cpu_s()
        report, wall, cpu = await timed_round(
            fleet, settings, registry, metrics, profile("create")
        )
        sim_cpu = sim.cpu_s() - sim_cpu
        fields = _report_fields(report)
        _check(fields["created"] == n * p and fields["converged"] == n,
               f"create round: {fields}, expected {n * p} created on {n} clusters")
        create_rate = fields["created"] / wall
        emit(Measurement("create", n, p, wall, {
            "objects": n * p, **fields, "applies_per_s": round(create_rate, 1),
            "bench_cpu_s": round(cpu, 2), "sim_cpu_s": round(sim_cpu, 2), **LAST_GC,
            **_request_fields(sim.stats(), ids),
            **_rss(sim),
        }), out)

        # (b) in sync: no writes, one list per cluster.
        sim.reset_stats()
        report, in_sync_wall, cpu = await timed_round(
            fleet, settings, registry, metrics, profile("in-sync")
        )
        fields = _report_fields(report)
        requests = _request_fields(sim.stats(), ids)
        _check(fields["created"] + fields["updated"] == 0 and requests["patches"] == 0,
               f"in-sync round wrote: {fields}, {requests}")
        _check(requests["requests_per_cluster"] == 1 and requests["lists_per_cluster"] == 1,
               f"in-sync round: expected one list per cluster, got {requests}")
        _check(fields["converged"] == n, f"in-sync round: {fields}")
        emit(Measurement("in-sync", n, p, in_sync_wall, {
            "objects": n * p, **fields, **requests, "bench_cpu_s": round(cpu, 2), **LAST_GC,
            **_rss(sim),
        }), out)
        if not limits.fault_rounds:
            return

        # (c) 10% of clusters down, then 10% hung: one timeout each, the others undelayed.
        faulty = ids[FAULT_SHARE - 1 :: FAULT_SHARE]
        fault_settings = limits.settings(sim.kubeconfig, request_timeout_s=limits.fault_timeout_s)
        for name, faults in (("down", {"down": True}), ("hang", {"hang": True})):
            if not faulty:
                break
            for c in faulty:
                sim.set_faults(c, faults)
            sim.reset_stats()
            try:
                report, wall, _ = await timed_round(fleet, fault_settings, registry, metrics)
            finally:
                for c in faulty:
                    sim.set_faults(c, None)
            emit(_fault_measurement(
                f"{name}-10%", n, p, wall=wall, report=report, stats=sim.stats(),
                faulty=faulty, in_sync_wall=in_sync_wall, limits=limits,
            ), out)

        # (d) the ceiling: the same PATCHes, bare aiohttp, same simulator.
        sim.reset_stats()
        bodies = _bare_bodies(fleet)
        cpu, sim_cpu = time.process_time(), sim.cpu_s()
        ok, bad, wall = await bare_patches(sim.kubeconfig, bodies, limits)
        cpu, sim_cpu = time.process_time() - cpu, sim.cpu_s() - sim_cpu
        _check(ok == n * p and bad == 0, f"bare aiohttp: {ok} ok, {bad} not ok of {n * p}")
        bare_rate = ok / wall
        emit(Measurement("bare-aiohttp", n, p, wall, {
            "objects": n * p, "patches": ok, "patches_per_s": round(bare_rate, 1),
            "ratio": round(create_rate / bare_rate, 3),
            "bench_cpu_s": round(cpu, 2), "sim_cpu_s": round(sim_cpu, 2),
            **_rss(sim),
        }), out)
    finally:
        await registry.close()


def _fault_measurement(
    bench: str, n: int, p: int, *, wall: float, report: RoundReport,
    stats: dict[str, dict[str, int]], faulty: Sequence[str], in_sync_wall: float, limits: Limits,
) -> Measurement:
    bad = set(faulty)
    healthy = [c for c in report.clusters if c.cluster not in bad]
    broken = [c for c in report.clusters if c.cluster in bad]
    fields = _report_fields(report)
    _check(fields["converged"] == len(healthy) and fields["unreached"] == len(broken),
           f"{bench}: {fields}, expected {len(healthy)} converged and {len(broken)} unreached")
    return Measurement(bench, n, p, wall, {
        "faulty": len(broken), **fields,
        "request_timeout_s": limits.fault_timeout_s,
        "in_sync_wall_s": round(in_sync_wall, 3),
        "healthy_max_s": round(max((c.duration_s for c in healthy), default=0.0), 3),
        "faulty_max_s": round(max((c.duration_s for c in broken), default=0.0), 3),
        "requests_per_faulty_cluster": round(
            sum(stats[c]["total"] for c in bad) / max(1, len(bad)), 2
        ),
        "reasons": sorted({c.reason or "" for c in broken}),
    })


# --- the table ---------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: thousands separated, floats to `digits` places, None empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(results: Sequence[Measurement]) -> str:
    head = (
        "| bench | clusters | policies | wall s | applies/s | req/cluster | bench CPU s | "
        "sim CPU s | bench RSS MB | sim RSS MB | notes |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    rows = [head]
    for m in results:
        f = m.fields
        rate = f.get("applies_per_s", f.get("patches_per_s"))
        notes = ""
        if m.bench == "create":
            notes = f"{f['created']:,} created"
        elif m.bench == "in-sync":
            notes = f"{f['patches']} writes, {f['lists_per_cluster']:g} list/cluster"
        elif m.bench == "bare-aiohttp":
            notes = f"ceiling; convergerd/bare = {f['ratio']:.2f}"
        elif "faulty" in f:
            notes = (
                f"{f['faulty']} faulty, timeout {f['request_timeout_s']:g} s; healthy in-sync "
                f"round {f['in_sync_wall_s']:.2f} s; slowest healthy cluster "
                f"{f['healthy_max_s']:.2f} s, slowest faulty {f['faulty_max_s']:.2f} s; "
                f"{f['requests_per_faulty_cluster']:g} req/faulty cluster"
            )
        rows.append(
            f"| {m.bench} | {fmt(m.clusters)} | {fmt(m.policies)} | {fmt(m.wall_s, 2)} | "
            f"{fmt(rate)} | {fmt(f.get('requests_per_cluster'), 2)} | "
            f"{fmt(f.get('bench_cpu_s'), 2)} | {fmt(f.get('sim_cpu_s'), 2)} | "
            f"{fmt(f.get('bench_rss_mb'))} | {fmt(f.get('sim_rss_mb'))} | {notes} |"
        )
    return "\n".join(rows)


def _git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def header(limits: Limits) -> str:
    return (
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {_git_commit()}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}; "
        f"cluster concurrency {limits.cluster_concurrency}, apply concurrency "
        f"{limits.apply_concurrency}, QPS {limits.qps:g}/burst {limits.burst} per cluster, "
        f"request timeout {limits.request_timeout_s:g} s ({limits.fault_timeout_s:g} s in the "
        f"fault rounds)"
        + (f"; {limits.rollouts} policies under a rollout (each cluster due revision 1 or 2)"
           if limits.rollouts else "")
        + ". Simulator and bench are separate processes on the same machine."
    )


# --- the command -------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _default(key: str) -> str:
    default = SETTINGS_BY_KEY[key].default
    assert default is not None
    return default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clusters", type=_int_list, default=[10, 100, 1000])
    parser.add_argument("--policies", type=_int_list, default=[10, 100])
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 10x10 and 100x10 only (overrides the matrix)")
    parser.add_argument("--cluster-concurrency", type=int,
                        default=int(_default("cluster_concurrency")))
    parser.add_argument("--apply-concurrency", type=int, default=int(_default("apply_concurrency")))
    parser.add_argument("--request-timeout", type=float,
                        default=float(_default("request_timeout_s")), metavar="SECONDS")
    parser.add_argument("--fault-timeout", type=float, default=2.0, metavar="SECONDS",
                        help="request timeout of the down/hang rounds (default 2)")
    parser.add_argument("--qps", type=float, default=float(_default("cluster_qps")))
    parser.add_argument("--burst", type=int, default=int(_default("cluster_burst")))
    parser.add_argument("--interval-minutes", type=float,
                        default=float(_default("interval_minutes")),
                        help="the round deadline is 0.8 of it, as in the daemon (default 5)")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="cProfile the create and in-sync rounds into DIR (slows them)")
    parser.add_argument("--gc-threshold", type=int, default=None, metavar="N",
                        help="experiment: gc.set_threshold(N, 10, 10) before the rounds (the "
                             "processes run with convergerd.eventloop.GC_GEN0_THRESHOLD; 700 "
                             "is CPython's default)")
    parser.add_argument("--no-faults", action="store_true",
                        help="only the create and in-sync rounds (no down/hang rounds, no "
                             "bare-aiohttp ceiling)")
    parser.add_argument("--rollouts", type=int, default=0, metavar="N",
                        help="the first N policies delivered per cluster by a rollout in its "
                             "second wave (rounds with rollouts in force)")
    parser.add_argument("--markdown-out", type=Path, default=None,
                        help="also write the table (with a header line) to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.clusters, args.policies = [10, 100], [10]
    return args


async def main_async(args: argparse.Namespace) -> list[Measurement]:
    limits = Limits(
        cluster_concurrency=args.cluster_concurrency,
        apply_concurrency=args.apply_concurrency,
        request_timeout_s=args.request_timeout,
        fault_timeout_s=args.fault_timeout,
        qps=args.qps,
        burst=args.burst,
        interval_minutes=args.interval_minutes,
        fault_rounds=not args.no_faults,
        rollouts=args.rollouts,
    )
    results: list[Measurement] = []
    if args.gc_threshold is not None:
        gc.set_threshold(args.gc_threshold, 10, 10)
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    for n, p in _matrix(args.clusters, args.policies):
        with tempfile.TemporaryDirectory(prefix="convergerd-bench-") as tmp:
            await bench_point(
                n, p, limits=limits, workdir=Path(tmp), out=results,
                profile_dir=args.profile_dir,
            )
    table = markdown(results)
    print()
    print(table, flush=True)
    if args.markdown_out is not None:
        args.markdown_out.write_text(f"{header(limits)}\n\n{table}\n", encoding="utf-8")
    return results


def _matrix(clusters: Sequence[int], policies: Sequence[int]) -> Iterator[tuple[int, int]]:
    for n in sorted(set(clusters)):
        for p in sorted(set(policies)):
            yield n, p


def _terminate(signum: int, _frame: object) -> None:
    # Unwind like Ctrl-C, so every `finally` runs and the simulator is stopped.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    # A background job may start with SIGINT ignored: Ctrl-C / kill -INT should still stop us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    eventloop.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
