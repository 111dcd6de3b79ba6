"""Rollouts in the database (migration `0013`): strategies, cluster labels, rollout rows, their
clusters and events. Each function runs on the connection it is given; `Store` opens it.

For rounds, `FleetRollouts.read` (inside the fleet's snapshot): which policies rounds deliver
per cluster, and each cluster's due Policy; a cluster's placements and a revision's content are
cached (both are fixed once written), so a round with rollouts in force costs a small read.

For saves (`start`): a save of a policy with a strategy starts a rollout in one transaction (the
row, its clusters' waves and previous revisions, the predecessor superseded, an event); a save
without one ends a rollout in force; a deletion aborts (`abort_for_deletion`).

For the gate job and the commands (wt/rollops), on `Store`:

- `Store.live_rollouts() -> list[Rollout]`, `Store.rollout_of(policy_id) -> Rollout | None`
  (the newest, any state), `Store.staged_rollout(policy_id) -> Staged | None` (the one in force
  with its placements and contents), `Store.rollout_events(rollout_id, limit)`; for a
  boundary's views, `Store.boundary_rollouts(boundary)` and the `boundary=` of `rollout_of` and
  `staged_rollout` (nothing of a policy while it is in another boundary).
- `Store.transition_rollout(before, after, *, by, what, detail=None, remaining_s) -> Rollout |
  None`: `after` written with a compare-and-set on `before`'s (id, state, wave, warn_step), in a
  transaction that records the event and asks `remaining_s` (the writer's fence,
  `Fence.remaining_s`: raises `Fenced`) before it writes and again before it commits, with the
  statement timeout capped by it (as `apply.write_timeout_s` caps a cluster write). None: the
  row had moved on (another replica made this transition): nothing written.
- `Store.record_rollout_event(rollout_id, *, by, what, wave=None, detail=None)`: a command that
  changes nothing (refused, say) recorded all the same.
- `Store.unsaved_revisions(*, older_than_s, limit) -> list[(policy, revision)]` (`unsaved`):
  revisions of policies with a strategy whose save never ran; the gate job saves them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from convergerd.core.decode import clean_text
from convergerd.core.model import BoundaryId, ClusterId, Policy, PolicyId, Position
from convergerd.core.rollout import (
    IN_FORCE_STATES,
    LIVE_STATES,
    Follow,
    Placement,
    Rollout,
    Staged,
    Start,
    State,
    Strategy,
    StrategyError,
    check_labels,
    due,
    follow,
    parse_strategy,
    placements_for,
    policy_of_content,
    strategy_doc,
)
from convergerd.core.shown import shown

# `by`, `what`, `detail` and `reason` as written (the writers are ours, the readers bound them
# again: anyone with a login can write these tables).
BY_MAX_CHARS = 200
WHAT_MAX_CHARS = 100
DETAIL_MAX_CHARS = 1000
EVENTS_LISTED_MAX = 500
# A transition's statement timeout at most (the fence may allow forever: `statement_timeout_ms`).
TRANSITION_TIMEOUT_MAX_S = 60.0

_ROLLOUT_COLUMNS = """id, policy_id, to_revision, from_revision, strategy, state, wave,
    warn_step, wave_started_at, wave_ready_at, reason, created_at, updated_at, updated_by"""
_IN_FORCE = [s.value for s in IN_FORCE_STATES]
_LIVE = [s.value for s in LIVE_STATES]


class UnreadableRollout(ValueError):
    """A `rollouts` row that cannot be read (a snapshot that is not a strategy, an unknown
    state): written by someone else."""


def rollout_of_row(r: asyncpg.Record) -> Rollout:
    try:
        strategy = parse_strategy(r["strategy"])
        state = State(r["state"])
    except (StrategyError, ValueError) as exc:
        raise UnreadableRollout(f"rollout {r['id']}: {exc}") from None
    reason = r["reason"]
    return Rollout(
        id=r["id"], policy=PolicyId(r["policy_id"]), to_revision=r["to_revision"],
        from_revision=r["from_revision"], strategy=strategy, state=state,
        wave=min(r["wave"], len(strategy.waves) - 1), warn_step=r["warn_step"],
        wave_started_at=r["wave_started_at"], wave_ready_at=r["wave_ready_at"],
        reason=clean_text(reason, DETAIL_MAX_CHARS) if reason is not None else None,
        created_at=r["created_at"], updated_at=r["updated_at"],
        updated_by=clean_text(r["updated_by"], BY_MAX_CHARS))


def _labels(value: object) -> dict[str, str]:
    """A cluster's stored labels; anything that is not a label mapping reads as none."""
    try:
        return check_labels(value, "labels")
    except StrategyError:
        return {}


# ---- strategies and labels (the import file) ----------------------------------------------------


async def upsert_strategies(conn: asyncpg.Connection, strategies: Sequence[Strategy]) -> int:
    """Write each strategy (its normalised document); how many were new or changed. JSON is
    sent as text: the import's connection has no JSON codec."""
    rows = await conn.fetch(
        """INSERT INTO rollout_strategies AS s (id, spec)
           SELECT u.id, u.spec::jsonb FROM unnest($1::text[], $2::text[]) AS u(id, spec)
           ON CONFLICT (id) DO UPDATE SET spec = EXCLUDED.spec, updated_at = now()
           WHERE s.spec IS DISTINCT FROM EXCLUDED.spec
           RETURNING id""",
        [s.id for s in strategies], [json.dumps(strategy_doc(s)) for s in strategies])
    return len(rows)


async def strategy_ids(conn: asyncpg.Connection) -> set[str]:
    return {r["id"] for r in await conn.fetch("SELECT id FROM rollout_strategies")}


async def set_cluster_labels(conn: asyncpg.Connection,
                             labels: Mapping[str, Mapping[str, str]]) -> None:
    await conn.execute(
        """UPDATE clusters c SET labels = u.labels::jsonb
           FROM unnest($1::text[], $2::text[]) AS u(id, labels)
           WHERE c.id = u.id AND c.labels IS DISTINCT FROM u.labels::jsonb""",
        list(labels), [json.dumps(dict(v)) for v in labels.values()])


async def set_strategies(conn: asyncpg.Connection, table: str,
                         chosen: Mapping[str, str | None]) -> None:
    """Each row's `rollout_strategy` (`table`: `policies` or `boundaries`); None clears it."""
    if table not in ("policies", "boundaries"):
        raise ValueError(table)
    await conn.execute(
        f"""UPDATE {table} t SET rollout_strategy = u.strategy
            FROM unnest($1::text[], $2::text[]) AS u(id, strategy)
            WHERE t.id = u.id AND t.rollout_strategy IS DISTINCT FROM u.strategy""",  # noqa: S608
        list(chosen), list(chosen.values()))


# ---- what rounds deliver -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoundRollouts:
    """What a round reads of rollouts: per policy delivered per cluster, each cluster's due
    Policy (None: nothing written there); the policies held out of this round (`Follow.HOLD`);
    the policies whose strategy cannot be used, with the reason (invalid); where each followed
    rollout stood (`positions`: a round's write checks it again)."""

    staged: dict[PolicyId, dict[ClusterId, Policy | None]]
    invalid: dict[PolicyId, str]
    positions: dict[PolicyId, Position]


_ROUND_POLICIES = """
SELECT p.id, p.revision, p.rollout_strategy AS own, b.rollout_strategy AS inherited,
       COALESCE(p.rollout_strategy, b.rollout_strategy) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM rollout_strategies s
                           WHERE s.id = COALESCE(p.rollout_strategy, b.rollout_strategy))
           AS unknown,
       (SELECT r.id FROM rollouts r WHERE r.policy_id = p.id ORDER BY r.id DESC LIMIT 1)
           AS newest
FROM policies p LEFT JOIN boundaries b ON b.id = p.boundary_id
WHERE p.deleted_at IS NULL
  AND (COALESCE(p.rollout_strategy, b.rollout_strategy) IS NOT NULL
       OR EXISTS (SELECT 1 FROM rollouts r WHERE r.policy_id = p.id
                  AND r.state NOT IN ('completed', 'superseded')))
"""


class FleetRollouts:
    """The rollouts part of the fleet read, with its caches: a rollout's placements (fixed at
    start) by rollout id, a revision's content by (policy, revision) (immutable), and each
    policy's due Policies per cluster by what they depend on (the rollout's state, wave and
    Warn step, the policy's revision and boundary, the scope), each kept only while a read
    still needs it: a round with rollouts in force whose state has not moved costs the query
    and a comparison of scopes."""

    def __init__(self) -> None:
        self._placements: dict[int, dict[ClusterId, Placement]] = {}
        self._contents: dict[tuple[PolicyId, int], Policy | None] = {}
        self._built: dict[PolicyId, tuple[tuple[object, ...], frozenset[ClusterId],
                                          dict[ClusterId, Policy | None]]] = {}

    async def read(self, conn: asyncpg.Connection, policies: Sequence[Policy],
                   scopes: Mapping[BoundaryId, frozenset[ClusterId]]) -> RoundRollouts:
        """Inside the fleet's snapshot: for each valid policy that has a strategy or a rollout
        in force (no other is read: a fleet without rollouts costs one index-backed query),
        what rounds deliver where (`core.rollout.follow`)."""
        rows = await conn.fetch(_ROUND_POLICIES)
        if not rows:
            self._placements, self._contents, self._built = {}, {}, {}
            return RoundRollouts({}, {}, {})
        by_id = {p.id: p for p in policies}
        newest_ids = [r["newest"] for r in rows if r["newest"] is not None]
        newest = {x.policy: x for x in map(rollout_of_row, await conn.fetch(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ANY($1::bigint[])",  # noqa: S608
            newest_ids))} if newest_ids else {}
        invalid: dict[PolicyId, str] = {}
        staged: dict[PolicyId, dict[ClusterId, Policy | None]] = {}
        positions: dict[PolicyId, Position] = {}
        built: dict[PolicyId, tuple[tuple[object, ...], frozenset[ClusterId],
                                    dict[ClusterId, Policy | None]]] = {}
        followed: list[tuple[Policy, Rollout, frozenset[ClusterId]]] = []
        for r in rows:
            pid = PolicyId(r["id"])
            policy = by_id.get(pid)
            if policy is None:
                continue  # invalid already
            if r["unknown"]:
                field = "rollout_strategy" if r["own"] is not None else \
                    "boundary rollout_strategy"
                invalid[pid] = (f"{field}: unknown strategy "
                                f"{shown(r['own'] or r['inherited'])}")
                continue
            has_strategy = (r["own"] or r["inherited"]) is not None
            rollout = newest.get(pid)
            how = follow(policy.revision, has_strategy, rollout)
            if how is Follow.HOLD:
                staged[pid] = {}  # no cluster gets anything this round
            elif how is Follow.ROLLOUT and rollout is not None:
                positions[pid] = rollout.position
                scope = scopes.get(policy.boundary, frozenset())
                key = _key(policy, rollout)
                hit = self._built.get(pid)
                if hit is not None and hit[0] == key and hit[1] == scope:
                    staged[pid], built[pid] = hit[2], hit
                else:
                    followed.append((policy, rollout, scope))
        placements, contents = await self._fill(conn, followed)
        for policy, rollout, scope in followed:
            placed = placements.get(rollout.id, {})
            found = Staged(rollout, {c: placed.get(c, _COMPLETED) for c in scope},
                           {rev: contents.get((policy.id, rev))
                            for rev in _revisions_of(rollout, set(placed.values()))})
            staged[policy.id] = found.policies()
            built[policy.id] = (_key(policy, rollout), scope, staged[policy.id])
        self._built = built
        return RoundRollouts(staged, invalid, positions)

    async def _fill(self, conn: asyncpg.Connection,
                    followed: Sequence[tuple[Policy, Rollout, frozenset[ClusterId]]]
                    ) -> tuple[dict[int, dict[ClusterId, Placement]],
                               dict[tuple[PolicyId, int], Policy | None]]:
        """The placements of the rollouts in force (clusters that joined the scope placed by
        their labels now) and the contents of the revisions they may make due: from the
        caches, what they lack read. Built apart and then kept, so reads that overlap
        (shards) never see a cache half made."""
        wanted = {r.id for _, r, _ in followed if r.in_force}
        placements = {k: v for k, v in self._placements.items() if k in wanted}
        missing = [i for i in wanted if i not in placements]
        if missing:
            placements.update(await read_placements(conn, missing))
        joining = {r.id: [c for c in scope if c not in placements[r.id]]
                   for _, r, scope in followed if r.in_force}
        labels = await cluster_labels(conn, {c for cs in joining.values() for c in cs}) \
            if any(joining.values()) else {}
        for _, rollout, _ in followed:
            if joining.get(rollout.id):
                placements[rollout.id] = {**placements[rollout.id], **placements_for(
                    rollout.strategy, joining[rollout.id], lambda c: labels.get(c, {}),
                    _constant(rollout.from_revision))}
        self._placements = placements
        needed = {(p.id, rev) for p, r, _ in followed
                  for rev in _revisions_of(r, set(placements.get(r.id, {}).values()))}
        contents = {k: v for k, v in self._contents.items() if k in needed}
        lacking = [k for k in needed if k not in contents]
        if lacking:
            boundary = {p.id: p.boundary for p, _, _ in followed}
            for (pid, rev), content in (await read_contents(conn, lacking)).items():
                contents[pid, rev] = policy_of_content(pid, rev, content, boundary[pid])
        self._contents = contents
        return placements, contents


def _key(policy: Policy, rollout: Rollout) -> tuple[object, ...]:
    """What a policy's due Policies per cluster depend on, besides the scope."""
    return (rollout.position, policy.revision, policy.boundary)


def _constant(revision: int | None) -> Callable[[ClusterId], int | None]:
    return lambda _cluster: revision


# A cluster of a completed rollout: every cluster is due its revision (the wave is not asked).
_COMPLETED = Placement(0, None)


def _revisions_of(rollout: Rollout, placements: Iterable[Placement]) -> set[int]:
    revisions = {rollout.to_revision}
    if rollout.from_revision is not None:
        revisions.add(rollout.from_revision)
    revisions.update(p.previous_revision for p in placements if p.previous_revision is not None)
    return revisions


async def read_placements(conn: asyncpg.Connection, rollout_ids: Sequence[int]
                          ) -> dict[int, dict[ClusterId, Placement]]:
    rows = await conn.fetch(
        """SELECT rollout_id, cluster_id, wave, previous_revision FROM rollout_clusters
           WHERE rollout_id = ANY($1::bigint[])""", list(rollout_ids))
    shared: dict[tuple[int, int | None], Placement] = {}
    out: dict[int, dict[ClusterId, Placement]] = {i: {} for i in rollout_ids}
    for r in rows:
        key = (r["wave"], r["previous_revision"])
        placement = shared.get(key)
        if placement is None:
            placement = shared[key] = Placement(*key)
        out[r["rollout_id"]][ClusterId(r["cluster_id"])] = placement
    return out


async def cluster_labels(conn: asyncpg.Connection, clusters: Collection[ClusterId]
                         ) -> dict[ClusterId, dict[str, str]]:
    rows = await conn.fetch("SELECT id, labels FROM clusters WHERE id = ANY($1::text[])",
                            list(clusters))
    return {ClusterId(r["id"]): _labels(r["labels"]) for r in rows}


async def read_contents(conn: asyncpg.Connection, wanted: Collection[tuple[PolicyId, int]]
                        ) -> dict[tuple[PolicyId, int], object]:
    """The kept content of each (policy, revision); one not kept (pruned, or never) is absent."""
    rows = await conn.fetch(
        """SELECT r.policy_id, r.revision, r.content FROM policy_revisions r
           JOIN unnest($1::text[], $2::bigint[]) AS w(policy_id, revision)
             ON r.policy_id = w.policy_id AND r.revision = w.revision""",
        [p for p, _ in wanted], [rev for _, rev in wanted])
    return {(PolicyId(r["policy_id"]), r["revision"]): r["content"] for r in rows}


# ---- saves ---------------------------------------------------------------------------------------


async def _event(conn: asyncpg.Connection, rollout_id: int, *, by: str, what: str,
                 wave: int | None = None, detail: str | None = None) -> None:
    await conn.execute(
        "INSERT INTO rollout_events (rollout_id, by, what, wave, detail) "
        "VALUES ($1, $2, $3, $4, $5)",
        rollout_id, clean_text(by, BY_MAX_CHARS), clean_text(what, WHAT_MAX_CHARS), wave,
        clean_text(detail, DETAIL_MAX_CHARS) if detail is not None else None)


async def record_event(conn: asyncpg.Connection, rollout_id: int, *, by: str, what: str,
                       wave: int | None = None, detail: str | None = None) -> None:
    await _event(conn, rollout_id, by=by, what=what, wave=wave, detail=detail)


async def _newest(conn: asyncpg.Connection, policy_id: str) -> Rollout | None:
    row = await conn.fetchrow(
        f"""SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE policy_id = $1
            ORDER BY id DESC LIMIT 1""", policy_id)  # noqa: S608
    return rollout_of_row(row) if row is not None else None


async def _end(conn: asyncpg.Connection, rollout: Rollout, state: State, *, by: str,
               what: str, detail: str) -> None:
    await conn.execute(
        "UPDATE rollouts SET state = $2, reason = $3, updated_at = now(), updated_by = $4 "
        "WHERE id = $1", rollout.id, state.value, clean_text(detail, DETAIL_MAX_CHARS),
        clean_text(by, BY_MAX_CHARS))
    await _event(conn, rollout.id, by=by, what=what, wave=rollout.wave, detail=detail)


async def staged(conn: asyncpg.Connection, rollout: Rollout, boundary: BoundaryId,
                 scope: Collection[ClusterId]) -> Staged:
    """`rollout` with its placements over `scope` (joining clusters placed by their labels
    now) and the contents of the revisions it may make due."""
    if rollout.state is State.COMPLETED:
        placed = dict.fromkeys(scope, _COMPLETED)
    else:
        placed = (await read_placements(conn, [rollout.id]))[rollout.id]
        joining = [c for c in scope if c not in placed]
        if joining:
            labels = await cluster_labels(conn, joining)
            placed |= placements_for(rollout.strategy, joining,
                                     lambda c: labels.get(c, {}),
                                     _constant(rollout.from_revision))
        placed = {c: placed[c] for c in scope}
    wanted = [(rollout.policy, rev) for rev in _revisions_of(rollout, placed.values())]
    contents = await read_contents(conn, wanted)
    return Staged(rollout, placed, {
        rev: policy_of_content(rollout.policy, rev, contents.get((rollout.policy, rev)),
                               boundary) for _, rev in wanted})


async def start(conn: asyncpg.Connection, policy_id: str, revision: int, *, by: str,
                already_delivered: bool, now: bool = False) -> Start:
    """What a save of `revision` delivers, starting its rollout when the policy has a strategy
    (its own, else its boundary's), in one transaction:

    - the revision already has its rollout (this save repeats an earlier one: a notification
      after the API's save, a save overtaken): that one, unchanged;
    - no strategy, or `now` (a rollback that skips the waves), or the revision is already
      delivered to some cluster (the strategy was set after it went out), or it moves the policy
      to another boundary (the clusters' previous revisions belong to the old one): delivered
      at once, as without rollouts; a rollout in force is ended (superseded; with a strategy a
      completed row records the revision as delivered, so a later save does not stage it);
    - else a new rollout: wave 0 progressing, every cluster of the scope placed (`wave_of` with
      its labels; previous: what the rollout in force made it due, else the policy's revision
      before), the rollout in force superseded, events recorded.
    """
    async with conn.transaction():
        policy = await conn.fetchrow(
            """SELECT p.revision, p.boundary_id, p.deleted_at IS NOT NULL AS deleting,
                      COALESCE(p.rollout_strategy, b.rollout_strategy) AS strategy_id,
                      p.rollout_strategy IS NOT NULL AS own
               FROM policies p LEFT JOIN boundaries b ON b.id = p.boundary_id
               WHERE p.id = $1 FOR UPDATE OF p""", policy_id)
        if policy is None or policy["deleting"]:
            return Start()  # the save answers it: gone, or its deletion began
        if policy["revision"] != revision:
            return Start(overtaken=policy["revision"] > revision)
        newest = await _newest(conn, policy_id)
        boundary = BoundaryId(policy["boundary_id"])
        scope = [ClusterId(r["cluster_id"]) for r in await conn.fetch(
            """SELECT bc.cluster_id FROM boundary_clusters bc JOIN clusters c
               ON c.id = bc.cluster_id WHERE bc.boundary_id = $1""", boundary)]
        in_force = newest if newest is not None and newest.in_force else None
        strategy_id = policy["strategy_id"]
        if newest is not None and newest.to_revision == revision and not now and \
                newest.state is not State.SUPERSEDED:
            return Start(await staged(conn, newest, boundary, scope))
        strategy = await _strategy(conn, strategy_id) if strategy_id is not None else None
        if isinstance(strategy, str):  # as rounds find it: invalid, delivered nowhere
            field = "rollout_strategy" if policy["own"] else "boundary rollout_strategy"
            return Start(refused=f"{field}: {strategy}")
        why_not = await _at_once(conn, policy_id, revision, boundary, strategy_id,
                                 already_delivered=already_delivered, now=now)
        if why_not is not None:
            if in_force is not None:
                state = State.COMPLETED if now and in_force.to_revision == revision \
                    else State.SUPERSEDED
                await _end(conn, in_force, state, by=by, what=state.value,
                           detail=f"revision {revision} saved at once: {why_not}")
            if strategy_id is not None and (in_force is None or in_force.to_revision != revision):
                await _completed(conn, policy_id, revision, strategy_id, by=by,
                                 detail=why_not or "")
            return Start(why_not=why_not)
        assert strategy is not None  # else `_at_once` said why not
        previous = await _previous(conn, policy_id, revision)
        saved = _Saved(PolicyId(policy_id), revision, boundary, scope)
        return Start(await _begin(conn, saved, previous=previous, strategy=strategy,
                                  in_force=in_force, by=by), started=True)


async def _at_once(conn: asyncpg.Connection, policy_id: str, revision: int,
                   boundary: BoundaryId, strategy_id: str | None, *,
                   already_delivered: bool, now: bool) -> str | None:
    """Why a save of a policy with a strategy goes everywhere at once (None: it is staged)."""
    if strategy_id is None:
        return "no rollout strategy"
    if now:
        return "the waves skipped (rollback --now)"
    if already_delivered:
        return "already delivered to some cluster (the strategy was set after it went out)"
    before = await conn.fetchrow(
        """SELECT revision, content ->> 'boundary_id' AS boundary FROM policy_revisions
           WHERE policy_id = $1 AND revision < $2 AND content IS NOT NULL
           ORDER BY revision DESC LIMIT 1""", policy_id, revision)
    if before is not None and before["boundary"] != boundary:
        return (f"it moves the policy from boundary {shown(before['boundary'])} to "
                f"{shown(boundary)}")
    return None


async def _strategy(conn: asyncpg.Connection, strategy_id: str) -> Strategy | str:
    """The strategy, or why it cannot be used."""
    spec = await conn.fetchval("SELECT spec FROM rollout_strategies WHERE id = $1", strategy_id)
    if spec is None:
        return f"unknown strategy {shown(strategy_id)}"
    try:
        return parse_strategy(spec)
    except StrategyError as exc:
        return f"strategy {shown(strategy_id)} cannot be used: {exc}"


async def _previous(conn: asyncpg.Connection, policy_id: str, revision: int) -> int | None:
    """The policy's revision before `revision` (None: a new policy, or one created again)."""
    row = await conn.fetchrow(
        """SELECT revision, content IS NULL AS deleted FROM policy_revisions
           WHERE policy_id = $1 AND revision < $2 ORDER BY revision DESC LIMIT 1""",
        policy_id, revision)
    return None if row is None or row["deleted"] else row["revision"]


async def _insert(conn: asyncpg.Connection, policy_id: str, revision: int, *,
                  previous: int | None, strategy: Strategy | dict[str, Any], state: State,
                  by: str, strategy_id: str, warn_step: bool = False) -> Rollout:
    doc = strategy_doc(strategy) if isinstance(strategy, Strategy) else strategy
    row = await conn.fetchrow(
        f"""INSERT INTO rollouts (policy_id, to_revision, from_revision, strategy_id, strategy,
                                  state, warn_step, updated_by)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {_ROLLOUT_COLUMNS}""",  # noqa: S608
        policy_id, revision, previous, strategy_id, doc, state.value, warn_step,
        clean_text(by, BY_MAX_CHARS))
    assert row is not None  # INSERT ... RETURNING
    return rollout_of_row(row)


async def _completed(conn: asyncpg.Connection, policy_id: str, revision: int,
                     strategy_id: str, *, by: str, detail: str) -> None:
    """A completed row for a revision of a policy with a strategy delivered at once: the
    revision is known to be out everywhere (`core.rollout.follow`)."""
    spec = await conn.fetchval("SELECT spec FROM rollout_strategies WHERE id = $1", strategy_id)
    try:
        snapshot: Strategy | dict[str, Any] = parse_strategy(spec)
    except StrategyError:
        snapshot = {"id": strategy_id, "waves": [{"name": "all", "fraction": 1.0}]}
    made = await _insert(conn, policy_id, revision, previous=None, strategy=snapshot,
                         state=State.COMPLETED, by=by, strategy_id=strategy_id)
    await _event(conn, made.id, by=by, what="delivered at once", detail=detail)


@dataclass(frozen=True, slots=True)
class _Saved:
    """The policy a save starts a rollout of: its id, revision, boundary and scope now."""

    policy: PolicyId
    revision: int
    boundary: BoundaryId
    scope: Sequence[ClusterId]


async def _begin(conn: asyncpg.Connection, saved: _Saved, *, previous: int | None,
                 strategy: Strategy, in_force: Rollout | None, by: str) -> Staged:
    policy_id, revision, boundary, scope = saved.policy, saved.revision, saved.boundary, \
        saved.scope
    labels = await cluster_labels(conn, scope)
    before: Staged | None = None
    if in_force is not None and previous is not None:
        # (A policy created again after its deletion starts from nothing: what the rollout
        # of its former life left in force says nothing of the clusters now.)
        before = await staged(conn, in_force, boundary, scope)
    if in_force is not None:
        await _end(conn, in_force, State.SUPERSEDED, by=by, what="superseded",
                   detail=f"revision {revision} saved: a new rollout starts from where each "
                          "cluster is")

    def was(cluster: ClusterId) -> int | None:
        if before is None:
            return previous
        return due(before.rollout, before.placements[cluster]).revision

    placements = placements_for(strategy, scope, lambda c: labels.get(c, {}), was)
    made = await _insert(conn, policy_id, revision, previous=previous, strategy=strategy,
                         state=State.PROGRESSING, by=by, strategy_id=strategy.id,
                         warn_step=strategy.waves[0].warn_first)
    await conn.execute(
        """INSERT INTO rollout_clusters (rollout_id, cluster_id, wave, previous_revision)
           SELECT $1, * FROM unnest($2::text[], $3::int[], $4::bigint[])""",
        made.id, list(placements), [p.wave for p in placements.values()],
        [p.previous_revision for p in placements.values()])
    counts = [sum(1 for p in placements.values() if p.wave == i)
              for i in range(len(strategy.waves))]
    await _event(conn, made.id, by=by, what="started", wave=0, detail=(
        f"revision {revision} (from {previous if previous is not None else 'none'}) with "
        f"strategy {strategy.id}: clusters per wave "
        + ", ".join(f"{w.name} {n}" for w, n in zip(strategy.waves, counts, strict=True))
        + (f"; supersedes rollout {in_force.id}" if in_force is not None else "")))
    contents = await read_contents(
        conn, [(PolicyId(policy_id), rev) for rev in _revisions_of(made, placements.values())])
    return Staged(made, placements, {
        rev: policy_of_content(PolicyId(policy_id), rev, content, boundary)
        for (_, rev), content in contents.items()})


async def abort_for_deletion(conn: asyncpg.Connection, policy_id: str, *, by: str) -> None:
    """The deletion of a policy aborts its rollout in force (recorded); the deletion then
    removes the policy everywhere as always."""
    row = await conn.fetchrow(
        f"""SELECT {_ROLLOUT_COLUMNS} FROM rollouts
            WHERE policy_id = $1 AND state = ANY($2::text[])""", policy_id, _LIVE)  # noqa: S608
    if row is not None:
        await _end(conn, rollout_of_row(row), State.ABORTED, by=by, what="aborted",
                   detail="the policy is being deleted")


# ---- the gate job and the commands ---------------------------------------------------------------


# Whether rollout `r` is boundary `$2`'s: its policy is in it now, and the revision it rolls
# out was (its kept content names it). A rollout from before the policy moved in, or whose
# revision is no longer kept, is no boundary's.
_OF_BOUNDARY = """EXISTS (SELECT 1 FROM policies p WHERE p.id = r.policy_id AND p.boundary_id = $2)
    AND EXISTS (SELECT 1 FROM policy_revisions v WHERE v.policy_id = r.policy_id
                AND v.revision = r.to_revision AND v.content->>'boundary_id' = $2)"""


async def live(conn: asyncpg.Connection, boundary: str | None = None) -> list[Rollout]:
    """The live rollouts; with `boundary`, its (`_OF_BOUNDARY`)."""
    rows = await conn.fetch(
        f"""SELECT {_ROLLOUT_COLUMNS} FROM rollouts r WHERE state = ANY($1::text[])
            AND ($2::text IS NULL OR ({_OF_BOUNDARY})) ORDER BY id""",  # noqa: S608
        _LIVE, boundary)
    return [rollout_of_row(r) for r in rows]


async def live_ids(conn: asyncpg.Connection, boundary: str) -> frozenset[int]:
    """The ids of `boundary`'s live rollouts (`_OF_BOUNDARY`; no row read further)."""
    return frozenset(await conn.fetchval(
        f"""SELECT coalesce(array_agg(r.id), '{{}}') FROM rollouts r
            WHERE r.state = ANY($1::text[]) AND {_OF_BOUNDARY}""",  # noqa: S608
        _LIVE, boundary))


async def live_in(conn: asyncpg.Connection, boundary: str) -> list[Rollout] | None:
    """`boundary`'s live rollouts (`_OF_BOUNDARY`); None: there is no such boundary."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        if not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM boundaries WHERE id = $1)", boundary):
            return None
        return await live(conn, boundary)


async def newest_of(conn: asyncpg.Connection, policy_id: str,
                    boundary: str | None = None) -> Rollout | None:
    """The policy's newest rollout, whatever its state; with `boundary`, only if it is that
    boundary's (`_OF_BOUNDARY`: never an older one instead)."""
    row = await conn.fetchrow(
        f"""SELECT * FROM (SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE policy_id = $1
                           ORDER BY id DESC LIMIT 1) r
            WHERE $2::text IS NULL OR ({_OF_BOUNDARY})""",  # noqa: S608
        policy_id, boundary)
    return rollout_of_row(row) if row is not None else None


async def staged_of(conn: asyncpg.Connection, policy_id: str,
                    boundary: str | None = None) -> Staged | None:
    """The policy's rollout in force with its placements over its scope now; None: none (with
    `boundary`, also when it is not that boundary's: `_OF_BOUNDARY`)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        row = await conn.fetchrow(
            f"""SELECT {_ROLLOUT_COLUMNS} FROM rollouts
                WHERE policy_id = $1 AND state = ANY($2::text[])""",  # noqa: S608
            policy_id, _IN_FORCE)
        policy = await conn.fetchrow(
            "SELECT boundary_id FROM policies WHERE id = $1 AND deleted_at IS NULL", policy_id)
        if row is None or policy is None:
            return None
        if boundary is not None and not await conn.fetchval(
                f"SELECT {_OF_BOUNDARY} FROM rollouts r WHERE r.id = $1",  # noqa: S608
                row["id"], boundary):
            return None
        found = BoundaryId(policy["boundary_id"])
        scope = [ClusterId(r["cluster_id"]) for r in await conn.fetch(
            """SELECT bc.cluster_id FROM boundary_clusters bc JOIN clusters c
               ON c.id = bc.cluster_id WHERE bc.boundary_id = $1""", found)]
        return await staged(conn, rollout_of_row(row), found, scope)


_UNSAVED = """
SELECT p.id, p.revision FROM policies p
LEFT JOIN boundaries b ON b.id = p.boundary_id
JOIN rollout_strategies s ON s.id = COALESCE(p.rollout_strategy, b.rollout_strategy)
LEFT JOIN policy_revisions v ON v.policy_id = p.id AND v.revision = p.revision
WHERE p.deleted_at IS NULL
  AND COALESCE(v.saved_at, p.updated_at) < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM rollouts r WHERE r.policy_id = p.id
                  AND r.to_revision = p.revision AND r.state <> 'superseded')
ORDER BY COALESCE(v.saved_at, p.updated_at), p.id
LIMIT $2
"""


async def unsaved(conn: asyncpg.Connection, *, older_than_s: float, limit: int
                  ) -> list[tuple[PolicyId, int]]:
    """The policies (id, revision) whose newest revision has a rollout strategy (a known one,
    its own or its boundary's) and no rollout (none of that revision, a superseded one aside),
    written more than `older_than_s` ago: a save that never ran (its notification lost, the
    replica that wrote it died before its fan-out). Every save of a policy with a strategy
    leaves a row for its revision (`start`: a rollout, or a completed one when delivered at
    once), so a revision without one was never saved. The oldest first, at most `limit`."""
    rows = await conn.fetch(_UNSAVED, older_than_s, limit)
    return [(PolicyId(r["id"]), r["revision"]) for r in rows]


@dataclass(frozen=True, slots=True)
class Event:
    rollout: int
    at: dt.datetime
    by: str
    what: str
    wave: int | None
    detail: str | None


async def events(conn: asyncpg.Connection, rollout_id: int, limit: int) -> list[Event]:
    rows = await conn.fetch(
        """SELECT rollout_id, at, by, what, wave, detail FROM rollout_events
           WHERE rollout_id = $1 ORDER BY at DESC LIMIT $2""",
        rollout_id, min(limit, EVENTS_LISTED_MAX))
    return [Event(r["rollout_id"], r["at"], clean_text(r["by"], BY_MAX_CHARS),
                  clean_text(r["what"], WHAT_MAX_CHARS), r["wave"],
                  clean_text(r["detail"], DETAIL_MAX_CHARS) if r["detail"] else None)
            for r in rows]


def statement_timeout_ms(allowed_s: float) -> int:
    """A transition's statement timeout, in whole milliseconds from 1 to
    `TRANSITION_TIMEOUT_MAX_S`: what the writer's fence allows (`allowed_s`), the cap when it
    allows more, or forever (the open fence of a replica without leader election, a command's
    writer: `float("inf")`)."""
    capped = allowed_s if allowed_s < TRANSITION_TIMEOUT_MAX_S else TRANSITION_TIMEOUT_MAX_S
    return max(1, math.ceil(capped * 1000))


async def transition(conn: asyncpg.Connection, before: Rollout, after: Rollout, *, by: str,
                     what: str, detail: str | None, remaining_s: Callable[[], float]
                     ) -> Rollout | None:
    """Write `after` if the row still is `before` (id, state, wave, warn_step), with its event,
    in one transaction under the writer's fence (`remaining_s` raises `Fenced`): asked before
    writing and again before committing, the statement timeout capped by what it allowed
    (`statement_timeout_ms`: an open fence, which allows forever, gets the cap). A new wave
    restarts its clock (`wave_started_at`). None: the row had moved on, nothing written."""
    if before.id != after.id:
        raise ValueError(f"rollouts {before.id} and {after.id}: a transition is of one rollout")
    async with conn.transaction():
        timeout_ms = statement_timeout_ms(remaining_s())
        await conn.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
        row = await conn.fetchrow(
            f"""UPDATE rollouts SET state = $5, wave = $6, warn_step = $7,
                       wave_ready_at = $8, reason = $9, updated_at = now(), updated_by = $10,
                       wave_started_at = CASE WHEN wave <> $6 THEN now() ELSE wave_started_at
                                         END
                WHERE id = $1 AND state = $2 AND wave = $3 AND warn_step = $4
                RETURNING {_ROLLOUT_COLUMNS}""",  # noqa: S608
            before.id, before.state.value, before.wave, before.warn_step, after.state.value,
            after.wave, after.warn_step, after.wave_ready_at,
            clean_text(after.reason, DETAIL_MAX_CHARS) if after.reason is not None else None,
            clean_text(by, BY_MAX_CHARS))
        if row is None:
            return None
        await _event(conn, before.id, by=by, what=what, wave=after.wave, detail=detail)
        remaining_s()  # still ours: commit (raises Fenced, and the transaction rolls back)
    return rollout_of_row(row)

