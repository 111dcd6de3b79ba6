"""Every route with every kind of token: the admin token, a read token of the route's boundary,
one of another boundary, a revoked one, an expired one, and none. The matrix is generated from
the app's router, so a new route is asked too; a route without a row in `scopes.ROUTE_SCOPES`
fails here. Against the daemon's app on a real PostgreSQL (tokens stored hashed there)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck as Checks
from hypothesis import given, settings
from hypothesis import strategies as st

from convergerd.api.app import make_app
from convergerd.api.auth import TokenBook
from convergerd.api.scopes import ROUTE_SCOPES, Scope, scope_of
from convergerd.api.server import server_options
from convergerd.config import load_settings
from convergerd.core.report import utc_now
from convergerd.core.tokens import new_token, token_digest
from convergerd.delivery.fanout import FanoutEnv, Saver
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.notify import PgNotifications
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import import_doc, sql
from tests.strategies import HOSTILE_BODIES

ADMIN = "scopes-test-admin-token"
FLEET = {
    "clusters": [{"id": "c1"}, {"id": "c2"}],
    "boundaries": [{"id": "team-a", "clusters": ["c1", "c2"]},
                   {"id": "team-b", "clusters": ["c2"]}],
    "policies": [
        {"id": "pa", "boundary": "team-a", "rule": {"type": "ForbidLatestTag"}},
        {"id": "pb", "boundary": "team-b", "rule": {"type": "ForbidLatestTag"}},
    ],
}
# What each placeholder of a route is filled with: ids that exist where that matters (the
# boundary view of team-a, its policy), none where an admin's request would change anything
# (a save or deletion of a policy that does not exist, a token that does not exist).
FILL = {"boundary": "team-a", "name": "no-such-token", "eid": "no-such-exception"}
FILL_ID = {"/v1/clusters/{id}": "c1", "/v1/boundaries/{boundary}/policies/{id}": "pa",
           "/v1/policies/{id}/status": "pa", "/v1/policies/{id}/revisions": "pa",
           "/v1/boundaries/{boundary}/policies/{id}/revisions": "pa"}
PUBLIC_PATHS = ("/healthz", "/readyz", "/openapi.json")
KINDS = ("admin", "this", "other", "revoked", "expired", "none")


def _no_clusters() -> FanoutEnv:
    raise AssertionError("no request here gets as far as the clusters")


@dataclass
class World:
    client: TestClient[web.Request, web.Application]
    app: web.Application
    tokens: dict[str, str]
    store: Store
    book: TokenBook

    async def ask(self, method: str, path: str, kind: str,
                  **kw: Any) -> tuple[int, bytes]:
        headers = {} if kind == "none" else {"Authorization": f"Bearer {self.tokens[kind]}"}
        async with self.client.request(method, path, headers=headers, **kw) as resp:
            return resp.status, await resp.read()


async def _token(store: Store, name: str, boundary: str,
                 expires_at: dt.datetime | None = None) -> str:
    token = new_token()
    digest = token_digest(token)
    assert digest is not None
    await store.create_token(name=name, boundary=boundary, digest=digest, by="test",
                             expires_at=expires_at)
    return token


@pytest.fixture
async def world(database_url: str, store: Store) -> AsyncIterator[World]:
    await import_doc(database_url, FLEET)
    soon = utc_now() + dt.timedelta(hours=1)
    tokens = {
        "admin": ADMIN,
        "this": await _token(store, "a-reader", "team-a"),
        "other": await _token(store, "b-reader", "team-b"),
        "revoked": await _token(store, "a-revoked", "team-a"),
        "expired": await _token(store, "a-expired", "team-a", soon),
    }
    assert await store.revoke_token("a-revoked", by="test") is not None
    await sql(database_url, "UPDATE read_tokens SET expires_at = now() - interval '1 s' "
                            "WHERE name = 'a-expired'")
    settings = load_settings({"CONVERGERD_DATABASE_URL": database_url,
                              "CONVERGERD_API_TOKEN": ADMIN, "CONVERGERD_IDENTITY": "rep-a",
                              # The matrix asks each route six times in a row.
                              "CONVERGERD_TOKEN_READS_PER_SECOND": "1000"})
    state = StatusState(identity="rep-a", interval_s=300)
    book = TokenBook(store)
    await book.reload()
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=Saver(store=store, env=_no_clusters,
                                                     guard_share=0.5),
                   tenants=store, book=book, revisions=store,
                   exceptions=store)
    async with TestClient(TestServer(app, **server_options())) as client:
        yield World(client, app, tokens, store, book)


def _routes(app: web.Application) -> list[tuple[str, str]]:
    return sorted({(r.method, r.resource.canonical) for r in app.router.routes()
                   if r.resource is not None and r.method != "HEAD"})


def _path(canonical: str) -> str:
    path = canonical.replace("{id}", FILL_ID.get(canonical, "p-none"))
    for key, value in FILL.items():
        path = path.replace(f"{{{key}}}", value)
    return path


async def test_every_route_has_a_scope_and_every_scope_row_a_route(world: World) -> None:
    routes = _routes(world.app)
    missing = [r for r in routes if scope_of(*r) is None]
    assert not missing, f"routes without a row in scopes.ROUTE_SCOPES: {missing}"
    assert set(ROUTE_SCOPES) == set(routes)


def test_the_scope_table_keeps_its_invariants() -> None:
    """What no row may say, whatever a new route is: a route that changes anything needs the
    admin token; a read token reads only paths of its boundary; nothing is public but health,
    readiness and this API's description (a new public route is added here on purpose); the
    web page's routes, and only they, decide from their cookie (their POSTs change nothing
    but the cookie: `test_ui`)."""
    for (method, path), scope in ROUTE_SCOPES.items():
        assert (scope is Scope.PAGE) == (path == "/ui" or path.startswith("/ui/")), (method,
                                                                                     path)
        if scope is Scope.PAGE:
            assert method == "GET" or path in ("/ui/login", "/ui/logout"), (method, path)
            continue
        if method != "GET":
            assert scope is Scope.ADMIN, (method, path)
        if path.startswith("/v1/boundaries/{boundary}"):
            assert scope is Scope.BOUNDARY, (method, path)
        if scope is Scope.BOUNDARY:
            assert path.startswith("/v1/boundaries/{boundary}"), (method, path)
        if scope is Scope.PUBLIC:
            assert path in PUBLIC_PATHS, (method, path)


async def test_every_route_answers_each_kind_of_token_as_its_scope_says(world: World) -> None:
    hidden_status, hidden = await world.ask("GET", "/v1/boundaries/team-zz", "admin")
    assert hidden_status == 404
    refused: list[str] = []
    for method, canonical in _routes(world.app):
        scope = scope_of(method, canonical)
        path = _path(canonical)
        served_status, _ = await world.ask(method, path, "admin")
        # (The page's POSTs without this server's Origin are 403 whatever the header.)
        assert scope is Scope.PAGE or served_status not in (401, 403), (method, path,
                                                                          served_status)
        for kind in KINDS[1:]:
            status, body = await world.ask(method, path, kind)
            want = _expected(scope, kind)
            if want == "served":
                ok = status == served_status
            elif want == "hidden":
                ok = (status, body) == (hidden_status, hidden.replace(b"team-zz", b"team-a"))
            else:
                ok = status == want
            if not ok:
                refused.append(f"{method} {path} with {kind}: {status} {body[:120]!r}, "
                               f"expected {want}")
    assert not refused, "\n".join(refused)


def _expected(scope: Scope | None, kind: str) -> int | str:
    """What the route of `scope` answers a token of `kind`: `served` (as the admin's
    request), `hidden` (a boundary that does not exist), or a status."""
    if scope in (Scope.PUBLIC, Scope.PAGE):  # the page reads its cookie, not the header
        return "served"
    if kind in ("revoked", "expired"):
        return 401
    table: dict[Scope | None, dict[str, int | str]] = {
        Scope.FLEET: {"this": 403, "other": 403, "none": "served"},
        Scope.ADMIN: {"this": 403, "other": 403, "none": 401},
        Scope.BOUNDARY: {"this": "served", "other": "hidden", "none": 401},
    }
    return table[scope][kind]


async def test_another_boundarys_policy_is_as_unknown_as_one_that_does_not_exist(
    world: World,
) -> None:
    for kind in ("admin", "this"):
        status, body = await world.ask("GET", "/v1/boundaries/team-a/policies/pb", kind)
        none_status, none_body = await world.ask("GET", "/v1/boundaries/team-a/policies/pz",
                                                 kind)
        assert (status, none_status) == (404, 404)
        assert body.replace(b"pb", b"pz") == none_body


async def test_fleet_views_closed_need_the_admin_token(database_url: str, store: Store) -> None:
    await import_doc(database_url, FLEET)
    settings = load_settings({"CONVERGERD_DATABASE_URL": database_url,
                              "CONVERGERD_API_TOKEN": ADMIN,
                              "CONVERGERD_FLEET_READS_NEED_TOKEN": "true"})
    state = StatusState(identity="rep-a", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=Saver(store=store, env=_no_clusters,
                                                     guard_share=0.5), tenants=store,
                   revisions=store)
    async with TestClient(TestServer(app, **server_options())) as client:
        for path in ("/status", "/metrics", "/v1/clusters/c1", "/v1/policies/pa/status",
                     "/v1/policies/pa/revisions"):
            async with client.get(path) as resp:
                assert resp.status == 401, path
            async with client.get(path, headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
                assert resp.status == 200, path
        async with client.get("/healthz") as resp:
            assert resp.status == 200


async def test_tokens_are_created_listed_and_revoked_through_the_api_and_kept_hashed(
    world: World, database_url: str,
) -> None:
    async with world.client.post("/v1/tokens", json={
            "boundary": "team-b", "name": "ci", "expires_at": "2999-01-31", "by": "alice"},
            headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == 201, await resp.text()
        made = await resp.json()
    token = made["token"]
    assert token.startswith("cvg_b_")
    assert made["created_by"] == "alice"
    assert made["expires_at"] == "2999-01-31T00:00:00Z"
    stored = await sql(database_url, "SELECT token_hash FROM read_tokens WHERE name = 'ci'")
    assert bytes(stored[0]["token_hash"]) == hashlib.sha256(token.encode()).digest()
    dump = await sql(database_url, "SELECT * FROM read_tokens")
    assert token not in repr([dict(r) for r in dump])

    world.tokens["ci"] = token
    assert (await world.ask("GET", "/v1/boundaries/team-b", "ci"))[0] == 200
    assert (await world.ask("GET", "/v1/boundaries/team-a", "ci"))[0] == 404
    async with world.client.get("/v1/tokens", headers={
            "Authorization": f"Bearer {ADMIN}"}) as resp:
        listed = await resp.json()
    assert "ci" in [t["name"] for t in listed["tokens"]]
    assert token not in await resp.text()

    async with world.client.delete("/v1/tokens/ci", json={"by": "bob"},
                                   headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == 200
        assert (await resp.json())["revoked"]["revoked_by"] == "bob"
    # At once on the replica that revoked it.
    assert (await world.ask("GET", "/v1/boundaries/team-b", "ci"))[0] == 401
    async with world.client.delete("/v1/tokens/ci",
                                   headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == 404


@pytest.mark.parametrize(("body", "status"), [
    ({"boundary": "team-zz", "name": "x"}, 422),
    ({"boundary": "team-a", "name": "a-reader"}, 409),
    ({"boundary": "team-a", "name": "Bad_Name"}, 400),
    ({"boundary": "team-a"}, 400),
    ({"boundary": "team-a", "name": "x", "expires_at": "2001-01-01"}, 400),
    ({"boundary": "team-a", "name": "x", "expires_at": "2999-01-01T00:00:00"}, 400),
    ({"boundary": "team-a", "name": "x", "extra": 1}, 400),
    ({"boundary": "team-a", "name": "x", "by": "\x1b[2J"}, 400),
])
async def test_a_bad_token_request_is_refused_naming_the_problem(
    world: World, body: dict[str, Any], status: int,
) -> None:
    async with world.client.post("/v1/tokens", json=body,
                                 headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
        assert resp.status == status, await resp.text()
        assert "error" in await resp.json()


async def test_a_revocation_on_another_replica_reaches_this_one_by_notification(
    world: World, database_url: str,
) -> None:
    """A second book, following the database as the daemon's does: the token revoked through
    the first replica's API stops working on it without waiting for the periodic read."""
    other = TokenBook(world.store, refresh_s=3600)
    listening = Connected()
    follow = asyncio.create_task(other.run(PgNotifications(database_url), observer=listening))
    try:
        await until(lambda: listening.up and other.find(world.tokens["this"]) is not None)
        async with world.client.delete("/v1/tokens/a-reader",
                                       headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
            assert resp.status == 200
        await until(lambda: other.find(world.tokens["this"]) is None)
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow


class Connected:
    up = False

    def listener_connected(self, connected: bool) -> None:
        self.up = connected

    def listener_reconnect(self) -> None:
        pass


async def until(condition: Any, within_s: float = 10.0) -> None:
    async with asyncio.timeout(within_s):
        while not condition():
            await asyncio.sleep(0.05)


# Untrusted input on the new endpoints, as the save API is fuzzed: any body, any boundary in
# the path, any bearer token is a 4xx with a JSON error (or served), never a 500.
@settings(max_examples=60, suppress_health_check=[Checks.function_scoped_fixture],
          deadline=None)
@given(body=HOSTILE_BODIES)
async def test_any_token_or_rollback_body_is_a_4xx_never_a_500(world: World, body: bytes) -> None:
    for method, path in (("POST", "/v1/tokens"), ("DELETE", "/v1/tokens/no-such-token"),
                         ("POST", "/v1/policies/p-none/rollback")):
        status, raw = await world.ask(method, path, "admin", data=body)
        assert status in (400, 404, 409, 422) or (status == 201 and path == "/v1/tokens"), (
            status, raw)
        assert json.loads(raw)["error" if status >= 400 else "token"]


@settings(max_examples=100, suppress_health_check=[Checks.function_scoped_fixture],
          deadline=None)
@given(segment=st.text(max_size=80), token=st.text(max_size=120))
async def test_any_boundary_path_and_token_is_a_4xx_never_a_500(
    world: World, segment: str, token: str,
) -> None:
    path = "/v1/boundaries/" + urllib.parse.quote(segment, safe="")
    world.tokens["fuzzed"] = token
    for kind in ("this", "admin", "fuzzed"):
        for target in (path, path + "/policies/pa", path + "/policies/pa/revisions"):
            try:
                status, raw = await world.ask("GET", target, kind)
            except (ValueError, aiohttp.ClientError):
                continue  # a header value the client itself refuses to send
            assert status < 500, (target, kind, status, raw)
            if status >= 400:
                assert json.loads(raw)["error"]
