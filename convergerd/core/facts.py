"""One policy on one cluster, as what a round learns of it (its delivery; its phase, Ready,
Verified and audit read back) is held in each of its shapes: the fields of each shape named
once, in order, and every position read back derived from these tables, never written as a
number. Pure: no imports.

The shapes, from the round to the database and back:

- `DELIVERY_KIND` and `READING_KIND`: what `core.report.Deliveries` and `Readings` share
  between a cluster's deliveries and readings (most often one per cluster);
- `RECORD_ROW`: a policy's row in the status state (`status.records`), packed per cluster as
  a summary row and per policy a bit mask of the fields that differ;
- `COLUMNS`: the columns a round's record copies into `incoming_deliveries` and upserts into
  `deliveries` (`store.records`), with their SQL types and how each is cleaned.

Adding a reading field: docs/design.md, "Where a change goes".

Each position is a literal constant (the type checker then knows each slot's type, and a hot
loop reads a constant), checked against its table's order once, as this module is imported:
a field moved in a table without its constant fails at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

# ---- the report's packing (`core.report`) ----------------------------------------------------

# A delivery's values but its policy and revision, which most of a cluster's deliveries
# share (an in-sync round: one per cluster).
DELIVERY_KIND = ("cluster", "result", "at", "error", "reason", "attempts")
DK_CLUSTER: Final = 0
DK_RESULT: Final = 1
DK_AT: Final = 2
DK_ERROR: Final = 3
DK_REASON: Final = 4
DK_ATTEMPTS: Final = 5

# A reading's values but its policy, revision and Verified probe times, which most of a
# cluster's readings share; `verified`: whether a Verified condition was read at all.
READING_KIND = ("cluster", "phase", "ready_reason", "ready_message", "seen_at", "audit",
                "verified", "verified_status", "verified_reason", "verified_message")
RK_CLUSTER: Final = 0
RK_PHASE: Final = 1
RK_READY_REASON: Final = 2
RK_READY_MESSAGE: Final = 3
RK_SEEN_AT: Final = 4
RK_AUDIT: Final = 5
RK_VERIFIED: Final = 6
RK_VERIFIED_STATUS: Final = 7
RK_VERIFIED_REASON: Final = 8
RK_VERIFIED_MESSAGE: Final = 9

# ---- the status state's rows (`status.records`) ----------------------------------------------

# A record as one flat row. The most variable fields first: their mask bits stay low (small
# ints are shared objects). Then, as runs, what a delivery writes and what a reading writes:
# a round's observation puts a row together from those parts (`PolicyRecords.take_round`).
RECORD_ROW = (
    # the head: per policy, most often its own
    "probed_at", "since", "phase_revision", "delivered_revision",
    # what a delivery writes (but its revision)
    "last_attempt_at", "last_success_at", "last_result", "last_error", "last_reason",
    # what a reading writes (but its revision and probe times)
    "phase", "ready_reason", "ready_message", "seen_at", "verified_status", "verified_reason",
    "verified_message", "audit",
)
ROW_PROBED_AT: Final = 0
ROW_SINCE: Final = 1
ROW_PHASE_REVISION: Final = 2
ROW_DELIVERED_REVISION: Final = 3
ROW_LAST_ATTEMPT_AT: Final = 4
ROW_LAST_SUCCESS_AT: Final = 5
ROW_LAST_RESULT: Final = 6
ROW_LAST_ERROR: Final = 7
ROW_LAST_REASON: Final = 8
ROW_PHASE: Final = 9
ROW_READY_REASON: Final = 10
ROW_READY_MESSAGE: Final = 11
ROW_SEEN_AT: Final = 12
ROW_VERIFIED_STATUS: Final = 13
ROW_VERIFIED_REASON: Final = 14
ROW_VERIFIED_MESSAGE: Final = 15
ROW_AUDIT: Final = 16
ROW_WIDTH = len(RECORD_ROW)
ROW_HEAD = ROW_LAST_ATTEMPT_AT  # the head's width: both probe times and both revisions
ROW_DELIVERED = slice(ROW_LAST_ATTEMPT_AT, ROW_PHASE)  # a delivery's part
ROW_READ = slice(ROW_PHASE, ROW_WIDTH)  # a reading's part


# ---- the record's columns (`store.records`) --------------------------------------------------


class Clean(StrEnum):
    """How the record makes a value fit its column (`store.values`, `store.records._Cleaner`)."""

    KEY = "key"  # an id: one that is not clean drops its row
    TEXT = "text"  # `pg_text`: NULs, unencodable characters, length
    REVISION = "revision"  # `pg_revision`: a bigint, else unknown
    COUNT = "count"  # `pg_count`: clamped
    TIME = "time"  # UTC-aware, as it is
    AS_IS = "as is"  # a value of our own making (a result, a flag)


class Change(StrEnum):
    """What a reading's value that differs from the recorded one means for the upsert
    (`store.records._UPSERT_DELIVERIES`): whether the row is written for it."""

    NEWS = "news"  # any difference is written
    FORWARD = "forward"  # a time moving forward is the operator at work again, not news
    SEEN = "seen"  # the reading's own time: which of two readings is newer


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a round's record: its name (in `incoming_deliveries` and, for a
    reading's, in `deliveries`), SQL type, how it is cleaned, and for a reading's what a
    change of it means."""

    name: str
    sql: str
    clean: Clean
    change: Change = Change.NEWS


# A delivery's columns, then a reading's (`READ_COLUMNS`): the order of the COPY.
COLUMNS = (
    Column("policy_id", "text", Clean.KEY),
    Column("cluster_id", "text", Clean.KEY),
    Column("revision", "bigint", Clean.REVISION),
    Column("result", "text", Clean.AS_IS),
    Column("at", "timestamptz", Clean.TIME),
    Column("error", "text", Clean.TEXT),
    Column("reason", "text", Clean.TEXT),
    Column("attempts", "integer", Clean.COUNT),
    Column("phase", "text", Clean.TEXT),
    Column("phase_reason", "text", Clean.TEXT),
    Column("phase_message", "text", Clean.TEXT),
    Column("phase_revision", "bigint", Clean.REVISION),
    Column("phase_seen_at", "timestamptz", Clean.TIME, Change.SEEN),
    Column("verified_status", "text", Clean.TEXT),
    Column("verified_reason", "text", Clean.TEXT),
    Column("verified_message", "text", Clean.TEXT),
    Column("verified_probed_at", "timestamptz", Clean.TIME, Change.FORWARD),
    Column("verified_since", "timestamptz", Clean.TIME),
    Column("audit_violations", "bigint", Clean.REVISION),
    Column("audit_at", "timestamptz", Clean.TIME, Change.FORWARD),
    Column("audit_synced", "boolean", Clean.AS_IS),
    Column("audit_problem", "text", Clean.TEXT),
)
COLUMN_NAMES = tuple(c.name for c in COLUMNS)
COL_POLICY = COLUMN_NAMES.index("policy_id")
COL_PHASE = COLUMN_NAMES.index("phase")  # the first of a reading's columns
READ_COLUMNS = COLUMNS[COL_PHASE:]
READ_NAMES = tuple(c.name for c in READ_COLUMNS)
# A row's reading columns when nothing was read.
NOT_READ: tuple[None, ...] = (None,) * len(READ_COLUMNS)


def _check(table: tuple[str, ...], prefix: str) -> None:
    """Every constant named `prefix` + a field of `table` in upper case is that field's
    position in `table`, and every field has one."""
    for i, field in enumerate(table):
        constant = globals().get(prefix + field.upper())
        if constant != i:
            raise RuntimeError(f"core.facts: {prefix}{field.upper()} is {constant}, the table "
                               f"has {field!r} at {i}")


_check(DELIVERY_KIND, "DK_")
_check(READING_KIND, "RK_")
_check(RECORD_ROW, "ROW_")
