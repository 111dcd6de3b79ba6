"""LISTEN on a PostgreSQL channel, on a connection of its own (never one from the pool: a
listening connection is held for as long as the daemon runs, and a pooled one would be handed
to a query meanwhile). `convergerd.delivery.listener` decides what a notification does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import asyncpg

from convergerd.config import redact_dsn
from convergerd.core.errors import DatabaseUnavailable
from convergerd.store.errors import database_errors

_CLOSE_TIMEOUT_S = 2.0


class PgSubscription:
    """One listening connection. `on_lost` is called once the connection is gone (the server
    closed it, the backend was terminated); `ping` finds a connection that died silently."""

    def __init__(self, conn: asyncpg.Connection, dsn: str) -> None:
        self._conn = conn
        self._dsn = dsn

    def is_closed(self) -> bool:
        return bool(self._conn.is_closed())

    async def ping(self, timeout_s: float) -> None:
        """Raises `DatabaseUnavailable` when the connection does not answer in time."""
        with database_errors(self._dsn):
            try:
                await self._conn.fetchval("SELECT 1", timeout=timeout_s)
            except asyncpg.InterfaceError as exc:
                # A closed connection says so by its state, not only by its error's class.
                if not self._conn.is_closed():
                    raise
                raise DatabaseUnavailable(
                    f"lost the database at {redact_dsn(self._dsn)}: connection closed"
                ) from exc

    async def close(self) -> None:
        if self._conn.is_closed():
            return
        try:
            await asyncio.wait_for(self._conn.close(), _CLOSE_TIMEOUT_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._conn.terminate()


class PgNotifications:
    """Opens `PgSubscription`s on the database at `dsn`
    (`convergerd.delivery.listener.NotifySource`)."""

    def __init__(self, dsn: str, *, connect_timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s

    async def subscribe(
        self, channel: str, on_payload: Callable[[str, int], None],
        on_lost: Callable[[], None],
    ) -> PgSubscription:
        """Connect and LISTEN; each notification's payload and its sender's backend process
        id to `on_payload`. Raises `DatabaseUnavailable` when the database cannot be
        reached (the DSN shown redacted)."""
        try:
            with database_errors(self._dsn, connecting=True):
                conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout_s)
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            # asyncpg's DSN parse errors may quote the DSN: never show it.
            raise DatabaseUnavailable(
                f"bad database URL {redact_dsn(self._dsn)}: {type(exc).__name__}") from None
        subscription = PgSubscription(conn, self._dsn)

        def deliver(_conn: Any, pid: int, _channel: str, payload: object) -> None:
            on_payload(str(payload), pid)

        conn.add_termination_listener(lambda _conn: on_lost())
        try:
            with database_errors(self._dsn, connecting=True):
                await conn.add_listener(channel, deliver)
        except BaseException:
            with contextlib.suppress(Exception):
                await subscription.close()
            raise
        return subscription
