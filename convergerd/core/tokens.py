"""Read tokens scoped to one boundary (pure): how a token looks, what is kept of it (its
SHA-256, never the token), its name, its expiry, and a record of one.

A token is `cvg_b_` followed by 32 random bytes in URL-safe base64 (43 characters): 256 bits,
so a fast unkeyed hash is enough to keep (nobody can search 2^256 candidates for a hash read
out of the database), and the prefix lets a secret scanner, a log filter or a person tell it
from the admin token.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from dataclasses import dataclass

from convergerd.core.model import RuleError, check_boundary_id
from convergerd.core.shown import shown

TOKEN_PREFIX = "cvg_b_"  # noqa: S105 - a prefix, not a secret
TOKEN_BYTES = 32
# What a token given to us may be at most (one of ours is 49 characters); longer is no token.
TOKEN_MAX_CHARS = 100
NAME_MAX_CHARS = 63
# Who created or revoked a token, as the admin's client said it (`created_by`).
BY_MAX_CHARS = 200
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_BY = re.compile(r"[\x20-\x7e]+")


def new_token() -> str:
    """A new read token (shown once, to its creator)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_digest(token: str) -> bytes | None:
    """What is kept of `token` and looked up by: its SHA-256; None for what cannot be one of
    ours (no prefix, too long, not ASCII), so such a string costs no hash and no lookup."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > TOKEN_MAX_CHARS \
            or not token.isascii():
        return None
    return hashlib.sha256(token.encode()).digest()


def check_token_name(name: object) -> str:
    """A token's name: a DNS label of at most 63 characters (it is a path segment of
    `DELETE /v1/tokens/{name}`); else `RuleError` naming the value."""
    if not isinstance(name, str) or len(name) > NAME_MAX_CHARS or not _NAME.fullmatch(name):
        raise RuleError(f"name: {shown(name)} is not a DNS label of at most {NAME_MAX_CHARS} "
                        "characters (lowercase letters, digits and '-')")
    return name


def check_by(by: object) -> str:
    """Who asked, as the client said it: printable ASCII, at most `BY_MAX_CHARS`."""
    if not isinstance(by, str) or len(by) > BY_MAX_CHARS or not _BY.fullmatch(by):
        raise RuleError(f"by: {shown(by)} is not printable ASCII of at most {BY_MAX_CHARS} "
                        "characters")
    return by


def check_boundary(boundary: object) -> str:
    if not isinstance(boundary, str):
        raise RuleError(f"boundary: expected a string, got {shown(boundary)}")
    check_boundary_id(boundary)
    return boundary


def parse_time(text: object, *, now: dt.datetime) -> dt.datetime:
    """An expiry in ISO 8601, as `convergerd token create --expires` takes it: a date
    (`2027-01-31`: the token stops working when that day begins, UTC) or a time with its
    offset (`2027-01-31T12:00:00Z`). It must be after `now`. Else `RuleError`."""
    if not isinstance(text, str) or len(text) > 40:
        raise RuleError(f"expires: {shown(text)} is not an ISO 8601 date or time")
    try:
        if len(text) == 10:
            moment = dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.UTC)
        else:
            moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise RuleError(f"expires: {shown(text)} is not an ISO 8601 date (2027-01-31) or time "
                        "with an offset (2027-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        raise RuleError(f"expires: {shown(text)} has no offset (add Z for UTC)")
    if moment <= now:
        raise RuleError(f"expires: {shown(text)} is not in the future")
    return moment.astimezone(dt.UTC)


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """One read token as the database keeps it (never the token itself)."""

    name: str
    boundary: str
    created_by: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_by: str | None = None
    revoked_at: dt.datetime | None = None

    def expired(self, now: dt.datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def live(self, now: dt.datetime) -> bool:
        """Whether it opens its boundary at `now`: neither revoked nor expired."""
        return self.revoked_at is None and not self.expired(now)
