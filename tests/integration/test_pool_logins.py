"""While the database refuses logins, asyncpg's pool retries restoring its connections and logs
each failure with a traceback (21 lines): the daemon's logging makes it one line, the error
named, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import urllib.parse
from collections.abc import Iterator

import pytest

from convergerd.cli.main import ONE_LINE_LOGGERS, configure_logging, one_line_errors
from convergerd.store.store import Store
from tests.integration.rounds_helpers import sql


@contextlib.contextmanager
def one_line_library_logs() -> Iterator[None]:
    """`configure_logging`'s filters on the libraries' loggers, the test's handlers kept."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    others = {name: logging.getLogger(name).level
              for name in ("aiohttp.access", "kubernetes_asyncio")}
    configure_logging("INFO")
    root.handlers[:] = handlers  # pytest's capture, not a new stderr handler
    root.setLevel(level)
    try:
        yield
    finally:
        for name in ONE_LINE_LOGGERS:
            logging.getLogger(name).removeFilter(one_line_errors)
        for name, was in others.items():
            logging.getLogger(name).setLevel(was)


async def test_a_pool_whose_logins_are_refused_logs_one_line_per_attempt(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="asyncpg.pool")
    role = f"convergerd_refused_{secrets.token_hex(4)}"
    await sql(database_url, f"CREATE ROLE {role} LOGIN")
    parsed = urllib.parse.urlsplit(database_url)
    as_role = parsed._replace(netloc=f"{role}@{parsed.hostname}:{parsed.port}").geturl()
    try:
        with one_line_library_logs():
            store = await Store.connect(as_role, check=False, min_size=1, max_size=1)
            try:
                await sql(database_url, f"ALTER ROLE {role} NOLOGIN")
                await sql(database_url, "SELECT pg_terminate_backend(pid) FROM "
                          "pg_stat_activity WHERE usename = $1", role)
                async with asyncio.timeout(30):
                    while not [r for r in caplog.records if r.name == "asyncpg.pool"]:
                        await asyncio.sleep(0.05)
            finally:
                await store.close()
    finally:
        await sql(database_url, f"DROP ROLE IF EXISTS {role}")
    [first, *_] = [r for r in caplog.records if r.name == "asyncpg.pool"]
    assert first.exc_info is None
    message = first.getMessage()
    assert "\n" not in message
    assert "Failed to restore the pool connection floor" in message
    assert "SQLSTATE" in message, message
    assert len(message) < 500
