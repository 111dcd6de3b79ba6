"""The `Informer` (list + watch cache) against the simulator through the real client."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from convergerd.config import ClusterAccess
from convergerd.core.model import ClusterId
from convergerd.kube.api import KubeObject
from convergerd.kube.objects import ObjectClient
from convergerd.kube.registry import ClusterRegistry
from convergerd.kube.watch import Informer
from convergerd.operator.controller import POLICIES
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES as SIM_POLICIES

CLUSTER = "c0001"


@contextlib.asynccontextmanager
async def small_history_fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with Fleet(clusters=1, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(7), bookmark_interval_s=0.2, history_limit=5) as f:
        yield f


@contextlib.asynccontextmanager
async def object_client(fleet: Fleet) -> AsyncIterator[ObjectClient]:
    access = ClusterAccess(kubeconfig=fleet.kubeconfig_path, request_timeout_s=5,
                           connect_timeout_s=2, qps=1000, burst=1000, apply_concurrency=2)
    registry = ClusterRegistry(kubeconfig=fleet.kubeconfig_path, access=access, identity="t")
    try:
        yield ObjectClient(registry.client(ClusterId(CLUSTER)))
    finally:
        await registry.close()


def put(fleet: Fleet, name: str, value: int) -> None:
    store = fleet.store(CLUSTER)
    body: dict[str, Any] = {"apiVersion": SIM_POLICIES.api_version, "kind": "Policy",
            "metadata": {"name": name}, "spec": {"value": value}}
    try:
        existing = store.get(SIM_POLICIES, None, name)
    except Exception:
        store.create(SIM_POLICIES, None, body, manager="test")
        return
    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
    store.update(SIM_POLICIES, None, name, body, manager="test")


async def until(check: Any, timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.02)


def values(informer: Informer) -> dict[str, Any]:
    return {n: o["spec"]["value"] for n, o in informer.objects.items()}


async def test_resumes_after_the_server_ends_the_watch_without_relisting(tmp_path: Path) -> None:
    async with small_history_fleet(tmp_path) as fleet, object_client(fleet) as api:
        put(fleet, "a", 1)
        changes: list[tuple[str, KubeObject | None]] = []
        restarts: list[str] = []
        informer = Informer(api, POLICIES, request_timeout_s=5, watch_timeout_s=1,
                            on_change=lambda n, o: changes.append((n, o)),
                            on_restart=restarts.append)
        task = asyncio.create_task(informer.run())
        try:
            await informer.synced.wait()
            await until(lambda: "closed" in restarts)  # the server ended a 1 s watch
            put(fleet, "b", 2)
            put(fleet, "a", 3)
            await until(lambda: values(informer) == {"a": 3, "b": 2})
            fleet.store(CLUSTER).delete(SIM_POLICIES, None, "b")
            await until(lambda: values(informer) == {"a": 3})
        finally:
            task.cancel()
        assert informer.lists == 1
        assert [n for n, _ in changes] == ["a", "b", "a", "b"]
        assert changes[-1][1] is None


async def test_relists_on_410_and_reports_only_differences(tmp_path: Path) -> None:
    async with small_history_fleet(tmp_path) as fleet, object_client(fleet) as api:
        put(fleet, "a", 1)
        put(fleet, "keep", 0)
        changes: list[tuple[str, KubeObject | None]] = []
        restarts: list[str] = []
        informer = Informer(api, POLICIES, request_timeout_s=5,
                            on_change=lambda n, o: changes.append((n, o)),
                            on_restart=restarts.append)
        await informer.relist()
        changes.clear()
        for i in range(10):  # more changes than the history keeps: the version expires
            put(fleet, "a", 10 + i)
        put(fleet, "new", 5)
        task = asyncio.create_task(informer.run())
        try:
            await until(lambda: values(informer) == {"a": 19, "keep": 0, "new": 5})
        finally:
            task.cancel()
        assert restarts[0] == "expired"
        assert informer.lists == 2
        assert sorted(n for n, _ in changes) == ["a", "new"]  # "keep" did not change


async def test_keeps_retrying_through_a_down_cluster(tmp_path: Path) -> None:
    from convergerd.sim.faults import Faults

    async with small_history_fleet(tmp_path) as fleet, object_client(fleet) as api:
        put(fleet, "a", 1)
        restarts: list[str] = []
        informer = Informer(api, POLICIES, request_timeout_s=2, watch_timeout_s=1,
                            on_restart=restarts.append)
        task = asyncio.create_task(informer.run())
        try:
            await informer.synced.wait()
            fleet.set_faults(CLUSTER, Faults(down=True))
            await until(lambda: any(r not in ("closed", "expired") for r in restarts))
            fleet.clear_faults(CLUSTER)
            put(fleet, "a", 2)
            await until(lambda: values(informer) == {"a": 2})
        finally:
            task.cancel()
        assert informer.lists == 1
