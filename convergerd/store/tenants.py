"""The read tokens' rows (migration `0010`): create, list, revoke, and the live ones every
replica keeps in memory (`convergerd.api.auth.TokenBook`). Only a token's SHA-256 is stored.
Each call runs on the connection it is given; `Store` opens it.

Who created or revoked a token is what the admin's client said (`by`): the admin token is
one shared secret, so the database records the claim next to the time the database gave.
"""

from __future__ import annotations

import enum

import asyncpg

from convergerd.core.decode import clean_text
from convergerd.core.tokens import BY_MAX_CHARS, TokenRecord

# Tokens not revoked, at most: what every replica keeps in memory (~300 bytes each).
MAX_LIVE_TOKENS = 10_000
# `token list` shows at most this many rows (revoked ones included with `all`).
MAX_LISTED = 2 * MAX_LIVE_TOKENS
_COLUMNS = "name, boundary_id, created_by, created_at, expires_at, revoked_by, revoked_at"


class Refused(enum.Enum):
    """Why a token was not created."""

    UNKNOWN_BOUNDARY = "unknown_boundary"
    NAME_TAKEN = "name_taken"
    TOO_MANY = "too_many"


def _record(r: asyncpg.Record) -> TokenRecord:
    # Rows are ours, but anyone with a login can write them: texts are bounded when read.
    return TokenRecord(
        name=clean_text(r["name"], 63), boundary=clean_text(r["boundary_id"], 63),
        created_by=clean_text(r["created_by"], BY_MAX_CHARS), created_at=r["created_at"],
        expires_at=r["expires_at"],
        revoked_by=clean_text(r["revoked_by"], BY_MAX_CHARS) if r["revoked_by"] else None,
        revoked_at=r["revoked_at"])


async def create(conn: asyncpg.Connection, *, name: str, boundary: str, digest: bytes,
                 by: str, expires_at: object) -> TokenRecord | Refused:
    """Insert a token of `boundary` (which must exist) named `name` (not taken by a token
    not revoked); the record, or why not."""
    async with conn.transaction():
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM boundaries WHERE id = $1)",
                                   boundary):
            return Refused.UNKNOWN_BOUNDARY
        live = await conn.fetchval("SELECT count(*) FROM read_tokens WHERE revoked_at IS NULL")
        if live >= MAX_LIVE_TOKENS:
            return Refused.TOO_MANY
        row = await conn.fetchrow(
            f"""INSERT INTO read_tokens (name, boundary_id, token_hash, created_by, expires_at)
                VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
                RETURNING {_COLUMNS}""",  # noqa: S608 - constant columns
            name, boundary, digest, by, expires_at)
    return _record(row) if row is not None else Refused.NAME_TAKEN


async def listed(conn: asyncpg.Connection, *, revoked: bool) -> list[TokenRecord]:
    """The tokens by name (with `revoked`, the revoked ones too, newest first after the
    live one of a name), at most `MAX_LISTED`."""
    where = "" if revoked else "WHERE revoked_at IS NULL"
    rows = await conn.fetch(
        f"""SELECT {_COLUMNS} FROM read_tokens {where}
            ORDER BY name, revoked_at DESC NULLS FIRST, id DESC LIMIT $1""",  # noqa: S608
        MAX_LISTED)
    return [_record(r) for r in rows]


async def revoke(conn: asyncpg.Connection, *, name: str, by: str) -> TokenRecord | None:
    """Revoke the token named `name` (the one not revoked); None when there is none."""
    row = await conn.fetchrow(
        f"""UPDATE read_tokens SET revoked_at = now(), revoked_by = $2
            WHERE name = $1 AND revoked_at IS NULL RETURNING {_COLUMNS}""",  # noqa: S608
        name, by)
    return _record(row) if row is not None else None


async def live(conn: asyncpg.Connection) -> list[tuple[bytes, TokenRecord]]:
    """The tokens that open their boundary now, by digest (at most `MAX_LIVE_TOKENS`)."""
    rows = await conn.fetch(
        f"""SELECT token_hash, {_COLUMNS} FROM read_tokens
            WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
            ORDER BY id LIMIT $1""",  # noqa: S608
        MAX_LIVE_TOKENS)
    return [(bytes(r["token_hash"]), _record(r)) for r in rows]
