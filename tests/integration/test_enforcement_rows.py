"""Enforcement modes in PostgreSQL (migration 0008): the column, its check, the revision a
change of mode raises, and `convergerd import` of a mode."""

from __future__ import annotations

import textwrap
from pathlib import Path

import asyncpg
import pytest

from convergerd.core.model import Enforcement, Policy, PolicyId
from convergerd.store.importer import import_file
from convergerd.store.store import Store

FILE = """
clusters:   [{id: c0001}]
boundaries: [{id: team-a, clusters: [c0001]}]
policies:
  - {id: p-latest, boundary: team-a, rule: {type: ForbidLatestTag}}
  - {id: p-warn, boundary: team-a, enforcement: Warn, rule: {type: ForbidLatestTag}}
"""


def write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


async def execute(database_url: str, statement: str, *args: object) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        return str(await conn.execute(statement, *args))
    finally:
        await conn.close()


async def modes(store: Store) -> dict[str, tuple[Enforcement, int]]:
    fleet = await store.load_fleet()
    return {p.id: (p.enforcement, p.revision) for p in fleet.policies}


async def test_a_row_written_without_the_column_is_deny(database_url: str, store: Store) -> None:
    """module-policies, or any writer from before modes, keeps the source documents' mode."""
    await execute(database_url, "INSERT INTO boundaries (id) VALUES ('team-a')")
    await execute(database_url, """INSERT INTO policies (id, boundary_id, rule)
                                   VALUES ('p-old', 'team-a', '{"type": "ForbidLatestTag"}')""")
    assert await modes(store) == {"p-old": (Enforcement.DENY, 1)}


async def test_the_database_refuses_a_mode_that_is_not_one(database_url: str) -> None:
    await execute(database_url, "INSERT INTO boundaries (id) VALUES ('team-a')")
    with pytest.raises(asyncpg.CheckViolationError, match="policies_enforcement_check"):
        await execute(database_url, """INSERT INTO policies (id, boundary_id, rule, enforcement)
                                       VALUES ('p', 'team-a', '{}', 'deny')""")


async def test_a_change_of_mode_by_any_writer_is_a_new_revision(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, FILE))
    await execute(database_url, "UPDATE policies SET enforcement = 'Audit' WHERE id = 'p-latest'")
    await execute(database_url, "UPDATE policies SET enforcement = 'Warn' WHERE id = 'p-warn'")
    assert await modes(store) == {"p-latest": (Enforcement.AUDIT, 2),
                                  "p-warn": (Enforcement.WARN, 1)}  # the same mode: no change


async def test_import_stores_the_mode_and_raises_the_revision_only_when_it_changes(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    summary = await import_file(database_url, write(tmp_path, FILE))
    assert summary.policies.created == 2
    assert await modes(store) == {"p-latest": (Enforcement.DENY, 1),
                                  "p-warn": (Enforcement.WARN, 1)}
    again = await import_file(database_url, write(tmp_path, FILE, "again.yaml"))
    assert (again.policies.unchanged, again.policies.updated) == (2, 0)
    # Written out as the default it is: still no change.
    explicit = FILE.replace("{id: p-latest, boundary: team-a,",
                            "{id: p-latest, boundary: team-a, enforcement: Deny,")
    same = await import_file(database_url, write(tmp_path, explicit, "explicit.yaml"))
    assert same.policies.unchanged == 2
    switched = FILE.replace("enforcement: Warn", "enforcement: Deny")
    changed = await import_file(database_url, write(tmp_path, switched, "switched.yaml"))
    assert (changed.policies.updated, changed.policies.unchanged) == (1, 1)
    assert await modes(store) == {"p-latest": (Enforcement.DENY, 1),
                                  "p-warn": (Enforcement.DENY, 2)}


async def test_set_enforcement_stores_a_new_mode_as_a_new_revision(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, FILE))
    await store.set_enforcement("p-latest", Enforcement.WARN)
    await store.set_enforcement("p-warn", Enforcement.WARN)  # already: nothing written
    await store.set_enforcement("nope", Enforcement.AUDIT)  # no such policy: nothing
    assert await modes(store) == {"p-latest": (Enforcement.WARN, 2),
                                  "p-warn": (Enforcement.WARN, 1)}
    found = await store.current_policy(PolicyId("p-latest"))
    assert isinstance(found, Policy)
    assert (found.enforcement, found.revision) == (Enforcement.WARN, 2)
