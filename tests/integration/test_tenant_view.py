"""What a tenant sees: the admin hands out a read token with `convergerd token create` (a real
process against the daemon's app on a real PostgreSQL, after a real round on the simulator),
the tenant reads its boundary with it (`convergerd status --boundary`, the API), and nothing
of another boundary shows: not its policies' names, not their counts on a shared cluster."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.api.auth import TokenBook
from convergerd.api.server import server_options
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.process_helpers import cli
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, settings_for
from tests.integration.savedelete_helpers import make_saver

ADMIN = "tenant-view-admin-token"
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(fleet: Fleet, database_url: str, store: Store) -> AsyncIterator[Client]:
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=ADMIN)
    rounds = Rounds(fleet, store, settings)
    rounds.state.observe_round(await rounds.run())
    book = TokenBook(store)
    app = make_app(metrics=Metrics(state=rounds.state), state=rounds.state, store=store,
                   settings=settings, health=HealthCheck(), saver=make_saver(rounds, store),
                   tenants=store, book=book)
    try:
        async with TestClient(TestServer(app, **server_options())) as c:
            yield c
    finally:
        await rounds.close()


async def get(client: Client, path: str, token: str) -> tuple[int, Any]:
    async with client.get(path, headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


async def test_an_admin_hands_out_a_token_and_the_tenant_sees_only_its_boundary(
    client: Client,
) -> None:
    code, out, err = await cli(client, "token", "create", "--boundary", "team-b",
                               "--name", "team-b-ci", "--expires", "2999-12-31", token=ADMIN)
    assert code == 0, err
    token = out.splitlines()[-1]
    assert token.startswith("cvg_b_")
    assert "team-b-ci" in out

    status, doc = await get(client, "/v1/boundaries/team-b", token)
    assert status == 200
    assert [p["id"] for p in doc["policies"]] == ["p-labels"]
    assert [c["id"] for c in doc["clusters"]] == ["c0001"]
    # c0001 also holds team-a's two policies: the tenant's counts are of its one policy.
    assert doc["clusters"][0]["in_sync"] == 1
    assert doc["policies"][0]["in_sync"] == 1
    text = json.dumps(doc)
    for other in ("p-latest", "p-regs", "team-a", "c0002"):
        assert other not in text

    status, view = await get(client, "/v1/boundaries/team-b/policies/p-labels", token)
    assert status == 200
    assert [c["cluster"] for c in view["clusters"]] == ["c0001"]
    assert view["clusters"][0]["delivered_revision"] == 1

    code, out, err = await cli(client, "status", "--boundary", "team-b", "--token", token,
                               token=None)
    assert code == 0, err
    assert "p-labels" in out
    assert "c0001" in out
    assert "p-latest" not in out
    code, _, err = await cli(client, "status", "--boundary", "team-a", "--token", token,
                             token=None)
    assert code == 2
    assert "404" in err

    code, out, _ = await cli(client, "token", "list", token=ADMIN)
    assert code == 0
    assert "team-b-ci" in out
    assert token not in out
    code, out, _ = await cli(client, "token", "revoke", "team-b-ci", token=ADMIN)
    assert code == 0
    assert (await get(client, "/v1/boundaries/team-b", token))[0] == 401
    code, _, _ = await cli(client, "token", "revoke", "team-b-ci", token=ADMIN)
    assert code == 1


async def test_token_create_refusals_exit_1_or_2(client: Client) -> None:
    code, _, err = await cli(client, "token", "create", "--boundary", "team-zz", "--name", "x",
                             token=ADMIN)
    assert code == 1, err
    code, _, err = await cli(client, "token", "create", "--boundary", "team-a", "--name", "x",
                             "--expires", "2001-01-01", token=ADMIN)
    assert code == 2
    assert "not in the future" in err
    code, _, err = await cli(client, "token", "create", "--boundary", "team-a", "--name", "x",
                             token=None)
    assert code == 2
    assert "no API token" in err
