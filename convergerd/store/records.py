"""How a round's outcome becomes rows in the database, and how they are written.

A round is recorded in one transaction: the round, each cluster's state (with when the round
listed it), the deliveries and phase readings (merged per policy and cluster) that changed what
is recorded, and the invalid policies it saw: an in-sync round writes one row per cluster. Every
value is cleaned for PostgreSQL first (`convergerd.store.values`; what changed is logged, naming the
cluster, policy and column). If the database still refuses the record for good
(`DatabaseRejected`), `write_round_by_cluster` writes it again with each cluster in a savepoint,
and a refused cluster row by row: only the refused rows are dropped, logged with their cluster
and policies, and counted on a `RecordObserver`.

A record at 10,000 clusters x 100 policies is 1,000,000 rows, made and written on the event
loop the rounds, the prober and HTTP share: rows are made from the report's packed columns
(`_packed_rows`), and building the record and feeding its rows to COPY give the loop a turn
every 10 ms of work (`eventloop.Pacer`).
"""

from __future__ import annotations

import datetime as dt
import logging
import operator
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import asyncpg

from convergerd.core.facts import (
    COL_POLICY,
    COLUMN_NAMES,
    COLUMNS,
    DELIVERY_COLUMNS,
    DK_AT,
    FORWARD_HELD,
    KIND_SEEN_AT,
    LISTED_COLUMNS,
    NOT_READ,
    READ_COLUMNS,
    READ_NAMES,
    READING,
    READING_KIND,
    RECORDED,
    SEEN_COLUMN,
    Change,
    Clean,
    Field,
)
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Delivery,
    PhaseReading,
    RoundReport,
)
from convergerd.core.shown import describe, shown
from convergerd.eventloop import Pacer
from convergerd.store.errors import rejection_reason
from convergerd.store.values import INT64_MAX, INT64_MIN, pg_count, pg_revision, pg_text

log = logging.getLogger(__name__)
T = TypeVar("T")


# Deliveries and phase readings, merged per policy and cluster, are copied (binary COPY) into a
# temporary table, then upserted in one statement that writes only the rows whose recorded facts
# change: a new row; a delivery that applied, failed (its attempts count), or differs from the
# recorded one in revision or error; a phase reading that differs in phase, Ready, revision or
# Verified verdict, or whose probe time went anywhere but forward. An in-sync policy read back as
# recorded is not written: its cluster's state row says when it was listed (`listed_at`), and
# readers derive its times from that (`convergerd.store.store`). Older facts never overwrite
# newer ones (a save racing a round, a late record), newer meaning later than what the row shows,
# derived times included.
# The columns, their types and order: `core.facts.COLUMNS`.
_CREATE_INCOMING = (
    "CREATE TEMPORARY TABLE incoming_deliveries ("
    + ", ".join(f"{c.name} {c.sql}" for c in COLUMNS)
    + ") ON COMMIT DROP"
)


def confirmed_by_listing(d: str, s: str) -> str:
    """SQL: whether delivery row `d`'s success was confirmed by its cluster's (`cluster_state
    s`) last listing without being rewritten: its object was found there (a phase is still
    recorded) at the revision delivered, after the row's last attempt. Its shown result is
    then `unchanged`, attempted and succeeded at `s.listed_at` (`store._D_COLUMNS`)."""
    return (f"({d}.phase_seen_at IS NOT NULL AND {d}.phase_revision = {d}.delivered_revision"
            f" AND {d}.last_result IN ('created', 'updated', 'unchanged')"
            f" AND {s}.listed_at > {d}.last_attempt_at)")


# A reading's columns in the upsert, made from `core.facts.READ_COLUMNS` (a new reading column
# needs no edit here): all of them taken together when the reading is newer (`seen`); the row
# written when one of them is news, or a time that only moves forward did not.
_READ_LIST = ", ".join(READ_NAMES)
_READ_SELECT = ", ".join("f.seen_at" if c.change is Change.SEEN else f"u.{c.name}"
                         for c in READ_COLUMNS)
_READ_NEWS = [c.name for c in READ_COLUMNS if c.change is Change.NEWS]
_READ_CHANGED = "\n            OR ".join([
    f"({', '.join(f'u.{n}' for n in _READ_NEWS)})"
    f" IS DISTINCT FROM ({', '.join(f'o.{n}' for n in _READ_NEWS)})",
    # A probe or audit time moving forward is the operator probing or auditing again, not
    # news: the cluster's `listed_probed_at` and `listed_audited_at` bound it. Gone, come, or
    # going back is written.
    *(f"(u.{c.name} IS DISTINCT FROM o.{c.name} AND NOT COALESCE(u.{c.name} > o.{c.name}, false))"
      for c in READ_COLUMNS if c.change is Change.FORWARD)])
_READ_TAKEN = ",\n            ".join(f"CASE WHEN seen THEN EXCLUDED.{n} ELSE d.{n} END"
                                    for n in READ_NAMES)

# What a row shows, derived times included (as `store._D_COLUMNS`): `known`.
# What of the incoming row is newer than that: `f` (a part that is not is passed as NULL, so
# the upsert leaves it alone).
_UPSERT_DELIVERIES = f"""
INSERT INTO deliveries AS d (
    policy_id, cluster_id, delivered_revision, last_result, last_attempt_at, last_success_at,
    last_error, last_reason, attempts, round_id, {_READ_LIST})
SELECT u.policy_id, u.cluster_id,
       CASE WHEN u.result <> 'failed' THEN u.revision END,
       u.result, f.at,
       CASE WHEN u.result <> 'failed' THEN f.at END,
       u.error, u.reason,
       CASE WHEN u.result = 'failed' THEN u.attempts ELSE 0 END,
       $1::bigint,
       {_READ_SELECT}
FROM incoming_deliveries u
LEFT JOIN deliveries o ON o.policy_id = u.policy_id AND o.cluster_id = u.cluster_id
LEFT JOIN cluster_state s ON s.cluster_id = u.cluster_id
CROSS JOIN LATERAL (
    SELECT CASE WHEN {confirmed_by_listing("o", "s")}
                THEN s.listed_at ELSE o.last_attempt_at END AS attempt_at,
           -- Without a phase, the last listing did not find the object: older is stale.
           GREATEST(o.phase_seen_at, s.listed_at) AS seen_at
) AS known
CROSS JOIN LATERAL (
    SELECT CASE WHEN known.attempt_at IS NULL OR u.at >= known.attempt_at THEN u.at END AS at,
           CASE WHEN known.seen_at IS NULL OR u.phase_seen_at >= known.seen_at
                THEN u.phase_seen_at END AS seen_at
) AS f
WHERE o.policy_id IS NULL
   OR (f.at IS NOT NULL
       AND (u.result <> 'unchanged' OR o.last_result IS NULL OR o.last_result = 'failed'
            OR (u.revision, u.error, u.reason)
               IS DISTINCT FROM (o.delivered_revision, o.last_error, o.last_reason)))
   OR (f.seen_at IS NOT NULL
       AND (o.phase_seen_at IS NULL
            OR {_READ_CHANGED}))
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
    ({_READ_LIST}) =
    (SELECT {_READ_TAKEN}
     FROM (SELECT EXCLUDED.phase_seen_at IS NOT NULL
                  AND (d.phase_seen_at IS NULL
                       OR d.phase_seen_at <= EXCLUDED.phase_seen_at) AS seen) AS s)
"""  # noqa: S608 (no value is formatted in: a rule over column names only)

# A listing that did not find a policy's object: its recorded phase is no longer there (as this
# replica's own status has it), so it is cleared, or rows nobody rewrites would be shown as seen
# at every later listing. Unless a newer listing was recorded already (a late record).
_CLEAR_UNLISTED = f"""
UPDATE deliveries AS d SET {", ".join(f"{n} = NULL" for n in READ_NAMES)}
FROM unnest($1::text[], $2::timestamptz[]) AS l(cluster_id, listed_at)
WHERE d.cluster_id = l.cluster_id
  AND d.phase_seen_at IS NOT NULL AND d.phase_seen_at < l.listed_at
  AND NOT EXISTS (SELECT 1 FROM cluster_state s
                  WHERE s.cluster_id = l.cluster_id AND s.listed_at > l.listed_at)
  AND NOT EXISTS (SELECT 1 FROM incoming_deliveries u
                  WHERE u.cluster_id = d.cluster_id AND u.policy_id = d.policy_id
                    AND u.phase_seen_at IS NOT NULL)
"""  # noqa: S608 (no value is formatted in: column names only)

# A round recorded late (kept while the database was down) must not overwrite the outcome of a
# newer one: only a later success or reach time is taken from it. The listing's columns
# (`facts.LISTED_COLUMNS`: its time, then the oldest of each time a row is not rewritten for)
# are taken together from the newer listing.
_LISTED_LIST = ", ".join(LISTED_COLUMNS)
_UPSERT_CLUSTER_STATE = f"""
INSERT INTO cluster_state AS s (
    cluster_id, last_attempt_at, last_success_at, last_reached_at, reachable, last_error,
    last_reason, desired, in_sync, failed, server_version, duration_s, round_id,
    {_LISTED_LIST})
SELECT u.cluster_id, $2::timestamptz,
       CASE WHEN u.converged THEN $2::timestamptz END,
       CASE WHEN u.reached THEN $2::timestamptz END,
       u.reached, u.error, u.reason, u.desired, u.in_sync, u.failed, u.server_version,
       u.duration_s, $1::bigint, {", ".join(f"u.{c}" for c in LISTED_COLUMNS)}
FROM unnest($3::text[], $4::boolean[], $5::boolean[], $6::text[], $7::text[], $8::int[],
            $9::int[], $10::int[], $11::text[], $12::float8[],
            {", ".join(f"${13 + i}::timestamptz[]" for i in range(len(LISTED_COLUMNS)))})
     AS u(cluster_id, reached, converged, error, reason, desired, in_sync, failed,
          server_version, duration_s, {_LISTED_LIST})
ON CONFLICT (cluster_id) DO UPDATE SET
    last_success_at = GREATEST(EXCLUDED.last_success_at, s.last_success_at),
    last_reached_at = GREATEST(EXCLUDED.last_reached_at, s.last_reached_at),
    ({_LISTED_LIST}) =
    (SELECT {", ".join(f"CASE WHEN newer THEN EXCLUDED.{c} ELSE s.{c} END"
                       for c in LISTED_COLUMNS)}
     FROM (SELECT EXCLUDED.listed_at IS NOT NULL
                  AND (s.listed_at IS NULL OR s.listed_at < EXCLUDED.listed_at) AS newer) AS l),
    (last_attempt_at, reachable, last_error, last_reason, desired, in_sync, failed,
     server_version, duration_s, round_id) =
    (SELECT CASE WHEN fresh THEN EXCLUDED.last_attempt_at ELSE s.last_attempt_at END,
            CASE WHEN fresh THEN COALESCE(EXCLUDED.reachable, s.reachable)
                 ELSE s.reachable END,
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
"""  # noqa: S608 (no value is formatted in: column names and placeholders only)

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

    def copy(self) -> _Cleaner:
        other = _Cleaner()
        other.changed, other.examples = self.changed, list(self.examples)
        other._good_ids = set(self._good_ids)
        return other

    def note(
        self, cluster: str | None, policy: str | None, column: str, value: object, what: str
    ) -> None:
        self.changed += 1
        if len(self.examples) < self._EXAMPLES:
            where = " ".join(
                f"{name} {shown(v, style='text')}"
                for name, v in (("cluster", cluster), ("policy", policy)) if v is not None)
            self.examples.append(f"{where} {column} {shown(value, style='text')}: {what}".lstrip())

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

    def field(self, f: Field, value: Any, cluster: str, policy: str) -> Any:
        """A reading's field `f` as its column holds it (`Field.clean`)."""
        if value is None:
            return None
        if f.clean is Clean.TEXT:
            return self.text(value, cluster, policy, f.column or f.name)
        if f.clean is Clean.REVISION:
            return self.revision(value, cluster, policy, f.column or f.name)
        if f.clean is Clean.COUNT:
            return self.count(value, cluster, policy, f.column or f.name)
        if f.change is Change.SEEN:
            return _utc(value)  # which reading is newer is decided on it
        return value

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

    def all_good(self, ids: set[str]) -> bool:
        """Whether every one of `ids` is a clean key, noting nothing (else the caller takes
        `bad_id`'s way, which notes what it drops)."""
        new = ids.difference(self._good_ids)
        if any(pg_text(i) is not i for i in new):
            return False
        self._good_ids |= new
        return True

    def log(self, what: str) -> None:
        if self.changed:
            log.warning("%s: %d value(s) cleaned or dropped before writing: %s%s",
                        what, self.changed, "; ".join(self.examples),
                        "; ..." if self.changed > len(self.examples) else "",
                        extra={"cleaned_values": self.changed})


def _cluster_rows(c: ClusterOutcome, clean: _Cleaner) -> list[tuple[Any, ...]]:
    """A cluster's deliveries and readings as `_delivery_records` makes them: read from the
    packed columns when nothing needs cleaning or merging (`_packed_rows`), else from each
    `Delivery` and `PhaseReading` made again."""
    rows = _packed_rows(c, clean)
    return _delivery_records(c.deliveries, c.phases, clean) if rows is None else rows


def _bigints(values: Sequence[int | None]) -> bool:
    """Whether `pg_revision` keeps every one of `values` as it is."""
    ints = [v for v in values if v is not None]
    return not ints or (set(map(type, ints)) == {int}
                        and min(ints) >= INT64_MIN and max(ints) <= INT64_MAX)


def _kept(*texts: str | None) -> bool:
    """Whether `pg_text` keeps every one of `texts` as it is."""
    return all(pg_text(t) is t for t in texts)


def _delivery_kinds(c: ClusterOutcome) -> dict[int, tuple[Any, ...]] | None:
    """Per delivery kind of `c` (by id): its result, at, error, reason, attempts, and
    whether it created; None if any of them would be cleaned or checked (`_packed_rows`)."""
    parts: dict[int, tuple[Any, ...]] = {}
    for k in c.deliveries.kinds():
        cluster, result, at, error, reason, attempts = k
        if (cluster != c.cluster or at.tzinfo is None or not _kept(error, reason)
                or type(attempts) is not int or pg_count(attempts) != attempts):
            return None
        parts[id(k)] = (result.value, at, error, reason, attempts,
                        result is ApplyResult.CREATED)
    return parts


def _fits(f: Field, values: Sequence[Any]) -> bool:
    """Whether the record writes every one of `values` of field `f` as it is (`_Cleaner`
    would change or refuse none)."""
    if f.clean is Clean.TEXT:
        return _kept(*values)
    if f.clean is Clean.REVISION:
        return _bigints(values)
    if f.clean is Clean.COUNT:
        return all(v is None or (type(v) is int and pg_count(v) == v) for v in values)
    if f.change is Change.SEEN:
        return all(v.tzinfo is not None for v in values)
    return True


# A reading's recorded fields as the record's columns hold them (`facts.RECORDED`): its
# shared ones, read from its kind, then its own.
_SHARED_RECORDED = tuple(f for f in RECORDED if f.shared)
_OWN_RECORDED = tuple(f for f in RECORDED if not f.shared)
_kind_recorded = operator.itemgetter(*(READING_KIND.index(f.name) for f in _SHARED_RECORDED))
# A created object's first reading (see `_delivery_records`): its revision and seen time.
_READ_REVISION = READ_NAMES.index(next(f.column for f in READING if f.name == "revision"))
_READ_SEEN = READ_NAMES.index(SEEN_COLUMN)


def _first_reading(revision: int | None, at: dt.datetime) -> tuple[Any, ...]:
    """A row's reading columns for a created object not read since: its revision, seen as it
    was created, nothing else."""
    values = list(NOT_READ)
    values[_READ_REVISION], values[_READ_SEEN] = revision, at
    return tuple(values)


def _reading_kinds(c: ClusterOutcome) -> dict[int, tuple[Any, ...]] | None:
    """Per reading kind of `c` (by id): its shared recorded fields, in the record's order;
    None if any of them would be cleaned or checked (`_packed_rows`)."""
    parts: dict[int, tuple[Any, ...]] = {}
    for k in c.phases.kinds():
        part = _kind_recorded(k)
        if k[0] != c.cluster or not all(
                _fits(f, (v,)) for f, v in zip(_SHARED_RECORDED, part, strict=True)):
            return None
        parts[id(k)] = part
    return parts


def _packed_rows(c: ClusterOutcome, clean: _Cleaner) -> list[tuple[Any, ...]] | None:
    """What `_delivery_records(c.deliveries, c.phases, clean)` makes, without making a
    `Delivery` or `PhaseReading`: each distinct kind (most often one per cluster) is checked
    and taken apart once, each row is one tuple (a reading's columns: its kind's part, then
    its own values, `facts.RECORDED`). None (nothing noted) when any of the values would be
    cleaned, a key dropped, a time naive, or a policy is there twice: the careful way then
    makes the same rows and notes what it cleans."""
    cluster = c.cluster
    d_policies, d_revisions, d_kinds = c.deliveries.columns()
    r_policies, r_own, r_kinds = c.phases.columns()
    delivered, read = set(d_policies), set(r_policies)
    if (len(delivered) != len(d_policies) or len(read) != len(r_policies)
            or not clean.all_good({cluster} | delivered | read)
            or not _bigints(d_revisions)
            or not all(_fits(f, values) for f, values in zip(_OWN_RECORDED, r_own,
                                                              strict=True))):
        return None
    d_parts, r_parts = _delivery_kinds(c), _reading_kinds(c)
    if d_parts is None or r_parts is None:
        return None
    owns = list(zip(*r_own, strict=True))
    reading_of = dict(zip(r_policies, range(len(r_policies)), strict=True))
    rows: list[tuple[Any, ...]] = []
    append = rows.append
    last_k: object = None
    for policy, revision, k in zip(d_policies, d_revisions, d_kinds, strict=True):
        if k is not last_k:
            last_k = k
            result, at, error, reason, attempts, created = d_parts[id(k)]
        j = reading_of.pop(policy, None)
        if j is not None:
            part = r_parts[id(r_kinds[j])]
            # A created object's first reading (see `_delivery_records`) unless read later.
            if not created or at <= part[_READ_SEEN]:
                append((policy, cluster, revision, result, at, error, reason, attempts,
                        *part, *owns[j]))
                continue
        if created:
            append((policy, cluster, revision, result, at, error, reason, attempts,
                    *_first_reading(revision, at)))
        else:
            append((policy, cluster, revision, result, at, error, reason, attempts,
                    *NOT_READ))
    for j in reading_of.values():  # read, not delivered: in the readings' order
        append((r_policies[j], cluster, None, None, None, None, None, None,
                *r_parts[id(r_kinds[j])], *owns[j]))
    return rows


def _delivery_records(
    deliveries: Iterable[Delivery], phases: Iterable[PhaseReading], clean: _Cleaner
) -> list[tuple[Any, ...]]:
    """Merge deliveries and phase readings per (policy, cluster) into `COLUMN_NAMES`
    records (a row is written once; of duplicates the latest wins), every value cleaned for
    PostgreSQL. Built column by column: 100k rows must not become 100k small lists for the
    garbage collector."""
    index: dict[tuple[str, str], int] = {}
    named: dict[str, list[Any]] = {name: [] for name in COLUMN_NAMES}  # in `COLUMNS` order
    cols = list(named.values())
    (policy, cluster, revision, result, attempt_at, error, reason, attempts) = (
        named[c.name] for c in DELIVERY_COLUMNS)
    read_cols = [named[c.name] for c in READ_COLUMNS]
    # A reading's recorded fields and their columns, cleaned in `facts.READING`'s order.
    fields = [f for f in READING if f.column is not None]
    field_cols = [named[column] for f in READING if (column := f.column) is not None]
    phase_seen_at = named[SEEN_COLUMN]
    values = [col for name, col in named.items() if name not in {"policy_id", "cluster_id"}]

    def row(policy_id: str, cluster_id: str) -> tuple[int, bool]:
        """The row of (policy, cluster), and whether it was new."""
        key = (policy_id, cluster_id)
        i = index.get(key)
        if i is not None:
            return i, False
        index[key] = i = len(policy)
        policy.append(policy_id)
        cluster.append(cluster_id)
        for col in values:
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
        if d.result is ApplyResult.CREATED:
            # A created object has no status yet: its first reading, so that the round that
            # first lists it finds nothing changed (a reading from that listing, newer, wins).
            _set_row(read_cols, i, _first_reading(revision[i], attempt_at[i]))
    for p in phases:
        if clean.bad_id(p.cluster, p.policy):
            continue
        i, new = row(p.policy, p.cluster)
        if not new and phase_seen_at[i] is not None and phase_seen_at[i] > p.seen_at:
            continue
        _set_row(field_cols, i, [clean.field(f, getattr(p, f.name), p.cluster, p.policy)
                                 for f in fields])
    return list(zip(*cols, strict=True))


def _set_row(columns: Sequence[list[Any]], i: int, values: Iterable[Any]) -> None:
    """Row `i` of `columns` set to `values`, one per column."""
    for column, value in zip(columns, values, strict=True):
        column[i] = value


async def _upsert_deliveries(
    conn: asyncpg.Connection,
    records: Iterable[tuple[Any, ...]] | AsyncIterable[tuple[Any, ...]],
    round_id: int | None,
    listed: Sequence[tuple[str, dt.datetime]] = (),
) -> None:
    """Inside a transaction: COPY the merged records in (streamed: `records` may be made as
    they are copied, `_paced` to let the loop run meanwhile), clear the phases the `listed`
    clusters' listings (cluster, when) no longer found, upsert the records into `deliveries`.
    `records` must then hold all the readings of those listings."""
    await conn.execute(_CREATE_INCOMING)
    await conn.copy_records_to_table(
        "incoming_deliveries", records=records, columns=COLUMN_NAMES
    )
    if listed:
        await conn.execute(_CLEAR_UNLISTED, [c for c, _ in listed], [at for _, at in listed])
    await conn.execute(_UPSERT_DELIVERIES, round_id)
    await conn.execute("DROP TABLE incoming_deliveries")


@dataclass(frozen=True, slots=True)
class _ClusterPart:
    """One cluster's share of a round record: its state row (None for a cluster the round
    was cut short on: its deliveries happened, its state is not known) and its deliveries:
    made from `source` as they are written (a round's rows, hundreds of bytes each, are never
    all alive at once: 1,000,000 at 10,000 clusters x 100 policies), or already made
    (`rows`)."""

    cluster: str
    state: tuple[Any, ...] | None
    source: ClusterOutcome | None = None
    rows: tuple[tuple[Any, ...], ...] = ()

    def has_rows(self) -> bool:
        return bool(self.rows) if self.source is None else bool(
            self.source.deliveries or self.source.phases)

    def delivery_rows(self, clean: _Cleaner) -> Sequence[tuple[Any, ...]]:
        """The deliveries' rows, cleaned (noted on `clean` each time they are made)."""
        if self.source is None:
            return self.rows
        return _cluster_rows(self.source, clean)

    def made(self, clean: _Cleaner) -> _ClusterPart:
        """This part with its rows made."""
        return _ClusterPart(self.cluster, self.state, None, tuple(self.delivery_rows(clean)))


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A round as the database will hold it: every value cleaned (see `_Cleaner`). The
    deliveries' rows are made, cluster by cluster, as they are written: the report must
    not change meanwhile (it does not: a round's report is done when it is recorded)."""

    round_row: tuple[Any, ...]
    at: dt.datetime
    parts: list[_ClusterPart]
    invalid: tuple[Any, ...] | None  # the arguments of `_REPLACE_INVALID`, if it applies
    built: _Cleaner  # what building it cleaned (the round's, the clusters' rows)
    what: str  # the record in its log line

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """The deliveries' rows as one writing makes them (what `bench/status_memory.py`
        measures)."""
        return _rows(self.parts, self.cleaning())

    def cleaning(self) -> _Cleaner:
        """A cleaner for one writing of the record, starting from what building it noted:
        what one writing notes is logged once, when it is written."""
        return self.built.copy()

    @classmethod
    async def build(cls, report: RoundReport, identity: str, clean: _Cleaner) -> RoundRecord:
        """The record of `report`, the loop given a turn every `eventloop.SLICE_S` (a state
        row reads its cluster's readings: at 10,000 clusters far more than a slice of work;
        bench/RESULTS.md, "Figures once quoted in the code")."""
        pacer = Pacer()  # its first slice: the round's counts, then state rows
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
        parts: list[_ClusterPart] = []
        for c in report.clusters:
            await pacer.pause()
            if not clean.bad_id(c.cluster, None):
                parts.append(_ClusterPart(c.cluster, _state_row(c, at, clean), c))
        parts += [
            _ClusterPart(c.cluster, None, c)
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
        return cls(round_row, at, parts, invalid, clean,
                   f"round of {report.started_at.isoformat()}")


def _state_row(c: ClusterOutcome, at: dt.datetime, clean: _Cleaner) -> tuple[Any, ...]:
    """A cluster's outcome as a row of `_UPSERT_CLUSTER_STATE`'s unnest; its last values, the
    listing's (`facts.LISTED_COLUMNS`: its time, at `_LISTED_AT`, then the oldest of each time
    a row is not rewritten for), are None unless the round listed it."""
    listed: tuple[Any, ...] = _NOT_LISTED
    if c.listed:
        # From the packed readings: a reading's shared fields are its kind's, the others
        # its own.
        kinds = c.phases.kinds()
        listed_at = max((_utc(k[KIND_SEEN_AT]) for k in kinds), default=None)
        _, own, _ = c.phases.columns()
        oldest = tuple(
            min((t for t in ((k[i] for k in kinds) if shared else own[i]) if t is not None),
                default=None)
            for shared, i in FORWARD_HELD)
        if listed_at is None:
            # An empty listing: no later than the round's first write (what the round
            # created afterwards is newer than what the listing did not find).
            listed_at = min((_utc(k[DK_AT]) for k in c.deliveries.kinds()), default=at)
        listed = (listed_at, *oldest)
    return (
        # NULL: cut by the round's deadline unanswered; the reachability recorded stands.
        c.cluster, None if c.cut_unanswered else c.reached, c.converged,
        clean.text(c.error, c.cluster, None, "last_error"),
        clean.text(c.reason, c.cluster, None, "last_reason"),
        clean.count(c.desired, c.cluster, None, "desired"),
        clean.count(c.in_sync, c.cluster, None, "in_sync"),
        clean.count(c.failed, c.cluster, None, "failed"),
        clean.text(c.server_version, c.cluster, None, "server_version"),
        float(c.duration_s),
        *listed,
    )


# A state row's values, as `_UPSERT_CLUSTER_STATE`'s unnest names them.
_STATE_ROW = ("cluster_id", "reached", "converged", "error", "reason", "desired", "in_sync",
              "failed", "server_version", "duration_s", *LISTED_COLUMNS)
_STATE_CLUSTER = _STATE_ROW.index("cluster_id")
# The state row's listing time: the cluster's readings are all in the part.
_LISTED_AT = _STATE_ROW.index("listed_at")
_NOT_LISTED = (None,) * (len(_STATE_ROW) - _LISTED_AT)  # the listing's values


def _unlisted(state: tuple[Any, ...]) -> tuple[Any, ...]:
    """The state row without its listing: for a part that does not hold all of the listing's
    readings (the row-by-row fallback), whose unwritten rows must not be taken as read."""
    return (*state[:_LISTED_AT], *_NOT_LISTED)


async def _insert_round(conn: asyncpg.Connection, record: RoundRecord, kept: int) -> int:
    round_id: int = await conn.fetchval(
        """INSERT INTO rounds (started_at, finished_at, result, epoch_holder,
               epoch_transitions, identity, counts, error)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id""",
        *record.round_row,
    )
    await conn.execute("DELETE FROM rounds WHERE id <= $1", round_id - kept)
    return round_id


# Cluster states per statement: asyncpg encodes a statement's arguments in one go, and 10,000
# states held the loop for tens of milliseconds (bench/RESULTS.md, "Figures once quoted in the
# code").
_STATES_PER_STATEMENT = 1000


async def _write_parts(
    conn: asyncpg.Connection, record: RoundRecord, round_id: int,
    parts: Sequence[_ClusterPart], clean: _Cleaner,
) -> None:
    """Inside a transaction: the clusters' states and deliveries of `parts`, the deliveries'
    rows made cluster by cluster as they are copied."""
    states = [p.state for p in parts if p.state is not None]
    for i in range(0, len(states), _STATES_PER_STATEMENT):
        await conn.execute(
            _UPSERT_CLUSTER_STATE, round_id, record.at,
            *(list(col) for col in zip(*states[i:i + _STATES_PER_STATEMENT], strict=True)))
    listed = [(s[_STATE_CLUSTER], s[_LISTED_AT]) for s in states if s[_LISTED_AT] is not None]
    if listed or any(p.has_rows() for p in parts):
        await _upsert_deliveries(conn, _paced(_rows(parts, clean)), round_id, listed)


def _rows(parts: Iterable[_ClusterPart], clean: _Cleaner) -> Iterator[tuple[Any, ...]]:
    """The deliveries' rows of `parts`, made cluster by cluster as they are taken."""
    for part in parts:
        yield from part.delivery_rows(clean)


# Rows taken between two looks at the clock: a few hundred microseconds of making and
# encoding them.
_ROWS_PER_LOOK = 128


async def _paced(rows: Iterable[T]) -> AsyncIterator[T]:
    """`rows` for COPY, which makes and encodes them without letting the loop run unless the
    socket is full (asyncpg): at 10,000 clusters x 100 policies, a round's record held the
    loop for tens of seconds, and requests to clusters timed out behind it. This gives the
    other tasks a turn every `eventloop.SLICE_S` of work."""
    pacer = Pacer()
    for i, row in enumerate(rows):
        if not i % _ROWS_PER_LOOK:
            await pacer.pause()
        yield row


async def _replace_invalid(conn: asyncpg.Connection, record: RoundRecord, round_id: int) -> None:
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


async def _write_part_alone(
    conn: asyncpg.Connection,
    record: RoundRecord,
    round_id: int,
    part: _ClusterPart,
    refusals: _Refusals,
    *,
    clean: _Cleaner,
) -> None:
    """Inside a transaction: one cluster's rows in a savepoint; if refused, its state and each
    of its rows in savepoints of their own, so only what the database refuses is dropped."""
    part = part.made(clean)  # its rows, made (and cleaned) once
    try:
        async with conn.transaction():
            await _write_parts(conn, record, round_id, [part], clean)
    except Exception as exc:
        refusals.refused(exc)  # re-raised unless a refusal
    else:
        return
    cluster = part.cluster
    pieces: list[tuple[str | None, _ClusterPart]] = []
    if part.state is not None:
        pieces.append((None, _ClusterPart(cluster, _unlisted(part.state))))
    pieces += [(row[COL_POLICY], _ClusterPart(cluster, None, rows=(row,))) for row in part.rows]
    dropped: list[str] = []
    first: tuple[str, str] | None = None  # the first refusal's message and reason
    for policy, piece in pieces:
        if len(dropped) >= _ROW_BY_ROW_MAX_REFUSED:
            dropped.append(policy or "(cluster state)")
            continue
        try:
            async with conn.transaction():
                await _write_parts(conn, record, round_id, [piece], clean)
        except Exception as exc:
            reason = refusals.refused(exc)
            first = first or (f"{describe(exc)} ({reason})", reason)
            dropped.append(policy or "(cluster state)")
    if dropped and first is not None:
        refusals.count(first[1])
        log.error(
            "cluster %s: the database refused %d of its %d rows of round %d, dropped: %s%s; "
            "first refusal: %s", cluster, len(dropped), len(pieces), round_id,
            ", ".join(shown(p, 60, style="text") for p in dropped[:10]),
            ", ..." if len(dropped) > 10 else "", first[0],
            extra={"cluster": cluster, "policies": dropped[:10], "round_id": round_id,
                   "reason": first[1]},
        )


# ---- writing ------------------------------------------------------------------------------


async def round_record(report: RoundReport, identity: str) -> RoundRecord:
    """`report` as rows, cleaned as they are made; writing it logs one warning if anything
    had to be cleaned or dropped. `report` must stay as it is until it is written."""
    return await RoundRecord.build(report, identity, _Cleaner())


async def write_round(conn: asyncpg.Connection, record: RoundRecord, *, kept: int) -> int:
    """Inside a transaction: the whole record; returns the round id. Keeps `kept` rounds."""
    clean = record.cleaning()
    round_id = await _insert_round(conn, record, kept)
    await _write_parts(conn, record, round_id, record.parts, clean)
    await _replace_invalid(conn, record, round_id)
    clean.log(record.what)
    return round_id


async def write_round_by_cluster(
    conn: asyncpg.Connection, record: RoundRecord, *, kept: int,
    observer: RecordObserver | None,
) -> int:
    """Inside a transaction: the record with every cluster (and the invalid list) in a
    savepoint of its own, dropping and logging only what the database refuses. The round's
    own row is not optional: its refusal propagates."""
    clean = record.cleaning()
    round_id = await _insert_round(conn, record, kept)
    refusals = _Refusals(observer)
    for part in record.parts:
        await _write_part_alone(conn, record, round_id, part, refusals, clean=clean)
    try:
        async with conn.transaction():
            await _replace_invalid(conn, record, round_id)
    except Exception as exc:
        reason = refusals.refused(exc)
        refusals.count(reason)
        log.error(  # noqa: TRY400 - a refusal, not a bug: the reason is the story
            "invalid policies of round %d not recorded: %s (%s)", round_id,
            describe(exc), reason, extra={"reason": reason})
    clean.log(record.what)
    return round_id


async def write_deliveries(conn: asyncpg.Connection, deliveries: Sequence[Delivery]) -> None:
    """Inside a transaction: deliveries made outside a round (a save; `round_id` NULL)."""
    clean = _Cleaner()
    records = _delivery_records(deliveries, (), clean)
    clean.log("deliveries of a save")
    await _upsert_deliveries(conn, records, None)
