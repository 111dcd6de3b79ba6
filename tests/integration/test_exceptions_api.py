"""The exception endpoints and `convergerd policy except` / `policy exceptions` over HTTP (the
daemon's app, a real store, the simulator): the token, every bad input named by field and
value before anything is written, a grant saved to the clusters at once in the Policy's
`spec.exceptions`, listed, and withdrawn the same way."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, objects, settings_for
from tests.integration.savedelete_helpers import make_saver
from tests.integration.test_saveapi_http import AUTH, TOKEN, Client, call, policy_cli

NOW = dt.datetime.now(dt.UTC)


def day(days: float) -> str:
    return (NOW + dt.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


GRANT: dict[str, Any] = {"id": "legacy", "namespace": "team-a-web",
                         "selector": {"matchLabels": {"app": "legacy"}},
                         "reason": "TICKET-35", "requestedBy": "dev@team-a",
                         "approvedBy": "admin@platform", "expiresAt": day(30)}


@pytest.fixture
async def client(fleet: Fleet, database_url: str, store: Store) -> AsyncIterator[Client]:
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN,
                            CONVERGERD_EXCEPTION_MAX_DAYS="60")
    rounds = Rounds(fleet, store, settings)
    state = StatusState(identity="t", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=make_saver(rounds, store), exceptions=store)
    try:
        async with TestClient(TestServer(app)) as c:
            yield c
    finally:
        await rounds.close()


def carried(fleet: Fleet, policy: str = "p-latest") -> dict[str, list[Any]]:
    """Per cluster, the `spec.exceptions` of the Policy there ([] for none)."""
    return {c: objects(fleet, c)[f"policy-{policy}"]["spec"].get("exceptions", [])
            for c in ("c0001", "c0002", "c0003")}


@pytest.mark.parametrize(("change", "names"), [
    ({"expiresAt": day(-1)}, "body.expiresAt: "),
    ({"expiresAt": day(61)}, "is more than 60 days away"),
    ({"expiresAt": "tomorrow"}, "body.expiresAt: 'tomorrow' is not an ISO 8601"),
    ({"expiresAt": "2027-01-31T12:00:00"}, "has no zone"),
    ({"name": "api"}, "name 'api' and selector"),
    ({"namespace": "Team_A"}, "body.namespace: 'Team_A' is not a namespace name"),
    ({"selector": {"matchLabels": {"app": "bad value"}}},
     "body.selector.matchLabels.app: 'bad value' is not a label value"),
    ({"reason": ""}, "body.reason: required"),
    ({"approvedBy": 7}, "body.approvedBy: expected str, got 7"),
    ({"color": "red"}, "unknown field(s) 'color'"),
])
async def test_bad_grants_name_the_field_and_value_and_write_nothing(
        client: Client, fleet: Fleet, change: dict[str, Any], names: str) -> None:
    status, body = await call(client, "POST", "/v1/policies/p-latest/exceptions",
                              headers=AUTH, json={**GRANT, **change})
    assert status == 400, body
    assert names in body["error"]
    assert not any(objects(fleet, c) for c in fleet.member_ids)


async def test_grant_list_withdraw(client: Client, fleet: Fleet) -> None:
    assert (await call(client, "POST", "/v1/policies/p-latest/exceptions", json=GRANT))[0] == 401
    assert (await call(client, "POST", "/v1/policies/nope/exceptions", headers=AUTH,
                       json=GRANT))[0] == 404

    status, body = await call(client, "POST", "/v1/policies/p-latest/exceptions",
                              headers=AUTH, json=GRANT)
    assert status == 201, body
    assert body["save"]["status"] == "ok"
    assert body["save"]["revision"] == body["revision"]
    assert carried(fleet) == {key: [GRANT] for key in ("c0001", "c0002", "c0003")}

    status, again = await call(client, "POST", "/v1/policies/p-latest/exceptions",
                               headers=AUTH, json=GRANT)
    assert status == 409
    assert "already has an exception 'legacy'" in again["error"]

    status, listed = await call(client, "GET", "/v1/exceptions")
    assert status == 200
    [found] = listed["exceptions"]
    assert found["policy"] == "p-latest"
    assert found["state"] == "active"
    assert found["grantedRevision"] == body["revision"]
    assert (await call(client, "GET", "/v1/exceptions?policy=p-regs"))[1] == {"exceptions": []}

    path = "/v1/policies/p-latest/exceptions/legacy"
    status, refused = await call(client, "DELETE", path, headers=AUTH)
    assert status == 400
    assert "body.by: required" in refused["error"]
    status, withdrawn = await call(client, "DELETE", path, headers=AUTH,
                                   json={"by": "lead@platform"})
    assert status == 200, withdrawn
    assert withdrawn["revision"] == body["revision"] + 1
    assert carried(fleet) == {key: [] for key in ("c0001", "c0002", "c0003")}
    assert (await call(client, "DELETE", path, headers=AUTH, json={"by": "x"}))[0] == 404


async def test_policy_cli_except_and_exceptions(client: Client, fleet: Fleet) -> None:
    code, out, err = await policy_cli(
        client, "except", "p-regs", "--namespace", "team-a-web", "--name", "api",
        "--reason", "TICKET-36", "--expires", day(10)[:10], "--id", "api-fix",
        "--requested-by", "dev@team-a", "--approved-by", "admin@platform")
    assert code == 0, err
    assert "exception api-fix granted to policy p-regs" in out
    assert "3 cluster(s), 0 failed" in out
    assert carried(fleet, "p-regs")["c0002"][0]["name"] == "api"

    code, out, _ = await policy_cli(client, "exceptions", "p-regs", token=None)
    assert code == 0
    [header, row] = out.splitlines()
    assert header.split()[:5] == ["POLICY", "ID", "NAMESPACE", "WHICH", "EXPIRES"]
    assert row.split()[:4] == ["p-regs", "api-fix", "team-a-web", "name=api"]
    assert "active" in row

    code, _, err = await policy_cli(
        client, "except", "p-regs", "--namespace", "team-a-web", "--name", "api",
        "--selector", "app=x", "--reason", "r", "--expires", day(10))
    assert code == 2
    assert "not allowed with argument" in err
    code, _, err = await policy_cli(
        client, "except", "p-regs", "--namespace", "team-a-web", "--reason", "r",
        "--expires", day(400))
    assert code == 2
    assert "is more than 60 days away" in err
