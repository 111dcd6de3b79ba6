"""Every request of a `ClusterClient` goes to `server + path` with its query, as aiohttp reads
that text, whatever the kubeconfig's server looks like (a path prefix, characters to encode, a
default port, an upper-case host): the client builds most URLs without parsing them (one
parse per request cost ~12 us), and must never build another one than the text gives.

Each URL is read where aiohttp starts the request (a trace hook), before it connects: the
servers here refuse the connection."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from yarl import URL

from convergerd.config import ClusterAccess
from convergerd.core.errors import ClusterUnreachable
from convergerd.core.model import ClusterId
from convergerd.core.render import MANAGED_SELECTOR
from convergerd.kube.client import POLICIES_PATH, ClusterClient
from convergerd.kube.kubeconfig import Credentials

# Port 9 (discard) on the loopback: nothing listens, the connection is refused at once.
SERVERS = [
    "https://127.0.0.1:9",
    "https://LOCALHOST:9",
    "https://127.0.0.1:9/k8s/clusters/c-1",
    "https://127.0.0.1:9/pre fix/ä",
    "https://127.0.0.1:9/a%2Fb",
    "https://[::1]:9",
    "https://127.0.0.1:443",  # the default port: the text keeps it out of the URL
]
APPLY_QUERY = {"fieldManager": "stackship-platform", "force": "true"}
NAME = "policy-p-1"
BODY = {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": NAME}, "spec": {}}

Call = Callable[[ClusterClient], Awaitable[Any]]
CALLS: list[tuple[str, Call, str, dict[str, str]]] = [
    ("apply", lambda c: c.apply_policy(BODY, timeout_s=1), f"{POLICIES_PATH}/{NAME}",
     APPLY_QUERY),
    ("get", lambda c: c.get_policy(NAME, timeout_s=1), f"{POLICIES_PATH}/{NAME}", {}),
    ("delete", lambda c: c.delete_policy(NAME, timeout_s=1), f"{POLICIES_PATH}/{NAME}", {}),
    ("list", lambda c: c.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=1),
     POLICIES_PATH, {"labelSelector": MANAGED_SELECTOR, "limit": "500"}),
    ("version", lambda c: c.server_version(timeout_s=1), "/version", {}),
    ("call", lambda c: c.call("GET", "/api/v1/namespaces/a b", verb="get", timeout_s=1,
                              query={"q": "a=b c"}),
     "/api/v1/namespaces/a b", {"q": "a=b c"}),
    ("dots", lambda c: c.call("GET", "/api/v1/namespaces/x/../y", verb="get", timeout_s=1),
     "/api/v1/namespaces/x/../y", {}),
]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("verb", "call", "path", "query"), CALLS, ids=[c[0] for c in CALLS])
async def test_a_request_goes_to_the_url_the_server_and_path_give(
    server: str, verb: str, call: Call, path: str, query: dict[str, str]
) -> None:
    sent: list[URL] = []

    async def started(session: aiohttp.ClientSession, ctx: SimpleNamespace,
                      params: aiohttp.TraceRequestStartParams) -> None:
        sent.append(params.url)

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(started)
    client = ClusterClient(
        ClusterId("c"), Credentials(name="c", server=server, token="t"), ssl_context=None,
        access=ClusterAccess(kubeconfig=None, request_timeout_s=1, connect_timeout_s=1,
                             qps=100, burst=100, apply_concurrency=1),
        agent="test", trace_configs=[trace])
    try:
        with pytest.raises(ClusterUnreachable):
            await call(client)
    finally:
        await client.close()
    assert sent == [URL(server + path).update_query(query)]
    assert str(sent[0]) == str(URL(server + path).update_query(query))
