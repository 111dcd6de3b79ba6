"""Simulator contract: resource verbs over HTTP, with kubernetes-asyncio, the official sync
client and raw requests where the wire format is the point (status codes, watch framing)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes
import pytest
from kubernetes_asyncio import client, config

from convergerd.sim.fleet import Fleet
from convergerd.sim.tls import client_ssl_context
from tests.fixtures.fleet import kube_http

GROUP, VERSION, PLURAL = "platform.stackship.se", "v1alpha1", "policies"
POLICIES = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/stackship-system/leases"
APPLY = "application/apply-patch+yaml"


def policy(name: str, *, team: str = "a", enabled: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Policy",
        "metadata": {"name": name, "labels": {"team": team}},
        "spec": {"policyId": name, "enabled": enabled, "revision": 1},
        **extra,
    }


@asynccontextmanager
async def api_client(fleet: Fleet, context: str = "c0001") -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(fleet.kubeconfig_path), context=context, client_configuration=cfg
    )
    async with client.ApiClient(cfg) as api:
        yield api


async def apply(
    fleet: Fleet,
    body: dict[str, Any],
    *,
    manager: str = "stackship-platform",
    cluster: str = "c0001",
    query: str = "",
) -> Any:
    name = body["metadata"]["name"]
    return await kube_http(
        fleet,
        cluster,
        "PATCH",
        f"{POLICIES}/{name}?fieldManager={manager}{query}",
        body=body,
        content_type=APPLY,
    )


# -- create, get, update ---------------------------------------------------------------------


async def test_create_is_201_with_server_metadata(fleet: Fleet) -> None:
    resp = await kube_http(
        fleet,
        "c0001",
        "POST",
        POLICIES,
        body=policy("p1"),
        headers={"User-Agent": "probe/1.2 (test)"},
    )
    assert resp.status == 201
    meta = resp.json()["metadata"]
    assert meta["generation"] == 1
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    # No fieldManager parameter: the manager is the User-Agent up to its first "/".
    assert [(m["manager"], m["operation"]) for m in meta["managedFields"]] == [("probe", "Update")]

    again = await kube_http(fleet, "c0001", "POST", POLICIES, body=policy("p1"))
    assert again.status == 409
    assert again.json()["reason"] == "AlreadyExists"
    assert again.json()["message"] == 'policies.platform.stackship.se "p1" already exists'


async def test_update_needs_the_current_resource_version(fleet: Fleet) -> None:
    created = (await kube_http(fleet, "c0001", "POST", POLICIES, body=policy("p1"))).json()
    stale = policy("p1", enabled=False)
    stale["metadata"]["resourceVersion"] = "1"
    conflict = await kube_http(fleet, "c0001", "PUT", f"{POLICIES}/p1", body=stale)
    assert conflict.status == 409
    assert conflict.json()["message"] == (
        'Operation cannot be fulfilled on policies.platform.stackship.se "p1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    missing_rv = await kube_http(fleet, "c0001", "PUT", f"{POLICIES}/p1", body=policy("p1"))
    assert missing_rv.status == 422
    assert missing_rv.json()["details"]["causes"][0]["field"] == "metadata.resourceVersion"

    current = policy("p1", enabled=False)
    current["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    ok = await kube_http(fleet, "c0001", "PUT", f"{POLICIES}/p1", body=current)
    assert ok.status == 200
    assert ok.json()["metadata"]["generation"] == 2
    assert int(ok.json()["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )


async def test_lease_put_creates_and_micro_time_is_strict(fleet: Fleet) -> None:
    lease: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "convergerd", "namespace": "stackship-system"},
        "spec": {
            "holderIdentity": "a",
            "leaseDurationSeconds": 15,
            "renewTime": "2025-01-02T03:04:05.123456Z",
        },
    }
    created = await kube_http(fleet, "home", "PUT", f"{LEASES}/convergerd", body=lease)
    assert created.status == 201
    assert created.json()["spec"]["renewTime"] == "2025-01-02T03:04:05.123456Z"
    lease["metadata"]["name"] = "other"
    lease["spec"]["renewTime"] = "2025-01-02T03:04:05Z"
    bad = await kube_http(fleet, "home", "POST", LEASES, body=lease)
    assert bad.status == 400


async def test_dry_run_stores_nothing(fleet: Fleet) -> None:
    resp = await kube_http(fleet, "c0001", "POST", f"{POLICIES}?dryRun=All", body=policy("dry"))
    assert resp.status == 201
    assert (await kube_http(fleet, "c0001", "GET", f"{POLICIES}/dry")).status == 404


async def test_delete_answers_success_status_for_custom_resources(fleet: Fleet) -> None:
    await kube_http(fleet, "c0001", "POST", POLICIES, body=policy("gone"))
    resp = await kube_http(fleet, "c0001", "DELETE", f"{POLICIES}/gone")
    assert resp.status == 200
    assert resp.json()["status"] == "Success"
    missing = await kube_http(fleet, "c0001", "DELETE", f"{POLICIES}/gone")
    assert missing.status == 404
    assert missing.json()["details"] == {"name": "gone", "group": GROUP, "kind": PLURAL}


# -- server-side apply -----------------------------------------------------------------------


async def test_apply_creates_then_conflicts_then_forces(fleet: Fleet) -> None:
    first = await apply(fleet, policy("p1"))
    assert first.status == 201
    unchanged = await apply(fleet, policy("p1"))
    assert unchanged.status == 200
    assert (
        unchanged.json()["metadata"]["resourceVersion"]
        == first.json()["metadata"]["resourceVersion"]
    )

    clash = await apply(fleet, policy("p1", enabled=False), manager="someone-else")
    assert clash.status == 409
    assert clash.json()["message"] == (
        'Apply failed with 1 conflict: conflict with "stackship-platform": .spec.enabled'
    )
    forced = await apply(
        fleet, policy("p1", enabled=False), manager="someone-else", query="&force=true"
    )
    assert forced.status == 200
    assert forced.json()["spec"]["enabled"] is False
    assert forced.json()["metadata"]["generation"] == 2


async def test_apply_without_field_manager_is_422(fleet: Fleet) -> None:
    resp = await kube_http(
        fleet, "c0001", "PATCH", f"{POLICIES}/p1", body=policy("p1"), content_type=APPLY
    )
    assert resp.status == 422
    assert resp.json()["message"] == (
        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for '
        "apply patch"
    )


async def test_status_subresource_writes_only_status(fleet: Fleet) -> None:
    await apply(fleet, policy("p1"))
    status_body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Policy",
        "metadata": {"name": "p1"},
        "status": {"phase": "Enforcing", "observedGeneration": 1},
    }
    resp = await kube_http(
        fleet,
        "c0001",
        "PATCH",
        f"{POLICIES}/p1/status?fieldManager=operator",
        body=status_body,
        content_type=APPLY,
    )
    assert resp.status == 200
    obj = resp.json()
    assert obj["status"]["phase"] == "Enforcing"
    assert obj["metadata"]["generation"] == 1
    # Status sent to the main resource is ignored.
    ignored = await apply(fleet, {**policy("p1"), "status": {"phase": "Error"}})
    assert ignored.json()["status"]["phase"] == "Enforcing"


async def test_merge_and_json_patch_through_kubernetes_asyncio(fleet: Fleet) -> None:
    await apply(fleet, policy("p1"))
    async with api_client(fleet) as api:
        # Typed loosely: the generated signatures leave out `_content_type` and Optional.
        objects: Any = client.CustomObjectsApi(api)
        # Left to itself the client sends a dict as json-patch: the real 400 comes back.
        with pytest.raises(client.ApiException) as err:
            await objects.patch_cluster_custom_object(
                GROUP, VERSION, PLURAL, "p1", {"metadata": {"labels": {"extra": "yes"}}}
            )
        assert err.value.status == 400
        merged = await objects.patch_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            "p1",
            {"metadata": {"labels": {"extra": "yes"}}},
            _content_type="application/merge-patch+json",
        )
        assert merged["metadata"]["labels"] == {"team": "a", "extra": "yes"}
        patched = await objects.patch_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            "p1",
            [{"op": "replace", "path": "/spec/revision", "value": 2}],
            _content_type="application/json-patch+json",
        )
        assert patched["spec"]["revision"] == 2
        got = await objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, "p1")
        assert got["metadata"]["labels"]["extra"] == "yes"
        with pytest.raises(client.ApiException) as err:
            await objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, "nope")
        assert err.value.status == 404
        assert json.loads(err.value.body or b"")["reason"] == "NotFound"


# -- list ------------------------------------------------------------------------------------


async def test_pagination_and_selectors(fleet: Fleet) -> None:
    for i in range(7):
        await apply(fleet, policy(f"p{i}", team="a" if i % 2 else "b"))
    async with api_client(fleet) as api:
        # Typed loosely: the generated signatures leave out `_content_type` and Optional.
        objects: Any = client.CustomObjectsApi(api)
        names: list[str] = []
        token = None
        pages = 0
        rvs = set()
        while True:
            page = await objects.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, limit=3, _continue=token
            )
            pages += 1
            rvs.add(page["metadata"]["resourceVersion"])
            names += [item["metadata"]["name"] for item in page["items"]]
            token = page["metadata"].get("continue")
            if not token:
                break
        assert names == [f"p{i}" for i in range(7)]
        assert pages == 3
        assert len(rvs) == 1  # one consistent snapshot across pages
        odd = await objects.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, label_selector="team=a"
        )
        assert [i["metadata"]["name"] for i in odd["items"]] == ["p1", "p3", "p5"]
        by_name = await objects.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, field_selector="metadata.name=p4"
        )
        assert [i["metadata"]["name"] for i in by_name["items"]] == ["p4"]
    bad = await kube_http(fleet, "c0001", "GET", f"{POLICIES}?labelSelector=team%20in%20(a")
    assert bad.status == 400


KUBECTL_TABLE_ACCEPT = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)


async def test_table_only_when_the_accept_header_asks(fleet: Fleet) -> None:
    await apply(fleet, policy("t1"))
    await apply(fleet, policy("t2", team="b"))
    table_headers = {"Accept": KUBECTL_TABLE_ACCEPT}

    table = await kube_http(fleet, "c0001", "GET", f"{POLICIES}?limit=1", headers=table_headers)
    assert table.status == 200
    assert table.headers["Content-Type"] == "application/json"
    body = table.json()
    assert (body["kind"], body["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in body["columnDefinitions"]] == [
        "Name",
        "Boundary",
        "Enabled",
        "Revision",
        "Phase",
        "Age",
    ]
    # paging survives the conversion
    assert body["metadata"]["continue"]
    assert body["metadata"]["remainingItemCount"] == 1
    [row] = body["rows"]
    assert row["cells"][:5] == ["t1", None, True, 1, None]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["labels"] == {"team": "a"}

    one = await kube_http(
        fleet, "c0001", "GET", f"{POLICIES}/t2?includeObject=Object", headers=table_headers
    )
    [row] = one.json()["rows"]
    assert row["object"]["spec"]["policyId"] == "t2"
    assert row["object"]["kind"] == "Policy"

    bad = await kube_http(
        fleet, "c0001", "GET", f"{POLICIES}?includeObject=All", headers=table_headers
    )
    assert bad.status == 400
    assert bad.json()["message"] == 'unrecognized includeObject value: "All"'

    # a plain JSON client (and kubernetes-asyncio) still gets the List
    plain = await kube_http(fleet, "c0001", "GET", POLICIES, headers={"Accept": "application/json"})
    assert plain.json()["kind"] == "PolicyList"
    async with api_client(fleet) as api:
        objects: Any = client.CustomObjectsApi(api)
        listing = await objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        assert listing["kind"] == "PolicyList"
    # namespaced built-in: the Lease printer, namespace in the row metadata
    lease_table = await kube_http(
        fleet, "home", "GET", LEASES, headers={"Accept": KUBECTL_TABLE_ACCEPT}
    )
    assert [c["name"] for c in lease_table.json()["columnDefinitions"]] == [
        "Name",
        "Holder",
        "Age",
    ]


async def test_official_sync_client_in_a_thread(fleet: Fleet) -> None:
    sync: Any = kubernetes  # the generated stubs disagree with dict bodies

    def work() -> tuple[list[str], str]:
        api = sync.config.new_client_from_config(
            config_file=str(fleet.kubeconfig_path), context="home"
        )
        with api:
            namespaces = sync.client.CoreV1Api(api).list_namespace()
            lease = sync.client.CoordinationV1Api(api).create_namespaced_lease(
                "stackship-system",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": "sync"},
                    "spec": {"holderIdentity": "sync-client"},
                },
            )
        return [ns.metadata.name for ns in namespaces.items], lease.spec.holder_identity

    namespaces, holder = await asyncio.to_thread(work)
    assert {"default", "kube-system", "stackship-system"} <= set(namespaces)
    assert holder == "sync-client"


# -- watch -----------------------------------------------------------------------------------


async def _watch_lines(
    fleet: Fleet, query: str, cluster: str = "c0001", accept: str | None = None
) -> AsyncIterator[Any]:
    ssl_ctx = client_ssl_context(fleet.ca_pem(cluster))
    headers = {"Authorization": f"Bearer {fleet.token(cluster)}"}
    if accept is not None:
        headers["Accept"] = accept
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(
            f"{fleet.base_url(cluster)}{POLICIES}?watch=true&{query}", headers=headers, ssl=ssl_ctx
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        assert resp.headers["Transfer-Encoding"] == "chunked"
        while line := await resp.content.readline():
            assert line.endswith(b"\n")
            yield json.loads(line)


async def test_watch_streams_events_one_json_per_line(fleet: Fleet) -> None:
    await apply(fleet, policy("before"))
    events: list[Any] = []

    async def consume() -> None:
        async for event in _watch_lines(fleet, "timeoutSeconds=30"):
            events.append(event)
            if event["type"] == "DELETED":
                return

    task = asyncio.create_task(consume())
    while not events:  # the synthetic ADDED for "before" says the watch is live
        await asyncio.sleep(0.01)
    await apply(fleet, policy("live"))
    await apply(fleet, policy("live", enabled=False))
    await kube_http(fleet, "c0001", "DELETE", f"{POLICIES}/live")
    await asyncio.wait_for(task, 10)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "before"),
        ("ADDED", "live"),
        ("MODIFIED", "live"),
        ("DELETED", "live"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)
    # The client hung up: the server cancels the stream and the store drops the watcher.
    store = fleet.store("c0001")
    for _ in range(500):
        if store.watcher_count() == 0:
            break
        await asyncio.sleep(0.01)
    assert store.watcher_count() == 0


async def test_watch_sends_tables_when_asked_headers_once(fleet: Fleet) -> None:
    """kubectl get -w: every event's object is a Table, column definitions only on the first
    (apiserver handlers/watch.go); bookmarks stay plain."""
    await apply(fleet, policy("before"))
    events: list[Any] = []

    async def consume() -> None:
        query = "timeoutSeconds=30&allowWatchBookmarks=true"
        async for event in _watch_lines(fleet, query, accept=KUBECTL_TABLE_ACCEPT):
            events.append(event)
            if event["type"] == "MODIFIED":
                return

    task = asyncio.create_task(consume())
    while not events:
        await asyncio.sleep(0.01)
    await apply(fleet, policy("before", enabled=False))
    await asyncio.wait_for(task, 10)
    events = [e for e in events if e["type"] != "BOOKMARK"]
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    first, second = (e["object"] for e in events)
    assert first["kind"] == second["kind"] == "Table"
    assert [c["name"] for c in first["columnDefinitions"]][:3] == ["Name", "Boundary", "Enabled"]
    assert second["columnDefinitions"] is None
    assert second["rows"][0]["cells"][:3] == ["before", None, False]
    assert second["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


async def test_watch_bookmarks_and_clean_end_at_timeout(fleet: Fleet) -> None:
    rv = (await kube_http(fleet, "c0001", "GET", POLICIES)).json()["metadata"]["resourceVersion"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = [
        e
        async for e in _watch_lines(
            fleet, f"resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=3"
        )
    ]
    elapsed = loop.time() - started
    assert 2.9 <= elapsed < 6
    assert events
    assert {e["type"] for e in events} == {"BOOKMARK"}
    assert events[0]["object"] == {
        "kind": "Policy",
        "apiVersion": f"{GROUP}/{VERSION}",
        "metadata": {"resourceVersion": rv},
    }


async def test_watch_from_expired_resource_version_is_an_error_event(tmp_path: Path) -> None:
    async with Fleet(
        clusters=1, history_limit=3, kubeconfig_path=tmp_path / "kc", rng=random.Random(1)
    ) as small:
        for i in range(10):
            await apply(small, policy(f"p{i}"))
        events = [e async for e in _watch_lines(small, "resourceVersion=2&timeoutSeconds=5")]
    [event] = events
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"
    assert event["object"]["message"].startswith("too old resource version: 2 (")
