"""The time decoders of every edge, property-tested: `lease.parse_microtime` (Lease times),
`decode.rfc3339` (condition times from clusters) and what is computed from them
(`lease.next_renew_time` and the Lease bodies, `operator.reconcile.next_probe_in`, the times
`convergerd status` shows). Whatever
the text — far past, far future, an offset across year 0 or 9999, arbitrary strings, huge
numbers, cut short — each returns a value or its own error class, never anything else."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from convergerd.cli.status import render_status
from convergerd.core.decode import rfc3339
from convergerd.leader.lease import (
    MAX_RENEW_TIME_AHEAD,
    LeaseFormatError,
    LeaseRecord,
    acquire_body,
    format_microtime,
    next_renew_time,
    parse_microtime,
    release_body,
    renew_body,
)
from convergerd.operator.reconcile import PolicyObject, next_probe_in

UTC = dt.UTC
NOW = dt.datetime(2026, 12, 3, 9, 0, 0, tzinfo=UTC)


@st.composite
def time_like(draw: st.DrawFn) -> str:
    """Text shaped like an RFC 3339 time, with every part free to be out of range: years 0 and
    9999 (and more digits), months, days and hours past their ends, offsets up to ±99:99, the
    fraction of any length, `Z` or `z`, and the whole cut anywhere."""
    year = draw(st.integers(0, 99999))
    parts = [draw(st.integers(0, 99)) for _ in range(5)]
    fraction = draw(st.text("0123456789", max_size=12))
    zone = draw(st.sampled_from(["Z", "z", ""]) | st.builds(
        lambda sign, h, m: f"{sign}{h:02d}:{m:02d}",
        st.sampled_from("+-"), st.integers(0, 99), st.integers(0, 99)))
    text = (f"{year:04d}-{parts[0]:02d}-{parts[1]:02d}T{parts[2]:02d}:{parts[3]:02d}:"
            f"{parts[4]:02d}{'.' + fraction if fraction else ''}{zone}")
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


def extreme_times() -> st.SearchStrategy[dt.datetime]:
    """Any instant, with a fixed offset (a zone's DST gap is not an instant)."""
    offsets = st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59),
                            max_value=dt.timedelta(hours=23, minutes=59))
    return st.datetimes(min_value=dt.datetime.min, max_value=dt.datetime.max,
                        timezones=st.builds(dt.timezone, offsets) | st.just(UTC))


UTC_TIMES = st.datetimes(min_value=dt.datetime.min, max_value=dt.datetime.max,
                         timezones=st.just(UTC))
TEXT = st.text(max_size=80) | time_like() | st.builds(format_microtime, UTC_TIMES)


@given(TEXT)
@example("9999-12-31T23:59:59.999999Z")
@example("9999-12-31T23:30:00.000000-01:00")
@example("0001-01-01T00:30:00.000000+01:00")
@example("0000-01-01T00:00:00.000000Z")
@example("2025-01-02T03:04:05.000000Z\n")
def test_parse_microtime_returns_a_utc_time_or_its_own_error(text: str) -> None:
    try:
        parsed = parse_microtime(text)
    except LeaseFormatError:
        return
    assert parsed.tzinfo is UTC
    # What it accepts is a MicroTime: formatting it again gives the same instant.
    assert parse_microtime(format_microtime(parsed)) == parsed


@given(extreme_times())
def test_every_time_python_holds_round_trips_through_a_microtime(moment: dt.datetime) -> None:
    try:
        text = format_microtime(moment)
    except OverflowError:
        return  # a local time whose UTC is past the calendar: never a time we write
    assert parse_microtime(text) == moment


@given(st.text(max_size=80) | time_like() | st.integers() | st.floats() | st.none())
@example("9999-12-31T23:59:59.999999-01:00")
@example("0001-01-01T00:00:00+00:01")
def test_rfc3339_returns_a_utc_time_or_none(value: object) -> None:
    parsed = rfc3339(value)
    assert parsed is None or parsed.tzinfo is UTC


@given(TEXT | st.none(), st.datetimes(min_value=dt.datetime(1970, 1, 1),
                                      max_value=dt.datetime(2200, 1, 1), timezones=st.just(UTC)))
@example("9999-12-31T23:59:59.999999Z", NOW)
def test_next_renew_time_is_always_a_change_and_never_far_from_now(
    previous: str | None, now: dt.datetime
) -> None:
    renewed = next_renew_time(previous, now)
    written = format_microtime(renewed)
    assert written != previous
    assert now <= renewed <= now + MAX_RENEW_TIME_AHEAD + dt.timedelta(microseconds=1)


LEASE_SPEC = st.fixed_dictionaries({}, optional={
    "holderIdentity": st.sampled_from(["me", "other", ""]),
    "leaseDurationSeconds": st.integers(min_value=-(10**30), max_value=10**30),
    "leaseTransitions": st.integers(min_value=-(10**30), max_value=10**30),
    "acquireTime": TEXT,
    "renewTime": TEXT,
})


@given(LEASE_SPEC)
def test_lease_bodies_from_any_decoded_lease_never_raise_anything_else(
    spec: dict[str, Any],
) -> None:
    current = {"metadata": {"name": "convergerd", "resourceVersion": "1"}, "spec": spec}
    record = LeaseRecord.from_object(current)
    taken = acquire_body(current, identity="me", duration_s=15.0, now=NOW)
    released = release_body(current, now=NOW)
    for body in (taken, released):
        # What we write is what the API server accepts: int32 numbers, MicroTimes near now.
        assert 0 <= body["spec"]["leaseTransitions"] <= 2**31 - 1
        renewed = parse_microtime(body["spec"]["renewTime"])
        assert renewed - NOW <= MAX_RENEW_TIME_AHEAD
        if "acquireTime" in body["spec"]:
            assert parse_microtime(body["spec"]["acquireTime"]) <= renewed
    if record.holder == "me":
        assert renew_body(current, identity="me", duration_s=15.0, now=NOW) == taken


@given(st.text(max_size=40) | time_like() | st.builds(format_microtime, UTC_TIMES))
@example("9999-12-31T23:59:59Z")
def test_the_next_probe_is_never_more_than_one_interval_away(probe_time: str) -> None:
    policy = PolicyObject.from_object({
        "metadata": {"name": "policy-p1", "uid": "u-1", "generation": 1},
        "spec": {"policyId": "p1", "boundary": "b1", "enabled": True,
                 "rule": {"type": "ForbidLatestTag"}},
        "status": {"conditions": [{"type": "Verified", "status": "True", "reason": "Denied",
                                   "lastProbeTime": probe_time}]},
    })
    delay = next_probe_in(policy, now=NOW, interval_s=600, first_delay_s=5)
    assert 0 <= delay <= 600


@given(st.text(max_size=60) | time_like() | st.integers() | st.none())
@example("9999-12-31T23:59:59-01:00")
@example("0001-01-01T00:00:00+01:00")
def test_convergerd_status_shows_any_time_it_is_sent(value: object) -> None:
    """Before: an offset past year 1 or 9999 in /status crashed `convergerd status`."""
    shown = render_status({"next_round_at": value, "clusters": []})
    assert "next round: " in shown
