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
            charged = proc.operator.workloads.used_bytes
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
              f"{SLIM_BYTES_BUDGET}); it charges {charged / PODS_AT_SCALE:.0f} per pod")
    logging.getLogger(__name__).warning("%s", figure)
    assert per_pod <= SLIM_BYTES_BUDGET, figure
    # What the cache charges against its budget is at least what it retains.
    assert retained <= charged, figure


# -- one tenant's objects cannot stop another's audit (issue 33) --------------------------------

SMALL_CAP = 128 * 1024  # the response cap of these tests (16 MiB in production)


def deployment(name: str, images: list[str], annotation: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotation:  # within Kubernetes' 256 KiB of annotations per object
        meta["annotations"] = {"example.com/blob": "x" * annotation}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": f"c{i}", "image": image}
                                        for i, image in enumerate(images)]}}}}


def put_deployment(fleet: Fleet, ns: str, body: dict[str, Any]) -> None:
    fleet.store(CLUSTER).create(DEPLOYMENTS, ns, body, manager="test")


def metric(proc: OperatorProcess, line: str) -> bool:
    return line in proc.metrics.render().decode()


async def test_objects_too_large_to_list_stop_no_audit_and_are_named(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    """Deployments of `replicas: 0` and a large annotation each, in a namespace of no
    boundary, make every cluster-wide list page larger than the response cap; three more are
    larger than the cap alone (one of them in boundary b2's namespace, one the last listed)."""
    caplog.set_level(logging.INFO, logger="convergerd.operator")
    namespace(fleet, WEB, "b1")
    namespace(fleet, OTHER, "b2")
    fleet.store(CLUSTER).create(NAMESPACES, None, {"metadata": {"name": "intruder"}},
                                manager="test")
    for i in range(3):
        put_pod(fleet, WEB, f"web-{i}", "nginx")  # implied latest: denied
    put_deployment(fleet, WEB, deployment("web", ["nginx:latest"]))
    for i in range(24):  # 24 x 40 KB: a page of 500 is 7 times the cap
        put_deployment(fleet, "intruder", deployment(f"filler-{i:02d}", ["a:1"], 40_000))
    put_deployment(fleet, "intruder", deployment("huge", ["a:1"], 200_000))
    put_deployment(fleet, OTHER, deployment("huge", ["nginx"], 200_000))
    put_deployment(fleet, OTHER, deployment("small", ["nginx"]))
    fleet.store(CLUSTER).create(NAMESPACES, None, {"metadata": {"name": "zz-last"}},
                                manager="test")
    put_deployment(fleet, "zz-last", deployment("huge", ["a:1"], 200_000))  # listed last

    async with running(operator_settings(
            fleet, CONVERGERD_MAX_RESPONSE_BYTES=str(SMALL_CAP))) as proc:
        await put_policy(fleet, "b1", enabled=False, rule={"type": "ForbidLatestTag"})
        await put_policy(fleet, "b2", enabled=False, boundary="b2",
                         rule={"type": "ForbidLatestTag"})
        b1 = await wait_for(lambda: audit_of(fleet, "b1", violations=4, cacheSynced=True))
        assert "incomplete" not in b1  # another boundary's object is no concern of b1's
        assert [s["name"] for s in b1["sample"]] == ["web", "web-0", "web-1", "web-2"]
        b2 = await wait_for(lambda: audit_of(fleet, "b2", violations=1, cacheSynced=True))
        assert b2["sample"][0]["name"] == "small"
        assert b2["incomplete"]["skipped"] == 1
        assert b2["incomplete"]["objects"] == [
            {"kind": "Deployment", "namespace": OTHER, "name": "huge", "reason": "TooLarge"}]
        assert "larger than the operator's response cap" in b2["incomplete"]["reason"]

        # Pages shrank where they had to, and the list went on past each object too large.
        lists = [r.path for r in fleet.accounting.requests(cluster=CLUSTER, verb="list")
                 if r.path.startswith("/apis/apps/v1/deployments?")]
        assert any("limit=1&" in p or p.endswith("limit=1") for p in lists), lists
        assert len(lists) < 60, len(lists)  # the limit grows back after a page that fits
        assert metric(proc, 'convergerd_operator_workload_cache_skipped{reason="too_large"} 3.0')
        assert proc.operator is not None
        assert sorted(proc.operator.workloads.kinds["Deployment"].skipped) == [
            "intruder/huge", f"{OTHER}/huge", "zz-last/huge"]
        assert len(proc.operator.workloads) == 5  # 3 pods, web, small and nothing else

        # The watch too: an event too large to read is stepped past and named, the watch
        # resumes after it; the object's deletion is seen although its event is as large.
        store = fleet.store(CLUSTER)
        small = store.get(DEPLOYMENTS, OTHER, "small")
        small["metadata"]["annotations"] = {"example.com/blob": "z" * 200_000}
        store.update(DEPLOYMENTS, OTHER, "small", small, manager="test")
        b2 = await wait_for(lambda: audit_of(fleet, "b2", violations=0, cacheSynced=True))
        assert [o["name"] for o in b2["incomplete"]["objects"]] == ["huge", "small"]
        store.delete(DEPLOYMENTS, OTHER, "huge")
        b2 = await wait_for(lambda: _skipped(fleet, "b2", 1))
        assert [o["name"] for o in b2["incomplete"]["objects"]] == ["small"]
        await wait_for(lambda: audit_of(fleet, "b1", violations=4, cacheSynced=True))
        assert proc.metrics.workload_watch_restarts.get("too_large") == 2
    named = [r.getMessage() for r in caplog.records if "stepped past" in r.getMessage()]
    assert len(named) == 2, named  # once per change, not per list or audit
    assert f"{OTHER}/huge" in named[0]
    assert "intruder/huge" in named[0]
    assert f"an event about {OTHER}/small" in named[1]


async def test_a_boundary_of_huge_pod_specs_keeps_bounded_bytes(fleet: Fleet) -> None:
    """Deployments of 1,400 containers with 600-character images: the cache keeps no image
    longer than any valid reference, says so, and judges such an object 'cannot be judged'."""
    namespace(fleet, WEB, "b1")
    namespace(fleet, OTHER, "b2")
    for i in range(3):
        put_pod(fleet, WEB, f"web-{i}", "nginx")
    for i in range(4):
        put_deployment(fleet, OTHER, deployment(
            f"wide-{i}", [f"registry.example.com/{c:04d}/" + "x" * 578 + ":1"
                          for c in range(1400)]))
    async with running(operator_settings(fleet)) as proc:
        await put_policy(fleet, "b1", enabled=False)
        await put_policy(fleet, "b2", enabled=False, boundary="b2",
                         rule={"type": "AllowedRegistries",
                               "registries": ["registry.example.com"]})
        await wait_for(lambda: audit_of(fleet, "b1", violations=3, cacheSynced=True))
        b2 = await wait_for(lambda: audit_of(fleet, "b2", violations=4, cacheSynced=True), 60)
        assert "incomplete" not in b2  # every object judged (as not judgeable)
        assert b2["sample"][0]["message"].startswith(
            "cannot be judged: 1400 image(s) longer than 512 characters (no valid image "
            "reference is) not kept, the first 'registry.example.com/0000/xxx")
        assert proc.operator is not None
        cache = proc.operator.workloads
        # 4 objects of 840,000 image characters each: a few KiB in all.
        assert cache.used_bytes < 7 * 2048, cache.used_bytes
        assert cache.biggest(1)[0][0] == OTHER


async def test_at_its_budget_the_cache_says_incomplete_and_names_the_biggest_namespaces(
        fleet: Fleet) -> None:
    budget = 256 * 1024  # the smallest allowed
    namespace(fleet, WEB, "b1")
    namespace(fleet, OTHER, "b2")
    for i in range(3):
        put_pod(fleet, WEB, f"web-{i}", "nginx")
    async with running(operator_settings(
            fleet, CONVERGERD_OPERATOR_CACHE_MAX_BYTES=str(budget))) as proc:
        await put_policy(fleet, "b1", enabled=False)
        await put_policy(fleet, "b2", enabled=False, boundary="b2")
        await wait_for(lambda: audit_of(fleet, "b1", violations=3, cacheSynced=True))
        await wait_for(lambda: audit_of(fleet, "b2", violations=0, cacheSynced=True))
        assert proc.operator is not None
        cache = proc.operator.workloads

        # b2's tenant adds Deployments of as many 500-character images as an object may
        # keep whole (about 15 KiB charged each): 20 of them are past the budget.
        for i in range(20):
            put_deployment(fleet, OTHER, deployment(
                f"wide-{i:02d}", [f"registry.example.com/{c:03d}/" + "y" * 470 + ":1"
                                  for c in range(22)]))
        b2 = await wait_for(lambda: _incomplete(fleet, "b2"))
        assert b2["incomplete"]["biggestNamespaces"][0] == OTHER
        assert b2["incomplete"]["skipped"] == cache.refused_objects > 0
        assert "at its budget of 0.2 MiB" in b2["incomplete"]["reason"]
        # The cache's own accounting: within its budget (stubs within their margin), and
        # equal to what a recount of the objects it holds gives.
        assert cache.used_bytes <= budget * 1.125
        assert cache.used_bytes == cache.held_bytes()
        assert metric(proc, f"convergerd_operator_workload_cache_budget_bytes {budget}.0")
        # b1's objects came first: its audit is whole, and it says so.
        b1 = await audit_of(fleet, "b1", violations=3, cacheSynced=True)
        assert b1 is not None
        assert "incomplete" not in b1

        # The tenant removes them: the stubs go, the audit is whole again.
        for i in range(20):
            fleet.store(CLUSTER).delete(DEPLOYMENTS, OTHER, f"wide-{i:02d}")
        await wait_for(lambda: audit_of(fleet, "b2", violations=0, cacheSynced=True))
        await wait_for(lambda: _whole(fleet, "b2"))
        assert cache.refused_objects == 0
        assert cache.used_bytes < budget / 2


async def _incomplete(fleet: Fleet, pid: str) -> dict[str, Any] | None:
    found = await audit_of(fleet, pid)
    return found if found is not None and "incomplete" in found else None


async def _whole(fleet: Fleet, pid: str) -> bool:
    found = await audit_of(fleet, pid)
    return found is not None and "incomplete" not in found


async def _skipped(fleet: Fleet, pid: str, count: int) -> dict[str, Any] | None:
    found = await _incomplete(fleet, pid)
    return found if found is not None and found["incomplete"]["skipped"] == count else None
