"""Lease arithmetic: MicroTime, observation, acquisition, bodies, fencing, jitter."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from convergerd.config import MAX_IDENTITY_CHARS
from convergerd.leader.lease import (
    INT32_MAX,
    MAX_HOLDER_CHARS,
    MAX_PEER_DURATION_FACTOR,
    STALLED_AFTER_DURATIONS,
    LeaseFormatError,
    LeaseReading,
    LeaseRecord,
    acquire_body,
    acquire_delay,
    can_acquire,
    format_microtime,
    honoured_duration_s,
    jittered,
    lease_duration_field,
    new_lease_body,
    next_renew_time,
    next_transitions,
    observe,
    parse_microtime,
    release_body,
    renew_body,
    stalled_s,
    write_budget,
)
from convergerd.leader.shards import live_holder, live_member

UTC = dt.UTC
T0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def lease(holder: str | None, *, rv: str = "7", transitions: int = 0, duration: int | None = 15,
          renew: str = "2025-01-02T03:04:05.000000Z", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseTransitions": transitions, "renewTime": renew,
                            "acquireTime": "2025-01-02T03:00:00.000000Z"}
    if holder is not None:
        spec["holderIdentity"] = holder
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    spec.update(extra)
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "convergerd", "namespace": "stackship-system",
                     "resourceVersion": rv, "uid": "u-1",
                     "creationTimestamp": "2025-01-01T00:00:00Z",
                     "managedFields": [{"manager": "x"}]},
        "spec": spec,
    }


def rec(holder: str, *, duration: int | None = 15, renew: str = "r1", transitions: int = 0,
        rv: str = "1") -> LeaseRecord:
    return LeaseRecord(holder=holder, duration_s=duration, acquire_time=None, renew_time=renew,
                       transitions=transitions, resource_version=rv)


# --- MicroTime -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (T0, "2025-01-02T03:04:05.000000Z"),  # isoformat() would drop the fraction here
        (T0.replace(microsecond=7), "2025-01-02T03:04:05.000007Z"),
        (T0.replace(microsecond=123456), "2025-01-02T03:04:05.123456Z"),
        (dt.datetime(2025, 1, 2, 5, 4, 5, 10, tzinfo=dt.timezone(dt.timedelta(hours=2))),
         "2025-01-02T03:04:05.000010Z"),
        (dt.datetime(2025, 1, 1, 23, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
         "2025-01-02T04:00:00.000000Z"),
    ],
)
def test_format_microtime_is_utc_with_six_digits(moment: dt.datetime, text: str) -> None:
    assert format_microtime(moment) == text
    assert parse_microtime(text) == moment


def test_format_microtime_rejects_naive_datetime() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        format_microtime(dt.datetime(2025, 1, 2))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-01-02T03:04:05.123456Z", T0.replace(microsecond=123456)),
        ("2025-01-02T05:04:05.000000+02:00", T0),
    ],
)
def test_parse_microtime(text: str, expected: dt.datetime) -> None:
    assert parse_microtime(text) == expected
    assert parse_microtime(text).tzinfo == UTC


@pytest.mark.parametrize(
    "text",
    ["2025-01-02T03:04:05Z", "2025-01-02T03:04:05.123Z", "2025-01-02T03:04:05.1234567Z",
     "2025-01-02 03:04:05.123456Z", "2025-01-02T03:04:05.123456", "2025-13-02T03:04:05.000000Z",
     ""],
)
def test_parse_microtime_rejects_other_shapes(text: str) -> None:
    with pytest.raises(LeaseFormatError):
        parse_microtime(text)


@pytest.mark.parametrize(
    "text",
    [
        # Go parses these (an offset carries them past year 0 or 9999 in UTC); Python cannot
        # hold them: LeaseFormatError, not OverflowError.
        "9999-12-31T23:30:00.000000-01:00",
        "0001-01-01T00:30:00.000000+01:00",
        "0000-01-01T00:00:00.000000Z",
        "2025-01-02T03:04:05.000000+24:00",  # an offset out of range
        "2025-01-02T03:04:05.000000Z\n",  # `$` would have matched before the newline
        "\u0662\u0660\u0662\u0665-01-02T03:04:05.000000Z",  # digits, but not ASCII ones
    ],
)
def test_parse_microtime_raises_only_its_own_error_at_the_edges(text: str) -> None:
    with pytest.raises(LeaseFormatError):
        parse_microtime(text)


def test_parse_microtime_holds_the_extremes_python_can() -> None:
    assert parse_microtime("9999-12-31T23:59:59.999999Z") == dt.datetime.max.replace(tzinfo=UTC)
    assert parse_microtime("0001-01-01T00:00:00.000000Z") == dt.datetime.min.replace(tzinfo=UTC)


# --- the record -----------------------------------------------------------------------------------


def test_record_from_object() -> None:
    record = LeaseRecord.from_object(lease("a", rv="42", transitions=3))
    assert record == LeaseRecord("a", 15, "2025-01-02T03:00:00.000000Z",
                                 "2025-01-02T03:04:05.000000Z", 3)
    assert record.resource_version == "42"
    assert record.held


def test_record_from_empty_object_is_unheld() -> None:
    record = LeaseRecord.from_object({"metadata": {"name": "x"}})
    assert record == LeaseRecord("", None, None, None, 0)
    assert not record.held


@pytest.mark.parametrize(
    "obj",
    [
        "<html>bad gateway</html>",
        ["not", "a", "lease"],
        None,
        {"spec": "nope"},
        {"metadata": [], "spec": {}},
        {"spec": {"holderIdentity": 5}},
        {"spec": {"leaseDurationSeconds": "15"}},
        {"spec": {"leaseDurationSeconds": True}},
        {"spec": {"leaseTransitions": 1.5}},
        {"metadata": {"resourceVersion": 7}, "spec": {}},
    ],
)
def test_record_rejects_garbage(obj: object) -> None:
    with pytest.raises(LeaseFormatError):
        LeaseRecord.from_object(obj)


def test_resource_version_alone_is_not_a_change() -> None:
    assert rec("a", rv="1") == rec("a", rv="2")


# --- observation and acquisition ------------------------------------------------------------------


def test_observation_time_moves_only_when_the_record_changes() -> None:
    first = observe(None, rec("a", renew="r1"), 100.0)
    assert first == LeaseReading(rec("a", renew="r1"), 100.0)
    same = observe(first, rec("a", renew="r1", rv="9"), 105.0)
    assert same is first
    changed = observe(same, rec("a", renew="r2"), 110.0)
    assert changed == LeaseReading(rec("a", renew="r2"), 110.0)
    assert observe(changed, None, 120.0) is None


ME = "me"


@pytest.mark.parametrize(
    ("observed", "now", "expected", "why"),
    [
        (None, 0.0, True, "no Lease yet: create it"),
        (LeaseReading(rec(""), 100.0), 100.0, True, "released: take it at once"),
        (LeaseReading(rec(ME), 100.0), 100.0, True, "ours: renew"),
        (LeaseReading(rec(ME), 100.0), 1e9, True, "ours, even long after"),
        (LeaseReading(rec("other"), 100.0), 100.0, False, "just observed: respect it"),
        (LeaseReading(rec("other"), 100.0), 114.999, False, "still within its duration"),
        (LeaseReading(rec("other"), 100.0), 115.0, True, "unchanged for its duration: expired"),
        (LeaseReading(rec("other", duration=60), 100.0), 130.0, False, "its own duration counts"),
        (LeaseReading(rec("other", duration=60), 100.0), 160.0, True, "its own duration counts"),
        (LeaseReading(rec("other", duration=None), 100.0), 114.0, False, "no duration: ours (15)"),
        (LeaseReading(rec("other", duration=0), 100.0), 114.0, False, "zero duration: ours (15)"),
        (LeaseReading(rec("other", duration=None), 100.0), 115.0, True, "no duration: ours (15)"),
    ],
)
def test_can_acquire(observed: LeaseReading | None, now: float, expected: bool, why: str) -> None:
    assert can_acquire(observed, now, ME, own_duration_s=15.0) is expected, why


def test_wall_clock_jump_does_not_cause_takeover() -> None:
    """The record's renewTime may be hours behind our wall clock (or ahead): it is never compared
    with it. Only the monotonic time since we saw the record change counts."""
    stale_looking = rec("other", renew="1999-01-01T00:00:00.000000Z")
    seen = observe(None, stale_looking, 50.0)
    assert not can_acquire(seen, 50.0, ME)
    assert not can_acquire(seen, 64.0, ME)
    # The holder renews (a change), with a renewTime from a wall clock that jumped a year ahead.
    renewed = observe(seen, rec("other", renew="2026-01-01T00:00:00.000000Z"), 60.0)
    assert renewed is not None
    assert not can_acquire(renewed, 74.0, ME)
    assert can_acquire(renewed, 75.0, ME)


def test_a_foreign_lease_is_respected_while_it_keeps_changing() -> None:
    observed: LeaseReading | None = None
    for step in range(100):  # renewed every 2 s for 200 s: never ours
        now = 2.0 * step
        observed = observe(observed, rec("other", renew=f"r{step}"), now)
        assert not can_acquire(observed, now + 1.9, ME)
    assert observed is not None
    assert not can_acquire(observed, 198.0 + 14.9, ME)
    assert can_acquire(observed, 198.0 + 15.0, ME)  # it stopped changing 15 s ago


def test_release_lets_a_standby_acquire_at_once() -> None:
    held = lease("leader", transitions=4)
    released = release_body(held, now=T0)
    seen = observe(LeaseReading(LeaseRecord.from_object(held), 0.0),
                   LeaseRecord.from_object(released), 1.0)
    assert can_acquire(seen, 1.0, "standby")
    taken = acquire_body(released, identity="standby", duration_s=15, now=T0)
    assert taken["spec"]["holderIdentity"] == "standby"
    assert taken["spec"]["leaseTransitions"] == 5


# --- bodies ---------------------------------------------------------------------------------------


def test_new_lease_body() -> None:
    body = new_lease_body(namespace="ns", name="l", identity=ME, duration_s=15.0, now=T0)
    assert body == {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l", "namespace": "ns"},
        "spec": {"holderIdentity": ME, "leaseDurationSeconds": 15,
                 "acquireTime": "2025-01-02T03:04:05.000000Z",
                 "renewTime": "2025-01-02T03:04:05.000000Z", "leaseTransitions": 0},
    }


@pytest.mark.parametrize(
    ("previous_holder", "previous_transitions", "transitions", "acquire_changes"),
    [
        ("other", 0, 1, True),  # taken over: one transition more
        ("other", 41, 42, True),
        ("", 3, 4, True),  # after a release
        (None, 3, 4, True),  # holderIdentity absent
        (ME, 3, 3, False),  # already ours: a renewal, no transition
    ],
)
def test_acquire_body_counts_transitions(
    previous_holder: str | None, previous_transitions: int, transitions: int,
    acquire_changes: bool,
) -> None:
    current = lease(previous_holder, transitions=previous_transitions, rv="99",
                    preferredHolder="someone")
    now = T0 + dt.timedelta(hours=1)
    body = acquire_body(current, identity=ME, duration_s=15.0, now=now)
    spec = body["spec"]
    assert spec["holderIdentity"] == ME
    assert spec["leaseTransitions"] == transitions
    assert spec["renewTime"] == "2025-01-02T04:04:05.000000Z"
    expected_acquire = spec["renewTime"] if acquire_changes else "2025-01-02T03:00:00.000000Z"
    assert spec["acquireTime"] == expected_acquire
    assert spec["preferredHolder"] == "someone"  # unknown fields survive
    assert body["metadata"] == {"name": "convergerd", "namespace": "stackship-system",
                                "resourceVersion": "99", "uid": "u-1"}
    assert current["spec"].get("holderIdentity") == previous_holder  # input untouched


def test_renew_body_only_moves_renew_time() -> None:
    current = lease(ME, transitions=2, rv="5")
    body = renew_body(current, identity=ME, duration_s=15.0, now=T0 + dt.timedelta(seconds=2))
    assert body["spec"] == {**current["spec"], "renewTime": "2025-01-02T03:04:07.000000Z"}
    assert body["metadata"]["resourceVersion"] == "5"


def test_renew_body_refuses_a_foreign_lease() -> None:
    with pytest.raises(ValueError, match="held by 'other'"):
        renew_body(lease("other"), identity=ME, duration_s=15.0, now=T0)


@pytest.mark.parametrize(
    ("previous", "now", "expected"),
    [
        (None, T0, T0),
        ("2025-01-02T03:04:04.000000Z", T0, T0),  # normal: later than before
        # Wall clock stood still or went back: still a change, one microsecond later.
        ("2025-01-02T03:04:05.000000Z", T0, T0 + dt.timedelta(microseconds=1)),
        ("2025-01-02T04:00:00.000000Z", T0, dt.datetime(2025, 1, 2, 4, 0, 0, 1, tzinfo=UTC)),
        ("garbage", T0, T0),
        # Far ahead of our clock (by hand, or a clock far off): not followed, and no overflow.
        ("9999-12-31T23:59:59.999999Z", T0, T0),
        ("9999-12-31T23:30:00.000000-01:00", T0, T0),
        ("2025-01-02T04:04:05.000001Z", T0, T0),  # just over an hour ahead
        ("0001-01-01T00:00:00.000000Z", T0, T0),  # far behind: now is later anyway
    ],
)
def test_next_renew_time_always_changes_the_record(
    previous: str | None, now: dt.datetime, expected: dt.datetime
) -> None:
    assert next_renew_time(previous, now) == expected


def test_renewing_with_a_frozen_wall_clock_still_changes_the_record() -> None:
    current = lease(ME, renew=format_microtime(T0))
    body = renew_body(current, identity=ME, duration_s=15.0, now=T0)
    assert LeaseRecord.from_object(body) != LeaseRecord.from_object(current)


@pytest.mark.parametrize(
    "renew", ["9999-12-31T23:59:59.999999Z", "9999-12-31T23:30:00.000000-01:00",
              "0001-01-01T00:30:00.000000+01:00"])
def test_a_lease_with_a_time_at_the_edge_of_the_calendar_is_renewed_and_released(
    renew: str,
) -> None:
    current = lease(ME, renew=renew)
    renewed = renew_body(current, identity=ME, duration_s=15.0, now=T0)
    assert renewed["spec"]["renewTime"] == format_microtime(T0)
    released = release_body(current, now=T0)
    assert released["spec"]["renewTime"] == format_microtime(T0)
    taken = acquire_body(lease("other", renew=renew), identity=ME, duration_s=15.0, now=T0)
    assert taken["spec"]["renewTime"] == format_microtime(T0)


@pytest.mark.parametrize(
    ("spec", "duration", "transitions"),
    [
        ({"leaseDurationSeconds": INT32_MAX, "leaseTransitions": INT32_MAX}, INT32_MAX, INT32_MAX),
        # Out of the int32 range the API server accepts: read as absent.
        ({"leaseDurationSeconds": INT32_MAX + 1, "leaseTransitions": INT32_MAX + 1}, None, 0),
        ({"leaseDurationSeconds": 10**99, "leaseTransitions": -(10**99)}, None, 0),
        ({"leaseDurationSeconds": 0, "leaseTransitions": -1}, None, 0),
    ],
)
def test_record_reads_int32_fields_out_of_range_as_absent(
    spec: dict[str, Any], duration: int | None, transitions: int
) -> None:
    record = LeaseRecord.from_object({"spec": {"holderIdentity": "x", **spec}})
    assert (record.duration_s, record.transitions) == (duration, transitions)
    # Honoured up to ten of our durations (the int32 maximum is 68 years).
    assert LeaseReading(record, 100.0).expires_mono(15.0) == 100.0 + min(duration or 15.0, 150.0)


def test_transitions_wrap_to_zero_after_the_int32_maximum() -> None:
    assert next_transitions(6) == 7
    assert next_transitions(INT32_MAX) == 0
    taken = acquire_body(lease("other", transitions=INT32_MAX), identity=ME, duration_s=15.0,
                         now=T0)
    assert taken["spec"]["leaseTransitions"] == 0


def test_release_body_empties_the_holder_and_keeps_the_rest() -> None:
    current = lease(ME, transitions=6, rv="12")
    body = release_body(current, now=T0 + dt.timedelta(seconds=1))
    assert body["spec"] == {**current["spec"], "holderIdentity": "",
                            "renewTime": "2025-01-02T03:04:06.000000Z"}
    assert body["metadata"]["resourceVersion"] == "12"
    assert not LeaseRecord.from_object(body).held


@pytest.mark.parametrize(("seconds", "field"), [(15.0, 15), (15.2, 16), (0.3, 1), (1.0, 1)])
def test_lease_duration_field_rounds_up(seconds: float, field: int) -> None:
    assert lease_duration_field(seconds) == field


# --- fencing and timing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_renew", "deadline", "now", "budget"),
    [
        (100.0, 10.0, 100.0, 10.0),
        (100.0, 10.0, 104.5, 5.5),
        (100.0, 10.0, 110.0, 0.0),  # fenced exactly at the deadline
        (100.0, 10.0, 200.0, -90.0),
    ],
)
def test_write_budget(last_renew: float, deadline: float, now: float, budget: float) -> None:
    assert write_budget(last_renew, deadline, now) == pytest.approx(budget)


def test_fence_closes_before_anyone_can_take_over() -> None:
    """With settings the config check accepts, the leader's budget runs out before a standby that
    saw the renewal (no earlier than it was sent) may take the Lease."""
    duration, deadline, retry, timeout = 15.0, 10.0, 2.0, 2.0
    assert duration > deadline + retry + timeout
    sent = 100.0
    seen_by_standby = observe(None, rec("leader"), sent + 0.001)
    fenced_at = sent + deadline
    assert write_budget(sent, deadline, fenced_at) <= 0
    assert not can_acquire(seen_by_standby, fenced_at + retry + timeout, "standby")


def test_jitter_stays_within_its_spread() -> None:
    rng = random.Random(4)
    samples = [jittered(2.0, rng) for _ in range(1000)]
    assert min(samples) >= 1.6
    assert max(samples) <= 2.4
    assert max(samples) - min(samples) > 0.6  # it does spread


@pytest.mark.parametrize(
    ("observed", "now", "low", "high"),
    [
        (None, 0.0, 1.6, 2.4),  # no Lease: a jittered retry period
        (LeaseReading(rec("other"), 100.0), 101.0, 1.6, 2.4),  # far from expiry
        (LeaseReading(rec("other"), 100.0), 114.5, 0.5, 0.9),  # wake at expiry (+ up to 0.4 s)
        (LeaseReading(rec("other"), 100.0), 120.0, 1.6, 2.4),  # already expired: next period
        (LeaseReading(rec(ME), 100.0), 114.5, 1.6, 2.4),
    ],
)
def test_acquire_delay(observed: LeaseReading | None, now: float, low: float, high: float) -> None:
    rng = random.Random(1)
    for _ in range(200):
        delay = acquire_delay(observed, now, ME, 2.0, rng, own_duration_s=15.0)
        assert low <= delay <= high


# --- what a peer may claim: bounded ---------------------------------------------------------------


def test_a_holder_identity_is_cleaned_and_cut_where_it_is_read() -> None:
    """Before: a 1 MB holderIdentity went into every cluster's entry of /status and into a
    metric label."""
    huge = LeaseRecord.from_object(lease("x" * 2**20))
    assert len(huge.holder) == MAX_HOLDER_CHARS
    assert huge.holder == "x" * (MAX_HOLDER_CHARS - 1) + "…"
    assert huge.held
    forged = LeaseRecord.from_object(lease("evil\nlevel=ERROR msg=\x1b[31m\u202e"))
    assert forged.holder.isprintable()
    assert forged.holder.startswith("evil level=ERROR")
    assert LeaseRecord.from_object(lease("convergerd-7d9f-abc123")).holder == (
        "convergerd-7d9f-abc123")  # a sane identity reads back as itself
    assert MAX_HOLDER_CHARS == MAX_IDENTITY_CHARS  # ours is held to the same bound


@pytest.mark.parametrize(
    ("claimed", "honoured", "why"),
    [
        (15, 15.0, "ours"),
        (60, 60.0, "a longer one, within ten of ours"),
        (150, 150.0, "exactly ten of ours"),
        (151, 150.0, "past ten of ours: capped"),
        (INT32_MAX, 150.0, "68 years: capped"),
        (None, 15.0, "absent: ours"),
        (0, 15.0, "not a duration: ours"),
        (1, 1.0, "shorter than ours counts as it is"),
    ],
)
def test_a_claimed_duration_is_honoured_up_to_ten_of_ours(
    claimed: int | None, honoured: float, why: str
) -> None:
    assert MAX_PEER_DURATION_FACTOR == 10.0
    assert honoured_duration_s(claimed, 15.0) == honoured, why
    seen = LeaseReading(rec("other", duration=claimed), 100.0)
    assert seen.expires_mono(15.0) == 100.0 + honoured, why
    assert not can_acquire(seen, 100.0 + honoured - 0.001, ME, own_duration_s=15.0), why
    assert can_acquire(seen, 100.0 + honoured, ME, own_duration_s=15.0), why


def test_a_shard_lease_with_a_huge_duration_stops_counting_at_the_cap() -> None:
    seen = LeaseReading(rec("ghost", duration=INT32_MAX), 100.0)
    assert live_holder(seen, 249.9, 15.0) == "ghost"
    assert live_holder(seen, 250.0, 15.0) == ""


@pytest.mark.parametrize(("claimed", "counted_until"), [
    (INT32_MAX, 115.0),  # a ghost member: counted for one of our durations, not ten
    (15, 115.0),
    (4, 104.0),  # a shorter claim is its own
    (None, 115.0),
])
def test_a_member_counts_only_while_its_record_changes_within_our_duration(
        claimed: int | None, counted_until: float) -> None:
    """Every live replica renews its membership each retry period; a member record left
    unchanged for our lease duration is no replica, whatever it claims, so our share is not
    shrunk (and shards handed back for nobody) for ten of our durations."""
    seen = LeaseReading(rec("ghost", duration=claimed), 100.0)
    assert live_member(seen, counted_until - 0.001, 15.0) == "ghost"
    assert live_member(seen, counted_until, 15.0) == ""
    assert live_member(LeaseReading(rec("ghost", duration=claimed), counted_until),
                       counted_until + 1.0, 15.0) == "ghost"  # it renewed: counted again


def test_stalled_from_two_of_our_durations_unchanged_until_the_claim_runs_out() -> None:
    """A holder that wrote 68 years and never renews: stalled from 2 x 15 s after we saw the
    record change until the capped claim (150 s) runs out and the Lease may be taken."""
    assert STALLED_AFTER_DURATIONS == 2.0
    seen = LeaseReading(rec("ghost", duration=INT32_MAX), 100.0)
    assert stalled_s(seen, 130.0, ME, own_duration_s=15.0) is None
    assert stalled_s(seen, 130.5, ME, own_duration_s=15.0) == 30.5
    assert stalled_s(seen, 249.9, ME, own_duration_s=15.0) == pytest.approx(149.9)
    assert stalled_s(seen, 250.0, ME, own_duration_s=15.0) is None  # ours to take now
    # A renewal is a change: the observation starts again, and so does the count.
    renewed = observe(seen, rec("ghost", duration=INT32_MAX, renew="r2"), 200.0)
    assert stalled_s(renewed, 229.0, ME, own_duration_s=15.0) is None


@pytest.mark.parametrize(
    ("observed", "why"),
    [
        (None, "no Lease"),
        (LeaseReading(rec(""), 0.0), "released"),
        (LeaseReading(rec(ME, duration=INT32_MAX), 0.0), "ours"),
        (LeaseReading(rec("other"), 0.0), "our duration: taken over at 15 s, before 30 s"),
        (LeaseReading(rec("other", duration=30), 0.0), "expires at exactly two of ours"),
    ],
)
def test_never_stalled(observed: LeaseReading | None, why: str) -> None:
    for now in (0.0, 14.0, 29.0, 31.0, 1e6):
        assert stalled_s(observed, now, ME, own_duration_s=15.0) is None, why


def test_a_live_holder_with_a_long_duration_is_never_stalled() -> None:
    """Standbys stay ready behind a live leader, whatever duration it writes: it renews (a
    change) every retry period."""
    observed: LeaseReading | None = None
    for step in range(500):
        now = 2.0 * step
        observed = observe(observed, rec("other", duration=INT32_MAX, renew=f"r{step}"), now)
        assert stalled_s(observed, now + 1.9, ME, own_duration_s=15.0) is None
