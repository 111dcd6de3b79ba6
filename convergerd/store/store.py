"""`Store`: what convergerd reads from and records in the policy database (asyncpg pool).

Reads give the fleet (clusters, boundaries, validated policies) and the records the status API
shows on any replica; writes record rounds and deliveries. Transient database failures raise
`DatabaseUnavailable` (see `convergerd.store.errors`); callers wait and retry. Permanent
refusals raise `DatabaseRejected`; a round's record drops only the rows refused, and every
value written is cleaned first (how: `convergerd.store.records`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import asyncpg

from convergerd.config import MAX_IDENTITY_CHARS, redact_dsn
from convergerd.core.decode import clean_text
from convergerd.core.errors import DatabaseRejected, DatabaseUnavailable
from convergerd.core.exceptions import ExceptionTally
from convergerd.core.facts import READ_NAMES, READING_NAMES, RECORDED, SEEN_COLUMN, Field, reorder
from convergerd.core.model import (
    Boundary,
    BoundaryId,
    Cluster,
    ClusterId,
    Enforcement,
    Fleet,
    InvalidPolicy,
    Policy,
    PolicyException,
    PolicyId,
    PolicyRow,
    Position,
    UnreadableJson,
)
from convergerd.core.removal import Current, Target
from convergerd.core.render import deliverable_policy, validate_policy
from convergerd.core.report import (
    ApplyResult,
    ClusterResult,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    RoundResult,
)
from convergerd.core.revisions import History, Rollback
from convergerd.core.rollout import Rollout, Staged, Start
from convergerd.core.rows import (
    BoundaryPolicy,
    BoundaryRows,
    ClusterStateRow,
    ClusterStatusRows,
    DeliveryRow,
    PendingDeletion,
    PendingDeletions,
    PolicyStatusRows,
    RoundRow,
)
from convergerd.core.spread import Claimed, Part
from convergerd.core.tokens import TokenRecord
from convergerd.store import exceptions, parts, revisions, rollouts, tenants
from convergerd.store.errors import (
    database_errors,
    is_transient,
    rejected,
    rejection_reason,
    unavailable,
)
from convergerd.store.exceptions import StoredException, exceptions_column
from convergerd.store.records import (
    RecordObserver,
    confirmed_by_listing,
    round_record,
    write_deliveries,
    write_round,
    write_round_by_cluster,
)
from convergerd.store.revisions import Pruned
from convergerd.store.schema import check_schema
from convergerd.store.tenants import Refused
from convergerd.store.values import json_column

log = logging.getLogger(__name__)


# A rule larger than this as JSON text is not sent at all (the database checks): a valid rule
# is under 25 KiB (64 entries of at most 317 characters), and one row of hundreds of MiB would
# otherwise be read and decoded by every round of every replica. `rule` is NOT NULL, so a NULL
# read back means "too large".
MAX_RULE_BYTES = 1024 * 1024


def _rule_column(table: str = "") -> str:
    """The select-list item for a policy's rule, NULL when larger than `MAX_RULE_BYTES`."""
    rule = f"{table}.rule" if table else "rule"
    return f"CASE WHEN octet_length({rule}::text) <= {MAX_RULE_BYTES} THEN {rule} END AS rule"


def _shown_column(f: Field) -> str:
    """A reading's column as status shows it: a time the row is not rewritten for is at
    least what its cluster's last listing bounds it with (`Field.listed`)."""
    column = f"d.{f.column}"
    if f.listed is None:
        return column
    return (f"GREATEST({column}, CASE WHEN {column} IS NOT NULL THEN cs.{f.listed} END)"
            f" AS {f.column}")


# A delivery row as status shows it. Rows are written when their facts change
# (`convergerd.store.records`); what the last listing of the cluster (`cluster_state cs`)
# confirmed is derived: a phase still recorded was seen then, and with it a success still held
# when the object listed was the revision delivered (an in-sync policy: `unchanged`, attempted
# and succeeded then); a probe time is at least the oldest that listing read.
_CONFIRMED = confirmed_by_listing("d", "cs")
_D_COLUMNS = f"""
    d.policy_id, d.cluster_id, d.delivered_revision,
    CASE WHEN {_CONFIRMED} THEN 'unchanged' ELSE d.last_result END AS last_result,
    CASE WHEN {_CONFIRMED} THEN cs.listed_at ELSE d.last_attempt_at END AS last_attempt_at,
    CASE WHEN {_CONFIRMED} THEN cs.listed_at ELSE d.last_success_at END AS last_success_at,
    d.last_error, d.last_reason, d.attempts, d.round_id,
    {", ".join(map(_shown_column, RECORDED))}
"""
_WITH_LISTING = "LEFT JOIN cluster_state cs ON cs.cluster_id = d.cluster_id"

# One policy for its status page, in one statement: the row, whether its boundary exists, the
# known clusters the boundary covers (computed once), and its records on every cluster.
_POLICY_STATUS = f"""
WITH p AS (
    SELECT id, boundary_id, {_rule_column()}, enabled, revision, enforcement, deleted_at,
           {exceptions_column("policies")} FROM policies
    WHERE id = $1
), s AS (
    SELECT EXISTS (SELECT 1 FROM boundaries b JOIN p ON b.id = p.boundary_id) AS boundary_known,
           ARRAY(SELECT bc.cluster_id FROM p
                 JOIN boundary_clusters bc ON bc.boundary_id = p.boundary_id
                 JOIN clusters c ON c.id = bc.cluster_id) AS scope
)
SELECT p.id, p.boundary_id, p.rule, p.enabled, p.revision, p.enforcement, p.deleted_at,
       p.exceptions,
       s.boundary_known,
       -- The scope once, on the first row: on every row it would cost clusters^2 elements
       -- (at 1,000 clusters, 1,000,000 array elements for the server to build and us to decode).
       CASE WHEN row_number() OVER (ORDER BY d.cluster_id) = 1 THEN s.scope END AS scope,
       {_D_COLUMNS}
FROM p CROSS JOIN s LEFT JOIN deliveries d ON d.policy_id = p.id {_WITH_LISTING}
ORDER BY d.cluster_id
"""  # noqa: S608 (no value is formatted in: column names only)

# One cluster for its status page, in one statement: whether the cluster exists, and for every
# policy recorded there or asked about ($2), its record there and its current revision. The
# outer join keeps one row (with `known`) when there is no policy at all.
_CLUSTER_STATUS = f"""
WITH wanted AS (
    SELECT policy_id FROM deliveries WHERE cluster_id = $1
    UNION SELECT unnest($2::text[])
)
SELECT EXISTS (SELECT 1 FROM clusters WHERE id = $1) AS known,
       w.policy_id AS wanted_id, p.revision AS current_revision, {_D_COLUMNS}
FROM (SELECT 1) AS one
LEFT JOIN (wanted w
           LEFT JOIN policies p ON p.id = w.policy_id AND p.deleted_at IS NULL
           LEFT JOIN deliveries d ON d.cluster_id = $1 AND d.policy_id = w.policy_id
           {_WITH_LISTING}) ON true
ORDER BY w.policy_id
"""  # noqa: S608 (no value is formatted in: column names only)


# A row's reading columns (`facts.READ_NAMES`) in `PhaseReading`'s order.
_reading_of_columns = reorder(tuple(f.name for f in RECORDED), READING_NAMES)


def _delivery_row(r: asyncpg.Record) -> DeliveryRow:
    reading = None  # a row without a reading time has no reading
    if r[SEEN_COLUMN] is not None:
        reading = PhaseReading(ClusterId(r["cluster_id"]), PolicyId(r["policy_id"]),
                               *_reading_of_columns(tuple(map(r.__getitem__, READ_NAMES))))
    return DeliveryRow(
        policy=r["policy_id"],
        cluster=r["cluster_id"],
        delivered_revision=r["delivered_revision"],
        last_result=ApplyResult(r["last_result"]) if r["last_result"] else None,
        last_attempt_at=r["last_attempt_at"],
        last_success_at=r["last_success_at"],
        last_error=r["last_error"],
        last_reason=r["last_reason"],
        attempts=r["attempts"],
        round_id=r["round_id"],
        reading=reading,
    )


def _policy_row(r: asyncpg.Record) -> PolicyRow:
    return PolicyRow(
        id=r["id"],
        boundary=r["boundary_id"],
        rule=r["rule"] if r["rule"] is not None else UnreadableJson(
            f"larger than {MAX_RULE_BYTES} bytes"),
        enabled=r["enabled"],
        revision=r["revision"],
        enforcement=r["enforcement"],
        exceptions=r.get("exceptions") or (),
    )


class Store:
    """The policy database. Create with `await Store.connect(dsn)`; `close()` when done."""

    # Round history kept (by id): 10,000 rounds is about five weeks at the default interval.
    rounds_kept = 10_000
    # Pending deletions status lists (oldest first): a status document stays small.
    pending_deletions_listed = 100

    def __init__(
        self, pool: asyncpg.Pool, dsn: str, *, observer: RecordObserver | None = None
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        self._observer = observer
        self._rollouts = rollouts.FleetRollouts()  # its caches live as long as the store

    @property
    def dsn(self) -> str:
        """The DSN with its password redacted, for logs and status."""
        return redact_dsn(self._dsn)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 5,
        check: bool = True,
        connect_timeout_s: float = 10.0,
        command_timeout_s: float = 60.0,
        observer: RecordObserver | None = None,
    ) -> Self:
        """Open a pool; with `check`, refuse an unmigrated schema (`SchemaNotMigrated`).
        Unreachable database: `DatabaseUnavailable` naming the redacted DSN. A statement that
        hangs longer than `command_timeout_s` is `DatabaseUnavailable` too. `observer` counts the
        rows the database refused to record."""
        try:
            with database_errors(dsn, connecting=True):
                pool = await asyncpg.create_pool(
                    dsn,
                    min_size=min_size,
                    max_size=max_size,
                    init=_init_connection,
                    timeout=connect_timeout_s,
                    command_timeout=command_timeout_s,
                )
        except (ValueError, asyncpg.ClientConfigurationError) as exc:
            # asyncpg's DSN parse errors may quote the DSN: never show it.
            raise DatabaseUnavailable(
                f"bad database URL {redact_dsn(dsn)}: {type(exc).__name__}"
            ) from None
        store = cls(pool, dsn, observer=observer)
        if check:
            try:
                async with store._acquire() as conn:
                    await check_schema(conn)
            except BaseException:
                await pool.close()
                raise
        return store

    async def close(self) -> None:
        await self._pool.close()

    def _acquire(self) -> _Acquire:
        return _Acquire(self._pool, self._dsn)

    async def ping(self) -> None:
        """A round trip to the database (for /readyz); `DatabaseUnavailable` if it fails."""
        async with self._acquire() as conn:
            await conn.fetchval("SELECT 1", timeout=5)

    # ---- the fleet ---------------------------------------------------------------------------

    async def load_fleet(self) -> Fleet:
        """Clusters, boundaries and validated policies, from one consistent snapshot. A policy
        naming a boundary that does not exist is invalid (it could reach no cluster)."""
        async with self._acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            cluster_rows = await conn.fetch("SELECT id FROM clusters ORDER BY id")
            boundary_rows = await conn.fetch(
                """SELECT b.id, array_remove(array_agg(bc.cluster_id), NULL) AS clusters
                   FROM boundaries b LEFT JOIN boundary_clusters bc ON bc.boundary_id = b.id
                   GROUP BY b.id ORDER BY b.id"""
            )
            policy_rows = await conn.fetch(
                f"""SELECT id, boundary_id, {_rule_column()}, enabled, revision, enforcement,
                           {exceptions_column("policies")}
                    FROM policies WHERE deleted_at IS NULL ORDER BY id"""  # noqa: S608
            )
            boundaries = {
                BoundaryId(r["id"]): Boundary(
                    BoundaryId(r["id"]), frozenset(ClusterId(c) for c in r["clusters"])
                )
                for r in boundary_rows
            }
            policies: list[Policy] = []
            invalid: list[InvalidPolicy] = []
            for result in _validate_all([_policy_row(r) for r in policy_rows], boundaries):
                if isinstance(result, Policy):
                    policies.append(result)
                else:
                    invalid.append(result)
            staging = await self._rollouts.read(
                conn, policies, {b.id: b.clusters for b in boundaries.values()})
        if staging.invalid:  # a strategy that cannot be used: not delivered, reported
            invalid += [InvalidPolicy(p.id, p.boundary, p.revision, staging.invalid[p.id])
                        for p in policies if p.id in staging.invalid]
            invalid.sort(key=lambda bad: bad.id)
            policies = [p for p in policies if p.id not in staging.invalid]
        return Fleet(
            clusters=[Cluster(ClusterId(r["id"])) for r in cluster_rows],
            boundaries=boundaries,
            policies=policies,
            invalid=invalid,
            staged=staging.staged,
            positions=staging.positions,
        )

    async def get_policy(self, policy_id: str) -> PolicyRow | None:
        """The stored row (not validated), or None if there is none or it is being deleted."""
        async with self._acquire() as conn:
            row = await conn.fetchrow(
                f"""SELECT id, boundary_id, {_rule_column()}, enabled, revision, enforcement,
                           {exceptions_column("policies")}
                    FROM policies WHERE id = $1 AND deleted_at IS NULL""",  # noqa: S608
                policy_id,
            )
        return _policy_row(row) if row is not None else None

    async def set_enforcement(self, policy_id: str, enforcement: Enforcement) -> None:
        """Store a policy's mode (the save endpoint's `enforcement`); a change is a new
        revision (the trigger of migration 0008). Nothing is written, so nothing notified, when
        the mode is already the one stored, or there is no such policy or its deletion has
        begun: the save that follows answers those."""
        async with self._acquire() as conn, conn.transaction():
            await revisions.set_actor(conn, "admin token (POST /v1/policies/{id}/apply)")
            await conn.execute(
                """UPDATE policies SET enforcement = $2
                   WHERE id = $1 AND deleted_at IS NULL AND enforcement IS DISTINCT FROM $2""",
                policy_id, enforcement.value,
            )

    async def policy_scope(self, policy_id: str) -> frozenset[ClusterId]:
        """The known clusters the policy's boundary covers now (empty for an unknown policy)."""
        async with self._acquire() as conn:
            rows = await conn.fetch(
                """SELECT bc.cluster_id FROM policies p
                   JOIN boundary_clusters bc ON bc.boundary_id = p.boundary_id
                   JOIN clusters c ON c.id = bc.cluster_id
                   WHERE p.id = $1 AND p.deleted_at IS NULL""",
                policy_id,
            )
        return frozenset(ClusterId(r["cluster_id"]) for r in rows)

    async def policy_status(self, policy_id: str) -> PolicyStatusRows | None:
        """Everything `/v1/policies/{id}/status` shows of one policy, in one query; None when
        there is no such policy. A policy being deleted is shown with when its deletion began
        (its records say which clusters still hold it). The row is validated now, so a row
        fixed since the last round is not reported invalid."""
        async with self._acquire() as conn:
            rows = await conn.fetch(_POLICY_STATUS, policy_id)
        if not rows:
            return None
        first = rows[0]
        policy = _policy_row(first)
        checked = deliverable_policy(policy, boundary_exists=first["boundary_known"])
        return PolicyStatusRows(
            policy=policy,
            invalid=checked.reason if isinstance(checked, InvalidPolicy) else None,
            scope=frozenset(ClusterId(c) for c in first["scope"]),
            deliveries=tuple(_delivery_row(r) for r in rows if r["policy_id"] is not None),
            deletion_requested_at=first["deleted_at"],
        )

    async def boundary_status(self, boundary: str, most: int) -> BoundaryRows | None:
        """Everything `/v1/boundaries/{boundary}` reads of one boundary, in one snapshot: the
        known clusters it covers, its first `most` policies by id (each validated now), how
        many it has and its live rollouts; None when there is no such boundary."""
        async with self._acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            if not await conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM boundaries WHERE id = $1)", boundary):
                return None
            clusters = await conn.fetch(
                """SELECT bc.cluster_id FROM boundary_clusters bc
                   JOIN clusters c ON c.id = bc.cluster_id
                   WHERE bc.boundary_id = $1 ORDER BY bc.cluster_id""", boundary)
            rows = await conn.fetch(
                f"""SELECT id, boundary_id, {_rule_column()}, enabled, revision, enforcement,
                           deleted_at, count(*) OVER () AS total, {exceptions_column("policies")}
                    FROM policies WHERE boundary_id = $1 ORDER BY id LIMIT $2""",  # noqa: S608
                boundary, most)
            live = await rollouts.live_ids(conn, boundary)
        policies = []
        for r in rows:
            row = _policy_row(r)
            checked = deliverable_policy(row, boundary_exists=True)
            policies.append(BoundaryPolicy(
                row, checked.reason if isinstance(checked, InvalidPolicy) else None,
                r["deleted_at"]))
        return BoundaryRows(clusters=tuple(ClusterId(r["cluster_id"]) for r in clusters),
                            policies=tuple(policies),
                            policies_total=rows[0]["total"] if rows else 0,
                            rollouts=live)

    # ---- read tokens (`store.tenants`) -------------------------------------------------------

    async def create_token(self, *, name: str, boundary: str, digest: bytes, by: str,
                           expires_at: dt.datetime | None) -> TokenRecord | Refused:
        async with self._acquire() as conn:
            return await tenants.create(conn, name=name, boundary=boundary, digest=digest,
                                        by=by, expires_at=expires_at)

    async def tokens(self, *, revoked: bool = False) -> list[TokenRecord]:
        async with self._acquire() as conn:
            return await tenants.listed(conn, revoked=revoked)

    async def revoke_token(self, name: str, *, by: str) -> TokenRecord | None:
        async with self._acquire() as conn:
            return await tenants.revoke(conn, name=name, by=by)

    async def live_tokens(self) -> list[tuple[bytes, TokenRecord]]:
        async with self._acquire() as conn:
            return await tenants.live(conn)

    # ---- revisions (`store.revisions`) --------------------------------------------------------

    async def revision_history(self, policy_id: str, *, before: int | None,
                               limit: int) -> History | None:
        async with self._acquire() as conn:
            return await revisions.history(conn, policy_id, before=before, limit=limit)

    async def rollback(self, policy_id: str, to: int, *, actor: str) -> Rollback:
        """The content of revision `to` as the policy's new revision (see
        `revisions.rollback`), refused (nothing written) when that is not a valid policy now,
        as a save would find it."""

        async def check(conn: asyncpg.Connection) -> str | None:
            target = await _target(conn, policy_id)
            if target is None:
                return "the row is gone"
            found = deliverable_policy(target.row, boundary_exists=target.boundary_exists)
            return found.reason if isinstance(found, InvalidPolicy) else None

        async with self._acquire() as conn:
            return await revisions.rollback(conn, policy_id, to, actor=actor, check=check)

    async def prune_revisions(self, *, keep_last: int, max_age_days: float,
                              batches: int) -> Pruned:
        async with self._acquire() as conn:
            return await revisions.prune(conn, keep_last=keep_last, max_age_days=max_age_days,
                                         batches=batches)

    # ---- rollouts (`store.rollouts`) ---------------------------------------------------------

    async def start_rollout(self, policy_id: str, revision: int, *, by: str,
                            already_delivered: bool, now: bool = False) -> Start:
        """What a save of `revision` delivers, its rollout started if it has a strategy (see
        `rollouts.start`)."""
        async with self._acquire() as conn:
            return await rollouts.start(conn, policy_id, revision, by=by,
                                        already_delivered=already_delivered, now=now)

    async def staged_rollout(self, policy_id: str, *,
                             boundary: str | None = None) -> Staged | None:
        """The policy's rollout in force; with `boundary`, only while the policy is in it."""
        async with self._acquire() as conn:
            return await rollouts.staged_of(conn, policy_id, boundary)

    async def live_rollouts(self) -> list[Rollout]:
        async with self._acquire() as conn:
            return await rollouts.live(conn)

    async def unsaved_revisions(self, *, older_than_s: float, limit: int
                                ) -> list[tuple[PolicyId, int]]:
        """Policies whose newest revision has a strategy and no rollout: its save never ran
        (`rollouts.unsaved`)."""
        async with self._acquire() as conn:
            return await rollouts.unsaved(conn, older_than_s=older_than_s, limit=limit)

    async def boundary_rollouts(self, boundary: str) -> list[Rollout] | None:
        """The live rollouts of `boundary`'s policies; None: no such boundary."""
        async with self._acquire() as conn:
            return await rollouts.live_in(conn, boundary)

    async def rollout_of(self, policy_id: str, *, boundary: str | None = None) -> Rollout | None:
        """The policy's newest rollout, whatever its state; with `boundary`, only one of its
        revisions in that boundary while the policy is there (`rollouts.newest_of`)."""
        async with self._acquire() as conn:
            return await rollouts.newest_of(conn, policy_id, boundary)

    async def rollout_events(self, rollout_id: int, limit: int) -> list[rollouts.Event]:
        async with self._acquire() as conn:
            return await rollouts.events(conn, rollout_id, limit)

    async def transition_rollout(self, before: Rollout, after: Rollout, *, by: str, what: str,
                                 detail: str | None = None,
                                 remaining_s: Callable[[], float]) -> Rollout | None:
        """`after` written with a compare-and-set on `before` under the fence (see
        `rollouts.transition`); None when another writer moved the row on first."""
        async with self._acquire() as conn:
            return await rollouts.transition(conn, before, after, by=by, what=what,
                                             detail=detail, remaining_s=remaining_s)

    async def record_rollout_event(self, rollout_id: int, *, by: str, what: str,
                                   wave: int | None = None, detail: str | None = None) -> None:
        async with self._acquire() as conn:
            await rollouts.record_event(conn, rollout_id, by=by, what=what, wave=wave,
                                        detail=detail)

    async def pending_deletions(self) -> PendingDeletions:
        """Policies whose deletion began and has not finished: how many, and the oldest
        `pending_deletions_listed` of them, each with the clusters still recorded as holding
        it."""
        async with self._acquire() as conn:
            rows = await conn.fetch(
                """SELECT p.id, p.deleted_at, count(*) OVER () AS total,
                          (SELECT count(*) FROM deliveries d WHERE d.policy_id = p.id)
                              AS holders,
                          ARRAY(SELECT d.cluster_id FROM deliveries d WHERE d.policy_id = p.id
                                ORDER BY d.cluster_id LIMIT 5) AS held_by
                   FROM policies p WHERE p.deleted_at IS NOT NULL
                   ORDER BY p.deleted_at, p.id LIMIT $1""",
                self.pending_deletions_listed,
            )
        return PendingDeletions(
            total=rows[0]["total"] if rows else 0,
            oldest_first=tuple(
                PendingDeletion(PolicyId(r["id"]), r["deleted_at"], r["holders"],
                                tuple(ClusterId(c) for c in r["held_by"]))
                for r in rows),
        )

    async def cluster_status(
        self, cluster_id: str, policies: Sequence[str] = ()
    ) -> ClusterStatusRows:
        """Everything `/v1/clusters/{id}` reads of one cluster, in one query: whether it is
        known, its records, and the current revision of each policy recorded there or named in
        `policies` (what this replica saw there itself)."""
        async with self._acquire() as conn:
            rows = await conn.fetch(_CLUSTER_STATUS, cluster_id, list(policies))
        return ClusterStatusRows(
            known=bool(rows[0]["known"]),
            deliveries=tuple(_delivery_row(r) for r in rows if r["policy_id"] is not None),
            current={PolicyId(r["wanted_id"]): r["current_revision"] for r in rows
                     if r["current_revision"] is not None},
        )

    async def recorded_invalid(self) -> list[InvalidPolicy]:
        """The invalid policies the last round that ran recorded (cheap: no validation)."""
        async with self._acquire() as conn:
            rows = await conn.fetch(
                """SELECT policy_id, boundary_id, revision, reason FROM invalid_policies
                   ORDER BY policy_id""")
        return [InvalidPolicy(r["policy_id"], r["boundary_id"], r["revision"], r["reason"])
                for r in rows]

    async def invalid_policies(self) -> list[InvalidPolicy]:
        """Policies that cannot be delivered, validated now from the current rows (so a fixed
        row stops being reported at once, and standbys answer before any round)."""
        return list((await self.load_fleet()).invalid)

    # ---- records -----------------------------------------------------------------------------

    async def record_round(self, report: RoundReport, *, identity: str) -> int:
        """Record a round in one transaction: the round, each cluster's state, every delivery
        and phase reading, and the invalid policies it saw. Returns the round id.

        Values are cleaned first; if the database still refuses the record for good, it is
        written again cluster by cluster so that only the refused rows are dropped (logged
        and counted on the observer; see `convergerd.store.records`). Raises
        `DatabaseUnavailable` (record it later), or `DatabaseRejected` when even the round's
        own row is refused."""
        record = await round_record(report, identity)
        try:
            async with self._acquire() as conn, conn.transaction():
                round_id = await write_round(conn, record, kept=self.rounds_kept)
        except DatabaseRejected as exc:
            log.warning("the database refused the round's record (%s); recording it cluster "
                        "by cluster", exc, extra={"reason": exc.reason})
        else:
            return round_id
        async with self._acquire() as conn, conn.transaction():
            return await write_round_by_cluster(conn, record, kept=self.rounds_kept,
                                                observer=self._observer)

    async def record_deliveries(self, deliveries: Sequence[Delivery]) -> None:
        """Record deliveries made outside a round (a save): `round_id` stays NULL."""
        if not deliveries:
            return
        async with self._acquire() as conn, conn.transaction():
            await write_deliveries(conn, deliveries)

    # ---- what the status API reads -----------------------------------------------------------

    async def last_round(self) -> RoundRow | None:
        async with self._acquire() as conn:
            # By start, not by id: a round recorded late is not the last one.
            r = await conn.fetchrow(
                "SELECT * FROM rounds ORDER BY started_at DESC, id DESC LIMIT 1")
        if r is None:
            return None
        # Replica identities, bounded as a Lease holder is (`leader.lease.MAX_HOLDER_CHARS`):
        # /status shows who ran the last round.
        holder = _identity(r["epoch_holder"])
        return RoundRow(
            id=r["id"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            result=RoundResult(r["result"]),
            epoch=Epoch(holder, r["epoch_transitions"] or 0) if holder is not None else None,
            identity=_identity(r["identity"]) or "",
            # Written by rounds as a flat object; anything else (unreadable included) is none.
            counts=r["counts"] if isinstance(r["counts"], dict) else {},
            error=r["error"],
        )

    async def cluster_states(self) -> list[ClusterStateRow]:
        """Every cluster in the fleet, with its latest outcome (never-attempted ones too)."""
        async with self._acquire() as conn:
            rows = await conn.fetch(
                """SELECT c.id AS cluster_id, s.reachable, s.last_attempt_at, s.last_success_at,
                          s.last_reached_at, s.last_error, s.last_reason,
                          COALESCE(s.desired, 0) AS desired, COALESCE(s.in_sync, 0) AS in_sync,
                          COALESCE(s.failed, 0) AS failed, s.server_version, s.round_id
                   FROM clusters c LEFT JOIN cluster_state s ON s.cluster_id = c.id
                   ORDER BY c.id"""
            )
        return [
            ClusterStateRow(
                cluster=ClusterId(r["cluster_id"]),
                reachable=r["reachable"],
                last_attempt_at=r["last_attempt_at"],
                last_success_at=r["last_success_at"],
                last_reached_at=r["last_reached_at"],
                last_error=r["last_error"],
                last_reason=r["last_reason"],
                desired=r["desired"],
                in_sync=r["in_sync"],
                failed=r["failed"],
                server_version=r["server_version"],
                round_id=r["round_id"],
            )
            for r in rows
        ]

    async def _deliveries(self, where: str, *args: Any) -> list[DeliveryRow]:
        """Delivery records by `where`: the callers' literal clause after WHERE (ORDER BY
        included); values only as `args`."""
        query = f"SELECT {_D_COLUMNS} FROM deliveries d {_WITH_LISTING} WHERE {where}"  # noqa: S608
        async with self._acquire() as conn:
            rows = await conn.fetch(query, *args)
        return [_delivery_row(r) for r in rows]

    async def deliveries_for_policy(self, policy_id: str) -> list[DeliveryRow]:
        return await self._deliveries("d.policy_id = $1 ORDER BY d.cluster_id", policy_id)

    async def deliveries_for_clusters(self, cluster_ids: Sequence[str]) -> list[DeliveryRow]:
        """The records of several clusters in one query (a standby catching up)."""
        if not cluster_ids:
            return []
        return await self._deliveries(
            "d.cluster_id = ANY($1::text[]) ORDER BY d.cluster_id, d.policy_id",
            list(cluster_ids)
        )

    async def deliveries_for_cluster(self, cluster_id: str) -> list[DeliveryRow]:
        return await self._deliveries("d.cluster_id = $1 ORDER BY d.policy_id", cluster_id)

    # ---- saves and deletions -----------------------------------------------------------------

    async def save_target(self, policy_id: str) -> Target | None:
        """The row (being deleted or not), its scope and the clusters holding it, in one
        snapshot; None when there is no such row."""
        async with self._acquire() as conn, conn.transaction(
            isolation="repeatable_read", readonly=True
        ):
            target = await _target(conn, policy_id)
        return target  # noqa: RET504 - returning inside `async with` reads to mypy as maybe-None

    async def begin_deletion(self, policy_id: str) -> Target | None:
        """Mark the policy as being deleted (rounds stop delivering it from now on; a round
        that read it before checks again at write time) and return what to remove where."""
        async with self._acquire() as conn, conn.transaction():
            marked = await conn.fetchval(
                """UPDATE policies SET deleted_at = COALESCE(deleted_at, now())
                   WHERE id = $1 RETURNING id""",
                policy_id,
            )
            if marked is not None:
                await rollouts.abort_for_deletion(conn, policy_id, by="convergerd (DELETE "
                                                  "/v1/policies/{id})")
            target = await _target(conn, policy_id) if marked is not None else None
        return target  # noqa: RET504 - see save_target

    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str]) -> bool:
        """Forget the policy on the clusters it was removed from, then delete the marked row
        (its other records go with it), in one transaction; False if it was not marked.

        The database refuses to delete a policy some cluster is recorded as holding (migration
        `0003`): `DatabaseRejected` (reason `constraint`) when a cluster not in `removed_from`
        holds it, and nothing changes."""
        async with self._acquire() as conn, conn.transaction():
            await revisions.set_actor(conn, "convergerd (DELETE /v1/policies/{id})")
            await conn.execute(
                "DELETE FROM deliveries WHERE policy_id = $1 AND cluster_id = ANY($2::text[])",
                policy_id, list(removed_from),
            )
            gone = await conn.fetchval(
                "DELETE FROM policies WHERE id = $1 AND deleted_at IS NOT NULL RETURNING id",
                policy_id,
            )
        return gone is not None

    async def forget_deliveries(self, policy_id: str, clusters: Sequence[str]) -> None:
        """The policy was removed from these clusters: it is no longer held there."""
        if not clusters:
            return
        async with self._acquire() as conn:
            await conn.execute(
                "DELETE FROM deliveries WHERE policy_id = $1 AND cluster_id = ANY($2::text[])",
                policy_id, list(clusters),
            )

    async def current(self, policy_ids: Sequence[PolicyId]) -> dict[PolicyId, Current]:
        """Revision, deletion mark and newest rollout's position of each row that still exists
        (the round's write-time check: no rule is read)."""
        async with self._acquire() as conn:
            rows = await conn.fetch(
                """SELECT id, revision, deleted_at IS NOT NULL AS deleting,
                          r.rollout_id, r.state, r.wave, r.warn_step
                   FROM policies LEFT JOIN LATERAL (
                       SELECT r.id AS rollout_id, r.state, r.wave, r.warn_step FROM rollouts r
                       WHERE r.policy_id = policies.id ORDER BY r.id DESC LIMIT 1) r ON true
                   WHERE id = ANY($1::text[])""",
                list(policy_ids),
            )
        return {PolicyId(r["id"]): Current(
            revision=r["revision"], deleting=r["deleting"],
            rollout=None if r["rollout_id"] is None else Position(
                r["rollout_id"], r["state"], r["wave"], r["warn_step"]),
        ) for r in rows}

    async def current_policy(self, policy_id: PolicyId) -> Policy | None:
        """The policy as its row is now, validated; None when there is no row, its deletion
        has begun, or the row is not a deliverable policy now."""
        row = await self.get_policy(policy_id)
        if row is None:
            return None
        valid = validate_policy(row)
        return valid if isinstance(valid, Policy) else None

    # ---- exceptions (`convergerd.store.exceptions`) -------------------------------------------

    async def grant_exception(self, policy_id: str, exception: PolicyException) -> int:
        """Store a checked exception; the policy's new revision (`exceptions.grant`)."""
        async with self._acquire() as conn:
            return await exceptions.grant(conn, policy_id, exception)

    async def withdraw_exception(self, policy_id: str, exception_id: str,
                                 actor: str) -> tuple[dict[str, Any], int] | None:
        async with self._acquire() as conn:
            return await exceptions.withdraw(conn, policy_id, exception_id, actor)

    async def list_exceptions(self, policy_id: str | None = None) -> list[StoredException]:
        async with self._acquire() as conn:
            return await exceptions.listed(conn, policy_id)

    async def lapse_exceptions(self) -> tuple[list[tuple[str, str, int]], dt.datetime | None]:
        async with self._acquire() as conn:
            return await exceptions.lapse(conn)

    async def exception_tally(self, soon_s: float) -> list[ExceptionTally]:
        async with self._acquire() as conn:
            return await exceptions.tally(conn, soon_s)

    # ---- a save spread over the shard holders (`convergerd.store.parts`) ---------------------

    async def post_save_parts(
        self, policy_id: str, revision: int, requested_by: str, asked: Sequence[Part],
        wait_s: float,
    ) -> int:
        """Ask the holders for their parts (notified on commit); the request's id. The parts
        expire `wait_s` from now on the database's clock."""
        async with self._acquire() as conn, conn.transaction():
            return await parts.post(conn, policy_id=policy_id, revision=revision,
                                    requested_by=requested_by, parts=asked, wait_s=wait_s)

    async def save_parts_done(self, request_id: int, asked: int) -> frozenset[int]:
        async with self._acquire() as conn:
            return await parts.done_parts(conn, request_id, asked)

    async def save_part_results(self, request_id: int, limit: int) -> list[ClusterResult]:
        async with self._acquire() as conn:
            return await parts.results(conn, request_id, limit)

    async def end_save_parts(self, request_id: int) -> None:
        async with self._acquire() as conn:
            await parts.end(conn, request_id)

    async def claim_save_parts(
        self, identity: str, held: Sequence[int], limit: int
    ) -> list[Claimed]:
        async with self._acquire() as conn, conn.transaction():
            return await parts.claim(conn, identity, held, limit)

    async def save_part_items(
        self, request_id: int, shard: int, limit: int
    ) -> list[tuple[object, object, object]]:
        async with self._acquire() as conn:
            return await parts.items(conn, request_id, shard, limit)

    async def finish_save_part(
        self, identity: str, request_id: int, shard: int, done: Sequence[ClusterResult]
    ) -> None:
        async with self._acquire() as conn, conn.transaction():
            await parts.finish(conn, identity, request_id, shard, done)


async def _target(conn: asyncpg.Connection, policy_id: str) -> Target | None:
    row = await conn.fetchrow(
        f"""SELECT p.id, p.boundary_id, {_rule_column("p")}, p.enabled, p.revision,
                  p.enforcement, p.deleted_at IS NOT NULL AS deleting, {exceptions_column("p")},
                  EXISTS (SELECT 1 FROM boundaries b WHERE b.id = p.boundary_id) AS boundary_exists,
                  ARRAY(SELECT bc.cluster_id FROM boundary_clusters bc
                        JOIN clusters c ON c.id = bc.cluster_id
                        WHERE bc.boundary_id = p.boundary_id) AS scope,
                  ARRAY(SELECT d.cluster_id FROM deliveries d
                        WHERE d.policy_id = p.id ORDER BY d.cluster_id) AS holders,
                  -- Aligned with holders: the same rows in the same order and snapshot.
                  ARRAY(SELECT d.delivered_revision FROM deliveries d
                        WHERE d.policy_id = p.id ORDER BY d.cluster_id) AS revisions
           FROM policies p WHERE p.id = $1""",  # noqa: S608 (no value is formatted in)
        policy_id,
    )
    if row is None:
        return None
    delivered = {ClusterId(c): r for c, r in zip(row["holders"], row["revisions"],
                                                   strict=True) if r is not None}
    return Target(
        row=_policy_row(row),
        deleting=row["deleting"],
        boundary_exists=row["boundary_exists"],
        scope=frozenset(ClusterId(c) for c in row["scope"]),
        holders=frozenset(ClusterId(c) for c in row["holders"]),
        delivered=delivered,
    )


def _validate_all(
    rows: Sequence[PolicyRow], boundaries: Mapping[BoundaryId, Boundary]
) -> list[Policy | InvalidPolicy]:
    return [deliverable_policy(row, boundary_exists=BoundaryId(row.boundary) in boundaries)
            for row in rows]


async def _init_connection(conn: asyncpg.Connection) -> None:
    # Every JSON value read goes through the bounded decoder; one it will not read becomes an
    # `UnreadableJson` marker, so only its row fails (a rule: that policy is invalid).
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(
            kind, encoder=json.dumps, decoder=json_column, schema="pg_catalog"
        )


class _Acquire:
    """`async with`: a pooled connection; transient failures inside become
    `DatabaseUnavailable`, permanent refusals `DatabaseRejected`. A connection closed under us
    (server restart, terminated backend) makes asyncpg raise `InterfaceError` on its next use;
    that is classified by the connection's state (closed, or taken back by the pool), not by
    the message."""

    def __init__(self, pool: asyncpg.Pool, dsn: str) -> None:
        self._pool = pool
        self._dsn = dsn
        self._conn: Any = None

    async def __aenter__(self) -> asyncpg.Connection:
        with database_errors(self._dsn, connecting=True):
            self._conn = await self._pool.acquire(timeout=10)
        conn: asyncpg.Connection = self._conn
        return conn

    def _closed(self) -> bool:
        try:
            return bool(self._conn.is_closed())
        except asyncpg.InterfaceError:
            return True  # the proxy was detached: the pool took the closed connection back

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        lost = isinstance(exc, asyncpg.InterfaceError) and self._closed()
        try:
            await self._pool.release(self._conn)
        except Exception as release_error:
            # A broken connection is discarded by the pool; the first error is the story.
            if exc is None and is_transient(release_error):
                raise unavailable(self._dsn, release_error) from release_error
        if (
            isinstance(exc, Exception)
            and not isinstance(exc, DatabaseUnavailable)
            and (lost or is_transient(exc))
        ):
            raise unavailable(self._dsn, exc) from exc
        reason = rejection_reason(exc) if isinstance(exc, Exception) else None
        if exc is not None and reason is not None:
            raise rejected(exc, reason) from exc


def _identity(value: str | None) -> str | None:
    return clean_text(value, MAX_IDENTITY_CHARS) if value is not None else None
