"""Lifetimes of clients, SSL contexts and per-cluster/per-policy state against the simulator
(and the real PostgreSQL for the daemon): a kubeconfig reload never closes a client under a
call in flight, and what the daemon holds shrinks back when clusters, policies or CAs go."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from convergerd.core.errors import ClusterUnreachable, NoCredentials
from convergerd.core.model import ClusterId
from convergerd.kube.registry import ClusterRegistry
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.probe import Prober
from convergerd.status.state import StatusState
from tests.integration.rounds_helpers import (
    FLEET_DOC,
    import_doc,
    running_daemon,
    settings_for,
    sql,
    wait_for,
)
from tests.integration.test_kube_client import IDENTITY, access, write_kubeconfig

C1, C2, C3 = ClusterId("c0001"), ClusterId("c0002"), ClusterId("c0003")


def contexts(fleet: Fleet, *clusters: str, ca_extra: bytes = b"") -> dict[str, tuple[str, bytes,
                                                                                     str]]:
    return {c: (fleet.base_url(c), fleet.ca_pem(c) + ca_extra, fleet.token(c)) for c in clusters}


async def test_reload_with_a_request_in_flight_lets_it_finish_and_reports_nothing_down(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The prober's GET /version is on the wire (the cluster answers after 600 ms) when the
    kubeconfig Secret is rotated (c0001's CA bundle changes) and reloaded: the request
    completes with the cluster's real answer, later calls go to a new client, and the old one
    is closed only after its call finished."""
    fleet.set_faults(C1, Faults(latency_ms=600))
    path = write_kubeconfig(tmp_path / "kc", contexts(fleet, C1))
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    state = StatusState(identity=IDENTITY, interval_s=300)
    metrics = Metrics(state=state, process_collectors=False)
    prober = Prober(clusters=lambda: {C1: reg.get(C1)}, state=state, timeout_s=5)
    try:
        old = reg.client(C1)
        probe = asyncio.create_task(prober.probe_once())
        await wait_for(lambda: reg.sizes()["in_flight"] == 1, what="the probe in flight")
        write_kubeconfig(path, contexts(fleet, C1, ca_extra=fleet.ca_pem("home")))
        assert await reg.refresh()

        assert not old.closed  # retired, its call still in flight
        assert reg.sizes()["retiring"] == 1
        new = reg.client(C1)
        assert new is not old
        assert await probe == {C1: True}
        assert 'convergerd_cluster_up{cluster="c0001"} 1.0' in metrics.render().decode()
        assert state.clusters[C1].reachable is True
        assert state.clusters[C1].server_version == "v1.32.0"
        await wait_for(lambda: old.closed, timeout_s=5, what="the old client closed")
        assert reg.sizes() == {"clients": 1, "retiring": 0, "in_flight": 0, "tls_contexts": 1}
        assert not new.closed
    finally:
        await reg.close()


async def test_a_retired_client_with_a_hung_call_is_closed_after_the_drain_bound(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.set_faults(C1, Faults(hang=True))
    path = write_kubeconfig(tmp_path / "kc", contexts(fleet, C1, C2))
    reg = ClusterRegistry(kubeconfig=path, access=access(path, request_s=30), identity=IDENTITY,
                          drain_s=0.3)
    try:
        old = reg.client(C1)
        call = asyncio.create_task(reg.get(C1).server_version(timeout_s=30))
        await wait_for(lambda: reg.sizes()["in_flight"] == 1, what="the call in flight")
        write_kubeconfig(path, contexts(fleet, C2))  # c0001 removed from the kubeconfig
        await reg.refresh()
        assert not old.closed
        await wait_for(lambda: old.closed, timeout_s=3, what="closed after the drain bound")
        with pytest.raises(ClusterUnreachable):
            await asyncio.wait_for(call, 5)
        assert reg.sizes()["retiring"] == 0
        assert await reg.get(C2).server_version(timeout_s=2) == "v1.32.0"
        with pytest.raises(NoCredentials):
            reg.get(C1)
    finally:
        await reg.close()


async def test_retain_closes_the_clients_of_removed_clusters_but_not_home(
    fleet: Fleet,
) -> None:
    path = fleet.kubeconfig_path
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    try:
        home = reg.home_lease("home")
        for c in (C1, C2, C3):
            await reg.get(c).server_version(timeout_s=2)
        clients = {c: reg.client(c) for c in (C1, C2, C3)}
        assert reg.sizes() == {"clients": 4, "retiring": 0, "in_flight": 0, "tls_contexts": 3}

        await reg.retain([C1])

        assert [c for c, client in clients.items() if client.closed] == [C2, C3]
        assert reg.sizes() == {"clients": 2, "retiring": 0, "in_flight": 0, "tls_contexts": 2}
        assert await home.get_lease("stackship-system", "x", timeout_s=2) is None
        await reg.retain([])
        assert reg.sizes()["clients"] == 1  # home holds the Lease: kept
    finally:
        await reg.close()


async def test_ssl_contexts_of_rotated_cas_are_dropped(fleet: Fleet, tmp_path: Path) -> None:
    """A CA rotated again and again (c0001's trust bundle changes at every reload) keeps one
    SSL context for it, not one per CA ever seen."""
    path = write_kubeconfig(tmp_path / "kc", contexts(fleet, C1, C2))
    reg = ClusterRegistry(kubeconfig=path, access=access(path), identity=IDENTITY)
    bundles = [fleet.ca_pem("home"), fleet.ca_pem(C2), fleet.ca_pem("home") + fleet.ca_pem(C2),
               b""]
    try:
        await reg.get(C2).server_version(timeout_s=2)
        for extra in bundles:
            write_kubeconfig(path, contexts(fleet, C1, ca_extra=extra) | contexts(fleet, C2))
            await reg.refresh()
            assert await reg.get(C1).server_version(timeout_s=2) == "v1.32.0"
            assert len(reg.tls) == 2
        write_kubeconfig(path, contexts(fleet, C1))  # c0002 removed
        await reg.refresh()
        assert reg.sizes() == {"clients": 1, "retiring": 0, "in_flight": 0, "tls_contexts": 1}
    finally:
        await reg.close()


async def test_daemon_forgets_deleted_clusters_and_policies(
    fleet: Fleet, database_url: str
) -> None:
    """Through the daemon's wiring, on the real database: a cluster and a policy deleted from
    the database leave status, metrics, the prober and the open clients at the next round."""
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url,
                            Policies__ConvergeIntervalMinutes="0.005")  # 0.3 s
    async with running_daemon(settings) as (daemon, _):
        daemon.probe_period_s = 0.2  # before main() builds the prober (the task has not run)
        await wait_for(lambda: daemon.last_report is not None, what="the first round")
        await wait_for(lambda: daemon.sizes()["prober_clusters"] == 3, what="a probe pass")
        before = daemon.sizes()
        assert (before["status_clusters"], before["metrics_clusters"],
                before["registry_clients"]) == (3, 3, 3)
        assert before["status_policy_records"] == 7

        # What the database asks for before deleting rows convergerd delivered (migration
        # 0003): forget what they hold first, in the same transaction, with the table locked
        # so that the rounds going on meanwhile cannot record them in between. The cluster is
        # gone; p-labels stays installed, untracked on purpose.
        await sql(database_url, """DO $$ BEGIN
            LOCK TABLE deliveries IN SHARE ROW EXCLUSIVE MODE;
            DELETE FROM deliveries WHERE cluster_id = 'c0003' OR policy_id = 'p-labels';
            DELETE FROM clusters WHERE id = 'c0003';
            DELETE FROM policies WHERE id = 'p-labels';
        END $$""")

        def shrunk() -> bool:
            s = daemon.sizes()
            return (s["status_clusters"], s["metrics_clusters"], s["registry_clients"],
                    s["prober_clusters"]) == (2, 2, 2, 2)

        await wait_for(shrunk, what="c0003 forgotten")
        # c0001's p-labels object is still in the cluster (rounds never delete): kept, read back.
        records = {(c, p) for c, st in daemon.state.clusters.items() for p in st.policies}
        assert ("c0003", "p-latest") not in records
        assert daemon.sizes()["metrics_series"] < before["metrics_series"]
        assert 'cluster="c0003"' not in daemon.metrics.render().decode()
