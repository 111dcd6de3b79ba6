"""A rollout as the admin and as the tenant whose policy it is sees it, over HTTP (the daemon's
app, a real PostgreSQL, the simulator; `ui_helpers`' world: team-a's p-regs at revision 2
under a two-wave strategy, its canary c0001 written, the rest waiting for an approval):
`GET /v1/boundaries/{b}/rollouts` and `GET /v1/boundaries/{b}/policies/{id}/rollout` show
the tenant the admin's document, and another boundary's token learns nothing."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.server import server_options
from convergerd.cli import rollout
from convergerd.cli.main import build_parser
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.integration.rounds_helpers import import_doc
from tests.integration.ui_helpers import ROLLOUT_REASON, UiWorld, rollout_doc, ui_world

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


async def get(client: Client, world: UiWorld, path: str, who: str) -> tuple[int, Any]:
    async with client.get(path, headers={"Authorization": f"Bearer {world.tokens[who]}"}) as r:
        return r.status, await r.json()


async def test_the_tenant_sees_its_policys_rollout_as_the_admin_does(
    world: UiWorld, client: Client,
) -> None:
    status, fleet = await get(client, world, "/v1/policies/p-regs/rollout", "admin")
    assert status == 200, fleet
    assert (fleet["state"], fleet["gate"], fleet["reason"]) == (
        "waiting_approval", "approval", ROLLOUT_REASON)
    assert [(w["name"], w["progress"], w["approval"]) for w in fleet["waves"]] == [
        ("canary", "done", False), ("rest", "current", True)]
    # Which clusters hold which revision: the canary the new one, the rest the old.
    assert [w["revisions"] for w in fleet["waves"]] == [
        [{"revision": 2, "clusters": 1, "named": ["c0001"]}],
        [{"revision": 1, "clusters": 2, "named": ["c0002", "c0003"]}]]
    assert fleet["clusters"] == {"new": 1, "old": 2, "none": 0}
    assert [e["what"] for e in fleet["events"]] == ["started", "advance"]

    for who in ("team-a", "admin"):
        status, tenant = await get(client, world,
                                   "/v1/boundaries/team-a/policies/p-regs/rollout", who)
        assert status == 200, tenant
        assert tenant == {"boundary": "team-a", **fleet}, who
        status, listed = await get(client, world, "/v1/boundaries/team-a/rollouts", who)
        assert status == 200, listed
        assert listed == {"boundary": "team-a",
                          "rollouts": (await get(client, world, "/v1/rollouts", "admin"))[1][
                              "rollouts"]}
        assert [r["policy"] for r in listed["rollouts"]] == ["p-regs"]
        # The boundary's view lists its live rollouts as /status does.
        status, view = await get(client, world, "/v1/boundaries/team-a", who)
        assert status == 200
        assert [(r["policy"], r["gate"], r["clusters"]) for r in view["rollouts"]] == [
            ("p-regs", "approval", {"new": 1, "old": 2})]


async def test_another_boundarys_token_learns_nothing_of_the_rollout(
    world: UiWorld, client: Client,
) -> None:
    # Its own boundary: no live rollout; its own policy without one is the same 404 as one
    # that does not exist, and as another boundary's policy.
    assert await get(client, world, "/v1/boundaries/team-b/rollouts", "team-b") == (
        200, {"boundary": "team-b", "rollouts": []})
    status, view = await get(client, world, "/v1/boundaries/team-b", "team-b")
    assert (status, view["rollouts"]) == (200, [])
    answers = {pid: await get(client, world,
                              f"/v1/boundaries/team-b/policies/{pid}/rollout", "team-b")
               for pid in ("p-regs", "p-labels", "p-none")}
    assert {pid: status for pid, (status, _) in answers.items()} == dict.fromkeys(answers, 404)
    bodies = {json.dumps(body).replace(pid, "P") for pid, (_, body) in answers.items()}
    assert len(bodies) == 1, bodies
    # team-a's paths: the 404 of a boundary that does not exist.
    hidden = await get(client, world, "/v1/boundaries/team-zz/rollouts", "admin")
    assert hidden[0] == 404
    for path in ("/v1/boundaries/team-a/rollouts",
                 "/v1/boundaries/team-a/policies/p-regs/rollout"):
        status, body = await get(client, world, path, "team-b")
        assert (status, body) == (404, json.loads(json.dumps(hidden[1]).replace(
            "team-zz", "team-a"))), path
    # The fleet's views are the admin's.
    for path in ("/v1/rollouts", "/v1/policies/p-regs/rollout"):
        assert (await get(client, world, path, "team-a"))[0] == 403, path


async def test_a_rollout_from_before_the_policy_moved_in_is_not_the_new_boundarys(
    world: UiWorld, client: Client, database_url: str,
) -> None:
    """p-regs moved to team-b (stored, not saved yet: its team-a rollout is still in force):
    team-b's tenant sees no rollout of it, nor does team-a's, whose policy it no longer is;
    the admin still does."""
    doc = rollout_doc()
    doc["policies"] = [{**p, "boundary": "team-b"} if p["id"] == "p-regs" else p
                       for p in doc["policies"]]
    await import_doc(database_url, doc)
    for boundary in ("team-a", "team-b"):
        status, _ = await get(client, world,
                              f"/v1/boundaries/{boundary}/policies/p-regs/rollout", boundary)
        assert status == 404, boundary
        status, listed = await get(client, world, f"/v1/boundaries/{boundary}/rollouts",
                                   boundary)
        assert (status, listed["rollouts"]) == (200, []), boundary
    status, fleet = await get(client, world, "/v1/policies/p-regs/rollout", "admin")
    assert (status, fleet["state"]) == (200, "waiting_approval")


async def test_the_tenant_asks_with_the_cli_and_its_token(
    world: UiWorld, client: Client, tmp_path: Path,
) -> None:
    """`convergerd rollout status --boundary team-a` with team-a's read token: its rollouts and
    its policy's in detail; with team-b's, refused as the API refuses."""
    addr = f"http://127.0.0.1:{client.port}"
    parser = build_parser()

    async def status(who: str, *argv: str) -> tuple[int, str, str]:
        token = tmp_path / f"{who}.token"
        token.write_text(world.tokens[who])
        args = parser.parse_args(["rollout", "status", *argv, "--addr", addr,
                                  "--api-token-file", str(token)])
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(rollout.run, args, env={}, out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    code, out, err = await status("team-a", "--boundary", "team-a")
    assert code == 0, err
    assert out.splitlines()[1].split()[:5] == ["p-regs", "1", "->", "2", "waiting_approval"]
    code, out, err = await status("team-a", "p-regs", "--boundary", "team-a")
    assert code == 0, err
    assert out.startswith("policy p-regs: rollout 1 of revision 2 (from 1)")
    assert "reason: approval" in out
    code, out, err = await status("team-b", "p-regs", "--boundary", "team-a")
    assert code != 0
    assert out == ""
