"""A round's rows read from the packed report (`records._packed_rows`, one check per kind) are
the rows the careful way makes from each `Delivery` and `PhaseReading` (`_delivery_records`),
and the cleaner notes the same: whatever the deliveries and readings (duplicates, creations
read before and after, values to clean, bad keys, naive times), property-tested. A cluster's
listing times (its state row) are read from the packed readings as from the readings.

The pacing that lets the loop run while rows are made: a row source that ends only once
another task ran sees it run."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.facts import FORWARD
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import (
    ApplyResult,
    Audit,
    ClusterOutcome,
    Delivery,
    PhaseReading,
    Verification,
    audit_fields,
    verified_fields,
)
from convergerd.store.records import (
    _Cleaner,
    _cluster_rows,
    _delivery_records,
    _paced,
    _packed_rows,
    _state_row,
)

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
C1 = ClusterId("c1")

times = st.sampled_from([T0, T0 + dt.timedelta(seconds=1), T0 - dt.timedelta(seconds=1),
                         dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))])
NAIVE = dt.datetime(2026, 1, 1, 12, 0)  # a bug upstream: refused, not written
maybe_times = st.none() | times
texts = st.sampled_from([None, "", "Enforcing", "a reason", "NUL\x00inside", "lone \ud800",
                         "x" * 5000])
policies = st.sampled_from([PolicyId(p) for p in ("p1", "p2", "p3", "p4", "bad\x00id")])
revisions = st.sampled_from([1, 3, 2**70, -1, 0])


@st.composite
def deliveries(draw: st.DrawFn, cluster: ClusterId) -> Delivery:
    return Delivery(cluster, draw(policies), draw(revisions), draw(st.sampled_from(ApplyResult)),
                    draw(times), draw(texts), draw(texts), draw(st.sampled_from([1, 3, 2**40])))


@st.composite
def readings(draw: st.DrawFn, cluster: ClusterId) -> PhaseReading:
    verified = draw(st.none() | st.builds(
        Verification, st.sampled_from(["True", "False", "", None, "bad\x00"]), texts, texts,
        maybe_times, maybe_times))
    audit = draw(st.none() | st.builds(
        Audit, st.none() | st.sampled_from([0, 2, 2**70]), maybe_times, st.booleans(), texts))
    return PhaseReading(cluster, draw(policies), draw(texts), draw(texts), draw(texts),
                        draw(st.none() | revisions), draw(times), **verified_fields(verified),
                        **audit_fields(audit))


@st.composite
def outcomes(draw: st.DrawFn) -> ClusterOutcome:
    """One cluster's outcome, most often clean and in step (the fast way's case), sometimes
    with anything the careful way handles."""
    cluster = draw(st.sampled_from([C1, C1, C1, ClusterId("c\x00")]))
    if draw(st.booleans()):  # clean, one policy at most once, as a round reports
        ids = st.lists(st.sampled_from(["p1", "p2", "p3", "p4", "p5"]), unique=True)
        result = draw(st.sampled_from(ApplyResult))
        at, seen = draw(times | st.just(NAIVE)), draw(times | st.just(NAIVE))
        revision = draw(st.sampled_from([3, 3, 2**70]))
        found = [Delivery(cluster, PolicyId(p), revision, result, at) for p in draw(ids)]
        read = [PhaseReading(cluster, PolicyId(p), "Enforcing", "Reconciled", "ok", revision,
                             seen,
                             # No status with the rest of a condition: none the edge makes.
                             verified_status=draw(st.sampled_from(["True", None])),
                             verified_reason="Denied", verified_message="denied",
                             verified_probed_at=draw(maybe_times), verified_since=at,
                             **audit_fields(draw(st.none() | st.just(Audit(2, at, True)))))
                for p in draw(ids)]
        if draw(st.booleans()) and found:  # delivered again (a later or an earlier attempt)
            found.append(Delivery(cluster, found[0].policy, 4, result, draw(times)))
        if draw(st.booleans()) and read:
            read.append(dataclasses.replace(read[-1], seen_at=draw(times)))
    else:
        found = draw(st.lists(deliveries(cluster), max_size=6))
        read = draw(st.lists(readings(cluster), max_size=6))
    return ClusterOutcome(cluster, reached=True, deliveries=found, phases=read)


def made(make: Callable[[_Cleaner], Any]) -> tuple[Any, int, list[str]]:
    """What `make` returns (or the error it raises), and what its cleaner noted."""
    clean = _Cleaner()
    try:
        made: Any = make(clean)
    except (ValueError, TypeError) as exc:  # a naive time: refused, or not comparable
        made = repr(exc)
    return made, clean.changed, clean.examples


@given(outcomes())
def test_rows_read_from_the_packed_report_are_the_careful_way_s(c: ClusterOutcome) -> None:
    assert made(lambda clean: _cluster_rows(c, clean)) == made(
        lambda clean: _delivery_records(c.deliveries, c.phases, clean))


def test_a_clean_cluster_in_step_takes_the_fast_way() -> None:
    """The fast way is the one a round takes: one delivery and one reading per policy."""
    at = T0 + dt.timedelta(seconds=1)
    c = ClusterOutcome(C1, reached=True, deliveries=[
        Delivery(C1, PolicyId(f"p{i}"), 3, ApplyResult.UNCHANGED, at) for i in range(50)],
        phases=[PhaseReading(C1, PolicyId(f"p{i}"), "Enforcing", "Reconciled", "ok", 3, at,
                             **verified_fields(Verification("True", "Denied", "denied", T0, T0)))
                for i in range(50)])
    rows = _packed_rows(c, _Cleaner())
    assert rows is not None
    assert rows == _delivery_records(c.deliveries, c.phases, _Cleaner())


@given(outcomes(), times)
def test_a_listing_s_times_are_read_from_the_packed_readings(
    c: ClusterOutcome, at: dt.datetime
) -> None:
    # The listing's time: its latest reading, or with none its first write.
    read = [p.seen_at for p in c.phases] or [d.at for d in c.deliveries]
    if any(t.tzinfo is None for t in read):
        with pytest.raises(ValueError, match="naive datetime"):
            _state_row(c, at, _Cleaner())
        return
    listed_at = max((p.seen_at for p in c.phases), default=None)
    if listed_at is None:
        listed_at = min((d.at for d in c.deliveries), default=at)
    # Then the oldest of each time a row is not rewritten for (a probe's, an audit's, ...).
    oldest = tuple(min((t for p in c.phases if (t := getattr(p, f.name)) is not None),
                       default=None) for f in FORWARD)
    assert _state_row(c, at, _Cleaner())[10:] == (listed_at, *oldest)


async def test_rows_made_for_copy_let_another_task_run() -> None:
    """A row source that ends only once another task ran: without turns for the loop, it
    would make its million rows first."""
    other_ran = asyncio.Event()

    async def other() -> None:
        other_ran.set()

    def rows() -> Any:
        for i in range(1_000_000):
            if other_ran.is_set():
                return
            yield (i,)

    task = asyncio.create_task(other())
    taken = [row async for row in _paced(rows())]
    await task
    assert len(taken) < 1_000_000
