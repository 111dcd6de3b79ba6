"""Shared pieces of the round integration tests: a fleet in the database, a round wired exactly
as the daemon wires it (`rounds.round_env`), a look into the simulated clusters, and a TCP
proxy in front of PostgreSQL that can play "database down"."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from convergerd.config import Settings, load_settings
from convergerd.core.report import RoundReport
from convergerd.delivery.apply import ClusterSource
from convergerd.delivery.converge import run_round
from convergerd.delivery.rounds import round_env
from convergerd.kube.registry import ClusterRegistry
from convergerd.leader.elector import NoElection
from convergerd.runtime import Daemon
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.importer import apply_plan, parse_import
from convergerd.store.store import Store

IDENTITY = "rounds-test"
WRITE_VERBS = ("create", "update", "patch", "delete")

# c0001 is in both boundaries; c0002 and c0003 only in team-a. p-plans never leaves the
# control plane. Desired: c0001 three policies, c0002 and c0003 two each.
FLEET_DOC: dict[str, Any] = {
    "clusters": [{"id": "c0001"}, {"id": "c0002"}, {"id": "c0003"}],
    "boundaries": [
        {"id": "team-a", "clusters": ["c0001", "c0002", "c0003"]},
        {"id": "team-b", "clusters": ["c0001"]},
    ],
    "policies": [
        {"id": "p-latest", "boundary": "team-a", "rule": {"type": "ForbidLatestTag"}},
        {"id": "p-regs", "boundary": "team-a",
         "rule": {"type": "AllowedRegistries", "registries": ["registry.example.com"]}},
        {"id": "p-labels", "boundary": "team-b",
         "rule": {"type": "RequiredLabels", "labels": ["app", "team"]}},
        {"id": "p-plans", "boundary": "team-a",
         "rule": {"type": "AllowedComputePlans", "plans": ["small"]}},
    ],
}
DESIRED: dict[str, set[str]] = {
    "c0001": {"policy-p-latest", "policy-p-regs", "policy-p-labels"},
    "c0002": {"policy-p-latest", "policy-p-regs"},
    "c0003": {"policy-p-latest", "policy-p-regs"},
}


def settings_for(
    kubeconfig: Path, database_url: str, **env: str
) -> Settings:
    """Settings as the daemon would load them, with short timeouts for the simulator."""
    values = {
        "CONVERGERD_DATABASE_URL": database_url,
        "CONVERGERD_KUBECONFIG": str(kubeconfig),
        "CONVERGERD_LEADER_ELECTION": "false",
        "CONVERGERD_IDENTITY": IDENTITY,
        "CONVERGERD_HTTP_ADDR": "127.0.0.1:0",
        "CONVERGERD_REQUEST_TIMEOUT_SECONDS": "0.5",
        "CONVERGERD_CONNECT_TIMEOUT_SECONDS": "0.5",
        "CONVERGERD_CLUSTER_QPS": "1000",
        "CONVERGERD_CLUSTER_BURST": "1000",
        **env,
    }
    return load_settings(values)


async def import_doc(database_url: str, doc: Mapping[str, Any]) -> None:
    """`convergerd import` of an in-memory document."""
    conn = await asyncpg.connect(database_url)
    try:
        await apply_plan(conn, parse_import(doc))
    finally:
        await conn.close()


async def sql(database_url: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return list(await conn.fetch(statement, *args))
    finally:
        await conn.close()


@dataclass
class Rounds:
    """Runs converge rounds the daemon's way: fleet from the store, `round_env` (registry on the
    fleet's kubeconfig, `call_with_retries`, the open fence of `NoElection`, the store as the
    write-time check), `run_round`, then `store.record_round`."""

    sim: Fleet
    store: Store
    settings: Settings
    state: StatusState = field(init=False)
    metrics: Metrics = field(init=False)
    registry: ClusterRegistry = field(init=False)

    def __post_init__(self) -> None:
        self.state = StatusState(identity=IDENTITY, interval_s=self.settings.rounds.interval_s)
        self.metrics = Metrics(state=self.state)
        self.registry = ClusterRegistry(
            kubeconfig=self.settings.clusters.kubeconfig, access=self.settings.clusters,
            identity=IDENTITY, observer=self.metrics, on_insecure=self.state.set_insecure,
        )

    async def run(self, *, record: bool = True,
                  clusters: ClusterSource | None = None) -> RoundReport:
        """`clusters`: where the round reaches the clusters (the registry by default)."""
        fleet = await self.store.load_fleet()
        fence = NoElection(identity=IDENTITY).fence()
        env = round_env(self.settings, clusters or self.registry, fence, self.metrics,
                        deadline_s=self.settings.rounds.deadline_s, guard=self.store)
        report = await run_round(fleet, env)
        if record:
            await self.store.record_round(report, identity=IDENTITY)
        return report

    async def close(self) -> None:
        await self.registry.close()


def objects(sim: Fleet, cluster: str) -> dict[str, dict[str, Any]]:
    """Every Policy object in a simulated cluster, by name (read from its store directly)."""
    listed = sim.store(cluster).list(POLICIES, None)
    return {obj["metadata"]["name"]: obj for obj in listed["items"]}


def writes(sim: Fleet, cluster: str) -> int:
    counts = sim.accounting.counts(cluster)
    return sum(counts[verb] for verb in WRITE_VERBS)


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout_s: float = 20, what: str = ""
) -> None:
    """Poll `condition` (sync or async) until true; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running_daemon(settings: Settings) -> AsyncIterator[tuple[Daemon, asyncio.Task[int]]]:
    """`Daemon.main()` (what `convergerd run` runs) as a task; stopped as SIGTERM would stop it
    on the way out, which must end it with exit code 0."""
    daemon = Daemon(settings)
    task = asyncio.create_task(daemon.main(), name="daemon under test")
    try:
        yield daemon, task
    finally:
        daemon.stopping.set()
        exit_code = await asyncio.wait_for(task, 30)
    assert exit_code == 0


async def sigterm_mid_round(fleet: Fleet, database_url: str) -> None:
    """`FLEET_DOC` converged by a running daemon that is stopped as SIGTERM stops it in the
    middle of its first round: c0001 answers slowly and gets one write at a time, so the stop
    comes after its first write, with its others still to go (the fast clusters have finished).
    Returns once the daemon exited 0; what landed is the caller's to check."""
    await import_doc(database_url, FLEET_DOC)
    fleet.set_faults("c0001", Faults(latency_ms=400))
    settings = settings_for(fleet.kubeconfig_path, database_url,
                            CONVERGERD_APPLY_CONCURRENCY="1",
                            CONVERGERD_REQUEST_TIMEOUT_SECONDS="2")
    async with running_daemon(settings) as (daemon, task):
        await wait_for(lambda: writes(fleet, "c0001") >= 1, what="c0001's first write")
        daemon.stopping.set()  # what the SIGTERM handler does
        assert await asyncio.wait_for(task, 10) == 0


class TcpProxy:
    """A TCP proxy to PostgreSQL on a fixed loopback port. `down()` resets every proxied
    connection and refuses new ones (the server "crashed"); `up()` listens again."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._writers.discard(writer)
            self._writers.discard(up_writer)
