"""The processes' event loop (`convergerd.eventloop`): TLS connections read through a 32 KiB
buffer instead of asyncio's 256 KiB, and answers far larger than it still arrive whole."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from convergerd.eventloop import TLS_READ_BUFFER_BYTES, EventLoop
from convergerd.sim.fleet import Fleet
from convergerd.sim.tls import client_ssl_context

PATH = "/apis/platform.stackship.se/v1alpha1/policies"


def _policy(name: str) -> dict[str, object]:
    # ~5 KiB of labels each: 64 of them make a list answer over 8 times the buffer.
    return {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
            "metadata": {"name": name, "labels": {f"k{j}": "v" * 60 for j in range(60)}},
            "spec": {"policyId": name, "boundary": "b", "enabled": True, "revision": 1,
                     "rule": {"type": "ForbidLatestTag"}}}


async def test_tests_run_on_the_processes_loop() -> None:
    assert isinstance(asyncio.get_running_loop(), EventLoop)


async def test_a_tls_connection_reads_a_big_list_through_the_small_buffer(fleet: Fleet) -> None:
    ssl_ctx = client_ssl_context(fleet.ca_pem("c0001"))
    base = fleet.base_url("c0001") + PATH
    headers = {"Authorization": f"Bearer {fleet.token('c0001')}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for i in range(64):
            async with session.patch(
                f"{base}/big-{i}", params={"fieldManager": "t"}, data=json.dumps(_policy(
                    f"big-{i}")), ssl=ssl_ctx,
                headers={"Content-Type": "application/apply-patch+yaml"},
            ) as resp:
                assert resp.status == 201, await resp.text()
        async with session.get(base, ssl=ssl_ctx) as resp:
            assert resp.connection is not None
            protocol = resp.connection.transport._ssl_protocol  # type: ignore[union-attr]
            raw = await resp.read()
    assert protocol.max_size == TLS_READ_BUFFER_BYTES
    assert len(protocol._ssl_buffer) == TLS_READ_BUFFER_BYTES
    assert len(raw) > 8 * TLS_READ_BUFFER_BYTES
    names = [item["metadata"]["name"] for item in json.loads(raw)["items"]]
    assert sorted(names) == sorted(f"big-{i}" for i in range(64))
