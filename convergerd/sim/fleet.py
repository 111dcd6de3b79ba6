"""`Fleet`: the whole simulator in-process — listeners, clusters, admin API, kubeconfig.

    async with Fleet(clusters=3) as fleet:
        fleet.kubeconfig_path, fleet.admin_url, fleet.base_url("c0001")
        fleet.set_faults("c0002", Faults(down=True))

Clusters are spread over several https listeners, each with its own CA: the home cluster on
one, members round-robin over `ca_groups` others, so a client meets several distinct CAs.
A `FleetConfig` can also come from YAML (`--config FILE`):

    clusters: 50          # member clusters (CLI --clusters wins)
    caGroups: 3
    defaults:             # faults every member starts with
      latencyMs: 5
    overrides:            # per cluster id, on top of the defaults ("home" allowed)
      c0003: {version: v1.29.4}
      c0004: {crd: false}
      c0005: {hostile: {mode: oversized, bytes: 33554432}}

Fault fields (admin API and config file alike): down, hang, latencyMs, errorRate, errorStatus,
retryAfterSeconds, version, readOnly, crd, admission, metrics (convergerd.sim.faults), and
hostile: answers no
well-behaved apiserver sends, `{"mode": M, ...}` with M one of controlChars, wrongTypes
(`fields`), invalidJson, oversized (`bytes`), trickle (`bytesPerSecond`), amplification
(`bytes`), deepNesting (`depth`), endlessContinue, overLimit (`factor`), redirect (`status`,
`cluster` or `location`), wrongObject (`change`), wrongList (`shape`), hugeVersion (`bytes`,
`field`), hugeHeaders (`bytes`, `headerBytes`), hugeValues (`bytes`, `fields`); null clears it
(convergerd.sim.hostile).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import random
import secrets
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml
from aiohttp import web

from convergerd.admission.evaluate import PolicyEvaluator
from convergerd.sim.accounting import Accounting
from convergerd.sim.admin import build_admin_app
from convergerd.sim.faults import Faults, FaultsError
from convergerd.sim.kubeconfig import KubeconfigEntry, write_kubeconfig
from convergerd.sim.resources import NAMESPACES
from convergerd.sim.server import ApiServer, Cluster, Listener
from convergerd.sim.store import ClusterStore
from convergerd.sim.tls import CertAuthority, server_ssl_context
from convergerd.sim.vap import StoreAdmission

log = logging.getLogger(__name__)

HOME = "home"
# Namespaces every simulated cluster has on top of the apiserver's own (default, kube-system,
# ... which the store bootstraps): stackship-system holds the leader-election Lease.
EXTRA_NAMESPACES = ("stackship-system",)
# As if an admin had run `kubectl create namespace`.
_NAMESPACE_MANAGER = "kubectl-create"
_CONFIG_KEYS = frozenset({"clusters", "caGroups", "defaults", "overrides"})
_SHUTDOWN_GRACE_S = 1.0


class FleetConfigError(ValueError):
    """A fleet configuration that cannot be used; the message names the setting."""


@dataclass(frozen=True)
class FleetConfig:
    clusters: int = 3
    ca_groups: int = 2
    defaults: Faults = field(default_factory=Faults)  # for member clusters
    overrides: Mapping[str, Faults] = field(default_factory=dict)  # by cluster id
    host: str = "127.0.0.1"  # where the cluster listeners bind (loopback: the cert says so)
    admin_host: str = "127.0.0.1"
    admin_port: int = 0  # 0: any free port (read fleet.admin_url)
    bookmark_interval_s: float = 60.0
    history_limit: int = 10_000  # watch events a store keeps for resourceVersion resumes
    # events a watch may fall behind by before it gets 410 and ends (a slow consumer)
    watch_buffer_limit: int = 10_000
    log_size: int = 10_000  # request log ring buffer

    def __post_init__(self) -> None:
        if self.clusters < 0:
            raise FleetConfigError(f"clusters: must be >= 0, got {self.clusters}")
        if self.ca_groups < 1:
            raise FleetConfigError(f"caGroups: must be >= 1, got {self.ca_groups}")
        known = set(member_ids(self.clusters)) | {HOME}
        unknown = sorted(set(self.overrides) - known)
        if unknown:
            raise FleetConfigError(f"overrides: no such cluster(s): {', '.join(unknown)}")

    @classmethod
    def from_yaml(cls, text: str, **settings: Any) -> FleetConfig:
        """Parse a config file; keyword `settings` (e.g. from CLI flags) take precedence."""
        doc = yaml.safe_load(text) or {}
        if not isinstance(doc, dict):
            raise FleetConfigError("config: must be a mapping")
        unknown = sorted(set(doc) - _CONFIG_KEYS)
        if unknown:
            raise FleetConfigError(
                f"config: unknown key(s): {', '.join(unknown)} (known: {', '.join(_CONFIG_KEYS)})"
            )
        values: dict[str, Any] = {}
        for key, attr in (("clusters", "clusters"), ("caGroups", "ca_groups")):
            if key in doc:
                if not isinstance(doc[key], int) or isinstance(doc[key], bool):
                    raise FleetConfigError(f"{key}: must be an integer, got {doc[key]!r}")
                values[attr] = doc[key]
        try:
            defaults = Faults.from_mapping(_mapping(doc.get("defaults") or {}, "defaults"))
            overrides = {
                str(cid): defaults.merged(_mapping(f or {}, f"overrides.{cid}"))
                for cid, f in _mapping(doc.get("overrides") or {}, "overrides").items()
            }
        except FaultsError as e:
            raise FleetConfigError(str(e)) from e
        values.update(defaults=defaults, overrides=overrides)
        values.update({k: v for k, v in settings.items() if v is not None})
        return cls(**values)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FleetConfigError(f"{where}: must be a mapping, got {value!r}")
    return value


def member_ids(n: int) -> list[str]:
    width = max(4, len(str(n)))
    return [f"c{i:0{width}d}" for i in range(1, n + 1)]


class Fleet:
    """The simulator: start with `async with`, or `await start()` / `await close()`."""

    def __init__(
        self,
        config: FleetConfig | None = None,
        *,
        kubeconfig_path: Path | str | None = None,
        rng: random.Random | None = None,
        now: Callable[[], datetime.datetime] | None = None,
        **settings: Any,
    ) -> None:
        self.config = dataclasses.replace(config or FleetConfig(), **settings)
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        if kubeconfig_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="convergerd-sim-")
            kubeconfig_path = Path(self._tmpdir.name) / "kubeconfig"
        self.kubeconfig_path = Path(kubeconfig_path)
        self._rng = rng or random.Random()
        self._now = now
        self.accounting = Accounting(self.config.log_size)
        # One CEL runtime for the fleet: its compile cache serves every cluster's policies.
        self._policy_evaluator = PolicyEvaluator()
        self.clusters: dict[str, Cluster] = {}
        self._servers: list[tuple[asyncio.Server, web.Server]] = []
        self._admin: web.AppRunner | None = None
        self.admin_url = ""

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        home_listener = Listener("home", CertAuthority.create("home"), cfg.host)
        member_listeners = [
            Listener(f"members-{i + 1}", CertAuthority.create(f"members-{i + 1}"), cfg.host)
            for i in range(cfg.ca_groups)
        ]
        self._add_cluster(HOME, home_listener, cfg.overrides.get(HOME, Faults()))
        for i, cid in enumerate(member_ids(cfg.clusters)):
            listener = member_listeners[i % len(member_listeners)]
            self._add_cluster(cid, listener, cfg.overrides.get(cid, cfg.defaults))
        api = ApiServer(
            self.clusters,
            self.accounting,
            store_factory=self._new_store,
            rng=self._rng,
            bookmark_interval_s=cfg.bookmark_interval_s,
        )
        try:
            for listener in (home_listener, *member_listeners):
                await self._listen(api, listener)
            write_kubeconfig(self.kubeconfig_path, self._kubeconfig_entries(), current=HOME)
            # Last: an answering admin API tells pollers that everything else is ready.
            await self._start_admin()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._admin is not None:
            await self._admin.cleanup()
            self._admin = None
        for srv, _ in self._servers:
            srv.close()
        for srv, web_server in self._servers:
            # Cancels hung and watching handlers, then closes their connections.
            await web_server.shutdown(_SHUTDOWN_GRACE_S)
            await srv.wait_closed()
        self._servers.clear()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- queries and control -----------------------------------------------------------------

    @property
    def member_ids(self) -> list[str]:
        return [cid for cid in self.clusters if cid != HOME]

    def cluster(self, cluster_id: str) -> Cluster:
        try:
            return self.clusters[cluster_id]
        except KeyError:
            raise KeyError(f"no cluster {cluster_id!r}") from None

    def base_url(self, cluster_id: str) -> str:
        return self.cluster(cluster_id).base_url

    def token(self, cluster_id: str) -> str:
        return self.cluster(cluster_id).token

    def ca_pem(self, cluster_id: str) -> bytes:
        return self.cluster(cluster_id).listener.ca.cert_pem

    def faults(self, cluster_id: str) -> Faults:
        return self.cluster(cluster_id).faults

    def set_faults(self, cluster_id: str, faults: Faults) -> None:
        self.cluster(cluster_id).faults = faults

    def clear_faults(self, cluster_id: str) -> None:
        self.cluster(cluster_id).faults = Faults()

    def store(self, cluster_id: str) -> ClusterStore:
        """The cluster's object store (created if untouched): for seeding and inspecting."""
        cluster = self.cluster(cluster_id)
        if cluster.store is None:
            cluster.store = self._new_store(cluster)
        return cluster.store

    # -- internals ---------------------------------------------------------------------------

    def _add_cluster(self, cluster_id: str, listener: Listener, faults: Faults) -> None:
        self.clusters[cluster_id] = Cluster(
            id=cluster_id, token=secrets.token_urlsafe(24), listener=listener, faults=faults
        )

    def _new_store(self, cluster: Cluster) -> ClusterStore:
        kwargs: dict[str, Any] = {
            "history_limit": self.config.history_limit,
            "watch_buffer_limit": self.config.watch_buffer_limit,
            # Read on every call: a version fault changes what the store serves at once.
            "served_minor": lambda: cluster.faults.minor,
        }
        if self._now is not None:
            kwargs["now"] = self._now
        store = ClusterStore(**kwargs)
        store.admission = StoreAdmission(store, self._policy_evaluator,
                                         enforcing=lambda: cluster.faults.admission,
                                         counted=cluster.apiservers.record)
        for ns in EXTRA_NAMESPACES:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            store.create(NAMESPACES, None, body, manager=_NAMESPACE_MANAGER)
        return store

    async def _listen(self, api: ApiServer, listener: Listener) -> None:
        web_server = web.Server(api.handle, handler_cancellation=True, access_log=None)
        ctx = server_ssl_context(listener.ca.issue_serving_cert())
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(web_server, listener.host, 0, ssl=ctx, backlog=1024)
        self._servers.append((srv, web_server))
        listener.port = srv.sockets[0].getsockname()[1]

    async def _start_admin(self) -> None:
        app = build_admin_app(self.clusters, self.accounting)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._admin = runner
        site = web.TCPSite(runner, self.config.admin_host, self.config.admin_port)
        await site.start()
        port = runner.addresses[0][1]
        host = self.config.admin_host
        self.admin_url = f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def _kubeconfig_entries(self) -> list[KubeconfigEntry]:
        return [
            KubeconfigEntry(
                name=c.id, server=c.base_url, ca_pem=c.listener.ca.cert_pem, token=c.token
            )
            for c in self.clusters.values()
        ]
