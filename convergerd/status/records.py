"""What is known of one policy on one cluster (`PolicyRecord`: the last delivery and the
last phase read back), how this replica's record and the database's merge (the newer fact
wins), and how a cluster keeps its records compactly (`PolicyRecords`: one summary row per
cluster, per policy only what differs from it). Pure.
"""

from __future__ import annotations

import datetime as dt
import itertools
import operator
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergerd.core.facts import (
    READING_NAMES,
    READING_OWN,
    RECORD_ROW,
    ROW_DELIVERED,
    ROW_DELIVERED_REVISION,
    ROW_HEAD,
    ROW_LAST_ATTEMPT_AT,
    ROW_LAST_ERROR,
    ROW_LAST_REASON,
    ROW_LAST_RESULT,
    ROW_LAST_SUCCESS_AT,
    ROW_OWN,
    ROW_READ,
    ROW_READ_NAMES,
    ROW_SEEN_AT,
    ROW_WIDTH,
    joined,
    reorder,
)
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import ApplyResult, AuditSample, Deliveries, PhaseReading
from convergerd.core.rows import DeliveryRow
from convergerd.status.phases import known_violations

_ROW_REVISION = RECORD_ROW.index("revision")  # the reading's (the operator's) revision


@dataclass(slots=True)
class PolicyRecord:
    """What is known of one policy on one cluster: the last delivery and the last phase."""

    delivered_revision: int | None = None  # revision of the last successful apply
    last_result: str | None = None
    last_attempt_at: dt.datetime | None = None
    last_success_at: dt.datetime | None = None
    last_error: str | None = None
    last_reason: str | None = None
    phase: PhaseReading | None = None

    @classmethod
    def from_row(cls, row: DeliveryRow) -> PolicyRecord:
        return cls(
            delivered_revision=row.delivered_revision,
            last_result=str(row.last_result) if row.last_result is not None else None,
            last_attempt_at=row.last_attempt_at, last_success_at=row.last_success_at,
            last_error=row.last_error, last_reason=row.last_reason, phase=row.reading,
        )


def newer(a: dt.datetime | None, b: dt.datetime | None) -> bool:
    """True when `a` is known and later than `b` (or `b` unknown)."""
    return a is not None and (b is None or a > b)


def merge_records(mine: PolicyRecord | None, stored: PolicyRecord | None) -> PolicyRecord:
    """The newer delivery and the newer phase reading of the two."""
    if mine is None or stored is None:
        return mine or stored or PolicyRecord()
    merged = PolicyRecord(**{f: getattr(stored, f) for f in PolicyRecord.__slots__})
    if newer(mine.last_attempt_at, stored.last_attempt_at):
        merged.last_result, merged.last_attempt_at = mine.last_result, mine.last_attempt_at
        merged.last_error, merged.last_reason = mine.last_error, mine.last_reason
    if newer(mine.last_success_at, stored.last_success_at):
        merged.delivered_revision = mine.delivered_revision
        merged.last_success_at = mine.last_success_at
    # A tie is the same listing: this replica's own reading is the one whose audit sample
    # it keeps (the database records only the count).
    if mine.phase is not None and (
        stored.phase is None or mine.phase.seen_at >= stored.phase.seen_at
    ):
        merged.phase = mine.phase
    return merged


# ---------------------------------------------------------------------------------------------
# Per cluster, compactly: one summary and per policy only what differs from it
#
# At 10,000 clusters x 100 policies a `PolicyRecord` with its `PhaseReading` and `Verification`
# per delivery, each with its own decoded strings and times, ran to a gigabyte of status
# (`bench/status_memory.py`; bench/RESULTS.md, "Figures once quoted in the code"). Most of a
# cluster's records say the same (one round's result and time, one listing's phase, Ready and
# Verified): a record is kept as a tuple of its fields (`facts.RECORD_ROW`), the cluster keeps
# the most common value of each field (its summary), and each policy only a bit mask of the
# fields where it differs and those values.

# The row's fields, their order and the parts a delivery and a reading write: `core.facts`.
_NONE_ROW: tuple[Any, ...] = (None,) * ROW_WIDTH
_NOT_READ: tuple[Any, ...] = _NONE_ROW[ROW_READ]
_NOT_OWN: tuple[Any, ...] = _NONE_ROW[ROW_OWN]
# Positions in a delivery's part of a row (`ROW_DELIVERED`).
_D_AT = ROW_LAST_ATTEMPT_AT - ROW_DELIVERED.start
_D_SUCCESS = ROW_LAST_SUCCESS_AT - ROW_DELIVERED.start
_D_RESULT = ROW_LAST_RESULT - ROW_DELIVERED.start
_SAME: tuple[int] = (0,)  # the entry of a record equal to its cluster's summary
# A reading's fields as the row holds them, made in C; and the row back to a reading.
_own_of = operator.attrgetter(*READING_OWN)
_read_of = operator.attrgetter(*ROW_READ_NAMES)
_reading_of_row = reorder(RECORD_ROW, READING_NAMES)


def _shared(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def record_row(record: PolicyRecord) -> tuple[Any, ...]:
    """A record's fields as one flat tuple, in `facts.RECORD_ROW`'s order; repeated strings
    interned."""
    phase = record.phase
    own, read = (_NOT_OWN, _NOT_READ) if phase is None else (
        joined(_own_of(phase)), tuple(map(_shared, _read_of(phase))))
    success = record.last_success_at
    if success is not None and success == record.last_attempt_at:
        success = record.last_attempt_at
    return (*own, record.delivered_revision, record.last_attempt_at, success,
            _shared(record.last_result), _shared(record.last_error),
            _shared(record.last_reason), *read)


def reading_part(reading: PhaseReading) -> tuple[tuple[Any, ...], tuple[AuditSample, ...]]:
    """The `ROW_READ` fields of `reading` (repeated strings interned; its audit's sample is
    not one), and its audit's sample when the audit counts violations."""
    fresh = reading.audit_sample if known_violations(reading) else ()
    return tuple(map(_shared, _read_of(reading))), fresh


def row_record(row: tuple[Any, ...], cluster: ClusterId, policy: PolicyId) -> PolicyRecord:
    """The record `record_row` made `row` of (a new object: changing it changes nothing kept)."""
    return PolicyRecord(row[ROW_DELIVERED_REVISION], row[ROW_LAST_RESULT],
                        row[ROW_LAST_ATTEMPT_AT], row[ROW_LAST_SUCCESS_AT], row[ROW_LAST_ERROR],
                        row[ROW_LAST_REASON], row_reading(row, cluster, policy))


def summary_row(rows: Iterable[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The most common value of each field (the first seen among equally common ones)."""
    columns = list(zip(*rows, strict=True))
    if not columns:
        return _NONE_ROW
    return tuple(Counter(column).most_common(1)[0][0] for column in columns)


def packed(row: tuple[Any, ...], summary: tuple[Any, ...]) -> tuple[Any, ...]:
    """`row` as its differences from `summary`: `(mask, value, ...)`, bit i for field i."""
    if row == summary:
        return _SAME
    mask = 0
    values: list[Any] = []
    for i in range(ROW_WIDTH):
        value = row[i]
        if value != summary[i]:
            mask |= 1 << i
            values.append(value)
    return (mask, *values)


def unpacked(entry: tuple[Any, ...], summary: tuple[Any, ...]) -> tuple[Any, ...]:
    mask = entry[0]
    if not mask:
        return summary
    row = list(summary)
    k = 1
    while mask:  # only the set bits: a few per entry
        low = mask & -mask
        row[low.bit_length() - 1] = entry[k]
        k += 1
        mask ^= low
    return tuple(row)


def row_reading(row: tuple[Any, ...], cluster: ClusterId, policy: PolicyId) -> PhaseReading | None:
    """The phase reading of `row` alone (what `row_record` would hold), None without one."""
    if row[ROW_SEEN_AT] is None:
        return None
    return PhaseReading(cluster, policy, *_reading_of_row(row))


def _most_common(values: Iterable[Any]) -> Any:
    """The most common of `values` (the first seen among equally common ones)."""
    return Counter(values).most_common(1)[0][0]


def _summary_part(parts: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    """`summary_row` of `parts`, most of which are shared objects: counted once per object."""
    counts = Counter(map(id, parts))
    if len(counts) == 1:
        return parts[0]
    by_id = dict(zip(map(id, parts), parts, strict=True))
    width = len(parts[0])
    columns: list[Counter[Any]] = [Counter() for _ in range(width)]
    for key, n in counts.items():
        part = by_id[key]
        for i in range(width):
            columns[i][part[i]] += n
    return tuple(c.most_common(1)[0][0] for c in columns)


def _part_diff(part: tuple[Any, ...], summary: tuple[Any, ...],
               first: int) -> tuple[int, tuple[Any, ...]]:
    """`packed` of a part of a row (fields from `first` on): its mask bits and values."""
    if part == summary:
        return 0, ()
    mask, values = 0, []
    for i, value in enumerate(part):
        if value != summary[i]:
            mask |= 1 << (first + i)
            values.append(value)
    return mask, tuple(values)


def _entry_function(width: int) -> Callable[
        [tuple[Any, ...], tuple[Any, ...], int, tuple[Any, ...], tuple[Any, ...]],
        tuple[Any, ...]]:
    """`entry(h, s, mask, d, r)`: a row's `packed` entry made of its head `h` (the first
    `width` fields, compared with the summary's head `s`) and its other parts' mask bits and
    values (`mask`, `d`, `r`). Written out for the head's width at import, as `dataclasses`
    writes an `__init__`: a head is compared for every policy of every round, and a loop over
    its fields took twice as long (bench/RESULTS.md, "issue 34 item 1")."""
    lines = ["def entry(h, s, mask, d, r):", "    values = []"]
    for i in range(width):
        lines += [f"    if h[{i}] != s[{i}]:", f"        mask |= {1 << i}",
                  f"        values.append(h[{i}])"]
    lines.append("    return (mask, *values, *d, *r) if mask else same")
    namespace: dict[str, Any] = {"same": _SAME}
    exec("\n".join(lines), namespace)  # noqa: S102 - our own text, made of integers only
    made: Callable[[tuple[Any, ...], tuple[Any, ...], int, tuple[Any, ...], tuple[Any, ...]],
                   tuple[Any, ...]] = namespace["entry"]
    return made


_entry = _entry_function(ROW_HEAD)


def _head_function(width: int) -> Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]]:
    """`head(e, s)`: the first `width` fields of the row of entry `e`, whose mask has no bit
    past them, against the summary's first `width` fields `s` (`unpacked` of the head alone).
    Written out at import as `_entry_function` is: a reader judging a boundary's records
    unpacks a head per record (bench/RESULTS.md, "The web page")."""
    lines = ["def head(e, s):", "    m = e[0]", "    if not m:", "        return s", "    k = 1"]
    for i in range(width):
        lines += [f"    if m & {1 << i}:", f"        v{i} = e[k]", "        k += 1",
                  "    else:", f"        v{i} = s[{i}]"]
    lines.append(f"    return ({', '.join(f'v{i}' for i in range(width))},)")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102 - our own text, made of integers only
    made: Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]] = namespace["head"]
    return made


_head = _head_function(ROW_HEAD)


def _packed_parts(
    rows: Iterable[tuple[PolicyId, tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]], *,
    head: tuple[Any, ...], part_d: tuple[Any, ...], part_r: tuple[Any, ...],
) -> dict[PolicyId, tuple[Any, ...]]:
    """`packed` of each row, given as its policy's head, delivered and read parts, against
    the summary's parts: a shared part's differences are worked out once."""
    diffs: dict[int, tuple[int, tuple[Any, ...]]] = {}
    entries: dict[PolicyId, tuple[Any, ...]] = {}
    entry = _entry
    for policy, h, d, r in rows:
        dd = diffs.get(id(d))
        if dd is None:
            dd = diffs[id(d)] = _part_diff(d, part_d, ROW_DELIVERED.start)
        rd = diffs.get(id(r))
        if rd is None:
            rd = diffs[id(r)] = _part_diff(r, part_r, ROW_READ.start)
        entries[policy] = entry(h, head, dd[0] | rd[0], dd[1], rd[1])
    return entries


# A record's row (`facts.RECORD_ROW`'s order) in two: its head (`facts.ROW_HEAD`: a reading's
# own fields and the delivered revision, most often different per policy) and the rest, which
# is its cluster summary's own object where they are equal (most of a cluster's records: one
# round, one listing): a reader judging many records by the rest compares one object.
RecordRow = tuple[tuple[Any, ...], tuple[Any, ...]]
_AFTER_HEAD = 1 << ROW_HEAD  # an entry's mask below it: only head fields differ


# What a round's reading writes of a policy's row, as `StatusState._read_back` makes it: its
# own fields (`facts.READING_OWN`, the head's first), the `ROW_READ` fields, and the reading
# standing for its group.
ReadBack = tuple[tuple[Any, ...], tuple[Any, ...], PhaseReading]


class PolicyRecords(Mapping[PolicyId, PolicyRecord]):
    """A cluster's per-policy records, read as a mapping (each read builds the record anew);
    written whole (`repack`) or one at a time (`__setitem__`, packed against the summary as
    it is)."""

    __slots__ = ("_cluster", "_entries", "_summary")

    def __init__(self, cluster: ClusterId) -> None:
        self._cluster = cluster
        self._summary: tuple[Any, ...] = _NONE_ROW
        self._entries: dict[PolicyId, tuple[Any, ...]] = {}

    def __getitem__(self, policy: PolicyId) -> PolicyRecord:
        return row_record(unpacked(self._entries[policy], self._summary), self._cluster, policy)

    def __contains__(self, policy: object) -> bool:
        return policy in self._entries

    def __iter__(self) -> Iterator[PolicyId]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __setitem__(self, policy: PolicyId, record: PolicyRecord) -> None:
        self._entries[PolicyId(sys.intern(policy))] = packed(record_row(record), self._summary)

    def __delitem__(self, policy: PolicyId) -> None:
        del self._entries[policy]

    def record_rows(self, policies: Iterable[PolicyId]) -> list[RecordRow | None]:
        """Each of `policies`' record as its row (`RecordRow`), None where it has none: what a
        reader judging many records by their fields reads instead of building each
        (`row_record` builds one of `head + rest`)."""
        entries, summary = self._entries, self._summary
        head, rest = summary[:ROW_HEAD], summary[ROW_HEAD:]
        rows: list[RecordRow | None] = []
        for policy in policies:
            entry = entries.get(policy)
            if entry is None:
                rows.append(None)
            elif entry[0] < _AFTER_HEAD:  # differs from the summary in its head alone
                rows.append((_head(entry, head), rest))
            else:
                row = unpacked(entry, summary)
                rows.append((row[:ROW_HEAD], row[ROW_HEAD:]))
        return rows

    def whole(self) -> dict[PolicyId, PolicyRecord]:
        """Every record, as new objects to change and `repack`."""
        return {p: self[p] for p in self._entries}

    def repack(self, records: Mapping[PolicyId, PolicyRecord]) -> None:
        """Keep exactly `records`, against a summary made of them."""
        rows = {PolicyId(sys.intern(p)): record_row(r) for p, r in records.items()}
        summary = self._summary = summary_row(rows.values())
        self._entries = {p: packed(row, summary) for p, row in rows.items()}

    def _field(self, policy: PolicyId, i: int) -> Any:
        """Field `i` of `policy`'s row (None without a record), unpacking nothing else."""
        entry = self._entries.get(policy)
        if entry is None:
            return None
        mask, bit = entry[0], 1 << i
        if not mask & bit:
            return self._summary[i]
        return entry[(mask & (bit - 1)).bit_count() + 1]

    def fields_of(self, policy: PolicyId, positions: Sequence[int]) -> tuple[Any, ...] | None:
        """The fields at `positions` (in `facts.RECORD_ROW`) of `policy`'s record, unpacking
        nothing else (a rollout's gates read a few fields of thousands of records); None
        without a record."""
        entry = self._entries.get(policy)
        if entry is None:
            return None
        mask, summary = entry[0], self._summary
        return tuple(entry[(mask & ((1 << i) - 1)).bit_count() + 1] if mask >> i & 1
                     else summary[i] for i in positions)

    def revision_held(self, policy: PolicyId) -> int | None:
        """The revision the cluster holds of `policy` as last known: the one its operator
        reported, else the one last delivered (None: neither), unpacking nothing else (a
        rollout's clusters per revision, counted over the fleet)."""
        if self._field(policy, ROW_SEEN_AT) is not None:
            revision: int | None = self._field(policy, _ROW_REVISION)
            return revision
        delivered: int | None = self._field(policy, ROW_DELIVERED_REVISION)
        return delivered

    def take_round(self, deliveries: Deliveries, read: Mapping[PolicyId, ReadBack] | None) -> None:
        """A round's deliveries noted (the newer one wins; a failure keeps the last success's
        revision and time) and, with `read`, its listing's readings replacing every phase (a
        policy not read has none): worked out on the packed rows, a group of deliveries or
        readings that agree at a time (no `PolicyRecord` made, and only the rows the round
        does not overwrite unpacked)."""
        old, summary = self._entries, self._summary
        shared: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # equal parts: one object
        noted = self._noted(deliveries, shared)
        keys = list(dict.fromkeys(itertools.chain(old, read or (), noted)))
        heads: list[tuple[Any, ...]] = []
        delivered: list[tuple[Any, ...]] = []
        readback: list[tuple[Any, ...]] = []
        for policy in keys:
            r = read.get(policy) if read is not None else None
            d = noted.get(policy)
            row = _NONE_ROW
            if (read is None or d is None) and (entry := old.get(policy)) is not None:
                row = unpacked(entry, summary)
            if read is None:
                own = row[ROW_OWN]
                was_read = row[ROW_READ]
                readback.append(shared.setdefault(was_read, was_read))
            elif r is None:  # no longer in the cluster
                own = _NOT_OWN
                readback.append(_NOT_READ)
            else:
                own, was_read, _ = r
                readback.append(was_read)
            if d is None:
                was_delivered = row[ROW_DELIVERED]
                d = (row[ROW_DELIVERED_REVISION], shared.setdefault(was_delivered, was_delivered))
            delivered_revision, was_delivered = d
            heads.append((*own, delivered_revision))  # the `ROW_HEAD` fields
            delivered.append(was_delivered)
        if not keys:
            self._summary, self._entries = _NONE_ROW, {}
            return
        head = tuple(_most_common(column) for column in zip(*heads, strict=True))
        part_d, part_r = _summary_part(delivered), _summary_part(readback)
        self._summary = (*head, *part_d, *part_r)
        self._entries = _packed_parts(zip(keys, heads, delivered, readback, strict=True),
                                      head=head, part_d=part_d, part_r=part_r)

    def _noted(self, deliveries: Deliveries, shared: dict[tuple[Any, ...], tuple[Any, ...]],
               ) -> dict[PolicyId, tuple[int | None, tuple[Any, ...]]]:
        """Per policy delivered, what its deliveries leave of its row: the
        delivered revision and the `ROW_DELIVERED` fields."""
        noted: dict[PolicyId, tuple[int | None, tuple[Any, ...]]] = {}
        parts: dict[int, tuple[dt.datetime, tuple[Any, ...], bool]] = {}
        for policy, revision, d in deliveries.shared():
            part = parts.get(id(d))
            if part is None:
                written = (d.at, d.at, _shared(d.result.value), _shared(d.error),  # its part
                           _shared(d.reason))
                part = parts[id(d)] = (d.at, shared.setdefault(written, written),
                                       d.result is ApplyResult.FAILED)
            at, written, failed = part
            current = noted.get(policy)
            last = (current[1][_D_AT] if current is not None
                    else self._field(policy, ROW_LAST_ATTEMPT_AT))
            if last is not None and last > at:
                continue  # a newer one is known
            if not failed:
                noted[policy] = (revision, written)
                continue
            # A failure keeps the last success's revision and time.
            if current is None:
                current = (self._field(policy, ROW_DELIVERED_REVISION),
                           (None, self._field(policy, ROW_LAST_SUCCESS_AT)))
            success = current[1][_D_SUCCESS]
            if success is not None and success == at:
                success = at
            failure = (at, success, *written[_D_RESULT:])
            noted[policy] = (current[0], shared.setdefault(failure, failure))
        return noted

    def readings(self) -> list[PhaseReading]:
        summary, cluster = self._summary, self._cluster
        found = (row_reading(unpacked(entry, summary), cluster, policy)
                 for policy, entry in self._entries.items())
        return [r for r in found if r is not None]
