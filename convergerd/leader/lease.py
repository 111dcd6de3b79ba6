"""Lease arithmetic for leader election (coordination.k8s.io/v1), pure: no I/O, no clocks read.

Two kinds of time appear here and never mix:

- **monotonic seconds** (`*_mono`, a float from the caller's monotonic clock) make every
  decision: when a foreign lease expires, how long the leader may still write;
- **wall-clock datetimes** only fill the Lease's `acquireTime` / `renewTime` strings, which other
  clients read for display. They are never compared with our own clock: another replica's wall
  clock may be off, and ours may jump.

A foreign lease is judged the way client-go judges it: from the monotonic time at which *we
observed* its record change, plus the record's own `leaseDurationSeconds` — at most
`MAX_PEER_DURATION_FACTOR` times our own (`honoured_duration_s`): a holder that wrote a 68-year
duration and never renews is taken over after ten of our durations, not 68 years.

What a Lease holds was written by anyone with access to it, so it is decoded with bounds: a
MicroTime parses to a datetime or raises `LeaseFormatError` (never `OverflowError`), the
int32 fields out of the API's range read as absent, and no arithmetic here can overflow on a
value the API server accepted. The holder's identity is cleaned and cut to
`MAX_HOLDER_CHARS` where it is read (`LeaseRecord.from_object`): status, logs and metric labels
that name a holder never carry more.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from convergerd.config import MAX_IDENTITY_CHARS, default_of
from convergerd.core.decode import clean_text
from convergerd.core.shown import shown
from convergerd.kube.api import LEASE_API_VERSION


class Fence(Protocol):
    """What a writer asks before each cluster write: how long this replica's term still
    covers it. Implemented by the elector per term (`leader`), asked by rounds (`converge`)."""

    def remaining_s(self) -> float:
        """Seconds this replica may still write; raises `errors.Fenced` when it may not."""
        ...


KubeObject = dict[str, Any]

# The setting's default (CONVERGERD_LEASE_DURATION_SECONDS), written once in its row.
DEFAULT_LEASE_DURATION_S: float = default_of("lease_duration_s")
RETRY_JITTER = 0.2  # acquire attempts are spread over retry period x [0.8, 1.2]
INT32_MAX = 2**31 - 1  # leaseDurationSeconds and leaseTransitions are int32 in the API
# A previous renewTime further ahead of our wall clock than this was not written by a replica
# with a sane clock (or was written by hand): it is not kept moving forward (see
# `next_renew_time`); our own time is written, which is a change all the same.
MAX_RENEW_TIME_AHEAD = dt.timedelta(hours=1)
# A holder's identity as read: cleaned (no control characters) and at most this long. Our own
# identity is held to the same bound by the settings check, so it reads back unchanged.
MAX_HOLDER_CHARS = MAX_IDENTITY_CHARS
# The longest a foreign holder's claim is honoured without a change of its record, as a multiple
# of our own lease duration: replicas are meant to share their election settings, and ten
# times ours covers any sane difference; a longer claim (2^31-1 s written by hand, a holder
# that never renews) is capped, so no Lease value stops the rounds for longer.
MAX_PEER_DURATION_FACTOR = 10.0
# Leadership is stalled (readiness fails) when another holder's record has not changed for this
# many of our lease durations while its (capped) claim still runs: a live holder changes it
# every retry period, a convergerd holder that did not renew within its renew deadline (less
# than one duration) is fenced, so no round has run under it for at least that long.
STALLED_AFTER_DURATIONS = 2.0

_MICROTIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})(Z|[+-]\d{2}:\d{2})",
    re.ASCII,  # `\d` is 0-9 only, as in Go's parser
)
_ONE_MICROSECOND = dt.timedelta(microseconds=1)


class LeaseFormatError(ValueError):
    """A Lease object (or a MicroTime) that does not have the shape the API defines."""


# --- MicroTime -------------------------------------------------------------------------------


def format_microtime(moment: dt.datetime) -> str:
    """`2025-01-02T03:04:05.000000Z`: UTC, exactly six fractional digits, `Z`.

    Written explicitly: `isoformat()` drops the fraction at 0 µs and the API server answers
    such a value with 400; and `%Y` does not pad years before 1000 to four digits."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a MicroTime needs a timezone-aware datetime")
    utc = moment.astimezone(dt.UTC)
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S}.{utc.microsecond:06d}Z"


def parse_microtime(text: str) -> dt.datetime:
    """The inverse of `format_microtime`; also accepts a numeric offset (RFC3339Micro).

    Raises only `LeaseFormatError`, whatever `text` is: also for a time whose offset carries it
    past year 1 or 9999 in UTC (Go accepts those; a Python datetime cannot hold them)."""
    if not isinstance(text, str) or _MICROTIME.fullmatch(text) is None:
        raise LeaseFormatError("not a MicroTime (RFC3339 with six fractional digits): "
                               f"{shown(text, 40, style='json')}")
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.UTC)
    except (ValueError, OverflowError) as exc:
        raise LeaseFormatError(f"not a valid MicroTime: {shown(text, 40, style='json')}") from exc



# --- the record ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A Lease's spec as read, plus its resourceVersion (which does not count as content)."""

    holder: str  # "" when nobody holds it (released)
    duration_s: int | None
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str | None = field(default=None, compare=False)

    @property
    def held(self) -> bool:
        return self.holder != ""

    @classmethod
    def from_object(cls, obj: object) -> LeaseRecord:
        """From a Lease as the API returns it. Missing fields take their zero values; a wrong
        shape (not an object, wrong types) raises `LeaseFormatError`. An int32 field out of
        the range the API server accepts (a duration not in 1..2^31-1, transitions not in
        0..2^31-1) reads as absent: the default duration, zero transitions. The holder is
        cleaned and cut to `MAX_HOLDER_CHARS` (`core.decode.clean_text`)."""
        if not isinstance(obj, dict):
            raise LeaseFormatError(f"a Lease must be a JSON object, got {type(obj).__name__}")
        metadata = obj.get("metadata")
        spec = obj.get("spec")
        metadata = {} if metadata is None else metadata
        spec = {} if spec is None else spec
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            raise LeaseFormatError("a Lease's metadata and spec must be JSON objects")
        holder = clean_text(_typed(spec, "holderIdentity", str) or "", MAX_HOLDER_CHARS)
        duration = _in_range(_typed(spec, "leaseDurationSeconds", int), 1)
        transitions = _in_range(_typed(spec, "leaseTransitions", int), 0) or 0
        return cls(
            holder=holder,
            duration_s=duration,
            acquire_time=_typed(spec, "acquireTime", str),
            renew_time=_typed(spec, "renewTime", str),
            transitions=transitions,
            resource_version=_typed(metadata, "resourceVersion", str),
        )


def _typed(mapping: dict[str, Any], key: str, kind: type[Any]) -> Any:
    value = mapping.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise LeaseFormatError(f"Lease field {key} must be {kind.__name__}, got {shown(value)}")
    return value


def _in_range(value: int | None, low: int) -> int | None:
    return value if value is not None and low <= value <= INT32_MAX else None


def honoured_duration_s(duration_s: int | None, own_duration_s: float) -> float:
    """How long a record's holder keeps its claim without a change, for our decisions: its
    `leaseDurationSeconds`, ours when it has none, at most `MAX_PEER_DURATION_FACTOR` times
    ours."""
    claimed = float(duration_s) if duration_s is not None and duration_s > 0 else own_duration_s
    return min(claimed, MAX_PEER_DURATION_FACTOR * own_duration_s)


@dataclass(frozen=True, slots=True)
class LeaseReading:
    """A record and the monotonic time at which we first saw it with this content."""

    record: LeaseRecord
    since_mono: float

    def expires_mono(self, own_duration_s: float = DEFAULT_LEASE_DURATION_S) -> float:
        """When this record's holder loses its claim unless the record changes before
        (`honoured_duration_s`: the record's duration, capped)."""
        return self.since_mono + honoured_duration_s(self.record.duration_s, own_duration_s)

    def foreign(self, identity: str) -> bool:
        """Held by someone other than `identity`."""
        return self.record.held and self.record.holder != identity


def observe(
    previous: LeaseReading | None, record: LeaseRecord | None, now_mono: float
) -> LeaseReading | None:
    """Update what we know after reading the Lease at `now_mono` (when the answer arrived).

    The observation time only moves when the record's content changed: a holder that stops
    renewing leaves the same record, and its lease runs out from when we first saw it."""
    if record is None:
        return None
    if previous is not None and previous.record == record:
        return previous
    return LeaseReading(record, now_mono)


def can_acquire(
    observed: LeaseReading | None,
    now_mono: float,
    identity: str,
    *,
    own_duration_s: float = DEFAULT_LEASE_DURATION_S,
) -> bool:
    """May `identity` write itself into the Lease now?

    Yes when there is no Lease, nobody holds it, we hold it, or its record has not changed for
    the record's own duration, capped (measured on our monotonic clock from our observation)."""
    if observed is None or not observed.foreign(identity):
        return True
    return now_mono >= observed.expires_mono(own_duration_s)


def stalled_s(
    observed: LeaseReading | None,
    now_mono: float,
    identity: str,
    *,
    own_duration_s: float = DEFAULT_LEASE_DURATION_S,
) -> float | None:
    """How long another holder has left its record unchanged, when that is longer than
    `STALLED_AFTER_DURATIONS` of our durations while its claim still runs (nobody may take the
    Lease yet, and nobody renews it); None otherwise. Ends when the record changes, or when
    the capped claim runs out and the Lease may be taken."""
    if observed is None or not observed.foreign(identity):
        return None
    unchanged_s = now_mono - observed.since_mono
    if unchanged_s <= STALLED_AFTER_DURATIONS * own_duration_s:
        return None
    if now_mono >= observed.expires_mono(own_duration_s):
        return None
    return unchanged_s


# --- bodies ----------------------------------------------------------------------------------


def lease_duration_field(duration_s: float) -> int:
    """`leaseDurationSeconds` is an int32: round up, so others wait at least as long as we
    promised."""
    return max(1, math.ceil(duration_s))


def new_lease_body(
    *, namespace: str, name: str, identity: str, duration_s: float, now: dt.datetime
) -> KubeObject:
    """The body that creates the Lease with us as its first holder."""
    stamp = format_microtime(now)
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": lease_duration_field(duration_s),
            "acquireTime": stamp,
            "renewTime": stamp,
            "leaseTransitions": 0,
        },
    }


def acquire_body(
    current: KubeObject, *, identity: str, duration_s: float, now: dt.datetime
) -> KubeObject:
    """Take over (or, when we already hold it, renew) the existing Lease `current`.

    Keeps `current`'s resourceVersion as the precondition. When the holder changes (including
    from an empty holder after a release), `leaseTransitions` goes up by one and `acquireTime`
    is now; when it stays ours this is a renewal."""
    record = LeaseRecord.from_object(current)
    if record.holder == identity:
        return renew_body(current, identity=identity, duration_s=duration_s, now=now)
    body = _replacement(current)
    stamp = format_microtime(now)
    body["spec"].update(
        holderIdentity=identity,
        leaseDurationSeconds=lease_duration_field(duration_s),
        acquireTime=stamp,
        renewTime=stamp,
        leaseTransitions=next_transitions(record.transitions),
    )
    return body


def renew_body(
    current: KubeObject, *, identity: str, duration_s: float, now: dt.datetime
) -> KubeObject:
    """Renew our own Lease: a new `renewTime`, everything else as it is."""
    record = LeaseRecord.from_object(current)
    if record.holder != identity:
        raise ValueError(f"cannot renew a Lease held by {shown(record.holder)} as {identity!r}")
    body = _replacement(current)
    renewed = next_renew_time(record.renew_time, now)
    body["spec"].update(
        holderIdentity=identity,
        leaseDurationSeconds=lease_duration_field(duration_s),
        renewTime=format_microtime(renewed),
        leaseTransitions=record.transitions,
    )
    if not _acquired_by(record.acquire_time, renewed):
        # Absent, after the renewal (9999-12-31 by hand), or a value the API server would
        # refuse when we write it back (a year past 9999 or before 0, as a Go server answers
        # an offset across them): the renew time instead.
        body["spec"]["acquireTime"] = body["spec"]["renewTime"]
    return body


def _acquired_by(acquire_time: str | None, renewed: dt.datetime) -> bool:
    """Whether `acquire_time` is a MicroTime no later than `renewed`."""
    if acquire_time is None:
        return False
    try:
        return parse_microtime(acquire_time) <= renewed
    except LeaseFormatError:
        return False


def release_body(current: KubeObject, *, now: dt.datetime) -> KubeObject:
    """Give the Lease up: an empty holder, so a standby may take it at once (it need not wait
    for the duration). Transitions and times stay so the history is kept (an `acquireTime`
    the API server would refuse, or later than the renewal, becomes the renew time)."""
    record = LeaseRecord.from_object(current)
    body = _replacement(current)
    renewed = next_renew_time(record.renew_time, now)
    body["spec"].update(
        holderIdentity="",
        renewTime=format_microtime(renewed),
        leaseTransitions=record.transitions,
    )
    if record.acquire_time is not None and not _acquired_by(record.acquire_time, renewed):
        body["spec"]["acquireTime"] = body["spec"]["renewTime"]
    return body


def next_transitions(transitions: int) -> int:
    """`leaseTransitions` after a change of holder: one more, back to 0 after the int32
    maximum (the API server refuses a larger value, so +1 there would fail every acquire)."""
    return transitions + 1 if transitions < INT32_MAX else 0


def next_renew_time(previous: str | None, now: dt.datetime) -> dt.datetime:
    """`now`, but after the previous `renewTime` when that is not far ahead of `now`.

    Other replicas see a renewal only as a *change* of the record. If our wall clock stood
    still or went back, writing the same `renewTime` again would be no change at all (the
    server does not even store an identical object), and a standby would take over while we
    still think we lead. A previous time more than `MAX_RENEW_TIME_AHEAD` ahead (a clock far
    off, or a value written by hand such as 9999-12-31) is not followed: `now` differs from it,
    so writing `now` is a change too, and the Lease shows a sane time again."""
    now = now.astimezone(dt.UTC)
    if previous is None:
        return now
    try:
        before = parse_microtime(previous)
    except LeaseFormatError:
        return now
    if before - now > MAX_RENEW_TIME_AHEAD:
        return now
    return max(now, before + _ONE_MICROSECOND)


def _replacement(current: KubeObject) -> KubeObject:
    """A PUT body from the object as read: identity and resourceVersion in metadata (the
    precondition), the whole spec (fields we do not know, e.g. `preferredHolder`, survive)."""
    metadata = current.get("metadata") or {}
    kept = {k: copy.deepcopy(metadata[k]) for k in
            ("name", "namespace", "resourceVersion", "uid", "labels", "annotations")
            if k in metadata}
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": "Lease",
        "metadata": kept,
        "spec": copy.deepcopy(current.get("spec") or {}),
    }


# --- fencing and timing ------------------------------------------------------------------------


def write_budget(last_renew_mono: float, renew_deadline_s: float, now_mono: float) -> float:
    """Seconds a leader may still spend on a write; `<= 0` means it is fenced.

    `last_renew_mono` is when the last *successful* renew request was sent (not when its answer
    came): others count the lease from no earlier than that."""
    return last_renew_mono + renew_deadline_s - now_mono


def jittered(base_s: float, rng: random.Random, spread: float = RETRY_JITTER) -> float:
    """`base_s` spread uniformly over `[1 - spread, 1 + spread]` times itself, so contending
    replicas do not stay in lockstep."""
    return base_s * (1.0 + spread * (2.0 * rng.random() - 1.0))


def acquire_delay(
    observed: LeaseReading | None,
    now_mono: float,
    identity: str,
    retry_period_s: float,
    rng: random.Random,
    *,
    own_duration_s: float = DEFAULT_LEASE_DURATION_S,
) -> float:
    """How long a standby waits before its next attempt: a jittered retry period, but no longer
    than until the observed foreign lease expires (plus a little jitter), so a dead leader is
    replaced as soon as its lease runs out."""
    delay = jittered(retry_period_s, rng)
    if observed is not None and observed.foreign(identity):
        until_expiry = observed.expires_mono(own_duration_s) - now_mono
        if until_expiry >= 0:
            delay = min(delay, until_expiry + retry_period_s * RETRY_JITTER * rng.random())
    return max(0.0, delay)
