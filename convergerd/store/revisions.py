"""The policies' kept revisions (migration `0011`): a page of one policy's history, a rollback
(a new revision with an old one's content, written in one transaction with who asked), and the
retention's pruning. Each call runs on the connection it is given; `Store` opens it.

The revisions themselves are written by the database's triggers, whoever writes `policies`;
convergerd's own writers say who they are with `actor` (`SET LOCAL convergerd.actor`), which the
trigger records as `saved_by`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import asyncpg

from convergerd.config import RevisionRetention
from convergerd.core.decode import clean_text
from convergerd.core.errors import ConvergerdError
from convergerd.core.revisions import (
    CONTENT_MAX_BYTES,
    History,
    Operation,
    Refused,
    Revision,
    Rollback,
    refusal,
)

log = logging.getLogger(__name__)

# `saved_by` as the trigger bounds it.
SAVED_BY_MAX_CHARS = 200
# Rows one pruning statement deletes at most (each statement a short transaction), and
# statements a pass runs at most: a pass deletes at most 100,000 revisions, then the next one
# goes on after `PRUNE_AGAIN_S`.
PRUNE_BATCH = 5_000
PRUNE_BATCHES = 20
# Between passes; the first pass runs this long after start.
PRUNE_PERIOD_S = 3600.0
PRUNE_AGAIN_S = 60.0

_COLUMNS = f"""policy_id, revision, operation, saved_by, saved_at,
    CASE WHEN octet_length(content::text) <= {CONTENT_MAX_BYTES} THEN content END AS content,
    content IS NOT NULL AS has_content"""


async def set_actor(conn: asyncpg.Connection, actor: str) -> None:
    """Who the current transaction's writes to `policies` are recorded as (`saved_by`)."""
    await conn.execute("SELECT set_config('convergerd.actor', $1, true)",
                       clean_text(actor, SAVED_BY_MAX_CHARS))


def _revision(r: asyncpg.Record) -> Revision:
    # Rows are written by triggers, but anyone with a login can write them: bounded when read.
    content = r["content"]
    readable = not r["has_content"] or isinstance(content, dict)
    try:
        operation = Operation(r["operation"])
    except ValueError:
        operation, readable = Operation.UPDATE, False
    return Revision(
        policy=clean_text(r["policy_id"], 63), revision=r["revision"], operation=operation,
        content=content if isinstance(content, dict) else None,
        saved_by=clean_text(r["saved_by"], SAVED_BY_MAX_CHARS), saved_at=r["saved_at"],
        readable=readable)


async def history(conn: asyncpg.Connection, policy_id: str, *, before: int | None,
                  limit: int) -> History | None:
    """Up to `limit` of the policy's kept revisions, newest first, older than `before` (None:
    from the newest), with its boundary; None when it has neither a row nor a revision."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        boundary = await conn.fetchrow(
            """SELECT (SELECT boundary_id FROM policies WHERE id = $1) AS now,
                      (SELECT content ->> 'boundary_id' FROM policy_revisions
                       WHERE policy_id = $1 AND content IS NOT NULL
                       ORDER BY revision DESC LIMIT 1) AS last,
                      EXISTS (SELECT 1 FROM policies WHERE id = $1)
                          OR EXISTS (SELECT 1 FROM policy_revisions WHERE policy_id = $1)
                          AS known""", policy_id)
        if boundary is None or not boundary["known"]:
            return None
        rows = await conn.fetch(
            f"""SELECT {_COLUMNS} FROM policy_revisions
                WHERE policy_id = $1 AND ($2::bigint IS NULL OR revision < $2)
                ORDER BY revision DESC LIMIT $3""",  # noqa: S608 - constant columns
            policy_id, before, limit)
    named = boundary["now"] if boundary["now"] is not None else boundary["last"]
    return History(policy_id, clean_text(named, 63) if named is not None else None,
                   tuple(_revision(r) for r in rows))


# The check a rollback's new content must pass before it is committed: the reason it is not a
# valid policy now, or None (`Store` validates the row as a save would).
Check = Callable[[asyncpg.Connection], Awaitable[str | None]]


class _Invalid(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def rollback(conn: asyncpg.Connection, policy_id: str, to: int, *, actor: str,
                   check: Check) -> Rollback:
    """Write the content of revision `to` as the policy's new revision, recorded as saved by
    `actor`; a deleted policy is created again. Nothing is written when it is refused, or when
    the policy already has that content (`changed` false)."""
    try:
        async with conn.transaction():
            return await _rollback(conn, policy_id, to, actor=actor, check=check)
    except _Invalid as exc:  # rolled back
        return Rollback(policy_id, to, refused=Refused.INVALID, reason=exc.reason)


async def _rollback(conn: asyncpg.Connection, policy_id: str, to: int, *, actor: str,
                    check: Check) -> Rollback:
    await set_actor(conn, actor)
    current = await conn.fetchrow(
        """SELECT revision, deleted_at IS NOT NULL AS deleting,
                  convergerd_policy_content(p) AS content
           FROM policies p WHERE id = $1 FOR UPDATE""", policy_id)
    target = await conn.fetchrow(
        f"""SELECT {_COLUMNS} FROM policy_revisions
            WHERE policy_id = $1 AND revision = $2""", policy_id, to)  # noqa: S608
    if target is None:
        return await _unknown(conn, policy_id, to, row=current is not None)
    wanted = _revision(target)
    refused = refusal(wanted, deleting=current is not None and current["deleting"])
    if refused is not None:
        return Rollback(policy_id, to, refused=refused)
    if current is not None and current["content"] == wanted.content:
        return Rollback(policy_id, to, revision=current["revision"])
    made = await conn.fetchval("SELECT convergerd_restore_policy($1, $2::jsonb)",
                               policy_id, wanted.content)
    reason = await check(conn)
    if reason is not None:
        raise _Invalid(reason)
    return Rollback(policy_id, to, revision=made, changed=True)


async def _unknown(conn: asyncpg.Connection, policy_id: str, to: int, *, row: bool) -> Rollback:
    kept = await conn.fetchrow(
        """SELECT min(revision) AS oldest, max(revision) AS newest FROM policy_revisions
           WHERE policy_id = $1""", policy_id)
    if kept is None or kept["newest"] is None:
        return Rollback(policy_id, to, refused=(
            Refused.UNKNOWN_REVISION if row else Refused.UNKNOWN_POLICY))
    return Rollback(policy_id, to, refused=Refused.UNKNOWN_REVISION,
                    kept=(kept["oldest"], kept["newest"]))


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one pruning pass deleted: revisions and the policies they were of; `more`: it
    stopped at its bound with more to prune (the next pass goes on)."""

    revisions: int = 0
    policies: int = 0
    more: bool = False


# The revisions a rollout in force refers to (its new one, the one before, and each cluster's
# previous): rounds deliver them, so neither pruning deletes them, whatever their age or rank.
_IN_USE = """
    NOT EXISTS (SELECT 1 FROM rollouts o WHERE o.policy_id = {t}.policy_id
                AND o.state NOT IN ('completed', 'superseded')
                AND ({t}.revision IN (o.to_revision, o.from_revision)
                     OR EXISTS (SELECT 1 FROM rollout_clusters oc WHERE oc.rollout_id = o.id
                                AND oc.previous_revision = {t}.revision)))"""
_PRUNE_BY_COUNT = """
WITH doomed AS (
    SELECT policy_id, revision FROM (
        SELECT policy_id, revision,
               row_number() OVER (PARTITION BY policy_id ORDER BY revision DESC) AS newer
        FROM policy_revisions) AS ranked
    WHERE newer > $1 AND""" + _IN_USE.format(t="ranked") + """ LIMIT $2)
DELETE FROM policy_revisions r USING doomed d
WHERE r.policy_id = d.policy_id AND r.revision = d.revision
RETURNING r.policy_id
"""  # noqa: S608 (no value is formatted in: a constant clause)
# Older than the age, except a policy's newest revision while its row exists (what it holds
# now stays kept: the next revision is compared with it).
_PRUNE_BY_AGE = """
WITH doomed AS (
    SELECT r.policy_id, r.revision FROM policy_revisions r
    WHERE r.saved_at < now() - $1 * interval '1 day'
      AND NOT (EXISTS (SELECT 1 FROM policies p WHERE p.id = r.policy_id)
               AND r.revision = (SELECT max(m.revision) FROM policy_revisions m
                                 WHERE m.policy_id = r.policy_id))
      AND""" + _IN_USE.format(t="r") + """
    LIMIT $2)
DELETE FROM policy_revisions r USING doomed d
WHERE r.policy_id = d.policy_id AND r.revision = d.revision
RETURNING r.policy_id
"""  # noqa: S608 (no value is formatted in: a constant clause)


async def prune(conn: asyncpg.Connection, *, keep_last: int, max_age_days: float,
                batches: int, batch: int = PRUNE_BATCH) -> Pruned:
    """Delete the revisions beyond the last `keep_last` of each policy, then (`max_age_days`
    > 0) those older than that many days but a live policy's newest; at most `batches`
    statements of `batch` rows, each its own transaction."""
    policies: set[str] = set()
    deleted = 0
    left = batches
    for statement, bound in ((_PRUNE_BY_COUNT, keep_last), (_PRUNE_BY_AGE, max_age_days)):
        if statement is _PRUNE_BY_AGE and max_age_days <= 0:
            break
        while left > 0:
            left -= 1
            rows = await conn.fetch(statement, bound, batch)
            deleted += len(rows)
            policies.update(r["policy_id"] for r in rows)
            if len(rows) < batch:
                break
        else:
            return Pruned(deleted, len(policies), more=True)
    return Pruned(deleted, len(policies))


class PruneSource(Protocol):
    """Where the revisions are (`convergerd.store.store.Store`)."""

    async def prune_revisions(self, *, keep_last: int, max_age_days: float,
                              batches: int) -> Pruned: ...


class PruneObserver(Protocol):
    def revisions_pruned(self, revisions: int) -> None: ...


class Pruner:
    """The retention's job: every `PRUNE_PERIOD_S` (sooner while a pass leaves more), on the
    replica `leading()` (the leader: one pass for the fleet), the revisions beyond `retention`
    are deleted; each pass that deleted some is logged, with how many and of how many
    policies, and counted by `observer`. Never silently: a revision goes only by this job."""

    def __init__(self, source: PruneSource, retention: RevisionRetention, *,
                 leading: Callable[[], bool], observer: PruneObserver | None = None,
                 period_s: float = PRUNE_PERIOD_S) -> None:
        self._source = source
        self._retention = retention
        self._leading = leading
        self._observer = observer
        self._period_s = period_s

    async def run(self) -> None:
        wait_s = self._period_s
        while True:
            await asyncio.sleep(wait_s)
            pruned = await self.once() if self._leading() else Pruned()
            wait_s = PRUNE_AGAIN_S if pruned.more else self._period_s

    async def once(self) -> Pruned:
        """One pass; a database that fails it is logged, and the next pass tries again."""
        r = self._retention
        try:
            pruned = await self._source.prune_revisions(
                keep_last=r.keep_last, max_age_days=r.max_age_days, batches=PRUNE_BATCHES)
        except ConvergerdError as exc:
            log.warning("revision retention: pruning failed, tried again in %g s: %s",
                        self._period_s, exc)
            return Pruned()
        if pruned.revisions:
            if self._observer is not None:
                self._observer.revisions_pruned(pruned.revisions)
            age = f", at most {r.max_age_days:g} days old" if r.max_age_days > 0 else ""
            log.info("revision retention: deleted %d revision(s) of %d policies (kept: the "
                     "last %d of each policy%s)%s", pruned.revisions, pruned.policies,
                     r.keep_last, age, "; more next pass" if pruned.more else "",
                     extra={"revisions_pruned": pruned.revisions})
        return pruned
