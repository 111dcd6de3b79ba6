"""End-to-end harness: the simulator, a fresh database and real `convergerd` processes.

The `world` fixture (conftest.py) starts the simulator (three member clusters + `home`), runs
`convergerd migrate` and `convergerd import` on this test's own database, and hands the test a
`World` that starts daemons with short election timings and reads what they did from the
simulator's request log. Every child is killed in teardown and its log printed (pytest shows it
when the test failed). Waiting is always polling a condition against a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kubernetes as _kubernetes
import yaml

import convergerd
from tests.fixtures.fleet import SimProcess, free_port, start_sim_process, stop_sim_process

T = TypeVar("T")
# The official sync client; its partial stubs disagree with how it is called.
kubernetes: Any = _kubernetes

CONVERGERD: tuple[str, ...] = (sys.executable, "-m", "convergerd")
MEMBERS = ("c0001", "c0002", "c0003")
POLICIES = ("no-latest", "labels")
LEASE_NS, LEASE_NAME = "stackship-system", "convergerd"
POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "platform.stackship.se", "v1alpha1", "policies"
WRITE_VERBS = frozenset({"create", "update", "patch"})

# Short election timings: lease 4 s > renew deadline 2.5 + retry 0.5 + lease request 0.5.
LEASE_S, RENEW_DEADLINE_S, RETRY_S, LEASE_REQUEST_S = 4.0, 2.5, 0.5, 0.5
INTERVAL_MINUTES = 0.02  # a round every 1.2 s
TIMINGS: Mapping[str, str] = {
    "CONVERGERD_LEASE_DURATION_SECONDS": str(LEASE_S),
    "CONVERGERD_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE_S),
    "CONVERGERD_RETRY_PERIOD_SECONDS": str(RETRY_S),
    "CONVERGERD_LEASE_REQUEST_TIMEOUT_SECONDS": str(LEASE_REQUEST_S),
    "CONVERGERD_REQUEST_TIMEOUT_SECONDS": "1",
    "CONVERGERD_CONNECT_TIMEOUT_SECONDS": "1",
    "CONVERGERD_GRACE_PERIOD_SECONDS": "5",
    "Policies__ConvergeIntervalMinutes": str(INTERVAL_MINUTES),
}
STARTUP_S = 30.0  # a cold Python start on a busy 2-core machine
POLL_S = 0.05

TENANTS = f"""\
clusters: [{", ".join(f"{{id: {c}}}" for c in MEMBERS)}]
boundaries:
  - {{id: everyone, clusters: [{", ".join(MEMBERS)}]}}
policies:
  - {{id: {POLICIES[0]}, boundary: everyone, rule: {{type: ForbidLatestTag}}}}
  - {{id: {POLICIES[1]}, boundary: everyone, rule: {{type: RequiredLabels, labels: [team]}}}}
"""


def agent(identity: str) -> str:
    """The User-Agent a replica sends (docs/design.md, "Settings")."""
    return f"convergerd/{convergerd.__version__} ({identity})"


def say(text: str) -> None:
    """A measured figure, shown with `pytest -s` (and in the report of a failed test)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def wait_for(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    """Poll `condition` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


def stop_gently(proc: subprocess.Popen[bytes] | None, grace_s: float = 15) -> None:
    """SIGTERM (its clean shutdown: Leases released), SIGKILL if it has not exited within
    `grace_s`."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def http_json(url: str, timeout_s: float = 2.0) -> Any:
    """The JSON at `url`; a 429 (the daemon's status budget, spent by polling) is waited out
    as its Retry-After says, a few times, as a client must."""
    for _ in range(5):
        try:
            # Always a http://127.0.0.1 address this harness built.
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 429:
                raise
            time.sleep(float(exc.headers.get("Retry-After", "1")))
    raise AssertionError(f"{url} kept answering 429")


@dataclass(frozen=True)
class Request:
    """One line of the simulator's request log."""

    seq: int
    time: float
    cluster: str
    verb: str
    method: str
    path: str
    status: int
    user_agent: str

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Request:
        return cls(seq=doc["seq"], time=doc["time"], cluster=doc["cluster"], verb=doc["verb"],
                   method=doc["method"], path=doc["path"], status=doc["status"],
                   user_agent=doc["userAgent"])

    @property
    def policy_write(self) -> bool:
        """A write to a Policy in a member cluster."""
        return (self.cluster in MEMBERS and self.verb in WRITE_VERBS
                and f"/{POLICY_PLURAL}" in self.path)

    @property
    def lease_write(self) -> bool:
        return (self.cluster == "home" and self.verb in WRITE_VERBS
                and "/leases" in self.path)

    def by(self, identity: str) -> bool:
        return self.user_agent == agent(identity)


@dataclass
class Daemon:
    """A `convergerd run` (or `once`) child process."""

    identity: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def user_agent(self) -> str:
        return agent(self.identity)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self) -> dict[str, Any] | None:
        """`/status`, or None while the server is not up (or the process is gone)."""
        try:
            doc: dict[str, Any] = http_json(self.url + "/status")
        except (OSError, ValueError):
            return None
        return doc

    def is_leader(self) -> bool:
        doc = self.status()
        return bool(doc and doc["leader"]["is_leader"])

    def serving(self) -> bool:
        return self.status() is not None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


class World:
    """The simulator, the database and the daemons of one test."""

    def __init__(self, workdir: Path, sim: SimProcess, database_url: str) -> None:
        self.workdir = workdir
        self.sim = sim
        self.database_url = database_url
        self.daemons: list[Daemon] = []
        api = kubernetes.config.new_client_from_config(
            config_file=str(sim.kubeconfig_path), context="home")
        self._home_api = api
        self._member_apis: dict[str, Any] = {}
        self._proxies: list[HangingProxy] = []

    def close(self) -> None:
        for proxy in self._proxies:
            proxy.close()
        self._home_api.close()
        for api in self._member_apis.values():
            api.close()

    # -- processes ------------------------------------------------------------------------

    def env(self, identity: str | None, port: int, **overrides: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CONVERGERD_", "Policies__", "KUBERNETES_SERVICE"))}
        env.update(TIMINGS)
        env.update({
            "CONVERGERD_DATABASE_URL": self.database_url,
            "CONVERGERD_KUBECONFIG": str(self.sim.kubeconfig_path),
            "CONVERGERD_HOME_CONTEXT": "home",
            "CONVERGERD_HTTP_ADDR": f"127.0.0.1:{port}",
            "PYTHONUNBUFFERED": "1",
        })
        if identity is not None:
            env["CONVERGERD_IDENTITY"] = identity
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(self, identity: str, command: str = "run", **env: str | None) -> Daemon:
        port = free_port()
        log_path = self.workdir / f"{identity}.{command}.log"
        with log_path.open("wb") as out:
            proc = subprocess.Popen([*CONVERGERD, command], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env(identity, port, **env))
        daemon = Daemon(identity, proc, log_path, port)
        self.daemons.append(daemon)
        return daemon

    def cli(self, *args: str, timeout_s: float = 60,
            **env: str | None) -> subprocess.CompletedProcess[str]:
        """Run a `convergerd` command to completion."""
        return subprocess.run([*CONVERGERD, *args], capture_output=True, text=True, check=False,
                              timeout=timeout_s, env=self.env(None, free_port(), **env))

    def kill_all(self) -> None:
        for daemon in self.daemons:
            daemon.kill()

    def dump_logs(self) -> None:
        for daemon in self.daemons:
            sys.stderr.write(f"----- {daemon.identity} (exit {daemon.proc.returncode}) -----\n")
            sys.stderr.write(daemon.log())

    def leader(self, candidates: Sequence[Daemon] | None = None) -> Daemon | None:
        """The one daemon whose status says it leads (None if none; fails on two)."""
        leading = [d for d in (candidates or self.daemons)
                   if d.proc.poll() is None and d.is_leader()]
        assert len(leading) <= 1, f"two leaders: {[d.identity for d in leading]}"
        return leading[0] if leading else None

    # -- the simulator ----------------------------------------------------------------------

    def hanging_home(self, name: str) -> tuple[HangingProxy, Path]:
        """A proxy to `home` the test can hang, and a kubeconfig that reaches home through it."""
        proxy = HangingProxy(server_address(self.sim.kubeconfig_path, "home"))
        self._proxies.append(proxy)
        path = proxy.kubeconfig(self.sim.kubeconfig_path, self.workdir / f"{name}.kubeconfig")
        return proxy, path

    def requests(self, after: int = 0) -> list[Request]:
        status, doc = self.sim.admin("GET", f"/_sim/requests?after={after}")
        assert status == 200, doc
        return [Request.from_json(r) for r in doc["requests"]]

    def policy_writes(self, after: int = 0) -> list[Request]:
        return [r for r in self.requests(after) if r.policy_write]

    def last_seq(self) -> int:
        reqs = self.requests()
        return reqs[-1].seq if reqs else 0

    def faults(self, cluster: str, **faults: Any) -> None:
        status, doc = self.sim.admin("POST", f"/_sim/clusters/{cluster}/faults", faults)
        assert status == 200, doc

    def clear_faults(self, cluster: str) -> None:
        status, doc = self.sim.admin("DELETE", f"/_sim/clusters/{cluster}/faults")
        assert status == 200, doc

    def lease(self) -> dict[str, Any] | None:
        """The Lease in `home` as a JSON object (None when absent)."""
        api = kubernetes.client.CoordinationV1Api(self._home_api)
        try:
            obj = api.read_namespaced_lease(LEASE_NAME, LEASE_NS, _preload_content=False)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        doc: dict[str, Any] = json.loads(obj.data)
        return doc

    def leases(self) -> list[dict[str, Any]]:
        """Every Lease in the Lease namespace (the shard and membership Leases too)."""
        api = kubernetes.client.CoordinationV1Api(self._home_api)
        doc = json.loads(api.list_namespaced_lease(LEASE_NS, _preload_content=False).data)
        items: list[dict[str, Any]] = doc["items"]
        return items

    def lease_holder(self) -> str | None:
        lease = self.lease()
        return None if lease is None else lease["spec"].get("holderIdentity") or ""

    def put_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (no resourceVersion in `body`) or replace the Lease; returns what was stored."""
        api = kubernetes.client.CoordinationV1Api(self._home_api)
        if body["metadata"].get("resourceVersion"):
            obj = api.replace_namespaced_lease(LEASE_NAME, LEASE_NS, body,
                                               _preload_content=False)
        else:
            obj = api.create_namespaced_lease(LEASE_NS, body, _preload_content=False)
        doc: dict[str, Any] = json.loads(obj.data)
        return doc

    def delete_policies(self, cluster: str) -> int:
        """Delete convergerd's Policy objects in `cluster` (drift); how many were there."""
        api = self._member_apis.get(cluster)
        if api is None:
            api = self._member_apis[cluster] = kubernetes.config.new_client_from_config(
                config_file=str(self.sim.kubeconfig_path), context=cluster)
        custom = kubernetes.client.CustomObjectsApi(api)
        deleted = 0
        for policy in POLICIES:
            try:
                custom.delete_cluster_custom_object(
                    POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, f"policy-{policy}",
                    _request_timeout=2)
                deleted += 1
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise
        return deleted


@dataclass
class Drift:
    """Deletes the Policies in one member cluster over and over, from a thread, so every
    round has something to write."""

    world: World
    cluster: str = MEMBERS[0]
    period_s: float = 0.2
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)

    def __enter__(self) -> Drift:
        self._thread = threading.Thread(target=self._run, name="drift", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.world.delete_policies(self.cluster)
            except Exception as exc:  # the test reports it; the thread keeps going
                self.errors.append(exc)


@dataclass(frozen=True)
class LeaseVersion:
    """The Lease as one watch event showed it."""

    time: float  # time.time() when the event arrived
    holder: str
    transitions: int
    resource_version: str


class LeaseWatch:
    """Every version of the Lease, from a watch in a thread (a short-lived empty holder after a
    release is seen even when a standby takes the Lease a moment later)."""

    def __init__(self, world: World) -> None:
        self._api = kubernetes.config.new_client_from_config(
            config_file=str(world.sim.kubeconfig_path), context="home")
        self._stop = threading.Event()
        self.versions: list[LeaseVersion] = []
        self._thread = threading.Thread(target=self._run, name="lease watch", daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._api.close()

    def _run(self) -> None:
        api = kubernetes.client.CoordinationV1Api(self._api)
        while not self._stop.is_set():
            watch = kubernetes.watch.Watch()
            try:
                for event in watch.stream(api.list_namespaced_lease, LEASE_NS,
                                          timeout_seconds=2, _request_timeout=5):
                    lease = event["object"]
                    if lease.metadata.name == LEASE_NAME:
                        self.versions.append(LeaseVersion(
                            time.time(), lease.spec.holder_identity or "",
                            lease.spec.lease_transitions or 0, lease.metadata.resource_version))
                    if self._stop.is_set():
                        watch.stop()
            except Exception:  # noqa: S112 - a broken watch is restarted; the test checks data
                continue

    def holders(self) -> list[str]:
        """Holders in order, consecutive repeats collapsed."""
        out: list[str] = []
        for version in self.versions:
            if not out or out[-1] != version.holder:
                out.append(version.holder)
        return out


class HangingProxy:
    """A TCP relay to one simulated cluster that the test can make hang (bytes are swallowed
    both ways, connections stay open): that cluster hangs for one replica only."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.hung = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, name="proxy accept", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                return
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                if not self.hung.is_set():
                    dst.sendall(chunk)
        except OSError:
            pass
        finally:
            if not self.hung.is_set():
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def kubeconfig(self, original: Path, out: Path, context: str = "home") -> Path:
        """A copy of `original` whose `context` cluster is reached through this proxy."""
        doc = yaml.safe_load(original.read_text())
        for entry in doc["clusters"]:
            if entry["name"] == context:
                server = entry["cluster"]["server"]
                host_port = server.split("/")[2]
                entry["cluster"]["server"] = server.replace(host_port, f"127.0.0.1:{self.port}")
        out.write_text(yaml.safe_dump(doc))
        out.chmod(0o600)
        return out


@contextlib.contextmanager
def open_world(tmp_path: Path, database_url: str, *, clusters: int,
               tenants: str) -> Iterator[World]:
    """A simulator of `clusters` members and a migrated database with `tenants` imported;
    every replica killed, its logs dumped and the simulator stopped afterwards."""
    sim = start_sim_process(tmp_path, clusters=clusters)
    w = World(tmp_path, sim, database_url)
    try:
        migrated = w.cli("migrate")
        assert migrated.returncode == 0, migrated.stderr
        path = tmp_path / "tenants.yaml"
        path.write_text(tenants)
        imported = w.cli("import", str(path))
        assert imported.returncode == 0, imported.stdout + imported.stderr
        yield w
    finally:
        w.kill_all()
        w.dump_logs()
        w.close()
        stop_sim_process(sim)


def server_address(kubeconfig: Path, context: str) -> tuple[str, int]:
    doc = yaml.safe_load(kubeconfig.read_text())
    server = next(c["cluster"]["server"] for c in doc["clusters"] if c["name"] == context)
    host, _, port = server.split("/")[2].rpartition(":")
    return host, int(port)
