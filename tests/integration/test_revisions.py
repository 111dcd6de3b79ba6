"""Every revision kept, and the rollback, against a real PostgreSQL and the simulator: a write by
`convergerd import`, by plain SQL (as module-policies writes) and a deletion through the API
each leave a revision with who saved it and what changed; revisions cannot be changed; the
retention prunes the oldest beyond its bound, logged and counted; a rollback is a new revision
with the old content, delivered to every cluster at once; a boundary's view hides another
boundary's revisions; `convergerd policy history|rollback`."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.api.server import server_options
from convergerd.config import RevisionRetention
from convergerd.core.report import FanoutStatus
from convergerd.delivery.fanout import Saver
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.revisions import Pruner
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import Rounds, objects, settings_for, sql
from tests.integration.savedelete_helpers import make_saver

TOKEN = "revisions-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLUSTERS = ("c0001", "c0002", "c0003")  # team-a
REGS = {"type": "AllowedRegistries", "registries": ["registry.example.com"]}
Client = TestClient[web.Request, web.Application]


@pytest.fixture
def saver(rounds: Rounds, store: Store) -> Saver:
    return make_saver(rounds, store)


@pytest.fixture
async def client(rounds: Rounds, store: Store, saver: Saver, fleet: Fleet,
                 database_url: str) -> AsyncIterator[Client]:
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN,
                            CONVERGERD_TOKEN_READS_PER_SECOND="1000",
                            CONVERGERD_STATUS_READS_PER_SECOND="1000")
    state = StatusState(identity="t", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=saver, tenants=store, revisions=store)
    async with TestClient(TestServer(app, **server_options())) as c:
        yield c


async def call(client: Client, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    async with client.request(method, path, headers=AUTH, **kw) as resp:
        return resp.status, await resp.json()


async def history(client: Client, policy: str, query: str = "") -> list[dict[str, Any]]:
    status, body = await call(client, "GET", f"/v1/policies/{policy}/revisions{query}")
    assert status == 200, body
    found: list[dict[str, Any]] = body["revisions"]
    return found


def summaries(revisions: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    return [(r["revision"], r["saved_by"], r["what_changed"]["summary"]) for r in revisions]


async def test_every_writer_leaves_a_revision_with_who_and_what_changed(
    client: Client, saver: Saver, fleet: Fleet, database_url: str
) -> None:
    role = (await sql(database_url, "SELECT current_user AS r"))[0]["r"]
    await sql(database_url, """UPDATE policies SET rule = '{"type": "AllowedRegistries",
              "registries": ["registry.example.com", "mirror.example.com"]}' WHERE id = 'p-regs'""")
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")
    await sql(database_url, "UPDATE policies SET deleted_at = now() WHERE id = 'p-regs'")
    await sql(database_url, "UPDATE policies SET deleted_at = NULL WHERE id = 'p-regs'")
    assert (await saver.save("p-regs")).status is FanoutStatus.OK
    status, _ = await call(client, "DELETE", "/v1/policies/p-regs")
    assert status == 200

    assert summaries(await history(client, "p-regs")) == [
        (4, "convergerd (DELETE /v1/policies/{id})", "deleted"),
        (3, f"{role} (SQL)", "enabled: true → false"),
        (2, f"{role} (SQL)", "rule: registries"),
        (1, "convergerd import", "created"),
    ]
    [deleted, disabled, *_] = await history(client, "p-regs")
    assert (deleted["deleted"], deleted["content"]) == (True, None)
    assert disabled["content"] == {"boundary_id": "team-a", "enabled": False,
                                   "enforcement": "Deny",
                                   "rule": {"type": "AllowedRegistries", "registries": [
                                       "registry.example.com", "mirror.example.com"]}}
    assert disabled["what_changed"]["changes"] == [
        {"field": "enabled", "before": True, "after": False}]
    # The deletion mark alone (set, then cleared) made no revision: 4 in all.
    assert len(await history(client, "p-regs")) == 4

    with pytest.raises(asyncpg.RestrictViolationError, match="immutable"):
        await sql(database_url, "UPDATE policy_revisions SET saved_by = 'someone else'")
    # A new row of that id continues after the tombstone: no revision number twice.
    await sql(database_url, """INSERT INTO policies (id, boundary_id, rule)
              VALUES ('p-regs', 'team-a', '{"type": "ForbidLatestTag"}')""")
    [created, *_] = await history(client, "p-regs")
    assert (created["revision"], created["operation"], created["what_changed"]["kind"]) == (
        5, "insert", "created")


async def test_a_rollback_is_a_new_revision_with_the_old_content_delivered_everywhere(
    client: Client, saver: Saver, fleet: Fleet, database_url: str
) -> None:
    assert (await saver.save("p-regs")).status is FanoutStatus.OK
    await sql(database_url, """UPDATE policies SET rule = '{"type": "AllowedRegistries",
              "registries": ["typo.example.com"]}' WHERE id = 'p-regs'""")
    assert (await saver.save("p-regs")).status is FanoutStatus.OK
    for c in CLUSTERS:
        assert objects(fleet, c)["policy-p-regs"]["spec"]["rule"]["registries"] == [
            "typo.example.com"]

    status, body = await call(client, "POST", "/v1/policies/p-regs/rollback",
                              json={"to": 1, "by": "alice@laptop"})
    assert status == 200, body
    assert (body["status"], body["revision"], body["rolled_back_to"], body["changed"]) == (
        "ok", 3, 1, True)
    assert {(r["cluster"], r["result"]) for r in body["clusters"]} == {
        (c, "updated") for c in CLUSTERS}
    for c in CLUSTERS:
        spec = objects(fleet, c)["policy-p-regs"]["spec"]
        assert (spec["revision"], spec["rule"]) == (3, REGS)
    rows = await sql(database_url, "SELECT revision, content, saved_by FROM policy_revisions "
                     "WHERE policy_id = 'p-regs' AND revision IN (1, 3) ORDER BY revision")
    assert rows[0]["content"] == rows[1]["content"]
    assert rows[1]["saved_by"] == "alice@laptop (rollback to 1)"
    [newest, *_] = await history(client, "p-regs")
    assert newest["what_changed"]["summary"] == "rule: registries"

    # Already that content: no new revision, saved again.
    status, body = await call(client, "POST", "/v1/policies/p-regs/rollback",
                              json={"to": 1, "now": True})
    assert (status, body["revision"], body["changed"], body["now"]) == (200, 3, False, True)
    assert {r["result"] for r in body["clusters"]} == {"unchanged"}


async def test_a_deleted_policy_is_created_again_by_a_rollback(
    client: Client, saver: Saver, fleet: Fleet
) -> None:
    assert (await saver.save("p-regs")).status is FanoutStatus.OK
    assert (await call(client, "DELETE", "/v1/policies/p-regs"))[0] == 200
    assert "policy-p-regs" not in objects(fleet, "c0001")
    status, body = await call(client, "POST", "/v1/policies/p-regs/rollback", json={"to": 1})
    assert status == 200, body
    assert body["revision"] == 3  # after the tombstone, 2
    for c in CLUSTERS:
        assert objects(fleet, c)["policy-p-regs"]["spec"]["revision"] == 3
    assert [r["what_changed"]["kind"] for r in await history(client, "p-regs")] == [
        "created", "deleted", "created"]


@pytest.mark.parametrize(("policy", "body", "status", "names"), [
    ("p-regs", {"to": 99}, 404, "to: policy 'p-regs' has no revision 99 (revisions 1 to 2 are "
                                "kept; CONVERGERD_REVISION_RETENTION keeps the last 100"),
    ("p-labels", {"to": 3}, 409, "to: revision 3 of policy 'p-labels' is its deletion"),
    ("p-labels", {"to": 2}, 422, "to: revision 2 of policy 'p-labels' is not a valid policy "
                                 "now: boundary: 'team-gone' does not exist"),
    ("p-latest", {"to": 1}, 409, "policy 'p-latest': its deletion has begun"),
    ("p-regs", {}, 400, "body.to: expected a revision number"),
    ("p-regs", {"to": "1"}, 400, "body.to: expected int"),
    ("p-regs", {"to": 0}, 400, "body.to: expected a revision number"),
    ("p-regs", {"to": 1, "when": "now"}, 400, "unknown field(s) 'when'"),
    ("p-regs", {"to": 1, "by": "\x1b[2J"}, 400, "body.by:"),
])
async def test_a_rollback_refused_names_the_field_and_the_value_and_writes_nothing(  # noqa: PLR0917
    client: Client, database_url: str, policy: str, body: dict[str, Any], status: int,
    names: str,
) -> None:
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")
    # p-labels: revision 1 (team-b), 2 in team-gone (since removed), 3 its deletion, then
    # created again (4). p-latest: its deletion begun.
    await sql(database_url, "INSERT INTO boundaries (id) VALUES ('team-gone')")
    await sql(database_url, "UPDATE policies SET boundary_id = 'team-gone' WHERE id = 'p-labels'")
    await sql(database_url, "DELETE FROM boundaries WHERE id = 'team-gone'")
    await sql(database_url, "DELETE FROM policies WHERE id = 'p-labels'")
    await sql(database_url, """INSERT INTO policies (id, boundary_id, rule)
              VALUES ('p-labels', 'team-b', '{"type": "ForbidLatestTag"}')""")
    await sql(database_url, "UPDATE policies SET deleted_at = now() WHERE id = 'p-latest'")
    before = await sql(database_url, "SELECT * FROM policy_revisions ORDER BY 1, 2")
    got, answer = await call(client, "POST", f"/v1/policies/{policy}/rollback", json=body)
    assert got == status, answer
    assert names in answer["error"], answer
    assert await sql(database_url, "SELECT * FROM policy_revisions ORDER BY 1, 2") == before


async def test_a_policy_with_no_row_and_no_revision_is_unknown(client: Client) -> None:
    status, body = await call(client, "POST", "/v1/policies/p-none/rollback", json={"to": 1})
    assert (status, body["error"]) == (404, "unknown policy 'p-none': no row and no revision "
                                            "kept")
    assert (await call(client, "GET", "/v1/policies/p-none/revisions"))[0] == 404


async def test_retention_prunes_the_oldest_beyond_its_bound_logged_and_counted(
    client: Client, store: Store, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    for i in range(10):  # revisions 2 to 11
        await sql(database_url, "UPDATE policies SET enabled = $1 WHERE id = 'p-latest'",
                  i % 2 == 1)
    metrics = Metrics(state=StatusState(identity="t", interval_s=300))
    pruner = Pruner(store, RevisionRetention(keep_last=3), leading=lambda: True,
                    observer=metrics)
    with caplog.at_level(logging.INFO, logger="convergerd.store.revisions"):
        pruned = await pruner.once()
    assert (pruned.revisions, pruned.policies, pruned.more) == (8, 1, False)
    assert "revision retention: deleted 8 revision(s) of 1 policies (kept: the last 3 of each " \
           "policy)" in caplog.text
    assert "convergerd_policy_revisions_pruned_total 8.0" in metrics.render().decode()
    kept = await history(client, "p-latest")
    assert [r["revision"] for r in kept] == [11, 10, 9]
    assert kept[-1]["what_changed"]["kind"] == "first_kept"
    assert (await pruner.once()).revisions == 0  # nothing more: nothing logged again

    # By age: a deleted policy's history goes whole; a live one keeps what it holds now.
    await sql(database_url, "DELETE FROM policies WHERE id = 'p-plans'")
    await sql(database_url, "ALTER TABLE policy_revisions DISABLE TRIGGER "
                            "policy_revisions_immutable")
    await sql(database_url, "UPDATE policy_revisions SET saved_at = now() - interval '3 days'")
    aged = Pruner(store, RevisionRetention(keep_last=3, max_age_days=2), leading=lambda: True)
    assert (await aged.once()).revisions == 2 + 2  # p-latest's 9, 10; p-plans' 1 and tombstone
    left = await sql(database_url, "SELECT policy_id, revision FROM policy_revisions "
                     "ORDER BY policy_id")
    assert [(r["policy_id"], r["revision"]) for r in left] == [
        ("p-labels", 1), ("p-latest", 11), ("p-regs", 1)]
    assert (await call(client, "GET", "/v1/policies/p-plans/revisions"))[0] == 404


async def test_a_boundary_sees_its_policy_history_and_nothing_of_another_boundary(
    client: Client, database_url: str
) -> None:
    await sql(database_url, "UPDATE policies SET boundary_id = 'team-a' WHERE id = 'p-labels'")
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-labels'")
    status, body = await call(client, "GET",
                              "/v1/boundaries/team-a/policies/p-labels/revisions")
    assert status == 200, body
    assert [(r["revision"], r["what_changed"]["kind"], r["content"] is None,
             r["saved_by"] is None) for r in body["revisions"]] == [
        (3, "changed", False, False), (2, "moved_in", False, False),
        (1, "elsewhere", True, True)]
    assert "team-b" not in str(body)
    status, body = await call(client, "GET",
                              "/v1/boundaries/team-b/policies/p-labels/revisions")
    assert (status, body["error"]) == (404, "unknown policy 'p-labels' in boundary 'team-b'")


async def test_history_pages_newest_first(client: Client, database_url: str) -> None:
    for enabled in (False, True, False):
        await sql(database_url, "UPDATE policies SET enabled = $1 WHERE id = 'p-latest'",
                  enabled)
    status, body = await call(client, "GET", "/v1/policies/p-latest/revisions?limit=2")
    assert [r["revision"] for r in body["revisions"]] == [4, 3]
    assert body["listing"] == {"complete": False,
                               "next": "/v1/policies/p-latest/revisions?limit=2&before=3"}
    status, body = await call(client, "GET", body["listing"]["next"])
    assert [r["revision"] for r in body["revisions"]] == [2, 1]
    assert body["listing"] == {"complete": True, "next": None}
    for query in ("?limit=0", "?limit=101", "?before=x", "?before=-1"):
        status, body = await call(client, "GET", f"/v1/policies/p-latest/revisions{query}")
        assert status == 400, query
        assert body["error"].startswith(("limit:", "before:")), body


# ---------------------------------------------------------------------------------------------
# `convergerd policy history|rollback`: the real command (a process) against this app


async def policy_cli(client: Client, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGERD_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "convergerd", "policy", *args,
        "--addr", f"127.0.0.1:{client.server.port}",
        env={**env, "CONVERGERD_API_TOKEN": TOKEN},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_policy_cli_history_and_rollback(
    client: Client, saver: Saver, fleet: Fleet, database_url: str
) -> None:
    role = (await sql(database_url, "SELECT current_user AS r"))[0]["r"]
    await sql(database_url, """UPDATE policies SET rule = '{"type": "AllowedRegistries",
              "registries": ["typo.example.com"]}' WHERE id = 'p-regs'""")
    code, out, err = await policy_cli(client, "rollback", "p-regs", "--to", "1", "--by", "bob")
    assert code == 0, err
    assert out.startswith("policy p-regs: revision 1's content is revision 3 now\n"
                          "save p-regs (revision 3")
    assert "3 cluster(s), 0 failed" in out
    code, out, err = await policy_cli(client, "history", "p-regs")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("policy p-regs (boundary team-a): 3 revision(s) listed, the last 100 "
                        "of each policy kept")
    table = [re.split(r"\s{2,}", line) for line in lines[2:6]]
    assert [[row[0], *row[2:]] for row in table] == [
        ["REVISION", "BY", "WHAT CHANGED"],
        ["3", "bob (rollback to 1)", "rule: registries"],
        ["2", f"{role} (SQL)", "rule: registries"],
        ["1", "convergerd import", "created"]]
    code, _, err = await policy_cli(client, "rollback", "p-regs", "--to", "99")
    assert code == 1
    assert "has no revision 99 (revisions 1 to 3 are kept" in err
    code, _, err = await policy_cli(client, "history", "Bad_Id")
    assert code == 2
    assert "Bad_Id" in err
