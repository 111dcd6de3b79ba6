"""The operator's workload cache and audit against the simulator: a Policy's `status.audit`
counts the running objects its rule would deny, enabled or not, and follows the cluster."""

from __future__ import annotations

import gc
import logging
import random
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from convergerd.operator.main import OperatorProcess
from convergerd.operator.workloads import SLIM_BYTES_BUDGET
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import DEPLOYMENTS, NAMESPACES, PODS
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    get,
    operator_settings,
    put_policy,
    running,
    wait_for,
)

BOUNDARY_LABEL = "platform.stackship.se/boundary"
WEB, API, OTHER = "team-a-web", "team-a-api", "team-b-web"
PODS_AT_SCALE = 10_000
UNPINNED = ("image(s) 'nginx' have no tag or digest, which means tag 'latest': pin a version "
            "tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)")


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """One member cluster; a watch more than 20 events behind gets 410 (a slow consumer)."""
    async with Fleet(clusters=1, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(21), bookmark_interval_s=0.5,
                     watch_buffer_limit=20) as f:
        yield f


def namespace(fleet: Fleet, name: str, boundary: str) -> None:
    fleet.store(CLUSTER).create(NAMESPACES, None, {"metadata": {
        "name": name, "labels": {BOUNDARY_LABEL: boundary}}}, manager="test")


def pod(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}]}}


def put_pod(fleet: Fleet, ns: str, name: str, image: str) -> None:
    fleet.store(CLUSTER).create(PODS, ns, pod(name, image), manager="test")


def set_image(fleet: Fleet, ns: str, name: str, image: str) -> None:
    store = fleet.store(CLUSTER)
    current = store.get(PODS, ns, name)
    current["spec"]["containers"][0]["image"] = image
    store.update(PODS, ns, name, current, manager="test")


async def audit_of(fleet: Fleet, pid: str, **want: Any) -> dict[str, Any] | None:
    """The Policy's status.audit once it has every `want` field, else None."""
    policy = await get(fleet, f"{POLICIES}/policy-{pid}")
    found = ((policy or {}).get("status") or {}).get("audit")
    if isinstance(found, dict) and all(found.get(k) == v for k, v in want.items()):
        return found
    return None


def cache_lists(proc: OperatorProcess) -> int:
    assert proc.operator is not None
    return proc.operator.workloads.kinds["Pod"].lists


async def test_a_disabled_policy_audits_what_already_runs_and_follows_changes(
        fleet: Fleet) -> None:
    for ns, boundary in ((WEB, "b1"), (API, "b1"), (OTHER, "b2")):
        namespace(fleet, ns, boundary)
    for i in range(3):
        put_pod(fleet, WEB, f"web-{i}", "nginx")  # implied latest: denied
    put_pod(fleet, WEB, "web-ok", "nginx:1.27.3")
    put_pod(fleet, OTHER, "elsewhere", "nginx")  # another boundary: not this policy's
    fleet.store(CLUSTER).create(DEPLOYMENTS, API, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api"},
        "spec": {"selector": {"matchLabels": {"app": "api"}}, "template": {
            "metadata": {"labels": {"app": "api"}},
            "spec": {"containers": [{"name": "api", "image": "api:latest"}]}}}},
        manager="test")

    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "nolatest", enabled=False, rule={"type": "ForbidLatestTag"})
        found = await wait_for(lambda: audit_of(fleet, "nolatest", violations=4,
                                                cacheSynced=True))
        assert found["sample"] == [
            {"kind": "Deployment", "namespace": API, "name": "api",
             "message": "image(s) 'api:latest' use the tag 'latest', which changes under you: "
                        "pin a version tag (e.g. nginx:1.27.3) or a digest (nginx@sha256:...)"},
            *({"kind": "Pod", "namespace": WEB, "name": f"web-{i}", "message": UNPINNED}
              for i in range(3))]
        policy = await get(fleet, f"{POLICIES}/policy-nolatest")
        assert policy is not None
        assert policy["status"]["phase"] == "Inert"  # the reconciler's fields are kept too
        # Listed in pages, cluster-wide (one watch per kind, not per namespace).
        lists = [r.path for r in fleet.accounting.requests(cluster=CLUSTER, verb="list")
                 if r.path.startswith(("/api/v1/pods?", "/apis/apps/v1/deployments?"))]
        assert len(lists) == 2
        assert all("limit=500" in path for path in lists), lists

        # A compliant change to one pod: the watch brings it, the count drops.
        set_image(fleet, WEB, "web-1", "nginx:1.27.3")
        found = await wait_for(lambda: audit_of(fleet, "nolatest", violations=3), 10)
        assert [s["name"] for s in found["sample"]] == ["api", "web-0", "web-2"]
        assert cache_lists(proc) == 1  # no re-list: the watch carried it

        # More changes at once than a watch may fall behind by: 410, one re-list, and the
        # same answer as a fresh list would give.
        assert proc.operator is not None
        store = fleet.store(CLUSTER)
        for i in range(30):
            put_pod(fleet, WEB, f"burst-{i:02d}", "nginx:1" if i % 3 else "nginx")
        store.delete(PODS, WEB, "web-0")
        found = await wait_for(lambda: audit_of(fleet, "nolatest", violations=12,
                                                cacheSynced=True))
        assert proc.metrics.workload_watch_restarts.get("expired", 0) >= 1
        assert cache_lists(proc) >= 2
        assert [s["name"] for s in found["sample"]] == [
            "api", "burst-00", "burst-03", "burst-06", "burst-09"]
        assert len(proc.operator.workloads) == 34  # web-ok, web-1, web-2, 30 bursts, api
        text = proc.metrics.render().decode()
        assert "convergerd_operator_workload_cache_objects 34.0" in text
        assert "convergerd_operator_workload_cache_synced 1.0" in text
        assert "convergerd_operator_audit_violations 12.0" in text
        assert set(proc.metrics.workload_watch_restarts) == {"closed", "expired"}


async def test_a_namespace_joining_the_boundary_is_listed_and_audited(fleet: Fleet) -> None:
    namespace(fleet, WEB, "b1")
    fleet.store(CLUSTER).create(NAMESPACES, None, {"metadata": {"name": "later"}},
                                manager="test")
    put_pod(fleet, "later", "old", "nginx")
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "regs", rule={"type": "AllowedRegistries",
                                              "registries": ["registry.example.com"]})
        await wait_for(lambda: audit_of(fleet, "regs", violations=0, cacheSynced=True))
        store = fleet.store(CLUSTER)
        ns = store.get(NAMESPACES, None, "later")
        ns["metadata"]["labels"] = {BOUNDARY_LABEL: "b1"}
        store.update(NAMESPACES, None, "later", ns, manager="test")
        found = await wait_for(lambda: audit_of(fleet, "regs", violations=1, cacheSynced=True))
        assert found["sample"][0]["name"] == "old"
        assert found["sample"][0]["message"].startswith("image(s) 'nginx' not from an allowed")
        assert proc.operator is not None
        assert len(proc.operator.workloads) == 1
        lists = cache_lists(proc)

        # It leaves the boundary: its objects are dropped, nothing is listed again.
        ns = store.get(NAMESPACES, None, "later")
        ns["metadata"]["labels"] = {BOUNDARY_LABEL: "b2"}
        store.update(NAMESPACES, None, "later", ns, manager="test")
        await wait_for(lambda: audit_of(fleet, "regs", violations=0, cacheSynced=True))
        assert len(proc.operator.workloads) == 0
        assert cache_lists(proc) == lists
        # Nine watches at once (Policies, Namespaces, seven kinds) never starve the requests.
        assert set(proc.metrics.workload_watch_restarts) == {"closed", "expired"}


async def test_the_cache_of_10000_pods_listed_from_a_cluster_stays_within_its_budget(
        fleet: Fleet) -> None:
    """Through the real client, paged list and watch: what the cache retains (allocations made
    by the operator's, the client's and the decoder's code, after a collection) per pod."""
    namespace(fleet, WEB, "b1")
    store = fleet.store(CLUSTER)
    for i in range(PODS_AT_SCALE):
        store.create(PODS, WEB, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"api-7f9c-{i:05d}", "labels": {
                "app": "api", "pod-template-hash": "7f9c", "team": "a"},
                "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"}},
            "spec": {"containers": [
                {"name": "api", "image": "registry.example.com/team-a/api:1.4.2",
                 "ports": [{"containerPort": 8080}]},
                {"name": "proxy", "image": "registry.example.com/envoy:1.31"}]}},
            manager="kubectl-client-side-apply")
    gc.collect()
    tracemalloc.start()
    try:
        async with running(operator_settings(fleet)) as proc:
            await put_policy(fleet, "nolatest", enabled=False)
            await wait_for(lambda: audit_of(fleet, "nolatest", violations=0, cacheSynced=True),
                           120)
            assert proc.operator is not None
            assert len(proc.operator.workloads) == PODS_AT_SCALE
            gc.collect()
            snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    ours = [tracemalloc.Filter(True, f"*/convergerd/{part}/*")
            for part in ("operator", "kube", "core")]
    retained = sum(stat.size for stat in snapshot.filter_traces(ours).statistics("filename"))
    per_pod = retained / PODS_AT_SCALE
    figure = (f"{PODS_AT_SCALE} pods listed from the simulator: the cache retains "
              f"{retained / 2**20:.1f} MiB, {per_pod:.0f} bytes per pod (budget "
              f"{SLIM_BYTES_BUDGET})")
    logging.getLogger(__name__).warning("%s", figure)
    assert per_pod <= SLIM_BYTES_BUDGET, figure
