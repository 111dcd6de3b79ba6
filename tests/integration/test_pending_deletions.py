"""A deletion some cluster refused is pending: the policy is kept and still enforced where it is
held. It shows where an admin looks (the policy's status, `/status`, `convergerd status`, the
metrics), on the real store and the simulator, until a retry finishes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from convergerd.api.app import make_app
from convergerd.api.server import server_options
from convergerd.cli.status import render_status
from convergerd.core.report import FanoutStatus
from convergerd.delivery.fanout import Saver
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.status.sync import StatusSync
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import Rounds
from tests.integration.savedelete_helpers import make_saver

C2 = "c0002"
Client = TestClient[web.Request, web.Application]


@dataclass
class Views:
    """What an admin looks at on one replica: its HTTP API, fed by the database sync, and its
    metrics."""

    client: Client
    sync: StatusSync
    metrics: Metrics

    async def json(self, path: str) -> Any:
        response = await self.client.get(path)
        assert response.status == 200, (path, await response.text())
        return await response.json()


@pytest.fixture
async def views(rounds: Rounds, store: Store) -> AsyncIterator[Views]:
    state = StatusState(identity="replica-a", interval_s=rounds.settings.rounds.interval_s)
    metrics = Metrics(state=state, process_collectors=False)
    app = make_app(metrics=metrics, state=state, store=store, settings=rounds.settings,
                   health=HealthCheck(), saver=make_saver(rounds, store))
    async with TestClient(TestServer(app, **server_options())) as client:
        yield Views(client, StatusSync(store=store, state=state), metrics)


@pytest.fixture
def saver(rounds: Rounds, store: Store) -> Saver:
    return make_saver(rounds, store)


def gauges(metrics: Metrics) -> dict[str, float]:
    text = metrics.render().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("convergerd_pending_deletion")}


async def test_a_refused_deletion_shows_where_the_policy_is_still_held_until_a_retry(
    fleet: Fleet, rounds: Rounds, saver: Saver, views: Views
) -> None:
    await rounds.run()
    fleet.set_faults(C2, Faults(down=True))
    refused = await saver.delete("p-regs")
    assert refused.status is FanoutStatus.REFUSED

    view = await views.json("/v1/policies/p-regs/status")
    deletion = view["policy"]["deletion"]
    assert deletion["held_by"] == [C2]
    assert deletion["requested_at"] is not None
    assert deletion["pending_seconds"] >= 0
    by_cluster = {c["cluster"]: c for c in view["clusters"]}
    assert by_cluster[C2]["last_error"].startswith("removing failed")

    assert await views.sync.once()
    doc = await views.json("/status")
    assert doc["pending_deletions"]["count"] == 1
    [pending] = doc["pending_deletions"]["oldest_first"]
    assert (pending["id"], pending["held_by"], pending["clusters_holding"]) == (
        "p-regs", [C2], 1)
    table = render_status(doc)
    assert "pending deletions (1, still enforced where held" in table
    assert "  p-regs: pending " in table
    assert "held by c0002" in table
    found = gauges(views.metrics)
    assert found["convergerd_pending_deletions"] == 1
    assert found["convergerd_pending_deletion_oldest_seconds"] >= 0

    # Other policies are not being deleted.
    other = await views.json("/v1/policies/p-latest/status")
    assert other["policy"]["deletion"] is None

    fleet.clear_faults(C2)
    assert (await saver.delete("p-regs")).status is FanoutStatus.OK
    assert (await views.client.get("/v1/policies/p-regs/status")).status == 404
    assert await views.sync.once()
    doc = await views.json("/status")
    assert doc["pending_deletions"] == {"count": 0, "oldest_first": []}
    assert "pending deletions" not in render_status(doc)
    assert gauges(views.metrics) == {"convergerd_pending_deletions": 0,
                                     "convergerd_pending_deletion_oldest_seconds": 0}
