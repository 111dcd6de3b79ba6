"""The exceptions' rows (migration `0009`): granted, withdrawn, imported, lapsed, listed and
counted, each change in one transaction with a new revision of its policy and a row of
`exception_changes` (who, when, what). Reads of a policy carry its exceptions in force
(`exceptions_column`) in the shape of the Policy CR's `spec.exceptions`.

Checks of the values are `convergerd.core.exceptions`'; this module only stores them.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from convergerd.core.exceptions import MAX_EXCEPTIONS, ExceptionTally, as_spec
from convergerd.core.model import PolicyException
from convergerd.store.values import json_column

# Expired rows are kept this long at least (and while a cluster may still hold them).
EXPIRED_KEPT_DAYS = 30
# `GET /v1/exceptions` lists at most this many (soonest expiry first).
LISTED_MAX = 1000
LAPSE_ACTOR = "convergerd"


def _json(table: str) -> str:
    """One row as a `spec.exceptions` entry (expiresAt to the second, in UTC)."""
    t = table
    return f"""jsonb_strip_nulls(jsonb_build_object(
        'id', {t}.id, 'namespace', {t}.namespace, 'name', {t}.name, 'selector', {t}.selector,
        'reason', {t}.reason, 'requestedBy', {t}.requested_by, 'approvedBy', {t}.approved_by,
        'expiresAt', to_char({t}.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))"""


# As text, decoded here (`_spec`): the same on the daemon's pool (JSON codecs) and on
# `convergerd import`'s plain connection.
_ROW = _json("e") + "::text"
_WITHDRAW = f"""DELETE FROM policy_exceptions e WHERE e.policy_id = $1 AND e.id = $2
                RETURNING {_ROW} AS spec, e.lapsed_revision IS NULL AS carried"""  # noqa: S608
_CURRENT = f"""SELECT {_ROW} AS spec FROM policy_exceptions e
               WHERE e.policy_id = $1 AND e.id = $2"""  # noqa: S608
_LISTED = f"""SELECT e.policy_id, {_ROW} AS spec, e.granted_at, e.granted_revision,
                     e.lapsed_revision, e.expires_at <= now() AS expired
              FROM policy_exceptions e
              WHERE $1::text IS NULL OR e.policy_id = $1
              ORDER BY e.expires_at, e.policy_id, e.id LIMIT $2"""  # noqa: S608


def exceptions_column(policy: str) -> str:
    """The select-list item `exceptions`: the policy's exceptions in force now, by id."""
    return f"""(SELECT coalesce(jsonb_agg({_json("e")} ORDER BY e.id), '[]'::jsonb)
                FROM policy_exceptions e
                WHERE e.policy_id = {policy}.id AND e.expires_at > now()) AS exceptions"""  # noqa: S608


def _spec(text: str) -> dict[str, Any]:
    value = json_column(text)
    return dict(value) if isinstance(value, dict) else {}


class PolicyGone(Exception):
    """No such policy, or its deletion has begun (`deleting`)."""

    def __init__(self, deleting: bool) -> None:
        super().__init__("its deletion has begun" if deleting else "no such policy")
        self.deleting = deleting


class Refused(Exception):
    """The change conflicts with what is stored (an id taken, too many in force)."""


@dataclass(frozen=True, slots=True)
class StoredException:
    """A row as `GET /v1/exceptions` shows it."""

    policy: str
    spec: dict[str, Any]  # the `spec.exceptions` entry
    granted_at: dt.datetime
    granted_revision: int
    lapsed_revision: int | None
    expired: bool


async def _bump(conn: asyncpg.Connection, policy_id: str) -> int:
    """A new revision of the policy (the notification trigger fires with it)."""
    revision: int = await conn.fetchval(
        """UPDATE policies SET revision = revision + 1, updated_at = now()
           WHERE id = $1 RETURNING revision""", policy_id)
    return revision


async def _record(conn: asyncpg.Connection, action: str, *, policy_id: str,
                  exception_id: str, actor: str, revision: int | None,
                  detail: dict[str, Any]) -> None:
    await conn.execute(
        """INSERT INTO exception_changes (action, policy_id, exception_id, actor, revision,
                                          detail) VALUES ($1, $2, $3, $4, $5, $6::text::jsonb)""",
        action, policy_id, exception_id, actor, revision, json.dumps(detail))


async def _lock_policy(conn: asyncpg.Connection, policy_id: str) -> None:
    row = await conn.fetchrow(
        "SELECT deleted_at IS NOT NULL AS deleting FROM policies WHERE id = $1 FOR UPDATE",
        policy_id)
    if row is None or row["deleting"]:
        raise PolicyGone(deleting=row is not None)


async def _write(conn: asyncpg.Connection, policy_id: str, exception: PolicyException,
                 revision: int, *, update: bool) -> None:
    values = (policy_id, exception.id, exception.namespace, exception.name,
              json.dumps({"matchLabels": dict(exception.selector)})
              if exception.selector is not None else None,
              exception.reason, exception.requested_by, exception.approved_by,
              exception.expires_at, revision)
    if update:
        await conn.execute(
            """UPDATE policy_exceptions SET namespace = $3, name = $4, selector = $5::text::jsonb,
                   reason = $6, requested_by = $7, approved_by = $8, expires_at = $9,
                   granted_at = now(), granted_revision = $10, lapsed_revision = NULL
               WHERE policy_id = $1 AND id = $2""", *values)
        return
    await conn.execute(
        """INSERT INTO policy_exceptions (policy_id, id, namespace, name, selector, reason,
               requested_by, approved_by, expires_at, granted_revision)
           VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8, $9, $10)""", *values)


async def _check_room(conn: asyncpg.Connection, policy_id: str) -> None:
    count = await conn.fetchval(
        """SELECT count(*) FROM policy_exceptions WHERE policy_id = $1 AND expires_at > now()""",
        policy_id)
    if count >= MAX_EXCEPTIONS:
        raise Refused(f"policy {policy_id!r} has {count} exceptions in force, at most "
                      f"{MAX_EXCEPTIONS}: withdraw one first")


async def grant(conn: asyncpg.Connection, policy_id: str, exception: PolicyException) -> int:
    """Store a new exception (its checks done); the policy's new revision. `PolicyGone`,
    or `Refused` when the id is taken or the policy has `MAX_EXCEPTIONS` in force."""
    async with conn.transaction():
        await _lock_policy(conn, policy_id)
        taken = await conn.fetchval(
            "SELECT 1 FROM policy_exceptions WHERE policy_id = $1 AND id = $2",
            policy_id, exception.id)
        if taken:
            raise Refused(f"policy {policy_id!r} already has an exception {exception.id!r}: "
                          "withdraw it first, or choose another id")
        await _check_room(conn, policy_id)
        revision = await _bump(conn, policy_id)
        await _write(conn, policy_id, exception, revision, update=False)
        await _record(conn, "grant", policy_id=policy_id, exception_id=exception.id,
                      actor=exception.approved_by, revision=revision, detail=as_spec(exception))
    return revision


async def withdraw(conn: asyncpg.Connection, policy_id: str, exception_id: str,
                   actor: str) -> tuple[dict[str, Any], int] | None:
    """Delete an exception: what it was and the policy's revision after (a new one when it
    was in force or not lapsed yet); None when there is no such exception."""
    async with conn.transaction():
        await _lock_policy(conn, policy_id)
        row = await conn.fetchrow(_WITHDRAW, policy_id, exception_id)
        if row is None:
            return None
        if row["carried"]:
            revision = await _bump(conn, policy_id)
        else:
            revision = await conn.fetchval("SELECT revision FROM policies WHERE id = $1",
                                           policy_id)
        await _record(conn, "withdraw", policy_id=policy_id, exception_id=exception_id,
                      actor=actor, revision=revision, detail=_spec(row["spec"]))
    return _spec(row["spec"]), int(revision)


async def upsert(conn: asyncpg.Connection, policy_id: str,
                 exception: PolicyException) -> str:
    """An imported exception, in the caller's transaction: `created`, `updated` (a new
    revision each) or `unchanged`."""
    current = await conn.fetchrow(_CURRENT, policy_id, exception.id)
    wanted = as_spec(exception)
    if current is not None and _spec(current["spec"]) == wanted:
        return "unchanged"
    if current is None:
        await _check_room(conn, policy_id)
    revision = await _bump(conn, policy_id)
    await _write(conn, policy_id, exception, revision, update=current is not None)
    await _record(conn, "import", policy_id=policy_id, exception_id=exception.id,
                  actor=exception.approved_by, revision=revision, detail=wanted)
    return "created" if current is None else "updated"


async def listed(conn: asyncpg.Connection, policy_id: str | None) -> list[StoredException]:
    """Every exception (of one policy, or all), soonest expiry first, at most `LISTED_MAX`."""
    rows = await conn.fetch(_LISTED, policy_id, LISTED_MAX)
    return [StoredException(r["policy_id"], _spec(r["spec"]), r["granted_at"],
                            r["granted_revision"], r["lapsed_revision"], r["expired"])
            for r in rows]


# Expired, not lapsed yet: each policy gets one new revision (without them), recorded.
_LAPSE = f"""
WITH due AS (
    SELECT policy_id, id FROM policy_exceptions
    WHERE lapsed_revision IS NULL AND expires_at <= now()
    FOR UPDATE SKIP LOCKED
), bumped AS (
    UPDATE policies p SET revision = p.revision + 1, updated_at = now()
    WHERE p.id IN (SELECT policy_id FROM due)
    RETURNING p.id, p.revision
)
UPDATE policy_exceptions e SET lapsed_revision = b.revision
FROM due JOIN bumped b ON b.id = due.policy_id
WHERE e.policy_id = due.policy_id AND e.id = due.id
RETURNING e.policy_id, e.id, e.lapsed_revision, {_ROW} AS spec
"""  # noqa: S608 (no value is formatted in)

# Expired rows no cluster is recorded with a revision carrying, past the days kept.
_FORGET = """
DELETE FROM policy_exceptions e
WHERE e.lapsed_revision IS NOT NULL AND e.expires_at < now() - make_interval(days => $1)
  AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.policy_id = e.policy_id
                  AND d.delivered_revision >= e.granted_revision
                  AND d.delivered_revision < e.lapsed_revision)
"""


async def lapse(conn: asyncpg.Connection) -> tuple[list[tuple[str, str, int]], dt.datetime | None]:
    """Mark every expired exception lapsed at a new revision of its policy (one per policy),
    each recorded; forget old ones no cluster holds. The lapsed (policy, id, revision) and
    the next expiry still to lapse."""
    async with conn.transaction():
        rows = await conn.fetch(_LAPSE)
        for r in rows:
            await _record(conn, "lapse", policy_id=r["policy_id"], exception_id=r["id"],
                          actor=LAPSE_ACTOR, revision=r["lapsed_revision"],
                          detail=_spec(r["spec"]))
        await conn.execute(_FORGET, EXPIRED_KEPT_DAYS)
        upcoming = await conn.fetchval(
            "SELECT min(expires_at) FROM policy_exceptions WHERE lapsed_revision IS NULL")
    return [(r["policy_id"], r["id"], r["lapsed_revision"]) for r in rows], upcoming


_TALLY = """
SELECT e.policy_id,
       count(*) FILTER (WHERE e.expires_at > now()) AS in_force,
       count(*) FILTER (WHERE e.expires_at > now()
                        AND e.expires_at <= now() + make_interval(secs => $1)) AS soon,
       count(*) FILTER (WHERE e.expires_at <= now() AND (
           e.lapsed_revision IS NULL OR EXISTS (
               SELECT 1 FROM deliveries d WHERE d.policy_id = e.policy_id
               AND d.delivered_revision >= e.granted_revision
               AND d.delivered_revision < e.lapsed_revision))) AS expired_delivered
FROM policy_exceptions e JOIN policies p ON p.id = e.policy_id AND p.deleted_at IS NULL
GROUP BY e.policy_id ORDER BY e.policy_id
"""


async def tally(conn: asyncpg.Connection, soon_s: float) -> list[ExceptionTally]:
    rows = await conn.fetch(_TALLY, soon_s)
    return [ExceptionTally(r["policy_id"], r["in_force"], r["soon"], r["expired_delivered"])
            for r in rows]

