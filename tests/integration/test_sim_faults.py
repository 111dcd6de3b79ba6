"""Simulator contract: discovery, authentication, fault injection and the admin API.

Driven over real https with the fleet's CAs, through kubernetes-asyncio where a client's view
matters (connection errors, timeouts, ApiException) and raw HTTP where the wire bytes do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from kubernetes_asyncio import client, config

from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from tests.fixtures.fleet import kube_http

POLICIES_PATH = "/apis/platform.stackship.se/v1alpha1/policies"
VAP_PATH = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
NOT_FOUND = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "the server could not find the requested resource",
    "reason": "NotFound",
    "code": 404,
}


@asynccontextmanager
async def api_client(fleet: Fleet, context: str) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(fleet.kubeconfig_path), context=context, client_configuration=cfg
    )
    async with client.ApiClient(cfg) as api:
        yield api


async def admin(
    fleet: Fleet, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, fleet.admin_url + path, data=body) as resp,
    ):
        return resp.status, await resp.json()


# -- discovery -------------------------------------------------------------------------------


async def test_version_and_discovery_documents(fleet: Fleet) -> None:
    version = (await kube_http(fleet, "c0001", "GET", "/version")).json()
    assert version["major"] == "1"
    assert version["minor"] == "32"
    assert version["gitVersion"] == "v1.32.0"

    api = await kube_http(fleet, "c0001", "GET", "/api")
    assert api.headers["Content-Type"] == "application/json"
    assert api.json()["kind"] == "APIVersions"
    assert api.json()["versions"] == ["v1"]

    groups = (await kube_http(fleet, "c0001", "GET", "/apis")).json()
    assert groups["kind"] == "APIGroupList"
    names = [g["name"] for g in groups["groups"]]
    assert names == [
        "coordination.k8s.io", "admissionregistration.k8s.io", "apps", "batch",
        "platform.stackship.se",
    ]

    crd = (await kube_http(fleet, "c0001", "GET", "/apis/platform.stackship.se/v1alpha1")).json()
    assert crd["groupVersion"] == "platform.stackship.se/v1alpha1"
    by_name = {r["name"]: r for r in crd["resources"]}
    assert by_name["policies"]["namespaced"] is False
    assert by_name["policies"]["kind"] == "Policy"
    assert set(by_name["policies"]["verbs"]) >= {"get", "list", "watch", "create", "patch"}
    assert by_name["policies/status"]["verbs"] == ["get", "patch", "update"]


async def test_openapi_v3_declares_field_validation_on_patch(fleet: Fleet) -> None:
    root = (await kube_http(fleet, "c0001", "GET", "/openapi/v3")).json()
    url = root["paths"]["apis/platform.stackship.se/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/platform.stackship.se/v1alpha1?hash=")
    doc = (await kube_http(fleet, "c0001", "GET", url)).json()
    patch = doc["paths"]["/apis/platform.stackship.se/v1alpha1/policies/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "platform.stackship.se",
        "version": "v1alpha1",
        "kind": "Policy",
    }
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}


async def test_unknown_paths_answer_the_not_found_handler_status(fleet: Fleet) -> None:
    resp = await kube_http(fleet, "c0001", "GET", "/apis/example.com/v1/widgets")
    assert resp.status == 404
    assert resp.json() == NOT_FOUND


# -- authentication and authorization --------------------------------------------------------


async def test_wrong_token_is_401_status(fleet: Fleet) -> None:
    resp = await kube_http(fleet, "c0001", "GET", POLICIES_PATH, token="not-the-token")
    assert resp.status == 401
    assert resp.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


async def test_token_of_another_cluster_is_401(fleet: Fleet) -> None:
    resp = await kube_http(fleet, "c0001", "GET", "/api", token=fleet.token("c0002"))
    assert resp.status == 401


async def test_no_token_is_anonymous_and_forbidden(fleet: Fleet) -> None:
    resp = await kube_http(fleet, "c0001", "GET", POLICIES_PATH, token=None)
    assert resp.status == 403
    body = resp.json()
    assert body["reason"] == "Forbidden"
    assert body["message"] == (
        'policies.platform.stackship.se is forbidden: User "system:anonymous" cannot list '
        'resource "policies" in API group "platform.stackship.se" at the cluster scope'
    )
    # /version is public information (system:public-info-viewer), even for anonymous.
    assert (await kube_http(fleet, "c0001", "GET", "/version", token=None)).status == 200


# -- faults ----------------------------------------------------------------------------------


async def test_down_cluster_fails_to_connect(fleet: Fleet) -> None:
    fleet.set_faults("c0002", Faults(down=True))
    async with api_client(fleet, "c0002") as api:
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.VersionApi(api).get_code()
    # The other clusters are unaffected.
    async with api_client(fleet, "c0001") as api:
        assert (await client.VersionApi(api).get_code()).minor == "32"


async def test_hang_cluster_times_out_and_leaks_no_handler(fleet: Fleet) -> None:
    fleet.set_faults("c0002", Faults(hang=True))
    tasks_before = len(asyncio.all_tasks())
    async with api_client(fleet, "c0002") as api:
        with pytest.raises(asyncio.TimeoutError):
            await client.VersionApi(api).get_code(_request_timeout=0.5)
    # The client hung up; the server side cancels the held handler.
    for _ in range(200):
        if len(asyncio.all_tasks()) <= tasks_before:
            break
        await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) <= tasks_before
    [record] = fleet.accounting.requests(cluster="c0002")
    assert record.status == 0


async def test_latency_is_added(fleet: Fleet) -> None:
    fleet.set_faults("c0003", Faults(latency_ms=300))
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await kube_http(fleet, "c0003", "GET", "/version")).status == 200
    assert loop.time() - started >= 0.3


async def test_429_is_plain_text_with_retry_after(fleet: Fleet) -> None:
    fleet.set_faults("c0001", Faults(error_rate=1.0, error_status=429, retry_after_seconds=3))
    resp = await kube_http(fleet, "c0001", "GET", POLICIES_PATH)
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "3"
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert resp.body == b"Too many requests, please try again later.\n"
    async with api_client(fleet, "c0001") as api:
        with pytest.raises(client.ApiException) as err:
            await client.CustomObjectsApi(api).list_cluster_custom_object(
                "platform.stackship.se", "v1alpha1", "policies"
            )
    assert err.value.status == 429
    assert err.value.headers is not None
    assert err.value.headers["Retry-After"] == "3"


@pytest.mark.parametrize(
    ("code", "reason"),
    [(500, "InternalError"), (503, "ServiceUnavailable"), (504, "Timeout")],
)
async def test_5xx_is_a_status_with_retry_after_when_set(
    fleet: Fleet, code: int, reason: str
) -> None:
    fleet.set_faults("c0001", Faults(error_rate=1.0, error_status=code, retry_after_seconds=2))
    resp = await kube_http(fleet, "c0001", "GET", "/api")
    assert resp.status == code
    assert resp.json()["reason"] == reason
    assert resp.json()["code"] == code
    assert resp.headers["Retry-After"] == "2"


async def test_error_rate_is_a_share_of_requests(fleet: Fleet) -> None:
    fleet.set_faults("c0001", Faults(error_rate=0.5, error_status=503))
    codes = [(await kube_http(fleet, "c0001", "GET", "/version")).status for _ in range(60)]
    assert 10 < codes.count(503) < 50
    assert codes.count(200) + codes.count(503) == 60


async def test_kubernetes_129_serves_no_validating_admission_policy(fleet: Fleet) -> None:
    fleet.set_faults("c0003", Faults(version="v1.29.4"))
    version = (await kube_http(fleet, "c0003", "GET", "/version")).json()
    assert (version["minor"], version["gitVersion"]) == ("29", "v1.29.4")
    resp = await kube_http(fleet, "c0003", "GET", VAP_PATH)
    assert resp.status == 404
    assert resp.json() == NOT_FOUND
    # Discovery agrees (the simulator serves no webhook configurations, so the group is gone).
    gv = await kube_http(fleet, "c0003", "GET", "/apis/admissionregistration.k8s.io/v1")
    assert gv.status == 404
    groups = (await kube_http(fleet, "c0003", "GET", "/apis")).json()
    assert "admissionregistration.k8s.io" not in [g["name"] for g in groups["groups"]]
    openapi = (await kube_http(fleet, "c0003", "GET", "/openapi/v3")).json()
    assert "apis/admissionregistration.k8s.io/v1" not in openapi["paths"]
    # A 1.32 cluster serves it.
    assert (await kube_http(fleet, "c0001", "GET", VAP_PATH)).status == 200


async def test_missing_crd_answers_404_and_leaves_discovery(fleet: Fleet) -> None:
    fleet.set_faults("c0003", Faults(crd=False))
    resp = await kube_http(fleet, "c0003", "GET", POLICIES_PATH)
    assert resp.status == 404
    assert resp.json() == NOT_FOUND
    groups = (await kube_http(fleet, "c0003", "GET", "/apis")).json()
    assert "platform.stackship.se" not in [g["name"] for g in groups["groups"]]
    gv = await kube_http(fleet, "c0003", "GET", "/apis/platform.stackship.se/v1alpha1")
    assert gv.status == 404


async def test_read_only_token_reads_but_cannot_write(fleet: Fleet) -> None:
    fleet.set_faults("c0001", Faults(read_only=True))
    assert (await kube_http(fleet, "c0001", "GET", POLICIES_PATH)).status == 200
    body = {
        "apiVersion": "platform.stackship.se/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": "p1"},
        "spec": {"enabled": True},
    }
    resp = await kube_http(
        fleet,
        "c0001",
        "PATCH",
        POLICIES_PATH + "/p1?fieldManager=stackship-platform",
        body=body,
        content_type="application/apply-patch+yaml",
    )
    assert resp.status == 403
    assert resp.json()["message"] == (
        'policies.platform.stackship.se "p1" is forbidden: User '
        '"system:serviceaccount:stackship-system:convergerd" cannot patch resource "policies" '
        'in API group "platform.stackship.se" at the cluster scope'
    )
    assert resp.json()["details"] == {
        "name": "p1",
        "group": "platform.stackship.se",
        "kind": "policies",
    }


# -- admin API -------------------------------------------------------------------------------


async def test_admin_sets_and_clears_faults(fleet: Fleet) -> None:
    code, body = await admin(fleet, "POST", "/_sim/clusters/c0002/faults", b'{"latencyMs": 5}')
    assert code == 200
    assert body["faults"]["latencyMs"] == 5
    code, body = await admin(fleet, "POST", "/_sim/clusters/c0002/faults", b'{"readOnly": true}')
    assert (body["faults"]["latencyMs"], body["faults"]["readOnly"]) == (5, True)
    assert fleet.faults("c0002") == Faults(latency_ms=5, read_only=True)
    code, body = await admin(fleet, "DELETE", "/_sim/clusters/c0002/faults")
    assert code == 200
    assert fleet.faults("c0002") == Faults()
    code, listing = await admin(fleet, "GET", "/_sim/clusters")
    assert [c["id"] for c in listing["clusters"]] == ["home", "c0001", "c0002", "c0003"]
    assert all(c["baseUrl"].startswith("https://127.0.0.1:") for c in listing["clusters"])
    assert "token" not in json.dumps(listing)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"{not json", "invalid JSON"),
        (b'{"latencyMS": 5}', "latencyMS"),
        (b'{"errorRate": 2}', "errorRate"),
        (b'{"errorStatus": 404}', "errorStatus"),
        (b'{"down": "yes"}', "down"),
        (b'{"version": "1.29"}', "version"),
        (b"[1]", "JSON object"),
    ],
)
async def test_admin_rejects_bad_faults_naming_the_field(
    fleet: Fleet, body: bytes, names: str
) -> None:
    code, answer = await admin(fleet, "POST", "/_sim/clusters/c0001/faults", body)
    assert code == 400
    assert names in answer["error"]
    assert fleet.faults("c0001") == Faults()


async def test_admin_unknown_cluster_is_404(fleet: Fleet) -> None:
    code, answer = await admin(fleet, "POST", "/_sim/clusters/c9999/faults", b"{}")
    assert code == 404
    assert "c9999" in answer["error"]


async def test_stats_and_request_log_count_by_verb(fleet: Fleet) -> None:
    await kube_http(fleet, "c0001", "GET", POLICIES_PATH, headers={"User-Agent": "probe/1.0"})
    await kube_http(fleet, "c0001", "GET", POLICIES_PATH + "/missing")
    await kube_http(fleet, "c0001", "GET", "/version")
    code, stats = await admin(fleet, "GET", "/_sim/stats?cluster=c0001")
    assert code == 200
    counts = stats["clusters"]["c0001"]
    assert (counts["list"], counts["get"], counts["nonResource"], counts["total"]) == (1, 1, 1, 3)
    assert counts["patch"] == 0
    code, log = await admin(fleet, "GET", "/_sim/requests?cluster=c0001")
    first, second, third = log["requests"]
    assert (first["verb"], first["status"], first["userAgent"]) == ("list", 200, "probe/1.0")
    assert first["path"] == POLICIES_PATH
    assert (second["verb"], second["status"]) == ("get", 404)
    assert third["verb"] == "nonResource"
    code, later = await admin(fleet, "GET", f"/_sim/requests?after={second['seq']}")
    assert [r["seq"] for r in later["requests"]] == [third["seq"]]
