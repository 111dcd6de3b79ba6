"""`ClusterClient` and `ClusterRegistry` against the fleet simulator: the wire contract
(pagination, server-side apply, User-Agent) and every error class (docs/design.md, "Errors from
a cluster")."""

from __future__ import annotations

import asyncio
import base64
import copy
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

import convergerd
from convergerd.config import ClusterAccess
from convergerd.core.errors import (
    ClusterLevelError,
    ClusterUnreachable,
    NoCredentials,
    ObjectRejected,
    Throttled,
    TransientApiError,
)
from convergerd.core.model import ClusterId
from convergerd.core.render import MANAGED_SELECTOR
from convergerd.kube.client import ClusterClient
from convergerd.kube.kubeconfig import Credentials, load_kubeconfig
from convergerd.kube.registry import ClusterRegistry
from convergerd.kube.tlsctx import TlsContexts
from convergerd.retry import call_with_retries
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from tests.fixtures.fifo import guarded_fifo

C1, C2, C3 = ClusterId("c0001"), ClusterId("c0002"), ClusterId("c0003")
IDENTITY = "replica-a"
AGENT = f"convergerd/{convergerd.__version__} ({IDENTITY})"


def access(kubeconfig: Path | None, *, request_s: float = 2.0, connect_s: float = 1.0,
           qps: float = 1000.0, burst: int = 1000) -> ClusterAccess:
    return ClusterAccess(kubeconfig=kubeconfig, request_timeout_s=request_s,
                         connect_timeout_s=connect_s, qps=qps, burst=burst, apply_concurrency=4)


class Observer:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, int | None, float]] = []
        self.retries: list[tuple[str, str]] = []

    def request_done(self, cluster: str, verb: str, status: int | None,
                     duration_s: float) -> None:
        self.requests.append((cluster, verb, status, duration_s))

    def retry(self, cluster: str, reason: str) -> None:
        self.retries.append((cluster, reason))


@pytest.fixture
def observer() -> Observer:
    return Observer()


@pytest.fixture
async def registry(fleet: Fleet, observer: Observer) -> AsyncIterator[ClusterRegistry]:
    reg = ClusterRegistry(kubeconfig=fleet.kubeconfig_path, access=access(fleet.kubeconfig_path),
                          identity=IDENTITY, observer=observer)
    try:
        yield reg
    finally:
        await reg.close()


def policy(name: str, revision: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "platform.stackship.se/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": f"policy-{name}",
                     "labels": {"platform.stackship.se/boundary": "team-a",
                                "app.kubernetes.io/managed-by": "convergerd"}},
        "spec": {"policyId": name, "boundary": "team-a", "enabled": True,
                 "revision": revision, "rule": {"type": "ForbidLatestTag"}},
    }


def write_kubeconfig(path: Path, contexts: dict[str, tuple[str, bytes, str]]) -> Path:
    """contexts: name -> (server, CA PEM, token)."""
    doc = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": s, "certificate-authority-data":
                                              base64.b64encode(ca).decode()}}
                     for n, (s, ca, _) in contexts.items()],
        "users": [{"name": n, "user": {"token": t}} for n, (_, _, t) in contexts.items()],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in contexts],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the wire contract ------------------------------------------------------------------------


async def test_apply_creates_then_is_unchanged(registry: ClusterRegistry) -> None:
    client = registry.get(C1)
    first = await client.apply_policy(policy("p1"), timeout_s=2)
    assert first.created
    assert first.object["metadata"]["managedFields"][0]["manager"] == "stackship-platform"
    second = await client.apply_policy(policy("p1"), timeout_s=2)
    assert not second.created
    assert second.object["metadata"]["resourceVersion"] == first.object["metadata"][
        "resourceVersion"]
    third = await client.apply_policy(policy("p1", revision=2), timeout_s=2)
    assert not third.created
    assert third.object["spec"]["revision"] == 2
    assert third.object["metadata"]["generation"] == 2


async def test_list_follows_continue(fleet: Fleet, observer: Observer) -> None:
    client = _client(fleet, C1, observer, page_size=2)
    try:
        for i in range(5):
            await client.apply_policy(policy(f"p{i}"), timeout_s=2)
        listed = await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=2)
    finally:
        await client.close()
    assert sorted(o["metadata"]["name"] for o in listed.items) == [f"policy-p{i}"
                                                                   for i in range(5)]
    assert listed.requests == 3
    assert listed.resource_version
    lists = [r for r in fleet.accounting.requests(cluster=C1) if r.verb == "list"]
    assert len(lists) == 3
    assert all("limit=2" in r.path for r in lists)
    assert "continue=" in lists[1].path


async def test_list_selects_by_label(registry: ClusterRegistry) -> None:
    client = registry.get(C1)
    await client.apply_policy(policy("mine"), timeout_s=2)
    other = policy("theirs")
    other["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone-else"
    await client.apply_policy(other, timeout_s=2)
    listed = await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=2)
    assert [o["metadata"]["name"] for o in listed.items] == ["policy-mine"]


async def test_delete(registry: ClusterRegistry) -> None:
    client = registry.get(C1)
    await client.apply_policy(policy("p1"), timeout_s=2)
    assert await client.delete_policy("policy-p1", timeout_s=2) is True
    assert await client.delete_policy("policy-p1", timeout_s=2) is False


async def test_server_version(fleet: Fleet, registry: ClusterRegistry) -> None:
    fleet.set_faults(C2, Faults(version="v1.29.4"))
    assert await registry.get(C1).server_version(timeout_s=2) == "v1.32.0"
    assert await registry.get(C2).server_version(timeout_s=2) == "v1.29.4"


async def test_user_agent_and_observer(fleet: Fleet, registry: ClusterRegistry,
                                       observer: Observer) -> None:
    await registry.get(C1).list_policies(label_selector=MANAGED_SELECTOR, timeout_s=2)
    await registry.get(C1).apply_policy(policy("p1"), timeout_s=2)
    records = fleet.accounting.requests(cluster=C1)
    assert [r.user_agent for r in records] == [AGENT, AGENT]
    assert [(c, v, s) for c, v, s, _ in observer.requests] == [
        (C1, "list", 200), (C1, "apply", 201)]
    assert all(d >= 0 for *_, d in observer.requests)


async def test_lease_api(registry: ClusterRegistry) -> None:
    home = registry.home("home")
    ns, name = "stackship-system", "convergerd"
    assert await home.get_lease(ns, name, timeout_s=2) is None
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"holderIdentity": IDENTITY, "leaseDurationSeconds": 15}}
    created = await home.create_lease(body, timeout_s=2)
    with pytest.raises(ObjectRejected) as info:
        await home.create_lease(body, timeout_s=2)
    assert info.value.status == 409
    got = await home.get_lease(ns, name, timeout_s=2)
    assert got is not None
    assert got["spec"]["holderIdentity"] == IDENTITY
    renewed = copy.deepcopy(got)
    renewed["spec"]["leaseTransitions"] = 1
    replaced = await home.replace_lease(renewed, timeout_s=2)
    assert replaced["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    with pytest.raises(ObjectRejected) as stale:
        await home.replace_lease(renewed, timeout_s=2)  # resourceVersion is now stale
    assert stale.value.status == 409


# --- pools and TLS ----------------------------------------------------------------------------


async def test_one_ssl_context_per_ca(fleet: Fleet, registry: ClusterRegistry) -> None:
    for cid in (C1, C2, C3):
        await registry.get(cid).server_version(timeout_s=2)
    await registry.home("home").get_lease("stackship-system", "x", timeout_s=2)
    # home has its own CA; the members share two (c0001 and c0003 on one listener).
    assert len({fleet.ca_pem(c) for c in (C1, C2, C3, "home")}) == 3
    assert len(registry.tls) == 3


async def test_client_is_cached_and_pool_reused(fleet: Fleet) -> None:
    created: list[int] = []

    async def on_create(*_: object) -> None:
        created.append(1)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    client = _client(fleet, C1, trace_configs=[trace])
    try:
        for i in range(20):
            await client.apply_policy(policy(f"p{i}"), timeout_s=2)
        await asyncio.gather(*(client.apply_policy(policy(f"p{i}"), timeout_s=2)
                               for i in range(20)))
    finally:
        await client.close()
    assert len(created) <= client.pool_size  # 40 requests, a handful of connections


async def test_only_the_warm_connection_outlives_a_burst(fleet: Fleet) -> None:
    """Overlapping requests open overflow connections, reused within the burst; once the
    burst is over they close (within twice their keep-alive) and one warm connection stays:
    the next single request (the prober's) reuses it, and of two overlapping requests only
    one finds a connection to reuse."""
    created: list[int] = []
    reused: list[int] = []

    async def on_create(*_: object) -> None:
        created.append(1)

    async def on_reuse(*_: object) -> None:
        reused.append(1)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    trace.on_connection_reuseconn.append(on_reuse)
    client = _client(fleet, C1, trace_configs=[trace], burst_keepalive_s=0.1)
    try:
        await asyncio.gather(*(client.apply_policy(policy(f"p{i}"), timeout_s=2)
                               for i in range(40)))
        assert 2 <= len(created) <= client.pool_size
        assert len(reused) == 40 - len(created)  # reuse within the burst
        await asyncio.sleep(0.5)  # > 2 x the overflow keep-alive; far below the warm one's
        created.clear()
        reused.clear()
        await client.server_version(timeout_s=2)
        assert (len(created), len(reused)) == (0, 1)
        await asyncio.gather(*(client.server_version(timeout_s=2) for _ in range(2)))
        assert (len(created), len(reused)) == (1, 2)
    finally:
        await client.close()
    assert client.closed


async def test_registry_caches_and_closes(registry: ClusterRegistry) -> None:
    client = registry.client(C1)
    assert registry.client(C1) is client
    await registry.close()
    assert client.closed


async def test_missing_context(registry: ClusterRegistry) -> None:
    with pytest.raises(NoCredentials) as info:
        registry.get(ClusterId("c0042"))
    assert str(info.value) == "no context named 'c0042' in the kubeconfig"


async def test_kubeconfig_reload_rebuilds_changed_clients(
    fleet: Fleet, tmp_path: Path
) -> None:
    path = write_kubeconfig(tmp_path / "kc", {
        C1: (fleet.base_url(C1), fleet.ca_pem(C1), "wrong"),
        C2: (fleet.base_url(C2), fleet.ca_pem(C2), fleet.token(C2)),
    })
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    try:
        c1, c2 = reg.client(C1), reg.client(C2)
        with pytest.raises(ClusterLevelError):
            await reg.get(C1).server_version(timeout_s=2)
        assert not await reg.refresh()  # unchanged
        write_kubeconfig(path, {
            C1: (fleet.base_url(C1), fleet.ca_pem(C1), fleet.token(C1)),
            C2: (fleet.base_url(C2), fleet.ca_pem(C2), fleet.token(C2)),
        })
        assert await reg.refresh()
        assert c1.closed
        assert reg.client(C2) is c2  # unchanged credentials keep their pool
        assert await reg.get(C1).server_version(timeout_s=2) == "v1.32.0"
    finally:
        await reg.close()


# --- errors (docs/design.md, "Errors from a cluster") ---------------------------------------


async def test_unauthorized(fleet: Fleet, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {C1: (fleet.base_url(C1), fleet.ca_pem(C1),
                                                   "not-the-token")})
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    try:
        with pytest.raises(ClusterLevelError) as info:
            await reg.get(C1).list_policies(label_selector=MANAGED_SELECTOR, timeout_s=2)
    finally:
        await reg.close()
    assert str(info.value) == "401 Unauthorized"
    assert info.value.reason == "unauthorized"
    assert "not-the-token" not in str(info.value)


async def test_forbidden(fleet: Fleet, registry: ClusterRegistry) -> None:
    fleet.set_faults(C1, Faults(read_only=True))
    with pytest.raises(ClusterLevelError) as info:
        await registry.get(C1).apply_policy(policy("p1"), timeout_s=2)
    assert info.value.reason == "forbidden"
    assert str(info.value).startswith(
        '403 Forbidden: policies.platform.stackship.se "policy-p1" is forbidden: User ')
    assert "cannot patch" in str(info.value)


@pytest.mark.parametrize("call", ["list", "apply", "delete"])
async def test_crd_missing(fleet: Fleet, registry: ClusterRegistry, call: str) -> None:
    fleet.set_faults(C1, Faults(crd=False))
    client = registry.get(C1)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "list": lambda: client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=2),
        "apply": lambda: client.apply_policy(policy("p1"), timeout_s=2),
        "delete": lambda: client.delete_policy("policy-p1", timeout_s=2),
    }
    with pytest.raises(ClusterLevelError) as info:
        await calls[call]()
    assert str(info.value) == "CRD policies.platform.stackship.se not installed"
    assert info.value.reason == "crd_missing"
    assert info.value.status == 404


async def test_throttled_carries_retry_after(fleet: Fleet, registry: ClusterRegistry) -> None:
    fleet.set_faults(C1, Faults(error_rate=1.0, error_status=429, retry_after_seconds=7))
    with pytest.raises(Throttled) as info:
        await registry.get(C1).list_policies(label_selector=MANAGED_SELECTOR, timeout_s=2)
    assert info.value.retry_after_s == 7.0
    assert str(info.value).startswith("429 Too Many Requests")


@pytest.mark.parametrize("status", [500, 502, 503, 504])
async def test_server_errors_are_transient(fleet: Fleet, registry: ClusterRegistry,
                                           status: int) -> None:
    fleet.set_faults(C1, Faults(error_rate=1.0, error_status=status))
    with pytest.raises(TransientApiError) as info:
        await registry.get(C1).apply_policy(policy("p1"), timeout_s=2)
    assert info.value.status == status
    assert str(info.value).startswith(str(status))


@pytest.mark.parametrize(
    ("mutate", "status", "text"),
    [
        (lambda b: b["metadata"].update(name="Bad_Name"), 422, 'Policy.platform.stackship.se'
                                                                ' "Bad_Name" is invalid'),
        (lambda b: b.update(apiVersion="platform.stackship.se/v9"), 400,
         "invalid object type"),
    ],
)
async def test_object_rejected(registry: ClusterRegistry, mutate: Any, status: int,
                               text: str) -> None:
    body = policy("p1")
    mutate(body)
    with pytest.raises(ObjectRejected) as info:
        await registry.get(C1).apply_policy(body, timeout_s=2)
    assert info.value.status == status
    assert text in str(info.value)
    assert not info.value.cluster_level


async def test_down_is_a_reset_and_retried(fleet: Fleet, registry: ClusterRegistry,
                                           observer: Observer) -> None:
    fleet.set_faults(C1, Faults(down=True))
    client = registry.get(C1)
    loop = asyncio.get_running_loop()
    with pytest.raises(ClusterUnreachable) as info:
        await call_with_retries(
            lambda: client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5),
            deadline=loop.time() + 1.0, cluster=C1,
            observer=observer, base=0.01, cap=0.05,
        )
    assert str(info.value) == "connection reset"
    assert info.value.reason == "connect_error"
    assert len(observer.retries) >= 2  # fast failures are retried within the deadline
    assert {s for _, _, s, _ in observer.requests} == {None}


async def test_connection_refused(fleet: Fleet, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {C1: (f"https://127.0.0.1:{free_port()}",
                                                   fleet.ca_pem(C1), "t")})
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    try:
        with pytest.raises(ClusterUnreachable) as info:
            await reg.get(C1).server_version(timeout_s=2)
    finally:
        await reg.close()
    assert str(info.value) == "connection refused"
    assert info.value.reason == "connect_error"


async def test_wrong_ca_is_a_tls_error(fleet: Fleet, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {C1: (fleet.base_url(C1), fleet.ca_pem("home"),
                                                   fleet.token(C1))})
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    try:
        with pytest.raises(ClusterUnreachable) as info:
            await reg.get(C1).server_version(timeout_s=2)
    finally:
        await reg.close()
    assert str(info.value).startswith("TLS certificate verification failed")
    assert fleet.token(C1) not in str(info.value)


async def test_hung_cluster_costs_one_timeout(fleet: Fleet, tmp_path: Path,
                                              observer: Observer) -> None:
    fleet.set_faults(C1, Faults(hang=True))
    path = fleet.kubeconfig_path
    reg = ClusterRegistry(kubeconfig=path, access=access(path, request_s=0.5),
                          identity=IDENTITY, observer=observer)
    loop = asyncio.get_running_loop()
    client = reg.get(C1)
    try:
        start = loop.time()
        with pytest.raises(ClusterUnreachable) as info:
            await call_with_retries(
                lambda: client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5),
                deadline=start + 10, cluster=C1, observer=observer,
            )
        elapsed = loop.time() - start
    finally:
        await reg.close()
    assert info.value.reason == "timeout"
    assert str(info.value) == "no answer within 0.5 s"
    assert 0.4 < elapsed < 1.5
    assert len(observer.requests) == 1
    assert observer.retries == []


async def test_blackholed_cluster_costs_one_connect_timeout(
    fleet: Fleet, tmp_path: Path, observer: Observer
) -> None:
    """A server that accepts TCP but never completes the TLS handshake: a connect timeout."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    path = write_kubeconfig(tmp_path / "kc", {C1: (f"https://127.0.0.1:{port}",
                                                   fleet.ca_pem(C1), "t")})
    reg = ClusterRegistry(kubeconfig=path, access=access(path, connect_s=0.3),
                          identity=IDENTITY, observer=observer)
    loop = asyncio.get_running_loop()
    try:
        client = reg.get(C1)
        start = loop.time()
        with pytest.raises(ClusterUnreachable) as info:
            await call_with_retries(
                lambda: client.apply_policy(policy("p1"), timeout_s=5),
                deadline=start + 10, cluster=C1, observer=observer,
            )
        elapsed = loop.time() - start
    finally:
        await reg.close()
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()
    assert str(info.value) == "connect timeout after 0.3 s"
    assert info.value.reason == "timeout"
    assert elapsed < 1.0
    assert len(observer.requests) == 1
    assert observer.requests[0][2] is None


async def test_timeout_s_bounds_the_whole_list(fleet: Fleet, observer: Observer) -> None:
    fleet.set_faults(C1, Faults(latency_ms=150))
    client = _client(fleet, C1, observer, page_size=1)
    loop = asyncio.get_running_loop()
    try:
        fleet.clear_faults(C1)
        for i in range(5):
            await client.apply_policy(policy(f"p{i}"), timeout_s=2)
        fleet.set_faults(C1, Faults(latency_ms=150))
        start = loop.time()
        with pytest.raises(ClusterUnreachable) as info:
            await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=0.5)
        assert loop.time() - start < 0.8
    finally:
        await client.close()
    assert info.value.reason == "timeout"


def _client(fleet: Fleet, cluster: ClusterId, observer: Observer | None = None,
            **kwargs: Any) -> ClusterClient:
    """A client built by hand (for page size and trace hooks)."""
    creds = load_kubeconfig(fleet.kubeconfig_path).credentials(cluster)
    return ClusterClient(cluster, creds, ssl_context=TlsContexts().context_for(creds),
                         access=access(None), agent=AGENT, observer=observer, **kwargs)


async def test_expired_continue_restarts_the_list_once(tmp_path: Path) -> None:
    """Writes between two pages push the token's revision out of history: 410 Expired, and
    the list starts over (once) instead of failing the round."""
    from convergerd.sim.resources import POLICIES

    async with Fleet(clusters=1, kubeconfig_path=tmp_path / "kc", history_limit=2) as fleet:
        store = fleet.store(C1)
        for i in range(3):
            store.create(POLICIES, None, policy(f"p{i}"), manager="test")
        writes = iter(range(3, 6))

        class WriteAfterFirstPage(Observer):
            def request_done(self, cluster: str, verb: str, status: int | None,
                             duration_s: float) -> None:
                super().request_done(cluster, verb, status, duration_s)
                if len(self.requests) == 1:  # between page 1 and page 2
                    for i in writes:
                        store.create(POLICIES, None, policy(f"p{i}"), manager="test")

        observer = WriteAfterFirstPage()
        client = _client(fleet, C1, observer, page_size=2)
        try:
            listed = await client.list_policies(label_selector=MANAGED_SELECTOR, timeout_s=5)
        finally:
            await client.close()
    assert [s for _, _, s, _ in observer.requests][:2] == [200, 410]
    assert sorted(o["metadata"]["name"] for o in listed.items) == [f"policy-p{i}"
                                                                   for i in range(6)]
    assert listed.requests == len(observer.requests)


async def test_token_file_is_reread_each_minute(fleet: Fleet, tmp_path: Path) -> None:
    """A projected service-account token rotates: the file is read again after a minute."""
    token_file = tmp_path / "token"
    token_file.write_text(fleet.token(C1) + "\n")
    creds = Credentials(name=C1, server=fleet.base_url(C1), ca_pem=fleet.ca_pem(C1),
                        token_file=token_file)
    now = [0.0]
    client = ClusterClient(C1, creds, ssl_context=TlsContexts().context_for(creds),
                           access=access(None), agent=AGENT, clock=lambda: now[0])
    try:
        assert await client.server_version(timeout_s=2) == "v1.32.0"
        token_file.write_text("rotated-to-something-else")
        now[0] += 30.0
        assert await client.server_version(timeout_s=2) == "v1.32.0"  # cached
        now[0] += 31.0
        with pytest.raises(ClusterLevelError, match="401 Unauthorized"):
            await client.server_version(timeout_s=2)
    finally:
        await client.close()


async def test_missing_token_file_is_no_credentials_not_a_reached_cluster(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A token file that cannot be read means the cluster was never contacted: the cluster is
    reported without credentials (and so not as reached), and nothing is sent."""
    creds = Credentials(name=C1, server=fleet.base_url(C1), ca_pem=fleet.ca_pem(C1),
                        token_file=tmp_path / "missing-token")
    client = ClusterClient(C1, creds, ssl_context=TlsContexts().context_for(creds),
                           access=access(None), agent=AGENT)
    try:
        with pytest.raises(NoCredentials, match=r"tokenFile .*: cannot read: No such") as caught:
            await client.server_version(timeout_s=2)
    finally:
        await client.close()
    assert caught.value.reason == "no_token"
    assert fleet.accounting.counts(C1)["nonResource"] == 0


async def test_an_oversized_token_file_is_no_credentials_and_not_sent(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A "token file" of 1 MiB is the wrong file: not read past 64 KiB, never sent as a header
    with every request."""
    token_file = tmp_path / "token"
    token_file.write_bytes(b"x" * 2**20)
    creds = Credentials(name=C1, server=fleet.base_url(C1), ca_pem=fleet.ca_pem(C1),
                        token_file=token_file)
    client = ClusterClient(C1, creds, ssl_context=TlsContexts().context_for(creds),
                           access=access(None), agent=AGENT)
    try:
        with pytest.raises(NoCredentials, match="1048576 bytes, more than 65536 bytes"):
            await client.server_version(timeout_s=2)
    finally:
        await client.close()
    assert fleet.accounting.counts(C1)["nonResource"] == 0


async def test_apply_forces_fields_owned_by_another_manager(fleet: Fleet,
                                                            registry: ClusterRegistry) -> None:
    """Drift by someone else (kubectl edit) is taken back: apply is sent with force."""
    from convergerd.sim.resources import POLICIES

    drifted = policy("p1")
    drifted["spec"]["enabled"] = False
    fleet.store(C1).create(POLICIES, None, drifted, manager="kubectl-edit")
    applied = await registry.get(C1).apply_policy(policy("p1"), timeout_s=2)
    assert not applied.created
    assert applied.object["spec"]["enabled"] is True
    path = fleet.accounting.requests(cluster=C1)[-1].path
    assert "fieldManager=stackship-platform" in path
    assert "force=true" in path


# --- token files and proxies (issue 17, items 5 and 14) ---------------------------------------


async def _refused_before_contact(fleet: Fleet, token_file: Path) -> NoCredentials:
    """The error of a first call with this token file; asserts nothing reached the cluster."""
    creds = Credentials(name=C1, server=fleet.base_url(C1), ca_pem=fleet.ca_pem(C1),
                        token_file=token_file)
    client = ClusterClient(C1, creds, ssl_context=TlsContexts().context_for(creds),
                           access=access(None), agent=AGENT)
    try:
        with pytest.raises(NoCredentials) as caught:
            await client.server_version(timeout_s=2)
    finally:
        await client.close()
    assert fleet.accounting.counts(C1)["nonResource"] == 0
    assert caught.value.reason == "no_token"
    return caught.value


async def test_a_token_file_that_is_a_pipe_is_refused_without_blocking(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A named pipe as tokenFile used to block the event loop in open() until a writer came
    (/healthz hung, SIGTERM was not handled). `guarded_fifo` fails the test instead of hanging
    the suite if it still blocks."""
    with guarded_fifo(tmp_path / "token") as fifo:
        refused = await _refused_before_contact(fleet, fifo)
    assert str(refused) == (f"context 'c0001': tokenFile {str(fifo)!r}: not a regular file (a "
                            "directory, pipe or device); give a file path")


async def test_a_token_file_that_is_a_device_is_refused_without_reading_it(
    fleet: Fleet
) -> None:
    """/dev/zero used to be read until MemoryError."""
    refused = await _refused_before_contact(fleet, Path("/dev/zero"))
    assert str(refused).endswith("'/dev/zero': not a regular file (a directory, pipe or "
                                 "device); give a file path")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x80\x81binary", "not text (byte 0 is not UTF-8)"),
        (b"line-one\nline-two\n", "holds a line break (a token is one line) at character 9"),
        (b"token\r\nX-Forged: 1\r\n", "holds a line break (a token is one line) at character 6"),
    ],
    ids=["binary", "two-lines", "crlf-inside"],
)
async def test_a_token_file_that_is_not_one_token_is_a_credentials_error(
    fleet: Fleet, tmp_path: Path, content: bytes, problem: str
) -> None:
    """These used to raise UnicodeDecodeError, or a ValueError from aiohttp for the header:
    a traceback and `internal_error` instead of the cluster's credentials problem."""
    token_file = tmp_path / "token"
    token_file.write_bytes(content)
    refused = await _refused_before_contact(fleet, token_file)
    assert problem in str(refused)
    assert str(refused).startswith(f"context 'c0001': tokenFile {str(token_file)!r}")


class ConnectProxy:
    """A loopback HTTP proxy that only tunnels (CONNECT), to any host name on 127.0.0.1, and
    records the targets asked for."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            method, target, _ = (await reader.readuntil(b"\r\n\r\n")).split(b" ", 2)
            assert method == b"CONNECT", method
            self.targets.append(target.decode())
            port = int(target.rsplit(b":", 1)[1])
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


async def test_a_contexts_proxy_url_carries_every_request(fleet: Fleet, tmp_path: Path) -> None:
    """proxy-url used to be ignored (a direct connection). The server's host name here
    resolves nowhere (.invalid), so only the proxy can reach it: the Policy API's requests and
    the Lease API's (kubernetes-asyncio's own request layer) both went through it."""
    proxy = ConnectProxy()
    proxy_url = await proxy.start()
    server = fleet.base_url("home")
    port = server.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
    proxied = server.replace(f"127.0.0.1:{port}", f"home.convergerd.invalid:{port}")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "clusters": [{"name": "home", "cluster": {
            "server": proxied, "proxy-url": proxy_url, "tls-server-name": "localhost",
            "certificate-authority-data": base64.b64encode(fleet.ca_pem("home")).decode()}}],
        "users": [{"name": "home", "user": {"token": fleet.token("home")}}],
        "contexts": [{"name": "home", "context": {"cluster": "home", "user": "home"}}],
    }))
    reg = ClusterRegistry(kubeconfig=kubeconfig, access=access(kubeconfig), identity=IDENTITY)
    try:
        home = reg.home("home")
        assert await home.server_version(timeout_s=2) == "v1.32.0"
        assert await home.get_lease("stackship-system", "convergerd", timeout_s=2) is None
    finally:
        await reg.close()
        await proxy.stop()
    assert proxy.targets
    assert set(proxy.targets) == {f"home.convergerd.invalid:{port}"}
