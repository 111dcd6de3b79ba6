"""Schema migrations: idempotent, safe when two replicas migrate at once, and the daemon
refuses an unmigrated database with a message saying what to run."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from convergerd.core.errors import SchemaNotMigrated
from convergerd.store.schema import check_schema, load_migrations, migrate, required_version
from convergerd.store.store import Store


async def applied(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    return [r["version"] for r in rows]


def test_migrations_are_packaged_and_ordered() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions[0] == "0001"
    assert versions == sorted(versions, key=int)
    assert required_version() == versions[-1]


async def test_migrate_applies_everything_once(empty_database_url: str) -> None:
    everything = [m.version for m in load_migrations()]
    assert await migrate(empty_database_url) == everything
    assert await migrate(empty_database_url) == []
    assert await applied(empty_database_url) == everything


async def test_concurrent_migrations_apply_each_version_once(empty_database_url: str) -> None:
    results = await asyncio.gather(*(migrate(empty_database_url) for _ in range(4)))
    everything = [m.version for m in load_migrations()]
    assert sorted(results, key=len) == [[], [], [], everything]
    assert await applied(empty_database_url) == everything


async def test_store_refuses_an_unmigrated_database(empty_database_url: str) -> None:
    with pytest.raises(SchemaNotMigrated) as caught:
        await Store.connect(empty_database_url)
    assert str(caught.value) == (
        f"database schema is at version none, this convergerd needs {required_version()}: "
        "run `convergerd migrate`"
    )
    store = await Store.connect(empty_database_url, check=False)
    await store.close()


async def test_check_schema_names_the_current_version(empty_database_url: str) -> None:
    await migrate(empty_database_url)
    conn = await asyncpg.connect(empty_database_url)
    try:
        await check_schema(conn)
        await conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum) VALUES ('9999', 'newer', '')"
        )
        await check_schema(conn)  # a newer version migrated further: still fine
        await conn.execute(
            "DELETE FROM schema_migrations WHERE version = $1", required_version()
        )
        with pytest.raises(SchemaNotMigrated, match="schema is at version 9999"):
            await check_schema(conn)
    finally:
        await conn.close()


async def test_0002_adds_the_verified_columns_to_a_database_at_0001(
    empty_database_url: str
) -> None:
    """An existing database (0001, with records) is migrated in place: its rows stay, the new
    columns are null until a round reads a Verified condition."""
    [first, *_] = load_migrations()
    conn = await asyncpg.connect(empty_database_url)
    try:
        async with conn.transaction():
            await conn.execute(first.sql)
            await conn.execute(
                "CREATE TABLE schema_migrations (version text PRIMARY KEY, name text NOT NULL,"
                " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            await conn.execute("INSERT INTO schema_migrations (version, name, checksum) "
                               "VALUES ($1, $2, $3)", first.version, first.name, first.checksum)
        await conn.execute("INSERT INTO deliveries (policy_id, cluster_id, phase) "
                           "VALUES ('p1', 'c1', 'Enforcing')")
        applied_now = await migrate(empty_database_url)
        assert "0002" in applied_now
        row = await conn.fetchrow("SELECT phase, verified_status, verified_probed_at "
                                  "FROM deliveries")
    finally:
        await conn.close()
    assert row is not None
    assert dict(row) == {"phase": "Enforcing", "verified_status": None,
                         "verified_probed_at": None}
