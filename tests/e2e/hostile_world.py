"""A small fleet with one hostile cluster, a real `convergerd run`, and the invariants every
answer of that cluster must leave true (tests/e2e/test_hostile_grammar.py asserts them,
bench/hostile_soak.py runs them for minutes and prints what it sees).

The simulator runs in this process (its stores are read directly: what a cluster holds is not
asked of the cluster that may lie about it); the daemon is `convergerd run` in a process of its
own, so its RSS and its event loop are its own. Four members, `c0004` the hostile one, two
shards (so the daemon lists the Leases of its namespace and garbage ones there count), three
policies. A case:

1. make `c0004` hostile (one `hostile` mode with its parameters) or write garbage Leases next
   to the daemon's in `home`, then raise the revision of one policy (an UPDATE, as
   module-policies writes: every cluster has an apply to do, in the save it starts and in the
   rounds);
2. wait until every healthy member converged at the new revision after the case began, and
   at least `MIN_CASE_S` (two rounds of the hostile cluster's answers);
3. check the invariants (`Invariants`), clear the fault, delete the garbage, and wait for
   `c0004` to converge again.

A plain-http server (`PlainTarget`) stands where a redirect may send the daemon: it answers
like an apiserver that accepts everything, and records every request with its headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from convergerd.sim.faults import Faults
from convergerd.sim.fleet import HOME, Fleet
from convergerd.sim.resources import LEASES, POLICIES
from convergerd.sim.status import ApiError
from convergerd.store.importer import apply_plan, parse_import
from tests.e2e.harness import CONVERGERD, TIMINGS, stop_gently
from tests.fixtures.fleet import free_port

MiB = 2**20
HOSTILE = "c0004"
HEALTHY = ("c0001", "c0002", "c0003")
MEMBERS = (*HEALTHY, HOSTILE)
POLICY_IDS = ("no-latest", "labels", "registries")
BUMPED = "labels"  # the policy whose revision every case raises
SHARDS = 2
IDENTITY = "hostile-test"
LEASE_NS = "stackship-system"
INTERVAL_S = 1.2  # harness.INTERVAL_MINUTES
PROBE_S = 1.0
# RSS budget of the daemon process (VmHWM, the peak, reset before every case): at rest with
# four clusters it measures ~95 MB (2026-12-06); the response cap is 16 MiB, and the daemon
# reads one answer per cluster at once (4 x 16 MiB) plus what decoding one builds. What is
# above this is an answer's size amplified in memory (`{}` x 5 million is ~400 MB).
RSS_BUDGET_MB = 250.0
# The healthy members' rounds: every 1.2 s with a deadline of 0.96 s; a case gives them this
# long to converge at the new revision (a busy 2-core machine included).
CASE_S = 12.0
MIN_CASE_S = 2.5  # two rounds of the hostile cluster's answers at least
RECOVER_S = 15.0  # c0004 converges again once the fault is cleared
STARTUP_S = 40.0
POLL_S = 0.2

TENANTS: dict[str, Any] = {
    "clusters": [{"id": c} for c in MEMBERS],
    "boundaries": [{"id": "everyone", "clusters": list(MEMBERS)}],
    "policies": [
        {"id": "no-latest", "boundary": "everyone", "rule": {"type": "ForbidLatestTag"}},
        {"id": "labels", "boundary": "everyone",
         "rule": {"type": "RequiredLabels", "labels": ["team"]}},
        {"id": "registries", "boundary": "everyone",
         "rule": {"type": "AllowedRegistries", "registries": ["registry.example.com"]}},
    ],
}

# The grammar: mode -> parameter -> the values a case draws from. `to` of `redirect` is not a
# fault parameter: `World.fault` turns it into `cluster` or `location`.
GRAMMAR: dict[str, dict[str, tuple[Any, ...]]] = {
    "controlChars": {},
    "wrongTypes": {"fields": (("status.phase",), ("items",), ("metadata.labels", "spec"))},
    "invalidJson": {},
    "oversized": {"bytes": (32 * MiB,)},
    "trickle": {"bytesPerSecond": (10, 10_000)},
    "amplification": {"bytes": (MiB, 4 * MiB, 15 * MiB),
                      "shape": ("objects", "bracketStrings")},
    "deepNesting": {"depth": (2_000, 100_000, 1_000_000)},
    "endlessContinue": {},
    "overLimit": {"factor": (10, 100)},
    "redirect": {"status": (302, 307),
                 "to": ("self", "home", "c0001", "plain-http", "other-https")},
    "wrongObject": {"change": ("kind", "name", "revision")},
    "wrongList": {"shape": ("noItems", "otherKind")},
    "hugeVersion": {"bytes": (MiB, 15 * MiB), "field": ("gitVersion", "extra")},
    "hugeHeaders": {"bytes": (64 * 1024, MiB), "headerBytes": (4096, 16384)},
    "hugeValues": {"bytes": (64 * 1024, MiB),
                   "fields": (("metadata.labels",), ("metadata.annotations",),
                              ("status.conditions",),
                              ("metadata.labels", "metadata.annotations",
                               "status.conditions"))},
    # Not a fault of c0004: Leases in home next to the daemon's (`GARBAGE_LEASES`).
    "garbageLeases": {"leases": (("ghost",), ("big",), ("forever",),
                                 ("ghost", "big", "forever"))},
}
# Not in the grammar: no fault at all, the control a harness change is checked with.
HEALTHY_CASE = "healthy"
MAX_INT32 = 2**31 - 1
# Leases nobody renews, as another writer of the namespace could leave them: the membership
# Lease of a replica that does not exist, with the longest duration the API accepts (counted
# live forever, it would take a fair share of the shards for good), a shard Lease beyond the
# configured shards whose holder is 1 MiB long, and an unrelated Lease held for 68 years.
# (A member Lease with an ordinary duration that is never renewed is a replica that died: it
# is counted for one duration, by design, and is not garbage.)
GARBAGE_LEASES: dict[str, dict[str, Any]] = {
    "ghost": {"name": "convergerd-member-ghost",
              "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": MAX_INT32}},
    "big": {"name": "convergerd-shard-9",
            "spec": {"holderIdentity": "h" * MiB, "leaseDurationSeconds": 15}},
    "forever": {"name": "something-else",
                "spec": {"holderIdentity": "nobody", "leaseDurationSeconds": MAX_INT32}},
}


@dataclass(frozen=True)
class Case:
    """One draw of the grammar: a mode and its parameters."""

    mode: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, mode: str, params: Mapping[str, Any]) -> Case:
        return cls(mode, tuple(sorted(params.items())))

    def param(self, name: str) -> Any:
        return dict(self.params)[name]

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={_short(v)}" for k, v in self.params)
        return f"{self.mode}({shown})"


def _short(value: Any) -> str:
    if isinstance(value, int) and value >= MiB and value % MiB == 0:
        return f"{value // MiB}MiB"
    if isinstance(value, tuple):
        return "+".join(map(str, value))
    return str(value)


def draw(rng: random.Random, modes: Sequence[str] = tuple(GRAMMAR)) -> Case:
    """A case drawn with `rng` (the soak bench; the test draws with Hypothesis)."""
    mode = rng.choice(list(modes))
    return Case.of(mode, {k: rng.choice(v) for k, v in GRAMMAR.get(mode, {}).items()})


@dataclass
class Seen:
    """One request the plain-http target received."""

    method: str
    path: str
    authorization: bool
    headers: dict[str, str]


class PlainTarget:
    """A plain-http server a redirect may point at, answering as a cluster that takes
    everything: an apply echoes its body, a list is empty, `/version` is a version."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.method, request.path_qs,
                              "Authorization" in request.headers, dict(request.headers)))
        body = await request.read()
        if request.method == "PATCH" and body:
            return web.Response(body=body, content_type="application/json")
        if request.path.endswith("/version"):
            return web.json_response({"major": "1", "minor": "32", "gitVersion": "v1.32.0"})
        return web.json_response({"apiVersion": "v1", "kind": "List", "metadata": {},
                                  "items": []})


@dataclass
class Outcome:
    """What one case found: the invariants it broke and the figures it measured."""

    case: Case
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rss_mb: float = 0.0  # the daemon's VmRSS at the end of the case
    peak_mb: float = 0.0  # its VmHWM over the case
    loop_lag_s: float = 0.0  # the most convergerd_event_loop_lag_seconds said in the case
    hostile_reason: str | None = None  # the last reason /status gave for c0004 in the case

    def line(self) -> str:
        broke = "; ".join(self.violations) or "ok"
        return (f"{self.case}: {self.seconds:.1f} s, RSS {self.rss_mb:.0f} MB (peak "
                f"{self.peak_mb:.0f}), loop lag max {self.loop_lag_s * 1000:.0f} ms, c0004 "
                f"{self.hostile_reason}: {broke}")


def proc_mb(pid: int, key: str) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux: 5 > /proc/PID/clear_refs)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


@dataclass(frozen=True)
class Status:
    """One `/status` answer (None: it did not come)."""

    doc: dict[str, Any] | None

    @property
    def clusters(self) -> dict[str, dict[str, Any]]:
        return {c["id"]: c for c in self.doc["clusters"]} if self.doc else {}

    def converged_since(self, since: str, which: Sequence[str]) -> bool:
        found = self.clusters
        return all((c := found.get(cid)) is not None and c["last_error"] is None
                   and c["in_sync"] == c["desired"] == len(POLICY_IDS)
                   and (c["last_success_at"] or "") > since for cid in which)

    def reasons(self, which: Sequence[str]) -> dict[str, str | None]:
        return {cid: (self.clusters.get(cid) or {}).get("last_reason") for cid in which}

    def lost(self) -> str | None:
        """Why the daemon does not lead both shards, or None when it does."""
        if self.doc is None:
            return "no /status within 5 s"
        leader = self.doc["leader"]
        if not leader["is_leader"]:
            return f"is_leader false (holder {str(leader.get('holder'))[:80]!r})"
        held = self.doc.get("shards", {}).get("held_here")
        if held is not None and sorted(held) != list(range(SHARDS)):
            return f"holds shards {held} of {SHARDS}"
        return None


class World:
    """The fleet, the database, the plain-http target and the daemon of one run."""

    def __init__(self, workdir: Path, database_url: str, fleet: Fleet, target: PlainTarget,
                 http: aiohttp.ClientSession) -> None:
        self.workdir = workdir
        self.database_url = database_url
        self.fleet = fleet
        self.target = target
        self.http = http
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log_path = workdir / "daemon.log"
        self._revision_flip = False
        self._env: dict[str, str] = {}

    # -- the daemon -------------------------------------------------------------------------

    def start_daemon(self, **env: str) -> None:
        self._env = env
        self.port = free_port()
        full = {k: v for k, v in os.environ.items()
                if not k.startswith(("CONVERGERD_", "Policies__", "KUBERNETES_SERVICE"))}
        full.update(TIMINGS)
        full.update({
            "CONVERGERD_DATABASE_URL": self.database_url,
            "CONVERGERD_KUBECONFIG": str(self.fleet.kubeconfig_path),
            "CONVERGERD_HOME_CONTEXT": HOME,
            "CONVERGERD_HTTP_ADDR": f"127.0.0.1:{self.port}",
            "CONVERGERD_IDENTITY": IDENTITY,
            "CONVERGERD_SHARDS": str(SHARDS),
            # A probe (`GET /version`) of every cluster in every case, not every 10 s.
            "CONVERGERD_PROBE_PERIOD_SECONDS": str(PROBE_S),
            "PYTHONUNBUFFERED": "1",
            **env,
        })
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen([*CONVERGERD, "run"], stdout=out,
                                         stderr=subprocess.STDOUT, env=full)

    async def restart_daemon(self) -> None:
        """A fresh daemon (what a case left behind, memory above all, is gone)."""
        self.stop_daemon()
        self.log_path.rename(self.log_path.with_suffix(f".{self.pid}.log"))
        self.start_daemon(**self._env)
        await self.wait_ready()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_daemon(self) -> None:
        stop_gently(self.proc)

    async def get(self, path: str) -> Any:
        """The daemon's JSON at `path`; None when it does not answer within the client's 5 s
        (a 429, the status budget spent by polling, is waited out as Retry-After says)."""
        for _ in range(5):
            try:
                async with self.http.get(f"http://127.0.0.1:{self.port}{path}") as resp:
                    if resp.status == 429:
                        await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))
                        continue
                    return await resp.json() if resp.status == 200 else None
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                return None
        return None

    async def metric(self, name: str) -> float | None:
        try:
            async with self.http.get(f"http://127.0.0.1:{self.port}/metrics") as resp:
                text = await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    async def status(self) -> Status:
        return Status(await self.get("/status"))

    async def wait_ready(self) -> None:
        deadline = asyncio.get_running_loop().time() + STARTUP_S
        while not ((st := await self.status()).lost() is None
                   and st.converged_since("", MEMBERS)):
            if not self.alive():
                raise AssertionError(f"the daemon exited:\n{self.log_tail()}")
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"not leading and converged after {STARTUP_S:g} s:\n"
                                     f"{json.dumps(st.doc)[:3000]}\n{self.log_tail()}")
            await asyncio.sleep(POLL_S)

    # -- what the world holds -----------------------------------------------------------------

    def lease_transitions(self) -> dict[str, tuple[str, int]]:
        """The daemon's shard Leases in home: name -> (holder, transitions)."""
        out: dict[str, tuple[str, int]] = {}
        for lease in self.fleet.store(HOME).list(LEASES, LEASE_NS)["items"]:
            name = lease["metadata"]["name"]
            if name.startswith("convergerd-shard-"):
                spec = lease.get("spec", {})
                out[name] = (spec.get("holderIdentity", ""), spec.get("leaseTransitions", 0))
        return out

    def held_revisions(self, cluster: str) -> dict[str, int]:
        """Policy name -> spec.revision, as the cluster's store holds them."""
        items = self.fleet.store(cluster).list(POLICIES, None)["items"]
        return {i["metadata"]["name"]: int((i.get("spec") or {}).get("revision") or 0)
                for i in items}

    async def bump_revision(self) -> None:
        self._revision_flip = not self._revision_flip
        labels = ["team", "owner"] if self._revision_flip else ["team"]
        conn = await asyncpg.connect(self.database_url)
        try:
            await conn.execute("UPDATE policies SET rule = $1::jsonb WHERE id = $2",
                               json.dumps({"type": "RequiredLabels", "labels": labels}), BUMPED)
        finally:
            await conn.close()

    async def recorded_deliveries(self, cluster: str) -> dict[str, int]:
        conn = await asyncpg.connect(self.database_url)
        try:
            rows = await conn.fetch("SELECT policy_id, delivered_revision FROM deliveries "
                                    "WHERE cluster_id = $1 AND delivered_revision IS NOT NULL",
                                    cluster)
        finally:
            await conn.close()
        return {r["policy_id"]: r["delivered_revision"] for r in rows}

    # -- a case -------------------------------------------------------------------------------

    def fault(self, case: Case) -> dict[str, Any]:
        """The `hostile` document of a case."""
        params = dict(case.params)
        if case.mode == "redirect":
            to = params.pop("to")
            if to == "plain-http":
                params["location"] = self.target.url
            elif to == "other-https":
                # Another listener, another CA: cross-origin https.
                params["location"] = self.fleet.base_url("c0001").split("/clusters/")[0]
            else:
                params["cluster"] = HOSTILE if to == "self" else to
        if "fields" in params:
            params["fields"] = list(params["fields"])
        return {"mode": case.mode, **params}

    def write_garbage(self, names: Sequence[str]) -> None:
        store = self.fleet.store(HOME)
        for key in names:
            lease = GARBAGE_LEASES[key]
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": lease["name"], "namespace": LEASE_NS},
                    "spec": {**lease["spec"], "acquireTime": "2026-01-01T00:00:00.000000Z",
                             "renewTime": "2026-01-01T00:00:00.000000Z"}}
            store.create(LEASES, LEASE_NS, body, manager="hostile-test")

    def delete_garbage(self) -> None:
        store = self.fleet.store(HOME)
        for lease in GARBAGE_LEASES.values():
            with contextlib.suppress(ApiError):  # 404: not written by this case
                store.delete(LEASES, LEASE_NS, lease["name"])

    async def run(self, case: Case) -> Outcome:
        """One case: its fault, the wait, the invariants, the cleanup (module docstring)."""
        loop = asyncio.get_running_loop()
        out = Outcome(case)
        started = loop.time()
        leases_before = self.lease_transitions()
        self.target.seen.clear()
        logged = self.fleet.accounting.requests(limit=1)
        seq = logged[-1].seq if logged else 0
        reset_peak(self.pid)
        since = now_iso()
        if case.mode == "garbageLeases":
            self.write_garbage(case.param("leases"))
        elif case.mode != HEALTHY_CASE:
            self.fleet.set_faults(HOSTILE, Faults.from_mapping({"hostile": self.fault(case)}))
        try:
            # After the fault: the save this starts (the daemon is notified) meets it too.
            await self.bump_revision()
            await self._watch(out, since, started)
            await self._check_deliveries(out)
        finally:
            self.fleet.set_faults(HOSTILE, Faults())
            self.delete_garbage()
        out.peak_mb = proc_mb(self.pid, "VmHWM")
        out.rss_mb = proc_mb(self.pid, "VmRSS")
        lag = await self.metric("convergerd_event_loop_lag_seconds")
        out.loop_lag_s = max(out.loop_lag_s, lag or 0.0)
        self._check_after(out, seq, leases_before)
        out.seconds = loop.time() - started
        await self._recover(out)
        return out

    async def _watch(self, out: Outcome, since: str, started: float) -> None:
        """Poll until the healthy members converged since `since` (and `MIN_CASE_S` passed),
        checking leadership at every poll."""
        loop = asyncio.get_running_loop()
        while True:
            if not self.alive():
                out.violations.append(f"exited: the daemon exited "
                                      f"({self.proc and self.proc.returncode})")
                return
            st = await self.status()
            lost = st.lost()
            if lost is not None and not any(v.startswith("lease:") for v in out.violations):
                out.violations.append(f"lease: not leading every shard during the case: {lost}")
            out.hostile_reason = st.reasons((HOSTILE,))[HOSTILE] or out.hostile_reason
            lag = await self.metric("convergerd_event_loop_lag_seconds")
            out.loop_lag_s = max(out.loop_lag_s, lag or 0.0)
            elapsed = loop.time() - started
            if elapsed >= MIN_CASE_S and st.converged_since(since, HEALTHY):
                return
            if elapsed > CASE_S:
                late = {c: r for c, r in st.reasons(HEALTHY).items()
                        if not st.converged_since(since, (c,))}
                out.violations.append(f"converge: healthy members not converged {CASE_S:g} s "
                                      f"after the case began: {late}")
                return
            await asyncio.sleep(POLL_S)

    async def _check_deliveries(self, out: Outcome) -> None:
        """Nothing recorded (database) or shown (/v1/clusters/c0004) as delivered at a
        revision the hostile cluster does not hold (it only ever moves forward here)."""
        held = self.held_revisions(HOSTILE)
        recorded = await self.recorded_deliveries(HOSTILE)
        view = await self.get(f"/v1/clusters/{HOSTILE}") or {"policies": []}
        shown = {p["id"]: p.get("delivered_revision") for p in view["policies"]}
        for source, claims in (("the database", recorded), ("/v1/clusters", shown)):
            false = [f"{pid} at revision {revision} (the cluster holds "
                     f"{'none' if has is None else has})"
                     for pid, revision in sorted(claims.items())
                     if revision is not None
                     and ((has := held.get(f"policy-{pid}")) is None or has < revision)]
            if false:
                more = f" and {len(false) - 3} more" if len(false) > 3 else ""
                out.violations.append(f"delivered: {source} says delivered to {HOSTILE}: "
                                      f"{', '.join(false[:3])}{more}")

    def _check_after(self, out: Outcome, seq: int,
                     leases_before: Mapping[str, tuple[str, int]]) -> None:
        if out.peak_mb > RSS_BUDGET_MB:
            out.violations.append(f"rss: peak {out.peak_mb:.0f} MB over the budget "
                                  f"{RSS_BUDGET_MB:g} MB")
        after = self.lease_transitions()
        for name, (holder, transitions) in sorted(leases_before.items()):
            now_holder, now_transitions = after.get(name, ("", -1))
            if (now_holder, now_transitions) != (holder, transitions):
                out.violations.append(
                    f"lease: {name} held by {holder[:40]!r} ({transitions} transitions) "
                    f"before, {now_holder[:40]!r} ({now_transitions}) after")
        if self.target.seen:
            seen = self.target.seen
            tokens = sum(s.authorization for s in seen)
            out.violations.append(
                f"plain-http: {len(seen)} request(s) left for the plain-http target, "
                f"{tokens} with an Authorization header; first: {seen[0].method} "
                f"{seen[0].path[:100]}")
        leaks = [r for r in self.fleet.accounting.requests(after=seq)
                 if r.token_of not in (None, "", r.cluster)]
        if leaks:
            out.violations.append(
                f"token: {len(leaks)} request(s) carried another cluster's token; first: "
                f"{leaks[0].token_of}'s to {leaks[0].cluster}: {leaks[0].method} "
                f"{leaks[0].path[:100]} ({leaks[0].status})")

    async def _recover(self, out: Outcome) -> None:
        loop = asyncio.get_running_loop()
        cleared = now_iso()
        deadline = loop.time() + RECOVER_S
        while not (st := await self.status()).converged_since(cleared, MEMBERS):
            if loop.time() > deadline or not self.alive():
                out.violations.append(
                    f"recover: not converged again {RECOVER_S:g} s after the fault cleared: "
                    f"{st.reasons(MEMBERS)}")
                return
            await asyncio.sleep(POLL_S)


@contextlib.asynccontextmanager
async def open_world(workdir: Path, database_url: str, **env: str) -> AsyncIterator[World]:
    """The fleet (4 members + home), the tenants imported, the target, the daemon leading and
    converged; everything stopped afterwards."""
    conn = await asyncpg.connect(database_url)
    try:
        await apply_plan(conn, parse_import(TENANTS))
    finally:
        await conn.close()
    target = PlainTarget()
    await target.start()
    try:
        async with (
            Fleet(clusters=len(MEMBERS), kubeconfig_path=workdir / "kubeconfig",
                  rng=random.Random(20261206)) as fleet,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
        ):
            world = World(workdir, database_url, fleet, target, http)
            world.start_daemon(**env)
            try:
                await world.wait_ready()
                yield world
            finally:
                world.stop_daemon()
    finally:
        await target.close()
