"""Rows of the policy database are untrusted input: module-policies writes the table directly,
and PostgreSQL's jsonb holds values no Python JSON decoder should be asked to build. A row that
cannot be read fails that row only; the daemon and every other tenant go on."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from convergerd.sim.fleet import Fleet
from convergerd.store.store import MAX_RULE_BYTES
from tests.fixtures.fleet import free_port
from tests.integration.rounds_helpers import (
    DESIRED,
    FLEET_DOC,
    import_doc,
    objects,
    running_daemon,
    settings_for,
    sql,
    wait_for,
)

# What jsonb accepts and a plain decoder does not survive: recursion past the interpreter's
# limit, and an integer past Python's 4,300-digit conversion limit.
DEEP_RULE = "[" * 5000 + "]" * 5000
HUGE_INT_RULE = '{"type": "ForbidLatestTag", "x": ' + "9" * 4301 + "}"
# Not read at all: every round of every replica would fetch and decode it (jsonb holds 255 MiB).
LARGE_RULE = '{"type": "RequiredLabels", "labels": ["' + "a" * (MAX_RULE_BYTES + 1) + '"]}'


async def get_json(port: int, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(
        f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=5)
    ) as response:
        return response.status, json.loads(await response.text())


async def test_an_unreadable_rule_fails_its_row_and_every_other_tenant_is_delivered(
    fleet: Fleet, database_url: str
) -> None:
    await import_doc(database_url, FLEET_DOC)
    for policy_id, rule in (("p-deep", DEEP_RULE), ("p-huge", HUGE_INT_RULE),
                            ("p-large", LARGE_RULE)):
        await sql(database_url, "INSERT INTO policies (id, boundary_id, rule) "
                  "VALUES ($1, 'team-a', $2::jsonb)", policy_id, rule)
    port = free_port()
    settings = settings_for(fleet.kubeconfig_path, database_url,
                            CONVERGERD_HTTP_ADDR=f"127.0.0.1:{port}")

    async with running_daemon(settings) as (daemon, task):
        await wait_for(lambda: task.done() or daemon.last_report is not None,
                       what="the first round, or the daemon ending")
        assert not task.done(), "the daemon stopped on a policy row"
        for cluster, names in DESIRED.items():
            assert set(objects(fleet, cluster)) == names
        report = daemon.last_report
        assert report is not None
        invalid = {p.id: p.reason for p in report.invalid}
        assert invalid == {
            "p-deep": "rule: the stored JSON cannot be read: nested deeper than 100 levels",
            "p-huge": "rule: the stored JSON cannot be read: an integer of 4301 digits "
                      "(at most 100)",
            "p-large": "rule: the stored JSON cannot be read: larger than 1048576 bytes",
        }
        status, view = await get_json(port, "/v1/policies/p-huge/status")
        assert status == 200
        assert view["policy"]["invalid"] == invalid["p-huge"]
        status, whole = await get_json(port, "/status")
        assert status == 200
        assert {p["id"] for p in whole["invalid_policies"]} == {"p-deep", "p-huge", "p-large"}
