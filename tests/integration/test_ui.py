"""The web page without a browser (the daemon's app, a real PostgreSQL, phases read back from the
simulator): signing in and out, the cookie's flags, the Content-Security-Policy, what a
boundary's token sees and does not, the 404 that says nothing of another boundary, every value
escaped. `tests/browser/` shows the same in Chromium."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.pages import GATE_WORDS
from convergerd.api.server import server_options
from convergerd.api.ui import COOKIE, CSP
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.integration.ui_helpers import ROLLOUT_REASON, XSS, UiWorld, ui_world

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def world(fleet: Fleet, database_url: str, store: Store) -> AsyncIterator[UiWorld]:
    made = await ui_world(fleet, database_url, store)
    try:
        yield made
    finally:
        await made.rounds.close()


@pytest.fixture
async def client(world: UiWorld) -> AsyncIterator[Client]:
    async with TestClient(TestServer(world.app, **server_options())) as c:
        yield c


def origin(client: Client) -> dict[str, str]:
    return {"Origin": f"http://{client.server.host}:{client.server.port}"}


async def sign_in(client: Client, token: str, **headers: str) -> ClientResponse:
    resp = await client.post("/ui/login", data={"token": token}, allow_redirects=False,
                             headers={**origin(client), **headers})
    await resp.read()
    return resp


async def page(client: Client, path: str) -> tuple[int, str]:
    async with client.get(path, allow_redirects=False) as resp:
        assert resp.headers["Content-Security-Policy"] == CSP
        assert resp.headers["Cache-Control"] == "no-store"
        return resp.status, await resp.text()


async def test_signing_in_keeps_the_token_in_a_strict_cookie_and_never_in_an_address(
    world: UiWorld, client: Client,
) -> None:
    status, text = await page(client, "/ui/")
    assert status == 200
    assert '<form method="post" action="/ui/login">' in text
    async with client.get("/ui", allow_redirects=False) as resp:
        assert (resp.status, resp.headers["Location"]) == (303, "/ui/")

    resp = await sign_in(client, world.tokens["team-a"])
    assert (resp.status, resp.headers["Location"]) == (303, "/ui/")
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    flags = {f.strip().split("=")[0].lower() for f in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path"} <= flags
    assert "SameSite=Strict" in cookie
    assert "Path=/ui/" in cookie
    assert "secure" not in flags  # plain HTTP here: a Secure cookie would never come back
    assert world.tokens["team-a"] not in resp.headers.get("Location", "")

    async with client.get("/ui/", allow_redirects=False) as resp:
        assert (resp.status, resp.headers["Location"]) == (303, "/ui/boundaries/team-a")

    behind_tls = await sign_in(client, world.tokens["team-a"], **{"X-Forwarded-Proto": "https"})
    assert "Secure" in behind_tls.headers["Set-Cookie"]

    out = await client.post("/ui/logout", headers=origin(client), allow_redirects=False)
    assert out.status == 303
    assert 'convergerd_token=""' in out.headers["Set-Cookie"]
    assert "Max-Age=0" in out.headers["Set-Cookie"]


async def test_a_wrong_token_or_a_foreign_form_gets_the_form_again_or_a_refusal(
    world: UiWorld, client: Client,
) -> None:
    resp = await sign_in(client, "cvg_b_not-a-token")
    assert resp.status == 403
    assert "Set-Cookie" not in resp.headers
    text = await resp.text()
    assert "opens nothing here" in text
    assert 'action="/ui/login"' in text
    assert "cvg_b_not-a-token" not in text  # what was typed is not shown back

    for headers in ({}, {"Origin": "http://evil.example"}, {"Origin": "null"}):
        async with client.post("/ui/login", data={"token": world.tokens["admin"]},
                               headers=headers, allow_redirects=False) as refused:
            assert refused.status == 403, headers
            assert "Set-Cookie" not in refused.headers
    # A cookie the daemon no longer accepts: the form again, the cookie cleared.
    client.session.cookie_jar.update_cookies({COOKIE: "cvg_b_revoked-long-ago"})
    status, text = await page(client, "/ui/boundaries/team-a")
    assert status == 200
    assert "opens nothing any more" in text


async def test_a_boundary_token_sees_its_boundary_only_and_others_are_not_found(
    world: UiWorld, client: Client,
) -> None:
    await sign_in(client, world.tokens["team-a"])
    status, text = await page(client, "/ui/boundaries/team-a")
    assert status == 200
    for seen in ("p-latest", "p-regs", "c0001", "c0002", "c0003", "Enforcing", "Unsupported",
                 "Error", "read token team-a-reader of boundary team-a", "Data read at"):
        assert seen in text, seen
    for unseen in ("p-labels", "team-b"):
        assert unseen not in text, unseen
    assert '<th scope="col">' in text
    assert '<th scope="row">' in text

    status, text = await page(client, "/ui/policies/p-regs")
    assert status == 200
    assert "Error" in text
    assert "c0002" in text

    # Another boundary's policy is the same page as a policy that does not exist.
    status, other = await page(client, "/ui/policies/p-labels")
    none_status, none = await page(client, "/ui/policies/p-nothing")
    assert (status, none_status) == (404, 404)
    assert other.replace("p-labels", "p-nothing") == none
    status, other = await page(client, "/ui/boundaries/team-b")
    none_status, none = await page(client, "/ui/boundaries/team-zz")
    assert (status, none_status) == (404, 404)
    assert other.replace("team-b", "team-zz") == none
    # The fleet is the admin's: a boundary's token is sent to its boundary.
    async with client.get("/ui/", allow_redirects=False) as resp:
        assert resp.headers["Location"] == "/ui/boundaries/team-a"


async def test_the_admin_token_sees_the_fleet(world: UiWorld, client: Client) -> None:
    await sign_in(client, world.tokens["admin"])
    status, text = await page(client, "/ui/")
    assert status == 200
    for seen in ("Fleet", "p-labels", "p-latest", "c0003", "Unsupported clusters"):
        assert seen in text, seen
    status, text = await page(client, "/ui/policies/p-labels")
    assert status == 200
    assert "team-b" in text
    status, text = await page(client, "/ui/boundaries/team-b")
    assert status == 200
    assert "p-labels" in text
    status, text = await page(client, "/ui/?page=99&policies=99")
    assert status == 200
    assert "No clusters on this page (3 in all)" in text


async def test_every_value_from_a_cluster_is_shown_as_text(
    world: UiWorld, client: Client,
) -> None:
    await sign_in(client, world.tokens["team-a"])
    for path in ("/ui/policies/p-regs", "/ui/policies/p-latest", "/ui/policies/p-regs/rollout",
                 "/ui/boundaries/team-a"):
        status, text = await page(client, path)
        assert status == 200
        assert html.escape(XSS) in text, path
        assert "<script>" not in text
        assert "<img" not in text
        assert "<b>bold" not in text


async def test_a_rollout_shows_its_waves_revisions_and_gate_to_the_admin_and_its_tenant(
    world: UiWorld, client: Client,
) -> None:
    for who, home in (("admin", "/ui/"), ("team-a", "/ui/boundaries/team-a")):
        await sign_in(client, world.tokens[who])
        status, text = await page(client, home)
        assert status == 200
        assert '<table class="rollouts">' in text, who
        assert 'href="/ui/policies/p-regs/rollout"' in text, who
        assert "waiting approval" in text
        assert "2 of 2: rest" in text
        assert "1 new, 2 old" in text
        status, text = await page(client, "/ui/policies/p-regs/rollout")
        assert status == 200, who
        for seen in ("Rollout of policy p-regs", "1 → 2", "careful", "labels ring=canary",
                     "by share: 100% of the clusters no selector chose", "60 s", "needed",
                     "c0001", "c0002, c0003", "revision 2 (new)", "done",
                     "current: waiting approval", GATE_WORDS["approval"]):
            assert seen in text, (who, seen)
        assert html.escape(ROLLOUT_REASON) in text
        status, text = await page(client, "/ui/policies/p-regs")
        assert 'href="/ui/policies/p-regs/rollout">waiting approval, wave 2 of 2: rest' in text


async def test_another_boundarys_tenant_sees_no_rollout_of_it(
    world: UiWorld, client: Client,
) -> None:
    await sign_in(client, world.tokens["team-b"])
    status, text = await page(client, "/ui/boundaries/team-b")
    assert status == 200
    assert "p-regs" not in text
    assert "Live rollouts (0)" in text
    # Another boundary's, its own without a rollout, none at all: the same page.
    answers = {pid: await page(client, f"/ui/policies/{pid}/rollout")
               for pid in ("p-regs", "p-labels", "p-none")}
    assert {pid: status for pid, (status, _) in answers.items()} == dict.fromkeys(answers, 404)
    assert len({text.replace(pid, "P") for pid, (_, text) in answers.items()}) == 1


async def test_the_stylesheet_comes_from_the_package(client: Client) -> None:
    async with client.get("/ui/static/ui.css") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/css")
        assert resp.headers["Content-Security-Policy"] == CSP
        assert ".ph-enforcing" in await resp.text()
    async with client.get("/ui/static/../app.py") as resp:
        assert resp.status == 404
    async with client.get("/ui/static/nope.js") as resp:
        assert resp.status == 404
