"""The private PostgreSQL the demo and the tests start when no database is configured."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from convergerd.demo.pgserver import PostgresServerError, find_bindir, private_postgres
from convergerd.store.schema import load_migrations, migrate
from convergerd.store.store import Store


def have_binaries() -> bool:
    try:
        find_bindir()
    except PostgresServerError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not have_binaries(), reason="no PostgreSQL server binaries on this machine"
)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not tmp_path: as root the server runs as `postgres`, which cannot enter pytest's
    # private (0700) base directory.
    with tempfile.TemporaryDirectory(prefix="convergerd-pgserver-test-") as path:
        yield Path(path)


async def test_start_migrate_use_stop_and_restart_with_the_data(data_dir: Path) -> None:
    async with private_postgres(data_dir) as dsn:
        assert dsn.startswith("postgresql://postgres@127.0.0.1:")
        # Every migration the package ships, in order, on a fresh database.
        assert await migrate(dsn) == [m.version for m in load_migrations()]
        store = await Store.connect(dsn)
        try:
            await store.ping()
        finally:
            await store.close()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("INSERT INTO clusters (id) VALUES ('kept')")
        finally:
            await conn.close()
    with pytest.raises(ConnectionRefusedError):  # stopped: nothing listens there any more
        await asyncpg.connect(dsn, timeout=5)
    # A restart reuses the directory: the data is still there (on another port).
    async with private_postgres(data_dir) as dsn2:
        assert await migrate(dsn2) == []
        conn = await asyncpg.connect(dsn2)
        try:
            assert await conn.fetchval("SELECT id FROM clusters") == "kept"
        finally:
            await conn.close()


async def test_two_servers_side_by_side(data_dir: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="convergerd-pgserver-test-") as other:
        await both_answer(data_dir, Path(other))


async def both_answer(one: Path, other: Path) -> None:
    async with private_postgres(one) as first, private_postgres(other) as second:
        assert first != second
        for dsn in (first, second):
            conn = await asyncpg.connect(dsn)
            try:
                assert await conn.fetchval("SELECT 1") == 1
            finally:
                await conn.close()
