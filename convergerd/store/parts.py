"""The rows of a save spread over the shard holders (migration `0007`, `delivery.spread`):
requests, parts and items, on one connection each call, inside the caller's transaction.

What another replica wrote is read bounded: at most the rows asked for, texts cut in the query
(`left`), then decoded by `core.spread` (`result_of`, `work_item`).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from convergerd.core.decode import MAX_MESSAGE_CHARS, MAX_REASON_CHARS, clean_text
from convergerd.core.report import ClusterResult
from convergerd.core.save import Work
from convergerd.core.spread import CHANNEL, DONE, PART, Claimed, Part, payload, result_of

# A request its requester did not delete (it died) is deleted this long after it expired.
STALE_AFTER = "1 hour"
# Read back from a row another replica may have written: longer values are cut.
_MAX_ID_CHARS = 64
_MAX_TEXT_CHARS = 4 * MAX_MESSAGE_CHARS


async def post(
    conn: asyncpg.Connection, *, policy_id: str, revision: int, requested_by: str,
    parts: Sequence[Part], wait_s: float,
) -> int:
    """Write a request, its parts and items, and notify the holders (on commit); its id."""
    await conn.execute(
        f"DELETE FROM save_requests WHERE expires_at < now() - interval '{STALE_AFTER}'")  # noqa: S608
    request_id: int = await conn.fetchval(
        """INSERT INTO save_requests (policy_id, revision, requested_by, expires_at)
           VALUES ($1, $2, $3, now() + make_interval(secs => $4)) RETURNING id""",
        policy_id, revision, requested_by, wait_s)
    await conn.execute(
        """INSERT INTO save_parts (request_id, shard, holder)
           SELECT $1, * FROM unnest($2::int[], $3::text[])""",
        request_id, [p.shard for p in parts], [p.holder for p in parts])
    items: list[tuple[int, Work]] = [(p.shard, w) for p in parts for w in p.work]
    await conn.execute(
        """INSERT INTO save_items (request_id, shard, cluster_id, action, read_first)
           SELECT $1, * FROM unnest($2::int[], $3::text[], $4::text[], $5::bool[])""",
        request_id, [k for k, _ in items], [w.cluster for _, w in items],
        [w.action for _, w in items], [w.read for _, w in items])
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload(PART, request_id))
    return request_id


async def done_parts(conn: asyncpg.Connection, request_id: int, parts: int) -> frozenset[int]:
    """The shards whose part is done (at most `parts` rows read)."""
    rows = await conn.fetch(
        """SELECT shard FROM save_parts WHERE request_id = $1 AND done_at IS NOT NULL
           LIMIT $2""", request_id, parts)
    return frozenset(r["shard"] for r in rows)


async def results(
    conn: asyncpg.Connection, request_id: int, limit: int
) -> list[ClusterResult]:
    """The results the holders wrote (at most `limit` rows read), decoded; an undecodable row
    is dropped (its cluster is left over)."""
    rows = await conn.fetch(
        f"""SELECT left(cluster_id, {_MAX_ID_CHARS}) AS cluster_id,
                   left(action, {_MAX_ID_CHARS}) AS action,
                   left(result, {_MAX_ID_CHARS}) AS result,
                   left(reason, {_MAX_TEXT_CHARS}) AS reason,
                   left(error, {_MAX_TEXT_CHARS}) AS error
            FROM save_items WHERE request_id = $1 AND result IS NOT NULL LIMIT $2""",  # noqa: S608
        request_id, limit)
    decoded = (result_of(r["cluster_id"], r["action"], r["result"], r["reason"], r["error"])
               for r in rows)
    return [r for r in decoded if r is not None]


async def end(conn: asyncpg.Connection, request_id: int) -> None:
    await conn.execute("DELETE FROM save_requests WHERE id = $1", request_id)


async def claim(
    conn: asyncpg.Connection, identity: str, held: Sequence[int], limit: int
) -> list[Claimed]:
    """Claim the parts asked of `identity` that have not expired: those of the shards it holds
    (`held`) to write, the others declined at once (done without results: the requester need
    not wait for them). Parts another transaction is claiming are skipped."""
    rows = await conn.fetch(
        f"""WITH c AS (
                SELECT p.request_id, p.shard FROM save_parts p
                JOIN save_requests r ON r.id = p.request_id
                WHERE p.holder = $1 AND p.claimed_by IS NULL AND r.expires_at > now()
                ORDER BY p.request_id, p.shard LIMIT $3 FOR UPDATE OF p SKIP LOCKED)
            UPDATE save_parts p SET claimed_by = $1, claimed_at = now(),
                   done_at = CASE WHEN p.shard = ANY($2::int[]) THEN NULL ELSE now() END
            FROM c, save_requests r
            WHERE p.request_id = c.request_id AND p.shard = c.shard AND r.id = p.request_id
            RETURNING p.request_id, p.shard, p.done_at IS NOT NULL AS declined,
                      left(r.policy_id, {_MAX_ID_CHARS}) AS policy_id, r.revision,
                      extract(epoch FROM r.expires_at - now())::float8 AS remaining_s""",  # noqa: S608
        identity, list(held), limit)
    declined = {r["request_id"] for r in rows if r["declined"]}
    for request_id in sorted(declined):
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload(DONE, request_id))
    return [Claimed(r["request_id"], r["shard"], r["policy_id"], r["revision"],
                    r["remaining_s"]) for r in rows if not r["declined"]]


async def items(
    conn: asyncpg.Connection, request_id: int, shard: int, limit: int
) -> list[tuple[object, object, object]]:
    """A part's items as stored (cluster, action, read first), at most `limit`: undecoded."""
    rows = await conn.fetch(
        f"""SELECT left(cluster_id, {_MAX_ID_CHARS}) AS cluster_id,
                   left(action, {_MAX_ID_CHARS}) AS action, read_first
            FROM save_items WHERE request_id = $1 AND shard = $2 LIMIT $3""",  # noqa: S608
        request_id, shard, limit)
    return [(r["cluster_id"], r["action"], r["read_first"]) for r in rows]


async def finish(
    conn: asyncpg.Connection, identity: str, request_id: int, shard: int,
    done: Sequence[ClusterResult],
) -> None:
    """Write a claimed part's results and mark it done (only while `identity` holds the
    claim), then notify the requester (on commit)."""
    await conn.execute(
        """UPDATE save_items i SET result = u.result, reason = u.reason, error = u.error
           FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
                AS u(cluster_id, action, result, reason, error)
           WHERE i.request_id = $1 AND i.shard = $2 AND i.cluster_id = u.cluster_id
             AND i.action = u.action""",
        request_id, shard, [r.cluster for r in done], [r.action for r in done],
        [r.result.value for r in done],
        [clean_text(r.reason, MAX_REASON_CHARS) if r.reason else None for r in done],
        [clean_text(r.error, MAX_MESSAGE_CHARS) if r.error else None for r in done])
    await conn.execute(
        """UPDATE save_parts SET done_at = now()
           WHERE request_id = $1 AND shard = $2 AND claimed_by = $3""",
        request_id, shard, identity)
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, payload(DONE, request_id))
