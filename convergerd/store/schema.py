"""Versioned schema migrations: `convergerd/store/migrations/NNNN_name.sql`, applied in order.

`migrate` applies the pending ones in one transaction under a PostgreSQL advisory lock, so two
replicas (or two `convergerd migrate` jobs) starting at once are safe: the second waits, then
finds nothing to do. Applied versions are recorded in `schema_migrations`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources

import asyncpg

from convergerd.core.errors import SchemaNotMigrated
from convergerd.store.errors import database_errors

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key: "convergerd migrate" (any constant; the same in every version).
MIGRATION_LOCK_KEY = 0x636F6E76_6D696772 & 0x7FFFFFFFFFFFFFFF

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    text        PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: str  # "0001"
    name: str  # "initial"
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """The migrations shipped with this version, in order."""
    folder = resources.files("convergerd.store").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        stem = entry.name.removesuffix(".sql")
        version, _, name = stem.partition("_")
        if not version.isdigit():
            raise RuntimeError(f"migration file {entry.name!r} does not start with a version")
        found.append(Migration(version, name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: int(m.version))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions in {versions}")
    return found


def required_version() -> str:
    return load_migrations()[-1].version


async def applied_versions(conn: asyncpg.Connection) -> dict[str, str]:
    """Version -> checksum of what is applied; empty if the schema was never migrated."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch("SELECT version, checksum FROM schema_migrations")
    return {r["version"]: r["checksum"] for r in rows}


async def migrate_connection(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations on an open connection; the versions applied, in order."""
    migrations = load_migrations()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await conn.execute(_CREATE_TABLE)
        applied = await applied_versions(conn)
        done: list[str] = []
        for migration in migrations:
            if migration.version in applied:
                if applied[migration.version] != migration.checksum:
                    log.warning(
                        "migration %s_%s differs from the one applied to this database",
                        migration.version,
                        migration.name,
                    )
                continue
            log.info("applying migration %s_%s", migration.version, migration.name)
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
            done.append(migration.version)
    return done


async def migrate(dsn: str) -> list[str]:
    """Create or upgrade the schema at `dsn` (`convergerd migrate`). Idempotent: returns the
    versions applied, empty when already up to date."""
    with database_errors(dsn, connecting=True):
        conn = await asyncpg.connect(dsn, timeout=10)
    try:
        with database_errors(dsn):
            return await migrate_connection(conn)
    finally:
        await conn.close()


async def check_schema(conn: asyncpg.Connection) -> None:
    """Raise `SchemaNotMigrated` unless every migration this version ships is applied.

    A database migrated further by a newer version is accepted (rolling upgrades: migrations
    only add), as long as nothing this version needs is missing.
    """
    needed = load_migrations()
    applied = await applied_versions(conn)
    missing = [m.version for m in needed if m.version not in applied]
    if not missing:
        return
    current = max(applied, key=int) if applied else "none"
    raise SchemaNotMigrated(
        f"database schema is at version {current}, this convergerd needs "
        f"{needed[-1].version}: run `convergerd migrate`"
    )
