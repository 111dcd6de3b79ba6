"""`GET /openapi.json` is true: every route the app serves is documented (and nothing else),
and every documented answer (path, method, status) is produced by a real request here, against
the daemon's app on a real store (behind a proxy that can take the database away) and the
simulator. The document validates as OpenAPI 3."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openapi_spec_validator import validate

from convergerd.api.app import make_app
from convergerd.api.auth import TokenBook
from convergerd.api.mutations import MAX_BODY_BYTES
from convergerd.api.openapi import document
from convergerd.api.scopes import Scope, scope_of
from convergerd.api.server import server_options
from convergerd.core.tokens import new_token, token_digest
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import (
    FLEET_DOC,
    Rounds,
    TcpProxy,
    import_doc,
    settings_for,
    sql,
)
from tests.integration.savedelete_helpers import make_saver

TOKEN = "openapi-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
READER = new_token()  # team-a's read token
READ = {"Authorization": f"Bearer {READER}"}
NOBODY = {"Authorization": "Bearer cvg_b_not-a-token"}
BIG = b"{" + b" " * MAX_BODY_BYTES + b"}"
Answer = tuple[str, str, int]  # method, route, status


def documented() -> set[Answer]:
    return {(method.upper(), path, int(status))
            for path, item in document()["paths"].items()
            for method, operation in item.items()
            for status in operation["responses"]}


@dataclass
class World:
    client: TestClient[web.Request, web.Application]
    app: web.Application
    health: HealthCheck
    proxy: TcpProxy
    seen: set[Answer] = field(default_factory=set)

    async def call(self, method: str, path: str, *, head_too: bool = True, **kw: Any) -> int:
        """The answer's status; a GET is asked again as HEAD (unless not `head_too`), which
        must answer the same."""
        async with self.client.request(method, path, **kw) as resp:
            await resp.read()
        if method == "GET" and head_too:
            async with self.client.request("HEAD", path, **kw) as head:
                assert head.status == resp.status, (path, head.status, resp.status)
        return resp.status

    async def late_body(self, method: str, path: str) -> int:
        """A request whose body never comes: the status of the answer."""
        host, port = self.client.server.host, self.client.server.port
        assert host is not None
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"{method} {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
                         f"{TOKEN}\r\nContent-Length: 10\r\n\r\n{{".encode())
            return int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
        finally:
            writer.close()


@pytest.fixture
async def world(fleet: Fleet, database_url: str) -> AsyncIterator[World]:
    await import_doc(database_url, FLEET_DOC)
    target = urllib.parse.urlsplit(database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.up()
    store = await Store.connect(database_url.replace(
        f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}"))
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN,
                            CONVERGERD_HTTP_BODY_TIMEOUT_SECONDS="0.5",
                            CONVERGERD_TOKEN_READS_PER_SECOND="50")
    digest = token_digest(READER)
    assert digest is not None
    await store.create_token(name="reader", boundary="team-a", digest=digest, by="test",
                             expires_at=None)
    book = TokenBook(store)
    await book.reload()
    rounds = Rounds(fleet, store, settings)
    health = HealthCheck()
    state = StatusState(identity="t", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state,
                   store=store, settings=settings, health=health,
                   saver=make_saver(rounds, store), status_db_timeout_s=2,
                   tenants=store, book=book, revisions=store,
                   exceptions=store, rollouts=store)
    seen: set[Answer] = set()

    async def record(request: web.Request, response: web.StreamResponse) -> None:
        route = request.match_info.route.resource
        if route is not None:
            seen.add((request.method, route.canonical, response.status))

    app.on_response_prepare.append(record)
    try:
        async with TestClient(TestServer(app, **server_options())) as client:
            yield World(client, app, health, proxy, seen)
    finally:
        await rounds.close()
        await proxy.down()
        await store.close()


def test_the_document_is_valid_openapi_3() -> None:
    validate(document())
    # DELETE may carry a body (an empty object): documented as optional.
    body = document()["paths"]["/v1/policies/{id}"]["delete"]["requestBody"]
    assert body["required"] is False


async def test_every_route_is_documented_and_every_documented_path_is_served(
    world: World,
) -> None:
    # The web page (HTML for a browser, docs/operations.md) is not this API.
    served = {(r.method, r.resource.canonical) for r in world.app.router.routes()
              if r.resource is not None and scope_of(r.method, r.resource.canonical)
              is not Scope.PAGE}
    assert served == {(m, p) for m, p, _ in documented()}
    assert await world.call("GET", "/openapi.json") == 200
    async with world.client.get("/openapi.json") as resp:
        assert await resp.json() == document()


async def test_every_documented_answer_is_produced(
    world: World, fleet: Fleet, database_url: str
) -> None:
    w = world
    for path in ("/healthz", "/readyz", "/metrics", "/status", "/status?limit=0",
                 "/openapi.json",
                 "/v1/clusters/c0001", "/v1/clusters/Bad_Id", "/v1/clusters/c0404",
                 "/v1/policies/p-regs/status", "/v1/policies/Bad_Id/status",
                 "/v1/policies/p-none/status"):
        await w.call("GET", path)
    for method, path in (("POST", "/v1/policies/{}/apply"), ("DELETE", "/v1/policies/{}")):
        await w.call(method, path.format("p-regs"), headers=AUTH)  # 200
        await w.call(method, path.format("Bad_Id"), headers=AUTH)  # 400
        await w.call(method, path.format("p-regs"))  # 401
        await w.call(method, path.format("p-none"), headers=AUTH)  # 404
        await w.call(method, path.format("p-latest"), headers=AUTH, data=BIG)  # 413
        assert await w.late_body(method, path.format("p-latest")) == 408
    grant = {"id": "legacy", "namespace": "team-a-web", "reason": "r", "requestedBy": "a",
             "approvedBy": "b", "expiresAt": "2099-01-01T00:00:00Z"}
    grants, withdraw = "/v1/policies/{}/exceptions", "/v1/policies/p-latest/exceptions/{}"
    await w.call("GET", "/v1/exceptions?policy=Bad_Id")  # 400
    await w.call("POST", grants.format("p-latest"), headers=AUTH, json=grant)  # 400: too far
    grant["expiresAt"] = (dt.datetime.now(dt.UTC) + dt.timedelta(days=9)).isoformat()
    assert await w.call("POST", grants.format("p-latest"), headers=AUTH, json=grant) == 201
    assert await w.call("POST", grants.format("p-latest"), headers=AUTH, json=grant) == 409
    await w.call("GET", "/v1/exceptions")  # 200
    await w.call("POST", grants.format("p-latest"), json=grant)  # 401
    await w.call("POST", grants.format("p-none"), headers=AUTH, json=grant)  # 404
    await w.call("POST", grants.format("p-latest"), headers=AUTH, data=BIG)  # 413
    assert await w.late_body("POST", grants.format("p-latest")) == 408
    by = {"by": "lead"}
    await w.call("DELETE", withdraw.format("Bad!"), headers=AUTH, json=by)  # 400
    await w.call("DELETE", withdraw.format("legacy"), json=by)  # 401
    assert await w.call("DELETE", withdraw.format("legacy"), headers=AUTH, json=by) == 200
    assert await w.call("DELETE", withdraw.format("legacy"), headers=AUTH, json=by) == 404
    await w.call("DELETE", withdraw.format("legacy"), headers=AUTH, data=BIG)  # 413
    assert await w.late_body("DELETE", withdraw.format("legacy")) == 408
    await sql(database_url, "UPDATE policies SET rule = '[]' WHERE id = 'p-labels'")
    assert await w.call("POST", "/v1/policies/p-labels/apply", headers=AUTH) == 422
    fleet.set_faults("c0003", Faults(down=True))
    assert await w.call("DELETE", "/v1/policies/p-latest", headers=AUTH) == 409
    assert await w.call("DELETE", "/v1/policies/p-latest/exceptions/x", headers=AUTH,
                        json=by) == 409
    assert await w.call("POST", "/v1/policies/p-latest/apply", headers=AUTH) == 409
    fleet.clear_faults("c0003")

    for path in ("/metrics", "/status", "/v1/clusters/c0001", "/v1/policies/p-regs/status",
                 "/v1/exceptions"):
        assert await w.call("GET", path, headers=NOBODY) == 401, path
        assert await w.call("GET", path, headers=READ) == 403, path
    for method, path in (("POST", "/v1/policies/p-regs/apply"), ("DELETE", "/v1/policies/p-regs"),
                         ("POST", "/v1/tokens"), ("GET", "/v1/tokens"),
                         ("DELETE", "/v1/tokens/reader"),
                         ("POST", "/v1/policies/p-regs/exceptions"),
                         ("DELETE", "/v1/policies/p-regs/exceptions/x")):
        assert await w.call(method, path, headers=READ) == 403, path
        assert await w.call(method, path) == 401, path
    await _tokens_and_boundaries(w)
    await _revisions(w, database_url)
    await _rollouts(w, database_url)

    ended = asyncio.create_task(asyncio.sleep(0))
    await ended
    w.health.watch([ended])
    assert await w.call("GET", "/healthz") == 500

    await w.proxy.down()  # the database goes away
    # A boundary's view not read yet (team-a's, read just now, is reused while fresh, as the
    # body of `/status` is: `boundaries.BoundaryViews.whole`).
    for method, path in (("GET", "/readyz"), ("GET", "/v1/policies/p-regs/status"),
                         ("POST", "/v1/policies/p-regs/apply"),
                         ("DELETE", "/v1/policies/p-regs"), ("GET", "/v1/tokens"),
                         ("DELETE", "/v1/tokens/reader"),
                         ("GET", "/v1/boundaries/team-b"),
                         ("GET", "/v1/boundaries/team-a/policies/p-regs"),
                         ("GET", "/v1/policies/p-regs/revisions"),
                         ("GET", "/v1/boundaries/team-a/policies/p-regs/revisions"),
                         ("GET", "/v1/exceptions"),
                         ("GET", "/v1/rollouts"), ("GET", "/v1/policies/p-wave/rollout"),
                         ("GET", "/v1/boundaries/team-a/rollouts"),
                         ("GET", "/v1/boundaries/team-a/policies/p-wave/rollout"),
                         *(("POST", f"/v1/policies/p-wave/rollout/{c}") for c in COMMANDS)):
        assert await w.call(method, path, headers=AUTH) == 503, path
    assert await w.call("POST", "/v1/policies/p-regs/rollback", headers=AUTH,
                        json={"to": 1}) == 503
    assert await w.call("POST", "/v1/tokens", headers=AUTH,
                        json={"boundary": "team-a", "name": "later"}) == 503

    assert await w.call("POST", grants.format("p-latest"), headers=AUTH, json=grant) == 503
    assert await w.call("DELETE", withdraw.format("legacy"), headers=AUTH, json=by) == 503
    for path, headers in (("/status", {}), ("/v1/clusters/c0001", {}),
                          ("/v1/policies/p-regs/status", {}), ("/v1/exceptions", {}),
                          ("/v1/boundaries/team-a", READ),
                          ("/v1/boundaries/team-a/policies/p-regs", READ),
                          ("/v1/policies/p-regs/revisions", {}),
                          ("/v1/boundaries/team-a/policies/p-regs/revisions", READ),
                          ("/v1/rollouts", {}), ("/v1/policies/p-wave/rollout", {}),
                          ("/v1/boundaries/team-a/rollouts", READ),
                          ("/v1/boundaries/team-a/policies/p-wave/rollout", READ),
                          # Past this token's reads (100 at 50/s).
                          ("/metrics", AUTH), ("/v1/tokens", AUTH)):
        for method in ("GET", "HEAD"):
            for _ in range(1000):  # past the budget's burst (40 at 20/s): 429, Retry-After
                if await w.call(method, path, head_too=False, headers=headers) == 429:
                    break
            else:
                pytest.fail(f"{method} {path} was never shed")

    assert w.seen == documented()


async def _tokens_and_boundaries(w: World) -> None:
    """The read tokens' and the boundary views' answers (the database up)."""
    made = {"boundary": "team-b", "name": "ci"}
    assert await w.call("POST", "/v1/tokens", headers=AUTH, json=made) == 201
    assert await w.call("POST", "/v1/tokens", headers=AUTH, json=made) == 409
    assert await w.call("POST", "/v1/tokens", headers=AUTH,
                        json={"boundary": "team-zz", "name": "x"}) == 422
    assert await w.call("POST", "/v1/tokens", headers=AUTH,
                        json={"boundary": "team-a", "name": "Bad_Name"}) == 400
    assert await w.call("POST", "/v1/tokens", headers=AUTH, data=BIG) == 413
    assert await w.late_body("POST", "/v1/tokens") == 408
    assert await w.call("GET", "/v1/tokens", headers=AUTH) == 200
    assert await w.call("GET", "/v1/tokens?revoked=maybe", headers=AUTH) == 400
    assert await w.call("DELETE", "/v1/tokens/ci", headers=AUTH) == 200
    assert await w.call("DELETE", "/v1/tokens/ci", headers=AUTH) == 404
    assert await w.call("DELETE", "/v1/tokens/Bad_Name", headers=AUTH) == 400
    assert await w.call("DELETE", "/v1/tokens/ci", headers=AUTH, data=BIG) == 413
    assert await w.late_body("DELETE", "/v1/tokens/ci") == 408
    for headers in (AUTH, READ):
        assert await w.call("GET", "/v1/boundaries/team-a", headers=headers) == 200
        # p-latest: its deletion was refused above, so it is still there.
        assert await w.call("GET", "/v1/boundaries/team-a/policies/p-latest",
                            headers=headers) == 200
    assert await w.call("GET", "/v1/boundaries/team-b", headers=READ) == 404
    assert await w.call("GET", "/v1/boundaries/team-a/policies/p-labels", headers=READ) == 404
    assert await w.call("GET", "/v1/boundaries/team-a") == 401
    assert await w.call("GET", "/v1/boundaries/team-a/policies/p-latest") == 401
    assert await w.call("GET", "/v1/boundaries/team-a?limit=0", headers=AUTH) == 400
    assert await w.call("GET", "/v1/boundaries/team-a/policies/Bad_Id", headers=AUTH) == 400


async def _revisions(w: World, database_url: str) -> None:
    """The revisions' and the rollback's answers (the database up). By now p-regs has its
    revision 1, p-labels an invalid rule (revision 2), p-latest its deletion begun."""
    await sql(database_url, """UPDATE policies SET rule = '{"type": "ForbidLatestTag"}'
              WHERE id = 'p-labels'""")  # revision 3: valid again, 2 is not
    for path in ("/v1/policies/p-regs/revisions", "/v1/policies/Bad_Id/revisions",
                 "/v1/policies/p-regs/revisions?limit=0", "/v1/policies/p-none/revisions"):
        await w.call("GET", path)
    for headers in (AUTH, READ):
        assert await w.call("GET", "/v1/boundaries/team-a/policies/p-regs/revisions",
                            headers=headers) == 200
    assert await w.call("GET", "/v1/boundaries/team-a/policies/p-labels/revisions",
                        headers=READ) == 404
    assert await w.call("GET", "/v1/boundaries/team-a/policies/Bad_Id/revisions",
                        headers=READ) == 400
    assert await w.call("GET", "/v1/boundaries/team-a/policies/p-regs/revisions") == 401
    assert await w.call("GET", "/v1/policies/p-regs/revisions", headers=NOBODY) == 401
    assert await w.call("GET", "/v1/policies/p-regs/revisions", headers=READ) == 403

    rollback = "/v1/policies/{}/rollback"
    for policy, body, status in (("p-regs", {"to": 1}, 200), ("Bad_Id", {"to": 1}, 400),
                                 ("p-regs", {"to": 99}, 404), ("p-latest", {"to": 1}, 409),
                                 ("p-labels", {"to": 2}, 422)):
        assert await w.call("POST", rollback.format(policy), headers=AUTH,
                            json=body) == status, (policy, body)
    assert await w.call("POST", rollback.format("p-regs"), json={"to": 1}) == 401
    assert await w.call("POST", rollback.format("p-regs"), headers=READ, json={"to": 1}) == 403
    assert await w.call("POST", rollback.format("p-regs"), headers=AUTH, data=BIG) == 413
    assert await w.late_body("POST", rollback.format("p-regs")) == 408


COMMANDS = ("pause", "resume", "approve", "abort")


async def _rollouts(w: World, database_url: str) -> None:
    """The rollouts' answers (the database up): p-wave, saved with a strategy, is rolling out
    (no gate job runs here: it stays where the commands put it)."""
    strategy = {"id": "careful", "waves": [{"name": "canary", "selector": {"ring": "canary"}},
                                           {"name": "rest", "fraction": 1.0}]}
    await sql(database_url, "INSERT INTO rollout_strategies (id, spec) VALUES ($1, $2::jsonb)",
              "careful", json.dumps(strategy))
    await sql(database_url, """INSERT INTO policies (id, boundary_id, rule, rollout_strategy)
              VALUES ('p-wave', 'team-a', '{"type": "ForbidLatestTag"}', 'careful')""")
    assert await w.call("POST", "/v1/policies/p-wave/apply", headers=AUTH) == 200
    assert await w.call("GET", "/v1/rollouts") == 200
    for path, status in (("/v1/policies/p-wave/rollout", 200),
                         ("/v1/policies/Bad_Id/rollout", 400),
                         ("/v1/policies/p-regs/rollout", 404)):
        assert await w.call("GET", path) == status, path
    for path in ("/v1/rollouts", "/v1/policies/p-wave/rollout"):
        assert await w.call("GET", path, headers=NOBODY) == 401, path
        assert await w.call("GET", path, headers=READ) == 403, path
    # A boundary's (the read token's, team-a's): the same documents, of its policies only.
    for path, status in (("/v1/boundaries/team-a/rollouts", 200),
                         ("/v1/boundaries/team-a/policies/p-wave/rollout", 200),
                         ("/v1/boundaries/team-a/policies/p-regs/rollout", 404),
                         ("/v1/boundaries/team-b/rollouts", 404),
                         ("/v1/boundaries/team-a/policies/Bad_Id/rollout", 400)):
        assert await w.call("GET", path, headers=READ) == status, path
        assert await w.call("GET", path) == 401, path
    assert await w.call("GET", "/v1/boundaries/team-zz/rollouts", headers=AUTH) == 404
    assert await w.call("GET", "/v1/boundaries/-bad-/rollouts", headers=AUTH) == 400
    command = "/v1/policies/{}/rollout/{}"
    for what in COMMANDS:
        assert await w.call("POST", command.format("Bad_Id", what), headers=AUTH) == 400
        assert await w.call("POST", command.format("p-regs", what), headers=AUTH) == 404
        assert await w.call("POST", command.format("p-wave", what)) == 401
        assert await w.call("POST", command.format("p-wave", what), headers=READ) == 403
        assert await w.call("POST", command.format("p-wave", what), headers=AUTH,
                            data=BIG) == 413
        assert await w.late_body("POST", command.format("p-wave", what)) == 408
    for what, status in (("pause", 200), ("pause", 409), ("approve", 409), ("resume", 200)):
        assert await w.call("POST", command.format("p-wave", what), headers=AUTH,
                            json={"by": "ci"}) == status, what
    await sql(database_url, "UPDATE rollouts SET state = 'waiting_approval' "
              "WHERE policy_id = 'p-wave'")  # as the gate job leaves it at an approval wave
    for what, status in (("approve", 200), ("abort", 200), ("abort", 409), ("resume", 409)):
        assert await w.call("POST", command.format("p-wave", what), headers=AUTH) == status, \
            what
