"""Fault `hostile` against the real `ClusterClient`: every mode ends in a classified outcome
(`bad_response`, a phase `Unknown` with its reason, a timeout), clean strings, and memory
that does not follow an oversized answer. Plus the admin API's spelling of the fault."""

from __future__ import annotations

import json
import time
import tracemalloc
import unicodedata
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

import convergerd
from convergerd.config import ClusterAccess
from convergerd.core.errors import BadResponse, ClusterLevelError, ClusterUnreachable
from convergerd.core.model import ClusterId
from convergerd.core.plan import MALFORMED_REASON, UNKNOWN_PHASE, ListedPolicy
from convergerd.core.render import MANAGED_SELECTOR
from convergerd.kube.client import ERROR_BODY_MAX_BYTES, ClusterClient
from convergerd.kube.kubeconfig import load_kubeconfig
from convergerd.kube.tlsctx import TlsContexts
from convergerd.sim.faults import Faults, Hostile
from convergerd.sim.fleet import Fleet

C1 = ClusterId("c0001")
AGENT = f"convergerd/{convergerd.__version__} (hostile-test)"
MiB = 2**20


def policy(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": f"policy-{name}",
                     "labels": {"app.kubernetes.io/managed-by": "convergerd"}},
        "spec": {"policyId": name, "boundary": "b", "enabled": True, "revision": 1,
                 "rule": {"type": "ForbidLatestTag"}},
    }


def safe(text: str) -> bool:
    return all(unicodedata.category(c) not in ("Cc", "Cs") and c != "\u202e" for c in text)


def make_client(fleet: Fleet, *, request_s: float = 5.0, cap: int = 16 * MiB) -> ClusterClient:
    creds = load_kubeconfig(fleet.kubeconfig_path).credentials(C1)
    access = ClusterAccess(kubeconfig=None, request_timeout_s=request_s, connect_timeout_s=2.0,
                           qps=1000.0, burst=1000, apply_concurrency=4, max_response_bytes=cap)
    return ClusterClient(C1, creds, ssl_context=TlsContexts().context_for(creds),
                         access=access, agent=AGENT)


@pytest.fixture
async def client(fleet: Fleet) -> AsyncIterator[ClusterClient]:
    c = make_client(fleet)
    try:
        await c.apply_policy(policy("p1"), timeout_s=5)
        await c.apply_policy(policy("p2"), timeout_s=5)
        yield c
    finally:
        await c.close()


def hostile(fleet: Fleet, mode: str, **params: Any) -> None:
    fleet.set_faults(C1, Faults.from_mapping({"hostile": {"mode": mode, **params}}))


async def observed(client: ClusterClient) -> list[ListedPolicy]:
    listed = await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    return [ListedPolicy.from_object(o) for o in listed.items]


# --- controlChars ------------------------------------------------------------------------------


async def test_control_chars_are_replaced_in_phases_messages_versions(
    fleet: Fleet, client: ClusterClient
) -> None:
    hostile(fleet, "controlChars")
    found = await observed(client)
    assert sorted(o.name for o in found) == ["policy-p1", "policy-p2"]
    for obj in found:
        assert obj.phase is not None
        assert obj.phase.startswith("Ready\ufffd")
        for text in (obj.phase, obj.ready_reason, obj.ready_message, *obj.labels.values()):
            assert text is not None
            assert safe(text), text
    version = await client.server_version(timeout_s=5)
    assert version.startswith("v1.32.0\ufffd")
    assert safe(version)


async def test_control_chars_in_a_403_body_are_replaced(fleet: Fleet,
                                                        client: ClusterClient) -> None:
    fleet.set_faults(C1, Faults(read_only=True, hostile=Hostile("controlChars")))
    with pytest.raises(ClusterLevelError) as info:
        await client.apply_policy(policy("p3"), timeout_s=5)
    assert info.value.reason == "forbidden"
    assert str(info.value).startswith('403 Forbidden: policies.platform.stackship.se "policy-p3"'
                                      " is forbidden")
    assert safe(str(info.value))
    assert info.value.k8s_reason is not None
    assert safe(info.value.k8s_reason)


# --- wrongTypes ----------------------------------------------------------------------------------


async def test_wrong_types_make_each_object_unknown_naming_the_field(
    fleet: Fleet, client: ClusterClient
) -> None:
    hostile(fleet, "wrongTypes", fields=["status.phase"])
    found = await observed(client)
    assert [(o.name, o.phase, o.ready_reason, o.ready_message) for o in found] == [
        (name, UNKNOWN_PHASE, MALFORMED_REASON,
         'status.phase: expected a string, got an object {"nested":"object"}')
        for name in ("policy-p1", "policy-p2")]


async def test_default_wrong_types_still_list_and_version_is_bad_response(
    fleet: Fleet, client: ClusterClient
) -> None:
    hostile(fleet, "wrongTypes")
    found = await observed(client)
    assert {o.phase for o in found} == {UNKNOWN_PHASE}
    with pytest.raises(BadResponse, match="gitVersion: expected a string, got a number 132"):
        await client.server_version(timeout_s=5)


async def test_items_that_are_not_objects_fail_the_list_as_bad_response(
    fleet: Fleet, client: ClusterClient
) -> None:
    hostile(fleet, "wrongTypes", fields=["items"])
    with pytest.raises(BadResponse, match=r"items\[2\]: expected an object, got a number 42"
                       ) as info:
        await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    assert info.value.reason == "bad_response"
    assert not info.value.retryable
    assert info.value.answered


# --- invalidJson ---------------------------------------------------------------------------------


async def test_an_answer_that_is_not_json_is_bad_response_not_unreachable(
    fleet: Fleet, client: ClusterClient
) -> None:
    hostile(fleet, "invalidJson")
    with pytest.raises(BadResponse, match=r"list answer \(200\) is not JSON"):
        await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    with pytest.raises(BadResponse, match=r"version answer \(200\) is not JSON"):
        await client.server_version(timeout_s=5)


async def test_an_error_that_is_not_json_keeps_its_status_class(fleet: Fleet,
                                                                client: ClusterClient) -> None:
    fleet.set_faults(C1, Faults(read_only=True, hostile=Hostile("invalidJson")))
    with pytest.raises(ClusterLevelError) as info:
        await client.apply_policy(policy("p3"), timeout_s=5)
    assert info.value.reason == "forbidden"
    assert safe(str(info.value))


# --- oversized ------------------------------------------------------------------------------------


async def test_an_oversized_list_is_bad_response_and_memory_stops_at_the_cap(
    fleet: Fleet, client: ClusterClient
) -> None:
    capped = make_client(fleet, cap=1 * MiB)
    hostile(fleet, "oversized", bytes=64 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(BadResponse, match="list answer \\(200\\) larger than 1048576 bytes"):
            await capped.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await capped.close()
    print(f"oversized 64 MiB answer, cap 1 MiB: peak traced {peak / MiB:.2f} MiB")  # noqa: T201
    # The answer was 64 MiB; what the client held stayed near its 1 MiB cap.
    assert peak < 8 * MiB, f"peak {peak / MiB:.1f} MiB"
    # The cluster's other answers still work on a fresh connection.
    fleet.clear_faults(C1)
    assert len(await observed(client)) == 2


async def test_an_answer_under_the_cap_is_read_whole(fleet: Fleet, client: ClusterClient) -> None:
    hostile(fleet, "oversized", bytes=2 * MiB)  # padded with spaces: still JSON
    assert len(await observed(client)) == 2


async def test_an_oversized_error_body_is_cut_not_fatal(fleet: Fleet,
                                                        client: ClusterClient) -> None:
    fleet.set_faults(C1, Faults(read_only=True, hostile=Hostile("oversized", bytes=32 * MiB)))
    with pytest.raises(ClusterLevelError) as info:
        await client.apply_policy(policy("p3"), timeout_s=10)
    # Padding follows the Status, so the first 64 KiB are not JSON: the text is the message.
    assert info.value.reason == "forbidden"
    assert len(str(info.value)) < ERROR_BODY_MAX_BYTES


async def test_a_declared_oversized_body_is_refused_without_reading(fleet: Fleet) -> None:
    """A Content-Length above the cap is refused from the header alone."""
    big = make_client(fleet, cap=8192)
    try:
        for i in range(30):
            await big.apply_policy(policy(f"q{i}"), timeout_s=5)
        with pytest.raises(BadResponse, match="larger than 8192 bytes"):
            await big.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
    finally:
        await big.close()


# --- trickle -------------------------------------------------------------------------------------


async def test_a_trickled_answer_is_bounded_by_the_request_timeout(fleet: Fleet) -> None:
    slow = make_client(fleet, request_s=1.0)
    try:
        await slow.apply_policy(policy("p1"), timeout_s=5)
        hostile(fleet, "trickle", bytesPerSecond=1)
        started = time.monotonic()
        with pytest.raises(ClusterUnreachable) as info:
            await slow.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=30)
        elapsed = time.monotonic() - started
    finally:
        await slow.close()
    assert info.value.reason == "timeout"
    assert 0.9 <= elapsed < 3.0, elapsed


# --- the admin API's spelling -------------------------------------------------------------------


async def admin(fleet: Fleet, method: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"{fleet.admin_url}/_sim/clusters/c0001/faults",
                        data=data) as resp,
    ):
        return resp.status, await resp.json()


async def test_admin_api_sets_shows_and_clears_hostile(fleet: Fleet) -> None:
    code, doc = await admin(fleet, "POST", {"hostile": {"mode": "trickle",
                                                        "bytesPerSecond": 50}})
    assert code == 200
    assert doc["faults"]["hostile"] == {"mode": "trickle", "bytesPerSecond": 50}
    code, doc = await admin(fleet, "POST", {"hostile": {"mode": "oversized"}})
    assert doc["faults"]["hostile"] == {"mode": "oversized", "bytes": 32 * MiB}
    code, doc = await admin(fleet, "POST", {"hostile": None})
    assert (code, doc["faults"]["hostile"]) == (200, None)
    await admin(fleet, "POST", {"hostile": {"mode": "controlChars"}, "latencyMs": 1})
    code, doc = await admin(fleet, "DELETE")
    assert (code, doc["faults"]["hostile"]) == (200, None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"hostile": "controlChars"}, 'hostile: invalid value "controlChars": must be an object'),
        ({"hostile": {}}, "hostile.mode: invalid value null: must be one of controlChars, "
                          "wrongTypes, invalidJson, oversized, trickle"),
        ({"hostile": {"mode": "nope"}}, 'hostile.mode: invalid value "nope"'),
        ({"hostile": {"mode": "oversized", "bytes": 0}},
         "hostile.bytes: invalid value 0: must be an integer in [1, "),
        ({"hostile": {"mode": "trickle", "bytesPerSecond": "fast"}},
         'hostile.bytesPerSecond: invalid value "fast"'),
        ({"hostile": {"mode": "wrongTypes", "fields": ["status"]}},
         'hostile.fields: invalid value ["status"]: must be a non-empty list of status.phase'),
        ({"hostile": {"mode": "controlChars", "bytes": 5}},
         "hostile: unknown field(s) for mode controlChars: bytes (known: mode)"),
    ],
)
async def test_admin_api_rejects_bad_hostile_documents(fleet: Fleet, body: Any,
                                                       message: str) -> None:
    code, doc = await admin(fleet, "POST", body)
    assert code == 400
    assert doc["error"].startswith(message), doc["error"]
    assert fleet.faults("c0001").hostile is None


async def test_hostile_leaves_other_clusters_alone(fleet: Fleet, client: ClusterClient) -> None:
    fleet.set_faults(ClusterId("c0002"), Faults(hostile=Hostile("invalidJson")))
    assert len(await observed(client)) == 2
