"""Each shape of the (policy, cluster) fact holds each field where `core.facts` names it: the
report's packed kinds and the status state's row are built as explicit tuples (for speed), so a
builder whose order drifts from its table shows here, field by field, as a value in the wrong
slot. Every value differs from every other, so a swap cannot go unseen."""

from __future__ import annotations

import datetime as dt
from typing import Any

from convergerd.core.facts import (
    COLUMN_NAMES,
    COLUMNS,
    DELIVERY_KIND,
    READ_COLUMNS,
    READING_KIND,
    RECORD_ROW,
    ROW_DELIVERED,
    ROW_READ,
    Change,
)
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    Audit,
    Deliveries,
    Delivery,
    PhaseReading,
    Readings,
    Verification,
    audit_fields,
    verified_fields,
)
from convergerd.status.records import PolicyRecord, record_row, row_record

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


VERIFIED = Verification("True", "Denied", "probe denied", at(1), at(2))
AUDIT = Audit(7, at(3), synced=True)
READING = PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", "Reconciled",
                       "ready message", 11, at(4), **verified_fields(VERIFIED),
                       **audit_fields(AUDIT))
DELIVERY = Delivery(ClusterId("c1"), PolicyId("p1"), 12, ApplyResult.FAILED, at(5),
                    "422 Unprocessable Entity", "invalid", 3)
RECORD = PolicyRecord(delivered_revision=13, last_result="failed", last_attempt_at=at(6),
                      last_success_at=at(7), last_error="boom", last_reason="invalid",
                      phase=READING)


def reading_value(name: str) -> Any:
    """What a reading holds under `name` as `READING_KIND` and `RECORD_ROW` name it."""
    if name == "verified":
        return True
    if name in ("probed_at", "since"):
        return getattr(VERIFIED, name)
    if name.startswith("verified_"):
        return getattr(VERIFIED, name.removeprefix("verified_"))
    if name == "phase_revision":
        return READING.revision
    return getattr(READING, name)


def test_a_delivery_kind_holds_each_field_where_the_table_names_it() -> None:
    (kind,) = Deliveries([DELIVERY]).kinds()
    assert len(kind) == len(DELIVERY_KIND)
    for i, name in enumerate(DELIVERY_KIND):
        assert kind[i] == getattr(DELIVERY, name), name


def test_a_reading_kind_holds_each_field_where_the_table_names_it() -> None:
    (kind,) = Readings([READING]).kinds()
    assert len(kind) == len(READING_KIND)
    for i, name in enumerate(READING_KIND):
        assert kind[i] == reading_value(name), name
    assert Readings([READING])[0] == READING


def test_a_state_row_holds_each_field_where_the_table_names_it() -> None:
    row = record_row(RECORD)
    assert len(row) == len(RECORD_ROW)
    for i, name in enumerate(RECORD_ROW):
        # A record's own fields are its delivery's; its `phase` is the reading.
        own = name != "phase" and hasattr(RECORD, name)
        expected = getattr(RECORD, name) if own else reading_value(name)
        assert row[i] == expected, name
    assert row_record(row, ClusterId("c1"), PolicyId("p1")) == RECORD


def test_the_row_parts_are_what_a_delivery_and_a_reading_write() -> None:
    delivered = RECORD_ROW[ROW_DELIVERED.start:ROW_DELIVERED.stop]
    assert delivered == ("last_attempt_at", "last_success_at", "last_result",
                         "last_error", "last_reason")
    assert not set(delivered) & set(RECORD_ROW[ROW_READ.start:])


def test_the_record_columns_are_a_deliverys_then_a_readings() -> None:
    assert len(set(COLUMN_NAMES)) == len(COLUMNS)
    assert COLUMN_NAMES[:2] == ("policy_id", "cluster_id")
    assert READ_COLUMNS[0].name == "phase"
    # One reading time decides which of two readings is newer.
    assert [c.name for c in READ_COLUMNS if c.change is Change.SEEN] == ["phase_seen_at"]
