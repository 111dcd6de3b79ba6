"""`Store`: what convergerd reads from and records in the policy database (asyncpg pool).

Reads give the fleet (clusters, boundaries, validated policies) and the records the status API
shows on any replica; writes record rounds and deliveries. Transient database failures raise
`DatabaseUnavailable` (see `convergerd.store.errors`); callers wait and retry. Permanent
refusals raise `DatabaseRejected`; a round's record drops only the rows refused (see
`Store.record_round`), every value written is cleaned first (`convergerd.store.values`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Self

import asyncpg

from convergerd.config import redact_dsn
from convergerd.errors import DatabaseRejected, DatabaseUnavailable
from convergerd.model import (
    Boundary,
    BoundaryId,
    Cluster,
    ClusterId,
    Fleet,
    InvalidPolicy,
    Policy,
    PolicyRow,
    validate_policy,
)
from convergerd.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    RoundResult,
)
from convergerd.store.errors import (
    database_errors,
    describe,
    is_transient,
    rejected,
    rejection_reason,
    unavailable,
)
from convergerd.store.schema import check_schema
from convergerd.store.values import for_log, pg_count, pg_revision, pg_text

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundRow:
    id: int
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: RoundResult
    epoch: Epoch | None
    identity: str
    counts: Mapping[str, int]
    error: str | None


@dataclass(frozen=True, slots=True)
class ClusterStateRow:
    """A cluster's latest outcome. A cluster never attempted has `reachable` None and no times."""

    cluster: ClusterId
    reachable: bool | None
    last_attempt_at: dt.datetime | None
    last_success_at: dt.datetime | None  # last time it fully converged
    last_reached_at: dt.datetime | None
    last_error: str | None
    last_reason: str | None
    desired: int
    in_sync: int
    failed: int
    server_version: str | None
    round_id: int | None


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """One policy on one cluster: the last delivery and the last phase read back."""

    policy: str
    cluster: str
    delivered_revision: int | None
    last_result: ApplyResult | None
    last_attempt_at: dt.datetime | None
    last_success_at: dt.datetime | None
    last_error: str | None
    last_reason: str | None
    attempts: int  # consecutive failed attempts; 0 after a success
    round_id: int | None  # None when written by a save
    phase: str | None
    phase_reason: str | None
    phase_message: str | None
    phase_revision: int | None
    phase_seen_at: dt.datetime | None


# Deliveries and phase readings, merged per policy and cluster, are copied (binary COPY) into a
# temporary table, then upserted in one statement: each row is rewritten once per round. Older
# facts never overwrite newer ones (a save racing a round, a late record).
_INCOMING_COLUMNS = (
    "policy_id", "cluster_id", "revision", "result", "at", "error", "reason", "attempts",
    "phase", "phase_reason", "phase_message", "phase_revision", "phase_seen_at",
)
_CREATE_INCOMING = """
CREATE TEMPORARY TABLE incoming_deliveries (
    policy_id text, cluster_id text, revision bigint, result text, at timestamptz,
    error text, reason text, attempts integer, phase text, phase_reason text,
    phase_message text, phase_revision bigint, phase_seen_at timestamptz
) ON COMMIT DROP
"""
_UPSERT_DELIVERIES = """
INSERT INTO deliveries AS d (
    policy_id, cluster_id, delivered_revision, last_result, last_attempt_at, last_success_at,
    last_error, last_reason, attempts, round_id,
    phase, phase_reason, phase_message, phase_revision, phase_seen_at)
SELECT u.policy_id, u.cluster_id,
       CASE WHEN u.result <> 'failed' THEN u.revision END,
       u.result, u.at,
       CASE WHEN u.result <> 'failed' THEN u.at END,
       u.error, u.reason,
       CASE WHEN u.result = 'failed' THEN u.attempts ELSE 0 END,
       $1::bigint,
       u.phase, u.phase_reason, u.phase_message, u.phase_revision, u.phase_seen_at
FROM incoming_deliveries u
ON CONFLICT (policy_id, cluster_id) DO UPDATE SET
    (delivered_revision, last_result, last_attempt_at, last_success_at, last_error,
     last_reason, attempts, round_id) =
    (SELECT CASE WHEN NOT fresh THEN d.delivered_revision
                 ELSE COALESCE(EXCLUDED.delivered_revision, d.delivered_revision) END,
            CASE WHEN fresh THEN EXCLUDED.last_result ELSE d.last_result END,
            CASE WHEN fresh THEN EXCLUDED.last_attempt_at ELSE d.last_attempt_at END,
            CASE WHEN NOT fresh THEN d.last_success_at
                 ELSE COALESCE(EXCLUDED.last_success_at, d.last_success_at) END,
            CASE WHEN fresh THEN EXCLUDED.last_error ELSE d.last_error END,
            CASE WHEN fresh THEN EXCLUDED.last_reason ELSE d.last_reason END,
            CASE WHEN NOT fresh THEN d.attempts
                 WHEN EXCLUDED.last_result = 'failed' THEN d.attempts + EXCLUDED.attempts
                 ELSE 0 END,
            CASE WHEN fresh THEN EXCLUDED.round_id ELSE d.round_id END
     FROM (SELECT EXCLUDED.last_attempt_at IS NOT NULL
                  AND (d.last_attempt_at IS NULL
                       OR d.last_attempt_at <= EXCLUDED.last_attempt_at) AS fresh) AS f),
    (phase, phase_reason, phase_message, phase_revision, phase_seen_at) =
    (SELECT CASE WHEN seen THEN EXCLUDED.phase ELSE d.phase END,
            CASE WHEN seen THEN EXCLUDED.phase_reason ELSE d.phase_reason END,
            CASE WHEN seen THEN EXCLUDED.phase_message ELSE d.phase_message END,
            CASE WHEN seen THEN EXCLUDED.phase_revision ELSE d.phase_revision END,
            CASE WHEN seen THEN EXCLUDED.phase_seen_at ELSE d.phase_seen_at END
     FROM (SELECT EXCLUDED.phase_seen_at IS NOT NULL
                  AND (d.phase_seen_at IS NULL
                       OR d.phase_seen_at <= EXCLUDED.phase_seen_at) AS seen) AS s)
"""

# A round recorded late (kept while the database was down) must not overwrite the outcome of a
# newer one: only a later success or reach time is taken from it.
_UPSERT_CLUSTER_STATE = """
INSERT INTO cluster_state AS s (
    cluster_id, last_attempt_at, last_success_at, last_reached_at, reachable, last_error,
    last_reason, desired, in_sync, failed, server_version, duration_s, round_id)
SELECT u.cluster_id, $2::timestamptz,
       CASE WHEN u.converged THEN $2::timestamptz END,
       CASE WHEN u.reached THEN $2::timestamptz END,
       u.reached, u.error, u.reason, u.desired, u.in_sync, u.failed, u.server_version,
       u.duration_s, $1::bigint
FROM unnest($3::text[], $4::boolean[], $5::boolean[], $6::text[], $7::text[], $8::int[],
            $9::int[], $10::int[], $11::text[], $12::float8[])
     AS u(cluster_id, reached, converged, error, reason, desired, in_sync, failed,
          server_version, duration_s)
ON CONFLICT (cluster_id) DO UPDATE SET
    last_success_at = GREATEST(EXCLUDED.last_success_at, s.last_success_at),
    last_reached_at = GREATEST(EXCLUDED.last_reached_at, s.last_reached_at),
    (last_attempt_at, reachable, last_error, last_reason, desired, in_sync, failed,
     server_version, duration_s, round_id) =
    (SELECT CASE WHEN fresh THEN EXCLUDED.last_attempt_at ELSE s.last_attempt_at END,
            CASE WHEN fresh THEN EXCLUDED.reachable ELSE s.reachable END,
            CASE WHEN fresh THEN EXCLUDED.last_error ELSE s.last_error END,
            CASE WHEN fresh THEN EXCLUDED.last_reason ELSE s.last_reason END,
            CASE WHEN fresh THEN EXCLUDED.desired ELSE s.desired END,
            CASE WHEN fresh THEN EXCLUDED.in_sync ELSE s.in_sync END,
            CASE WHEN fresh THEN EXCLUDED.failed ELSE s.failed END,
            CASE WHEN fresh THEN COALESCE(EXCLUDED.server_version, s.server_version)
                 ELSE COALESCE(s.server_version, EXCLUDED.server_version) END,
            CASE WHEN fresh THEN EXCLUDED.duration_s ELSE s.duration_s END,
            CASE WHEN fresh THEN EXCLUDED.round_id ELSE s.round_id END
     FROM (SELECT s.last_attempt_at IS NULL
                  OR s.last_attempt_at <= EXCLUDED.last_attempt_at AS fresh) AS f)
"""

_REPLACE_INVALID = """
WITH gone AS (
    DELETE FROM invalid_policies WHERE NOT (policy_id = ANY($1::text[]))
)
INSERT INTO invalid_policies AS i (
    policy_id, boundary_id, revision, reason, first_seen_at, seen_at, round_id)
SELECT u.policy_id, u.boundary_id, u.revision, u.reason, $4, $4, $5
FROM unnest($1::text[], $2::text[], $3::bigint[], $6::text[])
     AS u(policy_id, boundary_id, revision, reason)
ON CONFLICT (policy_id) DO UPDATE SET
    boundary_id = EXCLUDED.boundary_id,
    first_seen_at = CASE WHEN i.revision = EXCLUDED.revision AND i.reason = EXCLUDED.reason
                         THEN i.first_seen_at ELSE EXCLUDED.first_seen_at END,
    revision = EXCLUDED.revision,
    reason = EXCLUDED.reason,
    seen_at = EXCLUDED.seen_at,
    round_id = EXCLUDED.round_id
"""

_DELIVERY_COLUMNS = """
    policy_id, cluster_id, delivered_revision, last_result, last_attempt_at, last_success_at,
    last_error, last_reason, attempts, round_id, phase, phase_reason, phase_message,
    phase_revision, phase_seen_at
"""


def _delivery_row(r: asyncpg.Record) -> DeliveryRow:
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
        phase=r["phase"],
        phase_reason=r["phase_reason"],
        phase_message=r["phase_message"],
        phase_revision=r["phase_revision"],
        phase_seen_at=r["phase_seen_at"],
    )


def _policy_row(r: asyncpg.Record) -> PolicyRow:
    return PolicyRow(
        id=r["id"],
        boundary=r["boundary_id"],
        rule=r["rule"],
        enabled=r["enabled"],
        revision=r["revision"],
    )


def _utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: convergerd records UTC-aware times")
    return value


class _Cleaner:
    """Applies `convergerd.store.values` to every value a record writes, and notes what it
    changed or dropped, so one log line per record names the clusters and policies."""

    _EXAMPLES = 5

    def __init__(self) -> None:
        self.changed = 0
        self.examples: list[str] = []
        self._good_ids: set[str] = set()  # ids repeat on every row: checked once

    def note(
        self, cluster: str | None, policy: str | None, column: str, value: object, what: str
    ) -> None:
        self.changed += 1
        if len(self.examples) < self._EXAMPLES:
            where = " ".join(
                f"{name} {for_log(v)}" for name, v in (("cluster", cluster), ("policy", policy))
                if v is not None)
            self.examples.append(f"{where} {column} {for_log(value)}: {what}".lstrip())

    def text(
        self, value: str | None, cluster: str | None, policy: str | None, column: str
    ) -> str | None:
        if value is None:
            return None
        cleaned = pg_text(value)
        if cleaned is not value:
            self.note(cluster, policy, column, value, "cleaned (NUL, unencodable or too long)")
        return cleaned

    def revision(
        self, value: int | None, cluster: str | None, policy: str | None, column: str
    ) -> int | None:
        cleaned = pg_revision(value)
        if cleaned is None and value is not None:
            self.note(cluster, policy, column, value, "not a bigint, recorded as unknown")
        return cleaned

    def count(self, value: int, cluster: str | None, policy: str | None, column: str) -> int:
        cleaned = pg_count(value)
        if cleaned != value:
            self.note(cluster, policy, column, value, "out of range, clamped")
        return cleaned

    def bad_id(self, cluster: str | None, policy: str | None) -> bool:
        """Ids are keys: one that is not clean cannot be cleaned (it would name another row);
        its row is dropped."""
        for column, value in (("cluster_id", cluster), ("policy_id", policy)):
            if value is None or value in self._good_ids:
                continue
            if pg_text(value) is not value:
                self.note(cluster, policy, column, value, "not a valid key, row dropped")
                return True
            self._good_ids.add(value)
        return False

    def log(self, what: str) -> None:
        if self.changed:
            log.warning("%s: %d value(s) cleaned or dropped before writing: %s%s",
                        what, self.changed, "; ".join(self.examples),
                        "; ..." if self.changed > len(self.examples) else "",
                        extra={"cleaned_values": self.changed})


def _delivery_records(
    deliveries: Sequence[Delivery], phases: Sequence[PhaseReading], clean: _Cleaner
) -> list[tuple[Any, ...]]:
    """Merge deliveries and phase readings per (policy, cluster) into `_INCOMING_COLUMNS`
    records (a row is written once; of duplicates the latest wins), every value cleaned for
    PostgreSQL. Built column by column: 100k rows must not become 100k small lists for the
    garbage collector."""
    index: dict[tuple[str, str], int] = {}
    cols: list[list[Any]] = [[] for _ in range(13)]
    (policy, cluster, revision, result, attempt_at, error, reason, attempts,
     phase, phase_reason, phase_message, phase_revision, phase_seen_at) = cols

    def row(policy_id: str, cluster_id: str) -> tuple[int, bool]:
        """The row of (policy, cluster), and whether it was new."""
        key = (policy_id, cluster_id)
        i = index.get(key)
        if i is not None:
            return i, False
        index[key] = i = len(policy)
        policy.append(policy_id)
        cluster.append(cluster_id)
        for col in cols[2:]:
            col.append(None)
        return i, True

    for d in deliveries:
        if clean.bad_id(d.cluster, d.policy):
            continue
        i, new = row(d.policy, d.cluster)
        if not new and attempt_at[i] is not None and attempt_at[i] > d.at:
            continue
        revision[i] = clean.revision(d.revision, d.cluster, d.policy, "revision")
        result[i] = d.result.value
        attempt_at[i] = _utc(d.at)
        error[i] = clean.text(d.error, d.cluster, d.policy, "last_error")
        reason[i] = clean.text(d.reason, d.cluster, d.policy, "last_reason")
        attempts[i] = clean.count(d.attempts, d.cluster, d.policy, "attempts")
    for p in phases:
        if clean.bad_id(p.cluster, p.policy):
            continue
        i, new = row(p.policy, p.cluster)
        if not new and phase_seen_at[i] is not None and phase_seen_at[i] > p.seen_at:
            continue
        phase[i] = clean.text(p.phase, p.cluster, p.policy, "phase")
        phase_reason[i] = clean.text(p.ready_reason, p.cluster, p.policy, "phase_reason")
        phase_message[i] = clean.text(p.ready_message, p.cluster, p.policy, "phase_message")
        phase_revision[i] = clean.revision(p.revision, p.cluster, p.policy, "phase_revision")
        phase_seen_at[i] = _utc(p.seen_at)
    return list(zip(*cols, strict=True))


async def _upsert_deliveries(
    conn: asyncpg.Connection, records: Sequence[tuple[Any, ...]], round_id: int | None
) -> None:
    """Inside a transaction: COPY the merged records in, upsert them into `deliveries`."""
    await conn.execute(_CREATE_INCOMING)
    await conn.copy_records_to_table(
        "incoming_deliveries", records=records, columns=_INCOMING_COLUMNS
    )
    await conn.execute(_UPSERT_DELIVERIES, round_id)
    await conn.execute("DROP TABLE incoming_deliveries")


@dataclass(frozen=True, slots=True)
class _ClusterPart:
    """One cluster's share of a round record: its state row (None for a cluster the round
    was cut short on: its deliveries happened, its state is not known) and its deliveries."""

    cluster: str
    state: tuple[Any, ...] | None
    deliveries: list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class _RoundRecord:
    """A round as the database will hold it: every value cleaned (see `_Cleaner`)."""

    round_row: tuple[Any, ...]
    at: dt.datetime
    parts: list[_ClusterPart]
    invalid: tuple[Any, ...] | None  # the arguments of `_REPLACE_INVALID`, if it applies

    @classmethod
    def build(cls, report: RoundReport, identity: str, clean: _Cleaner) -> _RoundRecord:
        at = _utc(report.finished_at or report.started_at)
        epoch = report.epoch
        round_row = (
            _utc(report.started_at),
            report.finished_at,
            report.result.value,
            clean.text(epoch.holder, None, None, "epoch_holder") if epoch else None,
            clean.revision(epoch.transitions, None, None, "epoch_transitions") if epoch else None,
            clean.text(identity, None, None, "identity"),
            {k: pg_count(v, bits=64) for k, v in report.counts().items()},
            clean.text(report.error, None, None, "error"),
        )
        parts = [
            _ClusterPart(c.cluster, _state_row(c, clean),
                         _delivery_records(c.deliveries, c.phases, clean))
            for c in report.clusters if not clean.bad_id(c.cluster, None)
        ]
        parts += [
            _ClusterPart(c.cluster, None, _delivery_records(c.deliveries, c.phases, clean))
            for c in report.cut_short if not clean.bad_id(c.cluster, None)
        ]
        invalid = None
        if report.error is None:
            # A round that ran saw the whole fleet: its invalid list replaces the last one.
            kept = [p for p in report.invalid if not clean.bad_id(None, p.id)]
            invalid = (
                [p.id for p in kept],
                [clean.text(p.boundary, None, p.id, "boundary_id") for p in kept],
                [clean.revision(p.revision, None, p.id, "revision") or 0 for p in kept],
                at,
                [clean.text(p.reason, None, p.id, "reason") for p in kept],
            )
        return cls(round_row, at, parts, invalid)


def _state_row(c: ClusterOutcome, clean: _Cleaner) -> tuple[Any, ...]:
    """A cluster's outcome as a row of `_UPSERT_CLUSTER_STATE`'s unnest."""
    return (
        c.cluster, c.reached, c.converged,
        clean.text(c.error, c.cluster, None, "last_error"),
        clean.text(c.reason, c.cluster, None, "last_reason"),
        clean.count(c.desired, c.cluster, None, "desired"),
        clean.count(c.in_sync, c.cluster, None, "in_sync"),
        clean.count(c.failed, c.cluster, None, "failed"),
        clean.text(c.server_version, c.cluster, None, "server_version"),
        float(c.duration_s),
    )


async def _insert_round(conn: asyncpg.Connection, record: _RoundRecord, kept: int) -> int:
    round_id: int = await conn.fetchval(
        """INSERT INTO rounds (started_at, finished_at, result, epoch_holder,
               epoch_transitions, identity, counts, error)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id""",
        *record.round_row,
    )
    await conn.execute("DELETE FROM rounds WHERE id <= $1", round_id - kept)
    return round_id


async def _write_parts(
    conn: asyncpg.Connection, record: _RoundRecord, round_id: int, parts: Sequence[_ClusterPart]
) -> None:
    """Inside a transaction: the clusters' states and deliveries of `parts`."""
    states = [p.state for p in parts if p.state is not None]
    if states:
        await conn.execute(_UPSERT_CLUSTER_STATE, round_id, record.at,
                           *(list(col) for col in zip(*states, strict=True)))
    deliveries = [r for p in parts for r in p.deliveries]
    if deliveries:
        await _upsert_deliveries(conn, deliveries, round_id)


async def _replace_invalid(conn: asyncpg.Connection, record: _RoundRecord, round_id: int) -> None:
    if record.invalid is not None:
        ids, boundaries, revisions, at, reasons = record.invalid
        await conn.execute(_REPLACE_INVALID, ids, boundaries, revisions, at, round_id, reasons)


class RecordObserver(Protocol):
    def record_refused(self, reason: str) -> None:
        """The database refused part of a record for good (a metrics reason slug)."""
        ...


class _Refusals:
    """Classifies what the cluster-by-cluster fallback sees, and counts what it drops."""

    def __init__(self, observer: RecordObserver | None) -> None:
        self._observer = observer

    @staticmethod
    def refused(exc: BaseException) -> str:
        """The reason slug of a refusal; re-raises `exc` if it is not one (transient: the
        whole record is retried later; anything else: not the database's doing)."""
        reason = rejection_reason(exc)
        if reason is None:
            raise exc
        return reason

    def count(self, reason: str) -> None:
        """One record dropped (a cluster's rows, in part or whole; the invalid list)."""
        if self._observer is not None:
            self._observer.record_refused(reason)


# A cluster whose rows the database refused is retried row by row, to drop only the refused
# rows; past this many refused rows the rest of that cluster's rows are dropped unexamined.
_ROW_BY_ROW_MAX_REFUSED = 20


class Store:
    """The policy database. Create with `await Store.connect(dsn)`; `close()` when done."""

    # Round history kept (by id): 10,000 rounds is about five weeks at the default interval.
    rounds_kept = 10_000

    def __init__(
        self, pool: asyncpg.Pool, dsn: str, *, observer: RecordObserver | None = None
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        self._observer = observer

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
                """SELECT id, boundary_id, rule, enabled, revision FROM policies
                   WHERE deleted_at IS NULL ORDER BY id"""
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
        return Fleet(
            clusters=[Cluster(ClusterId(r["id"])) for r in cluster_rows],
            boundaries=boundaries,
            policies=policies,
            invalid=invalid,
        )

    async def get_policy(self, policy_id: str) -> PolicyRow | None:
        """The stored row (not validated), or None if there is none or it is being deleted."""
        async with self._acquire() as conn:
            row = await conn.fetchrow(
                """SELECT id, boundary_id, rule, enabled, revision FROM policies
                   WHERE id = $1 AND deleted_at IS NULL""",
                policy_id,
            )
        return _policy_row(row) if row is not None else None

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

    async def invalid_policies(self) -> list[InvalidPolicy]:
        """Policies that cannot be delivered, validated now from the current rows (so a fixed
        row stops being reported at once, and standbys answer before any round)."""
        return list((await self.load_fleet()).invalid)

    # ---- records -----------------------------------------------------------------------------

    async def record_round(self, report: RoundReport, *, identity: str) -> int:
        """Record a round in one transaction: the round, each cluster's state, every delivery
        and phase reading, and the invalid policies it saw. Returns the round id.

        Every value is cleaned for PostgreSQL first (`convergerd.store.values`; what changed is
        logged). If the database still refuses the record for good, it is recorded again
        cluster by cluster, and within a refused cluster row by row: only the refused rows
        are dropped, each logged with its cluster and policy, and counted on the observer.
        Raises `DatabaseUnavailable` (record it later), or `DatabaseRejected` when even the
        round's own row is refused."""
        clean = _Cleaner()
        record = _RoundRecord.build(report, identity, clean)
        clean.log(f"round of {report.started_at.isoformat()}")
        try:
            async with self._acquire() as conn, conn.transaction():
                round_id = await _insert_round(conn, record, self.rounds_kept)
                await _write_parts(conn, record, round_id, record.parts)
                await _replace_invalid(conn, record, round_id)
        except DatabaseRejected as exc:
            log.warning("the database refused the round's record (%s); recording it cluster "
                        "by cluster", exc, extra={"reason": exc.reason})
        else:
            return round_id
        async with self._acquire() as conn, conn.transaction():
            round_id = await _insert_round(conn, record, self.rounds_kept)
            refusals = _Refusals(self._observer)
            for part in record.parts:
                await _write_part_alone(conn, record, round_id, part, refusals)
            try:
                async with conn.transaction():
                    await _replace_invalid(conn, record, round_id)
            except Exception as exc:
                reason = refusals.refused(exc)
                refusals.count(reason)
                log.error(  # noqa: TRY400 - a refusal, not a bug: the reason is the story
                    "invalid policies of round %d not recorded: %s (%s)", round_id,
                    for_log(describe(exc), 300), reason, extra={"reason": reason})
        return round_id

    async def record_deliveries(self, deliveries: Sequence[Delivery]) -> None:
        """Record deliveries made outside a round (a save): `round_id` stays NULL."""
        if not deliveries:
            return
        clean = _Cleaner()
        records = _delivery_records(deliveries, (), clean)
        clean.log("deliveries of a save")
        async with self._acquire() as conn, conn.transaction():
            await _upsert_deliveries(conn, records, None)

    # ---- what the status API reads -----------------------------------------------------------

    async def last_round(self) -> RoundRow | None:
        async with self._acquire() as conn:
            # By start, not by id: a round recorded late is not the last one.
            r = await conn.fetchrow(
                "SELECT * FROM rounds ORDER BY started_at DESC, id DESC LIMIT 1")
        if r is None:
            return None
        holder = r["epoch_holder"]
        return RoundRow(
            id=r["id"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            result=RoundResult(r["result"]),
            epoch=Epoch(holder, r["epoch_transitions"] or 0) if holder is not None else None,
            identity=r["identity"],
            counts=r["counts"],
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

    async def deliveries_for_policy(self, policy_id: str) -> list[DeliveryRow]:
        async with self._acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {_DELIVERY_COLUMNS} FROM deliveries WHERE policy_id = $1 "  # noqa: S608
                "ORDER BY cluster_id",
                policy_id,
            )
        return [_delivery_row(r) for r in rows]

    async def deliveries_for_cluster(self, cluster_id: str) -> list[DeliveryRow]:
        async with self._acquire() as conn:
            rows = await conn.fetch(
                f"SELECT {_DELIVERY_COLUMNS} FROM deliveries WHERE cluster_id = $1 "  # noqa: S608
                "ORDER BY policy_id",
                cluster_id,
            )
        return [_delivery_row(r) for r in rows]


async def _write_part_alone(
    conn: asyncpg.Connection,
    record: _RoundRecord,
    round_id: int,
    part: _ClusterPart,
    refusals: _Refusals,
) -> None:
    """Inside a transaction: one cluster's rows in a savepoint; if refused, its state and each
    of its rows in savepoints of their own, so only what the database refuses is dropped."""
    try:
        async with conn.transaction():
            await _write_parts(conn, record, round_id, [part])
    except Exception as exc:
        refusals.refused(exc)  # re-raised unless a refusal
    else:
        return
    cluster = part.cluster
    pieces: list[tuple[str | None, _ClusterPart]] = []
    if part.state is not None:
        pieces.append((None, _ClusterPart(cluster, part.state, [])))
    pieces += [(row[0], _ClusterPart(cluster, None, [row])) for row in part.deliveries]
    dropped: list[str] = []
    first: tuple[str, str] | None = None  # the first refusal's message and reason
    for policy, piece in pieces:
        if len(dropped) >= _ROW_BY_ROW_MAX_REFUSED:
            dropped.append(policy or "(cluster state)")
            continue
        try:
            async with conn.transaction():
                await _write_parts(conn, record, round_id, [piece])
        except Exception as exc:
            reason = refusals.refused(exc)
            first = first or (f"{for_log(describe(exc), 300)} ({reason})", reason)
            dropped.append(policy or "(cluster state)")
    if dropped and first is not None:
        refusals.count(first[1])
        log.error(
            "cluster %s: the database refused %d of its %d rows of round %d, dropped: %s%s; "
            "first refusal: %s", cluster, len(dropped), len(pieces), round_id,
            ", ".join(for_log(p, 60) for p in dropped[:10]),
            ", ..." if len(dropped) > 10 else "", first[0],
            extra={"cluster": cluster, "policies": dropped[:10], "round_id": round_id,
                   "reason": first[1]},
        )


def _validate_all(
    rows: Sequence[PolicyRow], boundaries: Mapping[BoundaryId, Boundary]
) -> list[Policy | InvalidPolicy]:
    results: list[Policy | InvalidPolicy] = []
    for row in rows:
        result = validate_policy(row)
        if isinstance(result, Policy) and result.boundary not in boundaries:
            result = InvalidPolicy(
                row.id, row.boundary, row.revision,
                reason=f"boundary: {row.boundary!r} does not exist",
            )
        results.append(result)
    return results


async def _init_connection(conn: asyncpg.Connection) -> None:
    for kind in ("json", "jsonb"):
        await conn.set_type_codec(
            kind, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
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

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
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
        return False
