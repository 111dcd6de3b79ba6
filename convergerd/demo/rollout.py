"""The demo's rollout story (issue 37, item 6), told by the demo itself once the fleet has
converged: `team-c-registries` is saved with the three-wave strategy `careful` (the canary
c0009, half of the rest, the rest; see `demo/tenants.yaml`) as a revision that no longer
allows the registry mirror the canary's running `web-0` comes from. The canary's audit finds
the violation, the gate halts the rollout and sends the canary back to the revision it had
(`reverted`); no other cluster ever got it. Then a fixed revision (the mirror allowed again)
is saved and rolls through every wave. Each step is logged, and `convergerd rollout status
team-c-registries` shows it.

The saves are plain writes of the policy's row, as module-policies makes them (recorded as
saved by `convergerd demo`): the daemon's listener saves them and the gate job does the rest.
A failure (the database gone) ends the story with a log line; the demo goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from convergerd.store.revisions import set_actor

log = logging.getLogger(__name__)

POLICY = "team-c-registries"
STRATEGY = "careful"
CANARY = "c0009"
# The revision the story starts from is the tenants file's: the team's registry and its mirror.
TIGHTENED = ["registry.team-c.example.com"]  # the mirror dropped: the canary's web-0 violates
FIXED = ["registry.team-c.example.com", "mirror.example.com/team-c",
         "registry.example.com/team-c"]
ACTOR = "convergerd demo (the rollout story)"
POLL_S = 1.0


async def _wait(what: str, ready: Callable[[], Awaitable[bool]], poll_s: float) -> None:
    """Poll the database (another process writes it: nothing to be told by) until `ready`."""
    log.info("rollout story: waiting until %s", what)
    while True:
        if await ready():
            return
        await asyncio.sleep(poll_s)


async def _save(conn: asyncpg.Connection, registries: list[str]) -> None:
    """A new revision of the story's policy, with the strategy (a plain write of its row)."""
    async with conn.transaction():
        await set_actor(conn, ACTOR)
        await conn.execute(
            "UPDATE policies SET rule = $1::jsonb, rollout_strategy = $2 WHERE id = $3",
            json.dumps({"type": "AllowedRegistries", "registries": registries}), STRATEGY,
            POLICY)


async def _rollout(conn: asyncpg.Connection) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, to_revision, state, wave, reason FROM rollouts WHERE policy_id = $1 "
        "ORDER BY id DESC LIMIT 1", POLICY)
    return dict(row) if row is not None else None


async def tell(dsn: str, *, poll_s: float = POLL_S) -> None:
    """The story, from the canary enforcing the tenants file's revision to the fixed revision
    everywhere."""
    conn = await asyncpg.connect(dsn)
    try:
        await _story(conn, poll_s)
    except (OSError, asyncpg.PostgresError) as exc:
        log.warning("rollout story: stopped, the database failed it: %s", exc)
    finally:
        await conn.close()


async def _story(conn: asyncpg.Connection, poll_s: float) -> None:
    async def canary_enforcing() -> bool:
        row = await conn.fetchrow(
            "SELECT phase, verified_status FROM deliveries WHERE policy_id = $1 AND "
            "cluster_id = $2", POLICY, CANARY)
        return row is not None and row["phase"] == "Enforcing" \
            and row["verified_status"] == "True"

    await _wait(f"{POLICY} is enforced and verified on the canary {CANARY}",
                canary_enforcing, poll_s)
    await _save(conn, TIGHTENED)
    log.info("rollout story: %s saved with strategy %s, registries %s: the mirror the "
             "canary's web-0 runs from is no longer allowed; watch `convergerd rollout status "
             "%s`", POLICY, STRATEGY, TIGHTENED, POLICY)
    first = await _wait_for_state(conn, ("reverted", "halted", "completed"), poll_s)
    log.info("rollout story: rollout %s of revision %s is %s: %s", first["id"],
             first["to_revision"], first["state"], first["reason"])
    await _save(conn, FIXED)
    log.info("rollout story: %s saved again with registries %s (the mirror allowed again): "
             "through the canary, half, the rest", POLICY, FIXED)
    second = await _wait_for_state(conn, ("completed", "reverted", "halted"), poll_s,
                                   after=first["id"])
    log.info("rollout story: rollout %s of revision %s is %s", second["id"],
             second["to_revision"], second["state"])


async def _wait_for_state(conn: asyncpg.Connection, states: tuple[str, ...], poll_s: float, *,
                          after: int = 0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def reached() -> bool:
        row = await _rollout(conn)
        if row is None or row["id"] <= after or row["state"] not in states:
            return False
        found.update(row)
        return True

    await _wait(f"its rollout is {' or '.join(states)}", reached, poll_s)
    return found
