"""One policy on one cluster, as what a round learns of it (its delivery; its phase, Ready,
Verified and audit read back), named once. Pure.

`READING` is the table of a reading's fields: a row per field, naming it in
`core.report.PhaseReading` (and the status state's row), its column in `deliveries` and
`incoming_deliveries`, its SQL type, how the record cleans it, what a change of it means to the
record, whether a cluster's readings share it, and its value when nothing was read. Every
shape of the fact is made from it:

- `READING_KIND` and `READING_OWN`: how `core.report.Readings` packs a cluster's readings (the
  shared fields once per group of readings that agree, most often one per cluster; the others
  per reading);
- `RECORD_ROW`: a policy's row in the status state (`status.records`), packed per cluster as a
  summary row and per policy a bit mask of the fields that differ;
- `COLUMNS`: the columns a round's record copies into `incoming_deliveries` and upserts into
  `deliveries` (`store.records`), and the columns a delivery row is read back from
  (`store.store`, `core.rows.DeliveryRow.reading`).

Adding a reading field: a row in `READING` and its typed attribute in `PhaseReading` (checked
equal at import), a migration, the reading at the edge and the view (docs/design.md, "Where a
change goes"). A delivery's fields (`DELIVERY_KIND`, `DELIVERED`, `DELIVERY_COLUMNS`) are
tables of their own, with literal positions checked at import.

Every position read back is derived from these tables as the module is imported, never written
as a number: a hot loop reads a module constant.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final


class Clean(StrEnum):
    """How the record makes a value fit its column (`store.values`, `store.records._Cleaner`)."""

    KEY = "key"  # an id: one that is not clean drops its row
    TEXT = "text"  # `pg_text`: NULs, unencodable characters, length
    REVISION = "revision"  # `pg_revision`: a bigint, else unknown
    COUNT = "count"  # `pg_count`: clamped
    TIME = "time"  # as it is (the reading's own time, `Change.SEEN`, must be UTC-aware)
    AS_IS = "as is"  # a value of our own making (a result, a flag)


class Change(StrEnum):
    """What a reading's value that differs from the recorded one means for the upsert
    (`store.records._UPSERT_DELIVERIES`): whether the row is written for it."""

    NEWS = "news"  # any difference is written
    # A time moving forward is the operator at work again, not news: the row is not
    # rewritten, and what is shown is at least the cluster's listing's (`Field.listed`).
    FORWARD = "forward"
    SEEN = "seen"  # the reading's own time: which of two readings is newer


# ---- the reading: one table --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a reading (what a round reads back of one policy on one cluster)."""

    name: str  # in `PhaseReading` and the status state's row
    column: str | None  # in `deliveries` and `incoming_deliveries`; None: not recorded or kept
    sql: str = ""  # the column's type
    clean: Clean = Clean.AS_IS
    change: Change = Change.NEWS
    # Whether a cluster's readings most often agree on it (one listing, one operator): held
    # once per group of readings that agree. Else held per reading, and first in the state's
    # row (the fields most often differing: their mask bits stay low).
    shared: bool = True
    # For a time the row is not rewritten for (`Change.SEEN`, `Change.FORWARD`): the
    # `cluster_state` column its cluster's last listing bounds it with.
    listed: str | None = None
    # A field held per reading most often equal to another (a first probe's two times): then
    # held as that one's object.
    same_as: str | None = None
    default: Any = None  # its value when nothing was read (a reading without it)


READING: Final = (
    Field("phase", "phase", "text", Clean.TEXT),
    Field("ready_reason", "phase_reason", "text", Clean.TEXT),
    Field("ready_message", "phase_message", "text", Clean.TEXT),
    Field("revision", "phase_revision", "bigint", Clean.REVISION, shared=False),
    Field("seen_at", "phase_seen_at", "timestamptz", Clean.TIME, Change.SEEN,
          listed="listed_at"),
    # The Verified condition (`verified_status` None: none was read).
    Field("verified_status", "verified_status", "text", Clean.TEXT),
    Field("verified_reason", "verified_reason", "text", Clean.TEXT),
    Field("verified_message", "verified_message", "text", Clean.TEXT),
    Field("verified_probed_at", "verified_probed_at", "timestamptz", Clean.TIME,
          Change.FORWARD, shared=False, listed="listed_probed_at"),
    Field("verified_since", "verified_since", "timestamptz", Clean.TIME, shared=False,
          same_as="verified_probed_at"),
    # `status.audit` (`audit_synced` None: none was read).
    Field("audit_violations", "audit_violations", "bigint", Clean.REVISION),
    Field("audit_at", "audit_at", "timestamptz", Clean.TIME, Change.FORWARD,
          listed="listed_audited_at"),
    Field("audit_synced", "audit_synced", "boolean", Clean.AS_IS),
    Field("audit_problem", "audit_problem", "text", Clean.TEXT),
    # Travels with a round's readings only: the status state keeps samples per policy
    # (`status.samples`), not per policy and cluster.
    Field("audit_sample", None, default=()),
    # `status.enforcementAction`: the mode of the binding in force (None: no binding).
    Field("enforcement_action", "enforcement_action", "text", Clean.TEXT),
    # `status.admission`: the API server's counts since the revision `admission_revision` was
    # installed (`admission_since`) and over the hour before `admission_read_at`
    # (`admission_read_at` and `admission_problem` None: none was read; figures None and a
    # problem: unreadable). Most are 0 on most policies: shared.
    Field("admission_denied", "admission_denied", "bigint", Clean.REVISION),
    Field("admission_warned", "admission_warned", "bigint", Clean.REVISION),
    Field("admission_audited", "admission_audited", "bigint", Clean.REVISION),
    Field("admission_last_hour_denied", "admission_last_hour_denied", "bigint", Clean.REVISION),
    Field("admission_last_hour_warned", "admission_last_hour_warned", "bigint", Clean.REVISION),
    Field("admission_last_hour_audited", "admission_last_hour_audited", "bigint",
          Clean.REVISION),
    # When the revision was installed: a cluster's policies saved together share it, the
    # others not, so held per reading (a shared field that differs costs its entry a large
    # mask).
    Field("admission_since", "admission_since", "timestamptz", Clean.TIME, shared=False),
    # Rewritten by the operator at its heartbeat with the same figures: counting still runs.
    # Each policy's at its own time, so held per reading.
    Field("admission_read_at", "admission_read_at", "timestamptz", Clean.TIME, Change.FORWARD,
          shared=False, listed="listed_admission_read_at"),
    Field("admission_revision", "admission_revision", "bigint", Clean.REVISION, shared=False,
          same_as="revision"),
    Field("admission_resets", "admission_resets", "bigint", Clean.REVISION),
    Field("admission_note", "admission_note", "text", Clean.TEXT),
    Field("admission_problem", "admission_problem", "text", Clean.TEXT),
    # `status.audit.excepted`: objects the rule would deny that an exception admits (None:
    # not said, as while no exception is in force).
    Field("audit_excepted", "audit_excepted", "bigint", Clean.REVISION),
)
READING_NAMES: Final = tuple(f.name for f in READING)  # `PhaseReading`'s, after its keys
_SHARED = tuple(f for f in READING if f.shared)
_OWN = tuple(f for f in READING if not f.shared)
_KEPT = tuple(f for f in _SHARED if f.column is not None)  # shared, recorded and kept

# `Readings`' packing: per group of readings that agree, their cluster and shared fields (a
# "kind"); per reading, its policy and its own fields.
READING_KIND: Final = ("cluster", *(f.name for f in _SHARED))
READING_OWN: Final = tuple(f.name for f in _OWN)
KIND_SEEN_AT: Final = READING_KIND.index("seen_at")
OWN_PROBED_AT: Final = READING_OWN.index("verified_probed_at")
# The times a reading's row is not rewritten for (`Change.FORWARD`): what a cluster's listing
# bounds them with is the oldest it read of each, a `cluster_state` column (`Field.listed`),
# after the listing's own time (`LISTED_AT`). Each with where a reading holds it: (True, its
# position in a kind) for a shared one, (False, its position in the own values) else.
FORWARD: Final = tuple(f for f in READING if f.change is Change.FORWARD)
LISTED_AT: Final = next(f.listed or "" for f in READING if f.change is Change.SEEN)
LISTED_COLUMNS: Final = (LISTED_AT, *(f.listed or "" for f in FORWARD))  # each has one
FORWARD_HELD: Final = tuple((True, READING_KIND.index(f.name)) if f.shared
                            else (False, READING_OWN.index(f.name)) for f in FORWARD)


def joined(own: tuple[Any, ...]) -> tuple[Any, ...]:
    """`own` (a reading's own values, in `READING_OWN` order) with each value that equals the
    one its field is most often the same as (`Field.same_as`) held as that object, when it
    shows the same (same type and zone): one object less per reading kept."""
    for i, j in _ALIASES:
        value, other = own[i], own[j]
        if (value is not other and value is not None and value == other
                and type(value) is type(other)
                and getattr(value, "tzinfo", None) is getattr(other, "tzinfo", None)):
            own = (*own[:i], other, *own[i + 1:])
    return own


_ALIASES = tuple((READING_OWN.index(f.name), READING_OWN.index(f.same_as))
                 for f in _OWN if f.same_as is not None)


def reorder(held: Sequence[str], wanted: Sequence[str]) -> Callable[[tuple[Any, ...]],
                                                                    tuple[Any, ...]]:
    """A function taking values held in the order `held` to the order `wanted`; a reading
    field wanted and not held is its default (`Field.default`). Made once (`itemgetter`):
    each call is a tuple concatenation and a pick in C."""
    defaults_of = {f.name: f.default for f in READING}
    missing = tuple(n for n in wanted if n not in held)
    index = {name: i for i, name in enumerate((*held, *missing))}
    if len(wanted) < 2:
        raise ValueError("reorder: a single value is not a tuple")
    pick = operator.itemgetter(*(index[n] for n in wanted))
    defaults = tuple(defaults_of[n] for n in missing)

    def reordered(values: tuple[Any, ...]) -> tuple[Any, ...]:
        return pick(values + defaults)  # type: ignore[no-any-return]

    return reordered


# ---- a delivery -------------------------------------------------------------------------------

# A delivery's values but its policy and revision, which most of a cluster's deliveries
# share (an in-sync round: one per cluster).
DELIVERY_KIND: Final = ("cluster", "result", "at", "error", "reason", "attempts")
DK_CLUSTER: Final = 0
DK_RESULT: Final = 1
DK_AT: Final = 2
DK_ERROR: Final = 3
DK_REASON: Final = 4
DK_ATTEMPTS: Final = 5

# What a delivery writes of a policy's row in the status state (but its revision).
DELIVERED: Final = ("last_attempt_at", "last_success_at", "last_result", "last_error",
                    "last_reason")


# ---- the status state's rows (`status.records`) ----------------------------------------------

# A record as one flat row: the head (a reading's own fields, the delivered revision), then
# what a delivery writes (`DELIVERED`), then what a reading writes (its shared, kept fields).
# The most variable fields first: their mask bits stay low (small ints are shared objects).
# A round's observation puts a row together from those parts (`PolicyRecords.take_round`).
RECORD_ROW: Final = (*READING_OWN, "delivered_revision", *DELIVERED, *(f.name for f in _KEPT))
ROW_WIDTH: Final = len(RECORD_ROW)
ROW_OWN: Final = slice(0, len(READING_OWN))  # the reading's own fields
ROW_DELIVERED_REVISION: Final = RECORD_ROW.index("delivered_revision")
ROW_HEAD: Final = ROW_DELIVERED_REVISION + 1  # the head's width
ROW_LAST_ATTEMPT_AT: Final = RECORD_ROW.index("last_attempt_at")
ROW_LAST_SUCCESS_AT: Final = RECORD_ROW.index("last_success_at")
ROW_LAST_RESULT: Final = RECORD_ROW.index("last_result")
ROW_LAST_ERROR: Final = RECORD_ROW.index("last_error")
ROW_LAST_REASON: Final = RECORD_ROW.index("last_reason")
ROW_DELIVERED: Final = slice(ROW_HEAD, ROW_HEAD + len(DELIVERED))  # a delivery's part
ROW_READ: Final = slice(ROW_DELIVERED.stop, ROW_WIDTH)  # a reading's part
ROW_READ_NAMES: Final = RECORD_ROW[ROW_READ]
ROW_SEEN_AT: Final = RECORD_ROW.index("seen_at")


# ---- the record's columns (`store.records`, `store.store`) -----------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a round's record: its name (in `incoming_deliveries` and, for a
    reading's, in `deliveries`), SQL type, how it is cleaned, and for a reading's what a
    change of it means."""

    name: str
    sql: str
    clean: Clean
    change: Change = Change.NEWS


DELIVERY_COLUMNS: Final = (
    Column("policy_id", "text", Clean.KEY),
    Column("cluster_id", "text", Clean.KEY),
    Column("revision", "bigint", Clean.REVISION),
    Column("result", "text", Clean.AS_IS),
    Column("at", "timestamptz", Clean.TIME),
    Column("error", "text", Clean.TEXT),
    Column("reason", "text", Clean.TEXT),
    Column("attempts", "integer", Clean.COUNT),
)
# A reading's recorded fields in the record's order: its shared ones, then its own (a
# row is the report's kind and own values, one after the other).
RECORDED: Final = (*_KEPT, *_OWN)
READ_COLUMNS: Final = tuple(Column(f.column or "", f.sql, f.clean, f.change) for f in RECORDED)
# A delivery's columns, then a reading's: the order of the COPY.
COLUMNS: Final = (*DELIVERY_COLUMNS, *READ_COLUMNS)
COLUMN_NAMES: Final = tuple(c.name for c in COLUMNS)
COL_POLICY: Final = COLUMN_NAMES.index("policy_id")
READ_NAMES: Final = tuple(c.name for c in READ_COLUMNS)
# A row's reading columns when nothing was read.
NOT_READ: Final = tuple(f.default for f in RECORDED)
SEEN_COLUMN: Final = next(c.name for c in READ_COLUMNS if c.change is Change.SEEN)


def _check_positions(table: tuple[str, ...], prefix: str) -> None:
    """Every constant named `prefix` + a field of `table` in upper case is that field's
    position in `table`, and every field has one."""
    for i, field in enumerate(table):
        constant = globals().get(prefix + field.upper())
        if constant != i:
            raise RuntimeError(f"core.facts: {prefix}{field.upper()} is {constant}, the table "
                               f"has {field!r} at {i}")


def _check_reading() -> None:
    """What the derivations rely on: names and columns distinct (from each other and from a
    delivery's), one reading time, a time not rewritten bounded by its listing, a field held
    per reading recorded, `same_as` naming one."""
    names = [f.name for f in READING]
    taken = {"cluster", "policy", "delivered_revision", *DELIVERED}
    columns = [f.column for f in READING if f.column is not None]
    problems = []
    if len(set(names)) != len(names) or taken & set(names):
        problems.append("a name twice, or one a delivery's row uses")
    if len(set(columns)) != len(columns) or {c.name for c in DELIVERY_COLUMNS} & set(columns):
        problems.append("a column twice, or one a delivery's")
    if len(READING_OWN) < 2 or len(READING_KIND) < 3:  # packed as tuples (`reorder`)
        problems.append("fewer than two fields held per reading, or shared")
    if [f.change for f in READING].count(Change.SEEN) != 1:
        problems.append("not exactly one reading time (Change.SEEN)")
    for f in READING:
        if f.change is not Change.NEWS and (f.listed is None or f.column is None):
            problems.append(f"{f.name}: a time not rewritten needs its listing's column")
        if not f.shared and f.column is None:
            problems.append(f"{f.name}: held per reading and not recorded")
        if f.same_as is not None and (f.shared or f.same_as not in READING_OWN):
            problems.append(f"{f.name}: same_as names no field held per reading")
        if (f.column is None) != (f.sql == ""):
            problems.append(f"{f.name}: a column needs its SQL type, and only a column")
    if problems:
        raise RuntimeError("core.facts.READING: " + "; ".join(problems))


def check_reading_fields(fields: Sequence[tuple[str, Any]], missing: object) -> None:
    """`fields` (a reading type's fields after its keys, as (name, default), `missing` for
    none) are `READING`'s, in its order, each default its field's."""
    names = tuple(name for name, _ in fields)
    if names != READING_NAMES:
        raise RuntimeError(f"core.facts: the reading's fields {names} are not READING's "
                           f"{READING_NAMES}")
    for (name, default), f in zip(fields, READING, strict=True):
        if default is not missing and default != f.default:
            raise RuntimeError(f"core.facts: the reading's {name} defaults to {default!r}, "
                               f"READING says {f.default!r}")


_check_positions(DELIVERY_KIND, "DK_")
_check_reading()
