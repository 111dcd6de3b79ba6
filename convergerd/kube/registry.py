"""`ClusterRegistry`: one `ClusterClient` per cluster, created on first use and reused across
rounds, SSL contexts shared by CA, all pools closed together.

The kubeconfig is re-read by `refresh()` when the file changed (size or mtime): clients whose
credentials changed are closed and rebuilt on next use, the others keep their pools.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import convergerd
from convergerd.config import ClusterAccess
from convergerd.errors import NoCredentials
from convergerd.kube.api import KubeObject, LeaseApi, RequestObserver
from convergerd.kube.client import ClusterClient, user_agent
from convergerd.kube.kubeconfig import (
    Credentials,
    Kubeconfig,
    check_secure,
    in_cluster_credentials,
    load_kubeconfig,
)
from convergerd.kube.tlsctx import TlsContexts
from convergerd.model import ClusterId

log = logging.getLogger(__name__)

HOME_IN_CLUSTER = ClusterId("in-cluster")


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
        on_insecure: Callable[[str, bool], None] | None = None,
    ) -> None:
        """`on_insecure(cluster, insecure)` is told, for every client opened, whether it is
        reached insecurely (the metrics' `set_cluster_insecure`)."""
        self._path = kubeconfig
        self._access = access
        self._observer = observer
        self._env = env if env is not None else os.environ
        self._sa_dir = sa_dir
        self.tls = tls or TlsContexts()
        self.user_agent = user_agent(convergerd.__version__, identity)
        self._clients: dict[ClusterId, tuple[Credentials, ClusterClient]] = {}
        self._kubeconfig: Kubeconfig | None = None
        self._stamp: tuple[int, int] | None = None
        self._on_insecure = on_insecure
        self._warned_insecure: set[str] = set()  # warned once per cluster, not per reload
        if kubeconfig is not None:
            self._kubeconfig, self._stamp = _load(kubeconfig)

    def __repr__(self) -> str:
        return f"ClusterRegistry({self._path!s}, {len(self._clients)} clients)"

    @property
    def contexts(self) -> frozenset[str]:
        return self._kubeconfig.contexts if self._kubeconfig is not None else frozenset()

    def has_context(self, cluster_id: str) -> bool:
        return self._kubeconfig is not None and cluster_id in self._kubeconfig

    def get(self, cluster_id: ClusterId) -> ClusterClient:
        """The cluster's client; `NoCredentials` when the kubeconfig has no usable context."""
        entry = self._clients.get(cluster_id)
        if entry is not None:
            return entry[1]
        if self._kubeconfig is None:
            raise NoCredentials(
                f"no kubeconfig configured (CONVERGERD_KUBECONFIG), so no context for "
                f"{cluster_id!r}"
            )
        return self._open(cluster_id, self._kubeconfig.credentials(cluster_id))

    def home(self, context: str | None) -> ClusterClient:
        """The home cluster (the Lease): a kubeconfig context, or in-cluster config (None)."""
        if context is not None:
            return self.get(ClusterId(context))
        entry = self._clients.get(HOME_IN_CLUSTER)
        if entry is not None:
            return entry[1]
        kwargs = {"sa_dir": self._sa_dir} if self._sa_dir is not None else {}
        return self._open(HOME_IN_CLUSTER, in_cluster_credentials(self._env, **kwargs))

    def home_lease(self, context: str | None) -> LeaseApi:
        """The home cluster's Lease API for a long-lived user (the elector): each call goes
        through the current client, so a kubeconfig reload that rebuilds home's client does not
        leave the caller on the closed one. Opens the client now (a missing context is a
        startup error)."""
        self.home(context)
        return _HomeLease(self, context)

    async def refresh(self) -> bool:
        """Re-read the kubeconfig if the file changed; True when it did. Clients whose
        credentials changed (or whose context is gone) are closed."""
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
        stale: list[ClusterClient] = []
        for cluster_id, (creds, client) in list(self._clients.items()):
            if cluster_id == HOME_IN_CLUSTER:
                continue
            try:
                fresh = kubeconfig.credentials(cluster_id)
            except NoCredentials:
                fresh = None
            if fresh != creds:
                del self._clients[cluster_id]
                stale.append(client)
        for client in stale:
            await client.close()
        log.info("kubeconfig reloaded: %d contexts, %d clients rebuilt on next use",
                 len(kubeconfig.contexts), len(stale))
        return True

    async def close(self) -> None:
        clients = [client for _, client in self._clients.values()]
        self._clients.clear()
        for client in clients:
            await client.close()

    def _open(self, cluster_id: ClusterId, creds: Credentials) -> ClusterClient:
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
        self._clients[cluster_id] = (creds, client)
        return client


class _HomeLease:
    def __init__(self, registry: ClusterRegistry, context: str | None) -> None:
        self._registry = registry
        self._context = context

    def __repr__(self) -> str:
        return f"_HomeLease({self._context or HOME_IN_CLUSTER!r})"

    async def get_lease(self, namespace: str, name: str, *, timeout_s: float) -> KubeObject | None:
        client = self._registry.home(self._context)
        return await client.get_lease(namespace, name, timeout_s=timeout_s)

    async def create_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        return await self._registry.home(self._context).create_lease(body, timeout_s=timeout_s)

    async def replace_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        return await self._registry.home(self._context).replace_lease(body, timeout_s=timeout_s)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def _load(path: Path) -> tuple[Kubeconfig, tuple[int, int] | None]:
    try:
        stamp: tuple[int, int] | None = _stamp(path)
    except OSError:
        stamp = None
    return load_kubeconfig(path), stamp
