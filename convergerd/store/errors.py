"""Database errors classified where they enter: by exception class and SQLSTATE, never by
message text. Transient ones become `DatabaseUnavailable` (callers wait and retry); errors that
say "this statement will never succeed" (a data exception, a constraint, a missing privilege, a
trigger that raised, a value the client cannot encode) become `DatabaseRejected` with a reason
slug: the write is dropped and logged, the caller goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from convergerd.config import redact_dsn
from convergerd.core.errors import DatabaseRejected, DatabaseUnavailable
from convergerd.core.shown import describe

# SQLSTATE classes and codes that say "the database cannot serve you right now".
_TRANSIENT_CLASSES = (
    "08",  # connection exception
    "53",  # insufficient resources (too many connections, disk full, out of memory)
)
_TRANSIENT_CODES = frozenset({
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, recovery)
    "57P04",  # database_dropped
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
})
# Only meaningful while connecting: the server is up but will not let us in. Retrying is right
# (credentials rotate, the database gets created), and the message says which it is.
_CONNECT_CODES = frozenset({
    "28000",  # invalid_authorization_specification
    "28P01",  # invalid_password
    "3D000",  # invalid_catalog_name: the database does not exist
    "55000",  # object_not_in_prerequisite_state: database not accepting connections (maintenance)
})


# SQLSTATE classes of a permanent refusal, and their reason slugs (metrics label values).
REJECTION_REASONS: dict[str, str] = {
    "22": "data",  # data exception: NUL in text, numeric out of range, value too long
    "23": "constraint",  # integrity constraint violation
    "42": "access",  # insufficient privilege, undefined table or column (a schema out of step)
    "54": "limit",  # program limit exceeded (an index row too large)
    "P0": "raised",  # a trigger or function raised an exception
}
REJECTION_OTHER = "other"


def rejection_reason(exc: BaseException) -> str | None:
    """The reason slug if `exc` is a permanent refusal of this statement; None if it is not a
    database refusal (transient, or not from the database at all)."""
    if isinstance(exc, asyncpg.PostgresError):
        if is_transient(exc):
            return None
        code = str(getattr(exc, "sqlstate", "") or "")
        return REJECTION_REASONS.get(code[:2], REJECTION_OTHER)
    # The client could not encode a value (COPY raises these raw; query arguments raise
    # asyncpg's DataError, SQLSTATE 22000): a lone surrogate in text, an int beyond int64.
    if isinstance(exc, (UnicodeError, OverflowError)):
        return REJECTION_REASONS["22"]
    return None


def rejected(exc: BaseException, reason: str) -> DatabaseRejected:
    """The `DatabaseRejected` for `exc` (raise it `from exc`)."""
    return DatabaseRejected(describe(exc), reason=reason)


def is_transient(exc: BaseException, *, connecting: bool = False) -> bool:
    """Whether `exc` means the database is unreachable or failed transiently."""
    if isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError)):
        return True
    if isinstance(
        exc,
        (
            asyncpg.PostgresConnectionError,  # SQLSTATE 08, ConnectionDoesNotExistError included
            asyncpg.CannotConnectNowError,
            asyncpg.InsufficientResourcesError,
        ),
    ):
        return True
    if isinstance(exc, asyncpg.exceptions.InternalClientError):
        # The connection's protocol state broke, e.g. the server's FATAL (57P01) arrived while
        # the connection sat idle in the pool: that connection is gone, a new one will do.
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        # The client side of a lost connection: the pool or connection was closed under us.
        return isinstance(exc, asyncpg.exceptions.ConnectionDoesNotExistError) or connecting
    if isinstance(exc, asyncpg.PostgresError):
        code = str(getattr(exc, "sqlstate", "") or "")
        return (
            code[:2] in _TRANSIENT_CLASSES
            or code in _TRANSIENT_CODES
            or (connecting and code in _CONNECT_CODES)
        )
    return False


@contextmanager
def database_errors(dsn: str, *, connecting: bool = False) -> Iterator[None]:
    """Turn transient database errors raised inside into `DatabaseUnavailable` naming the
    redacted DSN; everything else passes through."""
    try:
        yield
    except DatabaseUnavailable:
        raise
    except Exception as exc:
        if not is_transient(exc, connecting=connecting):
            raise
        raise unavailable(dsn, exc, connecting=connecting) from exc


def unavailable(dsn: str, exc: BaseException, *, connecting: bool = False) -> DatabaseUnavailable:
    """The `DatabaseUnavailable` for a transient `exc` (raise it `from exc`)."""
    action = "cannot connect to" if connecting else "lost the database at"
    # The class, SQLSTATE and message: a server's message never holds the DSN's password.
    return DatabaseUnavailable(f"{action} {redact_dsn(dsn)}: {describe(exc)}")
