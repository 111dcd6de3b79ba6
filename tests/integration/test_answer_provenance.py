"""A cluster's answer is judged against the request it answers (docs/design.md, "Cluster
answers"): what it costs to decode, where it comes from, and whether it is what was asked.

One scripted cluster over TLS answers exactly what each test says, beside a plain-http
"elsewhere" that must never be asked anything. The real `ClusterClient` talks to it, through
both of its request layers (its own, and kubernetes-asyncio's for the Lease API).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web

import convergerd
from convergerd.config import ClusterAccess
from convergerd.core.errors import BadResponse, ClusterError, ClusterLevelError, TooLarge
from convergerd.core.model import ClusterId
from convergerd.core.render import API_VERSION, MANAGED_SELECTOR
from convergerd.kube.api import Resource
from convergerd.kube.client import ClusterClient, KeptLines
from convergerd.kube.kubeconfig import Credentials
from convergerd.kube.objects import ObjectClient
from convergerd.kube.tlsctx import TlsContexts
from convergerd.operator.admissioncounts import METRIC_NAMES, parse_metrics
from convergerd.sim.scripted import Handler, ScriptedCluster, Seen

CLUSTER = ClusterId("c0001")
TOKEN = "s3cret-token-of-c0001"


@dataclass
class Scripted:
    """The scripted cluster and the real client pointed at it."""

    cluster: ScriptedCluster
    client: ClusterClient

    @property
    def answer(self) -> Handler | None:
        return self.cluster.answer

    @answer.setter
    def answer(self, handler: Handler | None) -> None:
        self.cluster.answer = handler

    @property
    def elsewhere(self) -> str:
        return self.cluster.elsewhere

    @property
    def seen(self) -> Seen:
        return self.cluster.seen

    @property
    def seen_elsewhere(self) -> Seen:
        return self.cluster.seen_elsewhere


async def _a_delivery_from_elsewhere(_: web.Request) -> web.StreamResponse:
    """What a redirect's target would hand back to be shown in /status: a 200 "delivery"."""
    return web.json_response({"apiVersion": API_VERSION, "kind": "Policy",
                              "metadata": {"name": "policy-p1"}, "items": [],
                              "gitVersion": "v1.99.0-from-elsewhere"})


@pytest.fixture
async def cluster() -> AsyncIterator[Scripted]:
    async with ScriptedCluster(_a_delivery_from_elsewhere) as scripted:
        creds = Credentials(name=CLUSTER, server=scripted.server, ca_pem=scripted.ca_pem,
                            token=TOKEN)
        access = ClusterAccess(kubeconfig=None, request_timeout_s=5.0, connect_timeout_s=2.0,
                               qps=10_000.0, burst=10_000, apply_concurrency=2,
                               max_response_bytes=8 * 2**20)
        client = ClusterClient(CLUSTER, creds, ssl_context=TlsContexts().context_for(creds),
                               access=access, agent=f"convergerd/{convergerd.__version__} (t)",
                               page_size=50)
        try:
            yield Scripted(scripted, client)
        finally:
            await client.close()


def policy(name: str = "p1", revision: int = 3) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Policy",
            "metadata": {"name": f"policy-{name}",
                         "labels": {"app.kubernetes.io/managed-by": "convergerd"}},
            "spec": {"policyId": name, "boundary": "team-a", "enabled": True,
                     "revision": revision, "rule": {"type": "ForbidLatestTag"}}}


def policy_list(items: list[Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "PolicyList", "metadata": meta, "items": items}


def json_answer(doc: Any, status: int = 200) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(doc), status=status,
                            content_type="application/json")
    return handler


def raw_answer(body: bytes) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")
    return handler


def lease(name: str = "convergerd") -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "stackship-system", "resourceVersion": "7"},
            "spec": {"holderIdentity": "replica-b", "leaseDurationSeconds": 15}}


async def _every_call(client: ClusterClient) -> dict[str, Callable[[], Awaitable[Any]]]:
    objects = ObjectClient(client)
    pods = Resource("", "v1", "pods", namespaced=True)
    return {
        "list": lambda: client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5),
        "apply": lambda: client.apply_policy(policy(), timeout_s=5),
        "get": lambda: client.get_policy("policy-p1", timeout_s=5),
        "delete": lambda: client.delete_policy("policy-p1", timeout_s=5),
        "version": lambda: client.server_version(timeout_s=5),
        "lease get": lambda: client.get_lease("stackship-system", "convergerd", timeout_s=5),
        "lease list": lambda: client.list_leases("stackship-system", timeout_s=5),
        "lease update": lambda: client.replace_lease(lease(), timeout_s=5),
        "object list": lambda: objects.list_objects(pods, label_selector=None, timeout_s=5),
        "watch": lambda: _first_event(objects, pods),
        "metrics": lambda: objects.metrics(names=METRIC_NAMES, timeout_s=5),
    }


async def _first_event(objects: ObjectClient, resource: Resource) -> Any:
    async for event in objects.watch(resource, resource_version="1", label_selector=None,
                                     timeout_s=5):
        return event
    return None


# --- where answers come from: redirects are never followed -----------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_elsewhere_is_the_clusters_error_and_never_followed(
        cluster: Scripted, status: int) -> None:
    """To plain http on another host: before, aiohttp followed it (past the refusal of http
    servers) and the target's 200 was recorded as a delivery. Every call of both request
    layers now stops at the 3xx, which names where it pointed."""
    target = f"{cluster.elsewhere}/steal?x=1"

    async def redirect(_: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": target})

    cluster.answer = redirect
    for name, call in (await _every_call(cluster.client)).items():
        with pytest.raises(ClusterLevelError) as info:
            await call()
        assert info.value.reason == "redirect", name
        assert info.value.status == status, name
        assert f"redirect to {target} not followed" in str(info.value), name
        assert info.value.answered, name  # it answered: reached, not down
    assert cluster.seen_elsewhere.requests == []


async def test_a_same_origin_redirect_does_not_carry_the_token_to_another_path(
        cluster: Scripted) -> None:
    """Behind a shared front, another cluster's path: the token must not go there."""

    async def redirect(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/clusters/c0002"):
            return web.json_response(policy_list([]))
        return web.Response(status=307, headers={"Location": "/clusters/c0002" + request.path})

    cluster.answer = redirect
    for call in (await _every_call(cluster.client)).values():
        with pytest.raises(ClusterLevelError):
            await call()
    assert not [p for p in cluster.seen.paths() if p.startswith("/clusters/")]


async def test_a_long_location_is_cut_and_cleaned_in_the_reason(cluster: Scripted) -> None:
    cluster.answer = raw_status(302, {"Location": "https://x/" + "\u202e" + "a" * 5000})
    with pytest.raises(ClusterLevelError) as info:
        await cluster.client.server_version(timeout_s=5)
    message = str(info.value)
    assert len(message) < 300
    assert "\u202e" not in message


def raw_status(status: int, headers: dict[str, str]) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers=headers)
    return handler


# --- what comes back must be what was asked -------------------------------------------------


@pytest.mark.parametrize(("answer", "field"), [
    (policy("p2"), "metadata.name"),
    (policy(revision=2), "spec.revision"),
    ({**policy(), "kind": "Lease"}, "kind"),
    ({**policy(), "apiVersion": "v1"}, "apiVersion"),
    ({"kind": "Status", "status": "Success"}, "apiVersion"),
    ({}, "apiVersion"),
])
async def test_an_apply_answered_with_another_object_is_not_a_delivery(
        cluster: Scripted, answer: dict[str, Any], field: str) -> None:
    cluster.answer = json_answer(answer)
    with pytest.raises(BadResponse) as info:
        await cluster.client.apply_policy(policy(), timeout_s=5)
    assert f"apply answer is not the object asked for: {field}" in str(info.value)


async def test_the_applied_object_itself_is_a_delivery(cluster: Scripted) -> None:
    cluster.answer = json_answer({**policy(), "status": {"phase": "Enforcing"}}, status=201)
    applied = await cluster.client.apply_policy(policy(), timeout_s=5)
    assert applied.created
    assert applied.object["spec"]["revision"] == 3


@pytest.mark.parametrize(("answer", "says"), [
    ({"apiVersion": API_VERSION, "kind": "PolicyList", "metadata": {}}, "no items"),
    ({**policy_list([]), "kind": "LeaseList"}, "list answer: kind"),
    ({**policy_list([]), "apiVersion": "coordination.k8s.io/v1"}, "list answer: apiVersion"),
    (policy(), "list answer: kind"),
    ({}, "list answer: apiVersion"),
])
async def test_a_list_answer_of_another_kind_or_without_items_fails(
        cluster: Scripted, answer: dict[str, Any], says: str) -> None:
    """An answer without `items` used to read as "the cluster holds no Policy"."""
    cluster.answer = json_answer(answer)
    with pytest.raises(BadResponse) as info:
        await cluster.client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    assert says in str(info.value)


async def test_a_lease_answer_for_another_lease_fails(cluster: Scripted) -> None:
    cluster.answer = json_answer(lease("someone-else"))
    with pytest.raises(BadResponse) as info:
        await cluster.client.get_lease("stackship-system", "convergerd", timeout_s=5)
    assert "metadata.name" in str(info.value)
    cluster.answer = json_answer(lease())
    got = await cluster.client.get_lease("stackship-system", "convergerd", timeout_s=5)
    assert got is not None
    assert got["spec"]["holderIdentity"] == "replica-b"


# --- what an answer may cost ----------------------------------------------------------------


async def test_a_page_with_more_items_than_the_limit_sent_fails(cluster: Scripted) -> None:
    cluster.answer = json_answer(policy_list([policy(f"p{i}") for i in range(51)]))
    with pytest.raises(BadResponse) as info:
        await cluster.client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    assert "51 items, more than the limit of 50 asked" in str(info.value)


async def test_an_amplification_page_is_refused_before_it_is_decoded(cluster: Scripted) -> None:
    """7.5 MB of `{}` under the 8 MiB cap: 2.5 million dicts (about 900 MB and seconds of a
    blocked loop) if decoded. Refused by counting, with memory for little more than the body."""
    body = b'{"apiVersion":"%s","kind":"PolicyList","metadata":{},"items":[' % API_VERSION.encode()
    body += b",".join([b"{}"] * 2_500_000) + b"]}"
    cluster.answer = raw_answer(body)
    tracemalloc.start()
    try:
        with pytest.raises(BadResponse) as info:
            await cluster.client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "JSON objects and arrays, more than the 12,816 it may cost" in str(info.value)
    assert peak < 4 * len(body)


async def test_brackets_inside_strings_are_not_counted(cluster: Scripted) -> None:
    """Braces in a message (a CEL expression, JSON in an annotation) cost nothing to decode."""
    item = policy()
    item["status"] = {"conditions": [{"type": "Ready", "message": "{[" * 20_000}]}
    cluster.answer = json_answer(policy_list([item]))
    listed = await cluster.client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    assert len(listed.items) == 1


async def test_a_deeply_nested_answer_under_the_byte_cap_fails(cluster: Scripted) -> None:
    cluster.answer = raw_answer(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(BadResponse):
        await cluster.client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)


async def test_a_version_answer_has_its_own_small_budget(cluster: Scripted) -> None:
    """The prober asks every cluster every period, from every replica: 64 KiB, not 16 MiB."""
    cluster.answer = raw_answer(b'{"gitVersion": "v1.31.0", "pad": "' + b"x" * 100_000 + b'"}')
    with pytest.raises(BadResponse) as info:
        await cluster.client.server_version(timeout_s=5)
    assert "larger than 65536 bytes (the budget of a version answer)" in str(info.value)


async def test_endless_continue_tokens_end_the_list(cluster: Scripted) -> None:
    pages = iter(range(10**9))

    async def endless(_: web.Request) -> web.StreamResponse:
        return web.json_response(policy_list([], **{"continue": f"t{next(pages)}"}))

    cluster.answer = endless
    with pytest.raises(BadResponse) as info:
        await cluster.client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=30)
    assert "still not at its end after 200 pages" in str(info.value)
    assert len(cluster.seen.requests) == 200


async def test_oversized_answer_headers_are_a_bad_answer_not_an_outage(
        cluster: Scripted) -> None:
    cluster.answer = raw_status(200, {"X-Pad": "y" * 20_000})
    with pytest.raises(ClusterError) as info:
        await cluster.client.server_version(timeout_s=5)
    assert isinstance(info.value, BadResponse)
    assert "y" * 50 not in str(info.value)


# --- /metrics: a few lines of an answer far over the cap ------------------------------------


def _apiserver_metrics(filler_bytes: int) -> tuple[bytes, bytes]:
    """A kube-apiserver-like `/metrics` with `filler_bytes` of other series around ours, and
    our lines alone (what must come back)."""
    ours = [b'apiserver_validating_admission_policy_check_total{enforcement_action="deny",'
            b'error_type="no_error",policy="stackship-regs",policy_binding="stackship-regs"} 7',
            b"process_start_time_seconds 1.7e+09"]
    filler = (b'apiserver_request_duration_seconds_bucket{component="apiserver",le="0.05",'
              b'resource="pods",verb="LIST"} 12345\n')
    block = filler * (filler_bytes // (2 * len(filler)))
    body = (b"# HELP apiserver_validating_admission_policy_check_total x\n" + block
            + ours[0] + b"\n" + block + ours[1] + b"\n")
    return body, b"\n".join(ours) + b"\n"


def text_answer(body: bytes, *, chunk: int = 65_521) -> Handler:
    """Streamed in odd-sized chunks, so lines are cut across reads."""
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for at in range(0, len(body), chunk):
            await response.write(body[at:at + chunk])
        await response.write_eof()
        return response
    return handler


async def test_metrics_far_over_the_response_cap_still_give_the_counts(
        cluster: Scripted) -> None:
    """A large cluster's apiserver exports tens of MB of `/metrics`: over the 8 MiB cap the
    whole answer used to be refused, and no admission counts were ever read. Only the two
    series read are kept now, whatever the rest weighs."""
    body, ours = _apiserver_metrics(24 * 2**20)
    cluster.answer = text_answer(body)
    tracemalloc.start()
    try:
        kept = await ObjectClient(cluster.client).metrics(names=METRIC_NAMES, timeout_s=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept == ours
    scrape = parse_metrics(kept)
    assert scrape.start_time == 1.7e9
    assert scrape.counts["stackship-regs"].get("deny") == 7
    assert peak < 4 * 2**20  # a chunk and a line at a time, never the 24 MB


async def test_metrics_lines_are_bounded_too(cluster: Scripted) -> None:
    """What is kept is bounded by the cap, a kept line by its own cap, the whole read by
    its own budget: each past its bound is refused or skipped, never held."""
    line = (b'apiserver_validating_admission_policy_check_total{policy="stackship-a",'
            b'enforcement_action="deny"} 1\n')
    cluster.answer = text_answer(line * (9 * 2**20 // len(line)))  # over the 8 MiB cap kept
    with pytest.raises(TooLarge):
        await ObjectClient(cluster.client).metrics(names=METRIC_NAMES, timeout_s=30)

    huge = b"process_start_time_seconds " + b"9" * (200 * 2**10) + b"\n"
    cluster.answer = text_answer(huge + line[:-1])  # no newline after the last line
    kept = await ObjectClient(cluster.client).metrics(names=METRIC_NAMES, timeout_s=30)
    assert kept == line  # the 200 KiB line skipped, the unterminated last one kept

    body, _ = _apiserver_metrics(4 * 2**20)
    cluster.answer = text_answer(body)
    keep = KeptLines(tuple(n.encode() for n in METRIC_NAMES), max_scanned_bytes=2**20)
    with pytest.raises(TooLarge, match="larger than 1048576 bytes"):
        await cluster.client.text("/metrics", verb="metrics", timeout_s=30, keep=keep)
