"""Every shape of the (policy, cluster) fact follows `core.facts`' tables: a reading with a
distinct value in every field of `facts.READING` goes through each layer — the report's packing,
the status state's row (told whole and observed from a round), the record's rows (the fast way
from the packed report and the careful way), the SQL, a delivery row read back from the
database's columns — and each field is found where its table names it, by name, and comes
back equal. Nothing here names a reading field but the table: a field added to it is covered
as it is added (docs/design.md, "Where a change goes")."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path
from typing import Any

from convergerd.core import facts
from convergerd.core.facts import (
    COLUMN_NAMES,
    COLUMNS,
    DELIVERED,
    DELIVERY_KIND,
    READ_COLUMNS,
    READING,
    READING_KIND,
    READING_NAMES,
    READING_OWN,
    RECORD_ROW,
    ROW_DELIVERED,
    ROW_OWN,
    ROW_READ,
    Change,
    Field,
)
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    ClusterOutcome,
    Deliveries,
    Delivery,
    Epoch,
    PhaseReading,
    Readings,
    RoundReport,
)
from convergerd.status.records import PolicyRecord, PolicyRecords, record_row, row_record
from convergerd.status.state import StatusState
from convergerd.store import records as store_records
from convergerd.store import store

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
C1, P1 = ClusterId("c1"), PolicyId("p1")
MIGRATIONS = Path(store.__file__).parent / "migrations"


def at(seconds: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def distinct(i: int, f: Field) -> Any:
    """A value of field `f` (the `i`th) that no other field holds, of its column's type."""
    if f.sql == "timestamptz":
        return at(-100 + i)  # before the reading's time: a probe, an audit
    if f.sql in ("bigint", "integer"):
        return 1000 + i
    if f.sql == "boolean":
        return True
    return f"{f.name} value" if f.column is not None else (f"{f.name} value",)


VALUES = {f.name: distinct(i, f) for i, f in enumerate(READING)}
VALUES["seen_at"] = T0  # the listing's time, the latest of the reading's
READING_ = PhaseReading(C1, P1, **VALUES)
# What the status state and the database keep of it: its recorded fields.
KEPT = dataclasses.replace(READING_, **{f.name: f.default for f in READING if f.column is None})
DELIVERY = Delivery(C1, P1, 12, ApplyResult.FAILED, at(5), "422 Unprocessable Entity",
                    "invalid", 3)
RECORD = PolicyRecord(delivered_revision=13, last_result="failed", last_attempt_at=at(6),
                      last_success_at=at(7), last_error="boom", last_reason="invalid",
                      phase=READING_)


def test_the_reading_type_has_the_table_s_fields_in_its_order() -> None:
    fields = dataclasses.fields(PhaseReading)
    assert tuple(f.name for f in fields[:2]) == ("cluster", "policy")
    assert tuple(f.name for f in fields[2:]) == READING_NAMES
    assert len(set(VALUES.values()) - {True}) == len(VALUES) - 1  # each value its own


def test_a_reading_packed_holds_each_field_where_the_table_names_it() -> None:
    packed = Readings([READING_])
    assert packed[0] == READING_
    assert list(packed) == [READING_]
    (kind,) = packed.kinds()
    assert len(kind) == len(READING_KIND)
    for i, name in enumerate(READING_KIND):
        assert kind[i] == getattr(READING_, name), name
    policies, own, _ = packed.columns()
    assert list(policies) == [P1]
    assert [column[0] for column in own] == [getattr(READING_, n) for n in READING_OWN]
    [(policy, own_values, stand_in)] = packed.shared()
    assert (policy, own_values, stand_in) == (
        P1, tuple(getattr(READING_, n) for n in READING_OWN), READING_)


def test_a_state_row_holds_each_field_where_the_table_names_it() -> None:
    row = record_row(RECORD)
    assert len(row) == len(RECORD_ROW)
    for i, name in enumerate(RECORD_ROW):
        # The reading's fields (`phase` among them), then the record's own: its delivery's.
        expected = VALUES[name] if name in VALUES else getattr(RECORD, name)
        assert row[i] == expected, name
    assert row_record(row, C1, P1) == dataclasses.replace(RECORD, phase=KEPT)


def test_a_reading_observed_in_a_round_is_kept_by_name() -> None:
    state = StatusState(identity="test", interval_s=300.0, clock=lambda: T0)
    state.set_clusters([C1])
    state.observe_round(RoundReport(
        started_at=at(-5), finished_at=T0, epoch=Epoch("test", 1), clusters=[
            ClusterOutcome(C1, reached=True, desired=1, in_sync=0, failed=1,
                           deliveries=[DELIVERY], phases=[READING_])]))
    assert state.clusters[C1].policies[P1].phase == KEPT
    # ... and packed among others that differ from it in one field each.
    others = {PolicyId(f"other-{f.name}"): dataclasses.replace(
        RECORD, phase=dataclasses.replace(KEPT, policy=PolicyId(f"other-{f.name}"),
                                          **{f.name: f.default}))
        for f in READING if f.column is not None and f.change is not Change.SEEN}
    records = PolicyRecords(C1)
    records.repack({P1: dataclasses.replace(RECORD, phase=KEPT), **others})
    assert records[P1].phase == KEPT
    assert {p: records[p] for p in others} == others


def test_the_state_row_parts_are_what_a_delivery_and_a_reading_write() -> None:
    assert RECORD_ROW[ROW_DELIVERED] == DELIVERED
    assert RECORD_ROW[ROW_OWN] == READING_OWN
    assert set(RECORD_ROW[ROW_READ]) | set(READING_OWN) == {
        f.name for f in READING if f.column is not None}


def column_of(row: tuple[Any, ...], name: str) -> Any:
    return row[COLUMN_NAMES.index(name)]


def test_a_record_row_holds_each_field_in_its_column_both_ways() -> None:
    outcome = ClusterOutcome(C1, reached=True, deliveries=[DELIVERY], phases=[READING_])
    fast = store_records._packed_rows(outcome, store_records._Cleaner())
    careful = store_records._delivery_records([DELIVERY], [READING_], store_records._Cleaner())
    assert fast is not None
    assert fast == careful
    [row] = fast
    assert len(row) == len(COLUMNS)
    for f in READING:
        if f.column is not None:
            assert column_of(row, f.column) == VALUES[f.name], f.name
    assert (column_of(row, "policy_id"), column_of(row, "revision")) == (P1, 12)


def test_a_delivery_row_read_back_holds_the_reading_by_its_columns() -> None:
    columns = {"policy_id": P1, "cluster_id": C1, "delivered_revision": 13,
               "last_result": "failed", "last_attempt_at": at(6), "last_success_at": at(7),
               "last_error": "boom", "last_reason": "invalid", "attempts": 3, "round_id": 7,
               **{f.column: VALUES[f.name] for f in READING if f.column is not None}}
    row = store._delivery_row(columns)  # type: ignore[arg-type]  # a mapping, as a Record
    assert row.reading == KEPT
    assert PolicyRecord.from_row(row) == dataclasses.replace(RECORD, phase=KEPT)
    unread = {**columns, facts.SEEN_COLUMN: None}
    assert store._delivery_row(unread).reading is None  # type: ignore[arg-type]


def test_the_record_s_sql_names_every_reading_column() -> None:
    for c in READ_COLUMNS:
        assert f"{c.name} {c.sql}" in store_records._CREATE_INCOMING
        assert re.search(rf"\b{c.name}\b", store_records._UPSERT_DELIVERIES), c.name
        assert re.search(rf"\bd\.{c.name}\b", store._D_COLUMNS), c.name
    # One reading time decides which of two readings is newer.
    assert [c.name for c in READ_COLUMNS if c.change is Change.SEEN] == [facts.SEEN_COLUMN]


def test_every_recorded_column_is_added_by_a_migration() -> None:
    sql = "\n".join(p.read_text() for p in sorted(MIGRATIONS.glob("*.sql")))
    for f in READING:
        if f.column is not None:
            assert re.search(rf"\b{f.column}\s+{f.sql}\b", sql, re.IGNORECASE), f.column
        if f.listed is not None:
            assert re.search(rf"\b{f.listed}\s+timestamptz\b", sql, re.IGNORECASE), f.listed


def test_a_delivery_kind_holds_each_field_where_the_table_names_it() -> None:
    (kind,) = Deliveries([DELIVERY]).kinds()
    assert len(kind) == len(DELIVERY_KIND)
    for i, name in enumerate(DELIVERY_KIND):
        assert kind[i] == getattr(DELIVERY, name), name


def test_the_record_columns_are_a_deliverys_then_a_readings() -> None:
    assert len(set(COLUMN_NAMES)) == len(COLUMNS)
    assert COLUMN_NAMES[:2] == ("policy_id", "cluster_id")
    assert COLUMNS[len(COLUMNS) - len(READ_COLUMNS):] == READ_COLUMNS
