"""Shared pieces of the save/delete tests: a `Saver` wired as the daemon wires it (the real
registry on the simulator's kubeconfig, `fanout.fanout_env`, the store), the daemon's app over
it served to a test client, and a cluster source that runs a hook before a round's list, after
it or before a write (to inject a save or a delete there)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.core.model import ClusterId
from convergerd.delivery.apply import Unfenced
from convergerd.delivery.fanout import Saver, fanout_env
from convergerd.kube.api import Applied, KubeObject, ObjectList, PolicyApi
from convergerd.kube.registry import ClusterRegistry
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import FanoutMetrics, Metrics
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, settings_for

Hook = Callable[[], Awaitable[None]]


def make_saver(rounds: Rounds, store: Store, *, guard_share: float = 0.5,
               metrics: FanoutMetrics | None = None) -> Saver:
    registry: ClusterRegistry = rounds.registry
    settings = rounds.settings
    return Saver(
        store=store,
        env=lambda: fanout_env(settings, registry, Unfenced(), rounds.metrics),
        guard_share=guard_share,
        observer=metrics,
    )


@asynccontextmanager
async def daemon_client(fleet: Fleet, database_url: str, store: Store, env: dict[str, str],
                        **parts: Any) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The daemon's app over the real `store` (the fleet document imported) and the simulator,
    its settings from `env`, saving with `make_saver`; `parts`: the optional pieces of
    `make_app` the test needs (`modes=store`, `exceptions=store`)."""
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, **env)
    rounds = Rounds(fleet, store, settings)
    state = StatusState(identity="t", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=make_saver(rounds, store), **parts)
    try:
        async with TestClient(TestServer(app)) as c:
            yield c
    finally:
        await rounds.close()


@dataclass
class HookedApi:
    """A cluster's real client; `before_list` / `after_list` / `before_apply` run once, at
    that point."""

    inner: PolicyApi
    before_list: Hook | None = None
    after_list: Hook | None = None
    before_apply: Hook | None = None

    @property
    def cluster(self) -> ClusterId:
        return self.inner.cluster

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        hook, self.before_list = self.before_list, None
        if hook is not None:
            await hook()
        listed = await self.inner.list_policies(label_selector=label_selector,
                                                timeout_s=timeout_s)
        hook, self.after_list = self.after_list, None
        if hook is not None:
            await hook()
        return listed

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        hook, self.before_apply = self.before_apply, None
        if hook is not None:
            await hook()
        return await self.inner.apply_policy(body, timeout_s=timeout_s)

    async def get_policy(self, name: str, *, timeout_s: float) -> KubeObject | None:
        get = self.inner.get_policy  # type: ignore[attr-defined]  # a save's client has it
        found: KubeObject | None = await get(name, timeout_s=timeout_s)
        return found

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        return await self.inner.delete_policy(name, timeout_s=timeout_s)

    async def server_version(self, *, timeout_s: float) -> str:
        return await self.inner.server_version(timeout_s=timeout_s)


@dataclass
class HookedClusters:
    registry: ClusterRegistry
    hooked: dict[str, HookedApi] = field(default_factory=dict)

    def hook(self, cluster: str, **hooks: Any) -> None:
        self.hooked[cluster] = HookedApi(self.registry.get(ClusterId(cluster)), **hooks)

    def get(self, cluster: ClusterId) -> PolicyApi:
        return self.hooked.get(cluster) or self.registry.get(cluster)
