"""`ClusterRegistry`: one `ClusterClient` per cluster, created on first use and reused across
rounds, SSL contexts shared by CA, all pools closed together.

Lifetimes (what keeps this bounded over months of reloads and fleet changes):

- The kubeconfig is re-read by `refresh()` when the file changed (size or mtime): clients whose
  credentials changed, or whose context is gone, are *retired*; the others keep their pools.
- `retain(clusters)` retires the clients of clusters no longer in the fleet (the home cluster,
  which holds the Lease, is kept).
- A retired client is closed once no call is in flight on it (at once when idle), or after
  `drain_s` at the latest; calls that start after the swap go to the new client. So a reload
  never closes a connection under a request, and a cluster is never reported down for it.
- An SSL context lives while a client (current or draining) uses it.

Callers get a `ClusterHandle` (`get`, `home`): it resolves the cluster's current client at
each call and counts the call as in flight on it, so a handle kept for a long time (the
elector's, the prober's) always talks through the newest credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import convergerd
from convergerd.config import ClusterAccess
from convergerd.core.errors import NoCredentials
from convergerd.core.model import ClusterId
from convergerd.kube.api import Applied, KubeObject, ObjectList, RequestObserver
from convergerd.kube.client import ClusterClient, user_agent
from convergerd.kube.kubeconfig import (
    Credentials,
    Kubeconfig,
    check_secure,
    in_cluster_credentials,
    load_kubeconfig,
)
from convergerd.kube.tlsctx import TlsContexts, tls_key

log = logging.getLogger(__name__)

HOME_IN_CLUSTER = ClusterId("in-cluster")
# Upper bound on how long a retired client waits for its calls in flight before it is closed
# anyway: every call is bounded by its own timeout, so this is only a backstop.
DRAIN_MIN_S = 30.0


@dataclass(eq=False, slots=True)
class _Lent:
    """An open client, the credentials it was built from, and its calls in flight."""

    creds: Credentials
    client: ClusterClient
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class ClusterRegistry:
    def __init__(
        self,
        *,
        kubeconfig: Path | None,
        access: ClusterAccess,
        identity: str,
        observer: RequestObserver | None = None,
        env: Mapping[str, str] | None = None,
        sa_dir: Path | None = None,
        tls: TlsContexts | None = None,
        drain_s: float | None = None,
        on_insecure: Callable[[str, bool], None] | None = None,
    ) -> None:
        """`drain_s`: how long a retired client may wait for its calls in flight (default:
        twice the request timeout, at least `DRAIN_MIN_S`). `on_insecure(cluster, insecure)`
        is told, for every client opened, whether it is reached insecurely (the status's
        `set_insecure`, which the metrics read)."""
        self._path = kubeconfig
        self._access = access
        self._observer = observer
        self._env = env if env is not None else os.environ
        self._sa_dir = sa_dir
        self._drain_s = drain_s if drain_s is not None else max(
            DRAIN_MIN_S, 2 * access.request_timeout_s)
        self.tls = tls or TlsContexts()
        self._on_insecure = on_insecure
        self._warned_insecure: set[str] = set()  # warned once per cluster, not per reload
        self.user_agent = user_agent(convergerd.__version__, identity)
        self._clients: dict[ClusterId, _Lent] = {}
        self._retiring: set[_Lent] = set()
        self._drains: set[asyncio.Task[None]] = set()
        self._pinned: set[ClusterId] = set()  # home clusters: kept by `retain`
        self._kubeconfig: Kubeconfig | None = None
        self._stamp: tuple[int, int] | None = None
        if kubeconfig is not None:
            self._kubeconfig, self._stamp = _load(kubeconfig)

    def __repr__(self) -> str:
        return f"ClusterRegistry({self._path!s}, {len(self._clients)} clients)"

    @property
    def contexts(self) -> frozenset[str]:
        return self._kubeconfig.contexts if self._kubeconfig is not None else frozenset()

    def sizes(self) -> dict[str, int]:
        """How much this registry holds: open clients, retired ones still draining, calls in
        flight on either, SSL contexts (the soak benchmark and the tests watch these)."""
        lents = (*self._clients.values(), *self._retiring)
        return {"clients": len(self._clients), "retiring": len(self._retiring),
                "in_flight": sum(lent.in_flight for lent in lents),
                "tls_contexts": len(self.tls)}

    # -- handing out -----------------------------------------------------------------------

    def get(self, cluster_id: ClusterId) -> ClusterHandle:
        """The cluster's API; `NoCredentials` when the kubeconfig has no usable context."""
        self.client(cluster_id)
        return ClusterHandle(self, cluster_id)

    def home(self, context: str | None) -> ClusterHandle:
        """The home cluster (the Lease): a kubeconfig context, or in-cluster config (None).
        Opens the client now (a missing context is a startup error)."""
        cluster_id = ClusterId(context) if context is not None else HOME_IN_CLUSTER
        self._pinned.add(cluster_id)
        self.client(cluster_id)
        return ClusterHandle(self, cluster_id)

    def home_lease(self, context: str | None) -> ClusterHandle:
        """The home cluster's Lease API for a long-lived user (the elector)."""
        return self.home(context)

    def client(self, cluster_id: ClusterId) -> ClusterClient:
        """The cluster's current client, opened on first use."""
        return self._lend(cluster_id).client

    @contextlib.contextmanager
    def borrow(self, cluster_id: ClusterId) -> Iterator[ClusterClient]:
        """The current client, counted as in use until the block ends (a reload meanwhile
        retires it, and closes it only after)."""
        lent = self._lend(cluster_id)
        lent.in_flight += 1
        lent.idle.clear()
        try:
            yield lent.client
        finally:
            lent.in_flight -= 1
            if lent.in_flight == 0:
                lent.idle.set()

    def _lend(self, cluster_id: ClusterId) -> _Lent:
        lent = self._clients.get(cluster_id)
        if lent is not None:
            return lent
        if cluster_id == HOME_IN_CLUSTER:
            kwargs = {"sa_dir": self._sa_dir} if self._sa_dir is not None else {}
            return self._open(cluster_id, in_cluster_credentials(self._env, **kwargs))
        if self._kubeconfig is None:
            raise NoCredentials(
                f"no kubeconfig configured (CONVERGERD_KUBECONFIG), so no context for "
                f"{cluster_id!r}"
            )
        return self._open(cluster_id, self._kubeconfig.credentials(cluster_id))

    def _open(self, cluster_id: ClusterId, creds: Credentials) -> _Lent:
        # Every client, the home cluster's too, is opened here: the one place insecure
        # clusters are refused (NoCredentials, reason `insecure`) or, when allowed, flagged.
        insecure = check_secure(creds, allow_insecure=self._access.allow_insecure)
        if insecure is not None and cluster_id not in self._warned_insecure:
            self._warned_insecure.add(cluster_id)
            log.warning("cluster %s is reached insecurely (allowed by "
                        "CONVERGERD_ALLOW_INSECURE_CLUSTERS): %s", cluster_id, insecure,
                        extra={"cluster": cluster_id})
        if self._on_insecure is not None:
            self._on_insecure(cluster_id, insecure is not None)
        client = ClusterClient(
            cluster_id,
            creds,
            ssl_context=self.tls.context_for(creds),
            access=self._access,
            agent=self.user_agent,
            observer=self._observer,
        )
        lent = self._clients[cluster_id] = _Lent(creds, client)
        lent.idle.set()
        return lent

    # -- lifetimes -------------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Re-read the kubeconfig if the file changed; True when it did. Clients whose
        credentials changed (or whose context is gone) are retired."""
        if self._path is None:
            return False
        try:
            current = _stamp(self._path)
        except OSError:
            return False  # being replaced, or gone: keep what we have
        if current == self._stamp:
            return False
        kubeconfig, loaded = _load(self._path)
        self._kubeconfig, self._stamp = kubeconfig, loaded
        self._warned_insecure &= kubeconfig.contexts  # a context that comes back is new
        stale: list[ClusterId] = []
        for cluster_id, lent in self._clients.items():
            if cluster_id == HOME_IN_CLUSTER:
                continue
            try:
                fresh = kubeconfig.credentials(cluster_id)
            except NoCredentials:
                fresh = None
            if fresh != lent.creds:
                stale.append(cluster_id)
        await self._retire(stale)
        log.info("kubeconfig reloaded: %d contexts, %d clients rebuilt on next use",
                 len(kubeconfig.contexts), len(stale))
        return True

    async def retain(self, clusters: Collection[str]) -> None:
        """Keep the clients of `clusters` (the fleet) and the home cluster; retire the rest."""
        wanted = set(clusters) | self._pinned
        await self._retire([c for c in self._clients if c not in wanted])

    async def _retire(self, cluster_ids: Collection[ClusterId]) -> None:
        for cluster_id in cluster_ids:
            lent = self._clients.pop(cluster_id)
            if lent.in_flight == 0:
                await lent.client.close()
                continue
            self._retiring.add(lent)
            task = asyncio.create_task(self._drain(lent), name=f"drain client {cluster_id}")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        self._prune_tls()

    async def _drain(self, lent: _Lent) -> None:
        try:
            try:
                async with asyncio.timeout(self._drain_s):
                    await lent.idle.wait()
            except TimeoutError:
                log.warning("cluster %s: %d call(s) still in flight %g s after the client was "
                            "replaced; closing it", lent.client.cluster, lent.in_flight,
                            self._drain_s, extra={"cluster": lent.client.cluster})
            await lent.client.close()
        finally:
            self._retiring.discard(lent)
            self._prune_tls()

    def _prune_tls(self) -> None:
        self.tls.retain({tls_key(lent.creds)
                         for lent in (*self._clients.values(), *self._retiring)})

    async def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*self._drains, return_exceptions=True)
        lents = [*self._clients.values(), *self._retiring]
        self._clients.clear()
        self._retiring.clear()
        for lent in lents:
            await lent.client.close()


class ClusterHandle:
    """One cluster's `PolicyApi` and `LeaseApi` through the registry: every call goes to the
    cluster's current client and is counted in flight on it while it runs."""

    __slots__ = ("_cluster", "_registry")

    def __init__(self, registry: ClusterRegistry, cluster: ClusterId) -> None:
        self._registry = registry
        self._cluster = cluster

    def __repr__(self) -> str:
        return f"ClusterHandle({self._cluster!r})"

    @property
    def cluster(self) -> ClusterId:
        return self._cluster

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        with self._registry.borrow(self._cluster) as client:
            return await client.list_policies(label_selector=label_selector, timeout_s=timeout_s)

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        with self._registry.borrow(self._cluster) as client:
            return await client.apply_policy(body, timeout_s=timeout_s)

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        with self._registry.borrow(self._cluster) as client:
            return await client.delete_policy(name, timeout_s=timeout_s)

    async def get_policy(self, name: str, *, timeout_s: float) -> KubeObject | None:
        with self._registry.borrow(self._cluster) as client:
            return await client.get_policy(name, timeout_s=timeout_s)

    async def server_version(self, *, timeout_s: float) -> str:
        with self._registry.borrow(self._cluster) as client:
            return await client.server_version(timeout_s=timeout_s)

    async def get_lease(self, namespace: str, name: str, *, timeout_s: float) -> KubeObject | None:
        with self._registry.borrow(self._cluster) as client:
            return await client.get_lease(namespace, name, timeout_s=timeout_s)

    async def list_leases(self, namespace: str, *, timeout_s: float) -> list[KubeObject]:
        with self._registry.borrow(self._cluster) as client:
            return await client.list_leases(namespace, timeout_s=timeout_s)

    async def create_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        with self._registry.borrow(self._cluster) as client:
            return await client.create_lease(body, timeout_s=timeout_s)

    async def replace_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        with self._registry.borrow(self._cluster) as client:
            return await client.replace_lease(body, timeout_s=timeout_s)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def _load(path: Path) -> tuple[Kubeconfig, tuple[int, int] | None]:
    try:
        stamp: tuple[int, int] | None = _stamp(path)
    except OSError:
        stamp = None
    return load_kubeconfig(path), stamp
