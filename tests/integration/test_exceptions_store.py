"""Exceptions in the database (migration 0009) against a real PostgreSQL: a grant or a
withdrawal is a new revision of its policy carrying the exceptions in force, every change is
recorded (who, when, what), an expired one leaves what is delivered at once and is lapsed at a
new revision, and the metrics' tally says what is still held."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import asyncpg
import pytest
import yaml

from convergerd.core.exceptions import parse_exception
from convergerd.core.model import Policy, PolicyException
from convergerd.core.render import render_policy
from convergerd.store.exceptions import PolicyGone, Refused
from convergerd.store.importer import ImportFileError, import_file
from convergerd.store.store import Store


def exception(ident: str, *, expires_in_s: float = 86400.0, **fields: object) -> PolicyException:
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=expires_in_s)
    return parse_exception({"id": ident, "namespace": "team-a-web", "reason": "migrating",
                            "requestedBy": "dev@team-a", "approvedBy": "admin@platform",
                            "expiresAt": expires.isoformat(), **fields})


async def seed(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """INSERT INTO clusters (id) VALUES ('c1'), ('c2');
               INSERT INTO boundaries (id) VALUES ('team-a');
               INSERT INTO boundary_clusters VALUES ('team-a', 'c1'), ('team-a', 'c2');
               INSERT INTO policies (id, boundary_id, rule) VALUES
                   ('regs', 'team-a', '{"type": "ForbidLatestTag"}');""")
    finally:
        await conn.close()


async def policy(store: Store, pid: str = "regs") -> Policy:
    fleet = await store.load_fleet()
    return next(p for p in fleet.policies if p.id == pid)


async def changes(dsn: str) -> list[tuple[str, str, str, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT action, exception_id, actor, revision "
                                "FROM exception_changes ORDER BY id")
    finally:
        await conn.close()
    return [(r["action"], r["exception_id"], r["actor"], r["revision"]) for r in rows]


async def test_a_grant_is_a_new_revision_carrying_it_and_a_withdrawal_another(
        database_url: str, store: Store) -> None:
    await seed(database_url)
    before = await policy(store)
    assert before.exceptions == ()
    assert "exceptions" not in render_policy(before)["spec"]  # unchanged without any

    granted = exception("web-fix", selector={"matchLabels": {"app": "web"}})
    revision = await store.grant_exception("regs", granted)
    after = await policy(store)
    assert revision == after.revision == before.revision + 1
    assert after.exceptions == (granted,)
    spec = render_policy(after)["spec"]["exceptions"]
    assert spec == [{"id": "web-fix", "namespace": "team-a-web",
                     "selector": {"matchLabels": {"app": "web"}}, "reason": "migrating",
                     "requestedBy": "dev@team-a", "approvedBy": "admin@platform",
                     "expiresAt": granted.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    # Every read a save or a round makes carries it.
    target = await store.save_target("regs")
    assert target is not None
    assert target.row.exceptions == spec
    assert await store.current_policy(after.id) == after

    with pytest.raises(Refused, match="already has an exception 'web-fix'"):
        await store.grant_exception("regs", granted)
    with pytest.raises(PolicyGone, match="no such policy"):
        await store.grant_exception("nope", granted)

    withdrawn = await store.withdraw_exception("regs", "web-fix", "lead@platform")
    assert withdrawn is not None
    assert withdrawn[0]["id"] == "web-fix"
    assert withdrawn[1] == revision + 1
    assert (await policy(store)).exceptions == ()
    assert await store.withdraw_exception("regs", "web-fix", "lead@platform") is None
    assert await changes(database_url) == [
        ("grant", "web-fix", "admin@platform", revision),
        ("withdraw", "web-fix", "lead@platform", revision + 1)]


async def test_an_expired_exception_is_not_delivered_then_lapsed_and_tallied(
        database_url: str, store: Store) -> None:
    await seed(database_url)
    await store.grant_exception("regs", exception("soon", expires_in_s=3 * 86400))
    granted = await store.grant_exception("regs", exception("gone", expires_in_s=-1))
    # Expired: no longer in what a round or a save delivers, with no write at all.
    assert [e.id for e in (await policy(store)).exceptions] == ["soon"]
    [tally] = await store.exception_tally(7 * 86400)
    assert (tally.in_force, tally.expiring_soon, tally.expired_delivered) == (1, 1, 1)

    lapsed, upcoming = await store.lapse_exceptions()
    assert lapsed == [("regs", "gone", granted + 1)]
    assert upcoming is not None
    assert (await policy(store)).revision == granted + 1
    assert (await store.lapse_exceptions())[0] == []  # once
    [tally] = await store.exception_tally(7 * 86400)
    assert tally.expired_delivered == 0  # no cluster recorded with a revision carrying it

    # A cluster still recorded with the revision that carried it: still delivered there.
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("INSERT INTO deliveries (policy_id, cluster_id, delivered_revision) "
                           "VALUES ('regs', 'c2', $1)", granted)
    finally:
        await conn.close()
    [tally] = await store.exception_tally(7 * 86400)
    assert tally.expired_delivered == 1
    listed = {e.spec["id"]: e for e in await store.list_exceptions("regs")}
    assert listed["gone"].expired
    assert listed["gone"].lapsed_revision == granted + 1
    assert not listed["soon"].expired
    assert ("lapse", "gone", "convergerd", granted + 1) in await changes(database_url)


async def test_import_upserts_exceptions_and_refuses_bad_ones_naming_them(
        database_url: str, store: Store, tmp_path: Path) -> None:
    await seed(database_url)
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(days=20)).strftime("%Y-%m-%d")
    entry = {"policy": "regs", "id": "legacy", "namespace": "team-a-web", "name": "api",
             "reason": "TICKET-35", "requestedBy": "dev@team-a", "approvedBy": "admin",
             "expiresAt": expires}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"exceptions": [entry]}))
    before = (await policy(store)).revision
    summary = await import_file(database_url, path)
    assert str(summary).endswith("exceptions: 1 created, 0 updated, 0 unchanged")
    after = await policy(store)
    assert [e.name for e in after.exceptions] == ["api"]
    assert after.revision == before + 1
    assert str(await import_file(database_url, path)).endswith(
        "exceptions: 0 created, 0 updated, 1 unchanged")
    assert (await policy(store)).revision == before + 1  # unchanged: no new revision
    assert ("import", "legacy", "admin", before + 1) in await changes(database_url)

    far = (dt.datetime.now(dt.UTC) + dt.timedelta(days=200)).strftime("%Y-%m-%d")
    bad = [entry | {"expiresAt": far}, entry | {"id": "x", "selector": {"matchLabels":
                                                                           {"a": "b"}}},
           entry | {"id": "y", "policy": "nope"}]
    path.write_text(yaml.safe_dump({"exceptions": bad}))
    with pytest.raises(ImportFileError) as caught:
        await import_file(database_url, path, exception_max_days=90)
    problems = caught.value.problems
    assert "is more than 90 days away" in problems[0]
    assert problems[0].startswith("exceptions[0] (id 'legacy'): expiresAt: ")
    assert "name 'api' and selector" in problems[1]
    assert len(problems) == 2  # the unknown policy is a reference, checked once the file is
    path.write_text(yaml.safe_dump({"exceptions": bad[2:]}))
    with pytest.raises(ImportFileError, match=r"exceptions\[0\] \(id 'y'\): policy: unknown "
                                              r"policy 'nope'"):
        await import_file(database_url, path)
