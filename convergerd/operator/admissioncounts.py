"""Live admission counts per Policy, from the API server's `/metrics` (pure).

kube-apiserver counts, per (failed validation, action), `apiserver_validating_admission_policy_
check_total{policy, policy_binding, error_type, enforcement_action}` (k8s.io/apiserver/pkg/
admission/plugin/policy/validating/metrics/metrics.go, incremented in dispatcher.go): `deny`,
`warn` and `audit` once per failed validation of a binding with that action (dry-runs too; a
validation that passes is never counted; `allow` counts evaluation errors ignored under
`failurePolicy: Ignore`, which ours never use). Each API server process counts from zero at its
start (`process_start_time_seconds`), and behind one Service several answer in turn.

`parse_metrics` reads one answer (untrusted: a bounded body, only the lines of those two
names, our `stackship-*` policies only, those counted only, at most `MAX_POLICIES`), summing
each policy's series over bindings and error types into `Counts`. What no API server sends is
refused whole (`MetricsError`: nothing is written): a value that is not a whole count up to
`MAX_VALUE`, a series given twice (summed, a line repeated was a multiplied count), an answer
without `process_start_time_seconds` (an HTML page read as zero counts, with a fresh `readAt`).
Figures stop at `MAX_VALUE`. `AdmissionCounts` keeps, per API server process
(told apart by its start time), the values last read, so each read adds only what that process
counted since its previous read:

- a process first read after counting began that started after it: all its counts are new
  (an API server restarted or added); one that started before: its values are a baseline
  (what it counted before is not ours to add: the figures are then a lower bound, said);
- a value below the one last read (a reset without a new start time): counted from zero;
- a process restarted: what it counted after our last read of it is lost (a lower bound,
  said); every reset is counted in `resets`.

So alternating API servers are never added twice, and a reset never subtracts. Per Policy, the
figures since its current revision was installed (`since`: the first read at which the
operator saw that revision installed; what is read then is attributed to the revision before)
and over the last hour (`WINDOW_S`; a read's increase is placed at the read, so the window's
edge is as sharp as the read interval). The operator's own enforcement probes are counted by
the API server like any request, once under each action of the binding that judged them (a
Warn probe is `warn` and `audit`); those it knows were judged (`expect_own`) are taken out of
the next increases that show them whole, and reported as `probesExcluded` (probes, not
increments).

The status this gives (`as_status`), on `status.admission` of each Policy:

    admission: {denied: 3, warned: 0, audited: 0, since: ..., readAt: ..., revision: 4,
                lastHour: {denied: 1, warned: 0, audited: 0, since: ...},
                resets: 0, probesExcluded: 1, note: ...}   # note only when a lower bound
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from convergerd.core.decode import rfc3339
from convergerd.operator.reconcile import timestamp

CHECK_TOTAL = "apiserver_validating_admission_policy_check_total"
START_TIME = "process_start_time_seconds"
METRIC_NAMES = (CHECK_TOTAL, START_TIME)  # the only lines of an answer kept
POLICY_PREFIX = "stackship-"
ACTIONS = ("deny", "warn", "audit")  # the counter's enforcement_action values we report
WINDOW_S = 3600.0
MAX_POLICIES = 10_000  # distinct policies read from one answer
MAX_INSTANCES = 16  # API server processes remembered (the oldest read is forgotten)
MAX_VALUE = 2**53  # a counter beyond this is not a count a float holds exactly
_MAX_WINDOW_ENTRIES = 720  # reads with an increase kept per Policy (one per 5 s for an hour)
_MAX_OWN_PENDING = 32  # own probes awaiting their increase, per Policy
_LABEL = rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.){0,1024})"'
_CHECK_LINE = re.compile(
    rb"^" + CHECK_TOTAL.encode() + rb"\{([^}\n]{0,4096})\}[ \t]+(\S{1,64})(?:[ \t]+\S+)?[ \t]*$",
    re.M)
_START_LINE = re.compile(
    rb"^process_start_time_seconds(?:\{[^}\n]{0,4096}\})?[ \t]+(\S{1,64})(?:[ \t]+\S+)?[ \t]*$",
    re.M)
_LABELS = re.compile(_LABEL)
_RESET_NOTE = ("an API server's counters started again (a restart): what it counted after "
               "its last read before that is not included")
_LOWER_NOTE = ("an API server first read at {at} had started before counting began: what it "
               "counted before that read is not included")
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE = re.compile(r"\\[\\\"n]")


class MetricsError(ValueError):
    """An answer that is not the API server's metrics as we read them."""


@dataclass(frozen=True, slots=True)
class Counts:
    """Evaluations counted per action (`deny`, `warn`, `audit` -> denied, warned, audited)."""

    denied: int = 0
    warned: int = 0
    audited: int = 0

    def get(self, action: str) -> int:
        return (self.denied, self.warned, self.audited)[ACTIONS.index(action)]

    def plus(self, other: Counts) -> Counts:
        """The sum, each count at most `MAX_VALUE` (a counter that resets at every read far up
        would otherwise grow the figures past what a JSON reader or the API's int64 holds)."""
        return Counts(min(self.denied + other.denied, MAX_VALUE),
                      min(self.warned + other.warned, MAX_VALUE),
                      min(self.audited + other.audited, MAX_VALUE))

    @classmethod
    def of(cls, values: Mapping[str, int]) -> Counts:
        return cls(*(values.get(a, 0) for a in ACTIONS))

    def as_status(self) -> dict[str, int]:
        return {"denied": self.denied, "warned": self.warned, "audited": self.audited}

    def __bool__(self) -> bool:
        return bool(self.denied or self.warned or self.audited)


@dataclass(frozen=True, slots=True)
class Scrape:
    """One `/metrics` answer: the process's start time (None: not given) and our policies'
    counter values, summed over bindings and error types."""

    start_time: float | None
    counts: Mapping[str, Counts]
    truncated: bool = False  # more than MAX_POLICIES policies: the rest were not read


def _number(text: bytes, what: str, *, whole: bool = True) -> float:
    """A count (`whole`: an integer, as every counter of ours is) or a start time."""
    try:
        value = float(text)
    except ValueError:
        raise MetricsError(f"{what}: not a number: {text[:64]!r}") from None
    if (not math.isfinite(value) or value < 0 or value > MAX_VALUE
            or (whole and not value.is_integer())):
        raise MetricsError(f"{what}: {value!r} is not a count")
    return value


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value)


def parse_metrics(body: bytes, *, prefix: str = POLICY_PREFIX,
                  names: Collection[str] | None = None) -> Scrape:
    """Our policies' counters (`names`: only these policies) and the start time in a
    Prometheus text answer (the caller bounds its size); `MetricsError` for a value that is
    not a count, a series given twice, or an answer without `process_start_time_seconds`
    (kube-apiserver always exports it: an HTML page or another server's metrics are not read
    as zero counts)."""
    totals: dict[str, dict[str, int]] = {}
    seen: set[tuple[str, str, str, str]] = set()
    truncated = False
    for match in _CHECK_LINE.finditer(body):
        labels = {k.decode(): v.decode("utf-8", "replace")
                  for k, v in _LABELS.findall(match.group(1))}
        policy = _unescape(labels.get("policy", ""))
        action = labels.get("enforcement_action", "")
        if (not policy.startswith(prefix) or len(policy) > 253 or action not in ACTIONS
                or (names is not None and policy not in names)):
            continue
        if policy not in totals and len(totals) >= MAX_POLICIES:
            truncated = True
            continue
        what = f"{CHECK_TOTAL}{{policy={policy!r}}}"
        series = (policy, labels.get("policy_binding", ""), labels.get("error_type", ""), action)
        if series in seen:
            # Summed, one line repeated N times was N times the count.
            raise MetricsError(f"{what}: the same series twice: not an API server's answer")
        seen.add(series)
        value = int(_number(match.group(2), what))
        per = totals.setdefault(policy, {})
        per[action] = min(per.get(action, 0) + value, MAX_VALUE)
    start = _START_LINE.search(body)
    if start is None:
        raise MetricsError("no process_start_time_seconds: not an API server's metrics")
    start_time = _number(start.group(1), "process_start_time_seconds", whole=False)
    return Scrape(start_time, {p: Counts.of(v) for p, v in totals.items()}, truncated)


@dataclass
class _Instance:
    last: dict[str, Counts]
    read_at: dt.datetime


@dataclass
class _Policy:
    revision: str
    since: dt.datetime
    totals: Counts = Counts()
    window: deque[tuple[dt.datetime, Counts]] = field(
        default_factory=lambda: deque(maxlen=_MAX_WINDOW_ENTRIES))
    window_since: dt.datetime | None = None  # when this operator began counting it
    hour_since: dt.datetime | None = None  # the last hour's start, when carried from before
    read_at: dt.datetime | None = None
    resets: int = 0
    own: deque[tuple[dt.datetime, Counts]] = field(
        default_factory=lambda: deque(maxlen=_MAX_OWN_PENDING))
    probes_excluded: int = 0
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """One Policy's figures, as written to `status.admission`."""

    revision: str
    since: dt.datetime
    read_at: dt.datetime
    totals: Counts
    last_hour: Counts
    last_hour_since: dt.datetime
    resets: int
    probes_excluded: int
    note: str | None

    def as_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            **self.totals.as_status(), "since": timestamp(self.since),
            "readAt": timestamp(self.read_at),
            "lastHour": {**self.last_hour.as_status(),
                         "since": timestamp(self.last_hour_since)},
            "resets": self.resets, "probesExcluded": self.probes_excluded,
        }
        if self.revision.isdigit():
            status["revision"] = int(self.revision)
        if self.note is not None:
            status["note"] = self.note
        return status


def _carried_counts(figures: Mapping[str, Any]) -> Counts | None:
    """`denied`, `warned` and `audited` of figures written before (untrusted: a status anyone
    may have edited), or None when any is not a count."""
    values = [v for v in (figures.get(k) for k in ("denied", "warned", "audited"))
              if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_VALUE]
    return Counts(*values) if len(values) == len(ACTIONS) else None


class AdmissionCounts:
    """Per-process counter values and per-Policy figures, from successive `/metrics` reads."""

    def __init__(self, *, window_s: float = WINDOW_S, own_ttl_s: float = 600.0) -> None:
        """`own_ttl_s`: how long an own probe waits for its increase before it is dropped
        (an API server that restarted before it was read never shows it)."""
        self._window_s = window_s
        self._own_ttl_s = own_ttl_s
        self._instances: dict[float | None, _Instance] = {}
        self._policies: dict[str, _Policy] = {}

    def carry(self, name: str, revision: str, status: Any, *, now: dt.datetime) -> None:
        """Continue the figures a previous leader wrote (`status.admission`) when they are of
        `revision`; what was counted between its last read and our first is not included."""
        if name in self._policies or not isinstance(status, Mapping):
            return
        since, read_at = rfc3339(status.get("since")), rfc3339(status.get("readAt"))
        if str(status.get("revision")) != revision or since is None or read_at is None:
            return
        totals = _carried_counts(status)
        if totals is None:
            return
        resets, excluded = status.get("resets"), status.get("probesExcluded")
        policy = self._policies[name] = _Policy(
            revision, since, totals, window_since=now,
            resets=resets if isinstance(resets, int) and 0 <= resets <= MAX_VALUE else 0,
            probes_excluded=(excluded if isinstance(excluded, int)
                             and 0 <= excluded <= MAX_VALUE else 0),
            note=(f"counting paused from {timestamp(read_at)} to {timestamp(now)} (a new "
                  "operator leader): what was admitted in between is not included"))
        # The last hour goes on too, its figures placed at its start (the earliest they can
        # be): they leave the window no later than they would have, never counted too long.
        hour = status.get("lastHour")
        hour_counts = _carried_counts(hour) if isinstance(hour, Mapping) else None
        hour_since = rfc3339(hour.get("since")) if isinstance(hour, Mapping) else None
        if hour_counts is not None and hour_since is not None and hour_since <= read_at <= now:
            policy.hour_since = hour_since
            if hour_counts:
                policy.window.append((hour_since, hour_counts))

    def expect_own(self, name: str, actions: Iterable[str], *, now: dt.datetime) -> None:
        """The operator's own probe was judged by `name`, which counted it once under each of
        `actions` (a Warn binding's [Warn, Audit]: `warn` and `audit`): take it out of the
        figures when its increase is read."""
        policy = self._policies.get(name)
        counted = Counts.of({a: 1 for a in actions if a in ACTIONS})
        if policy is not None and counted:
            policy.own.append((now, counted))

    def observe(self, scrape: Scrape, *, now: dt.datetime,
                revisions: Mapping[str, str]) -> None:
        """One read. `revisions`: each Policy counted (by its admission policy's name) with
        its installed revision; any other is forgotten."""
        for name in set(self._policies) - set(revisions):
            del self._policies[name]
        known = self._instances.get(scrape.start_time)
        for name, revision in revisions.items():
            policy = self._policies.get(name)
            fresh = policy is None
            if policy is None:
                policy = self._policies[name] = _Policy(revision, now, window_since=now)
            raw = scrape.counts.get(name, Counts())
            last = None if known is None else known.last.get(name)
            delta, reset, lower = self._delta(policy, raw, last, scrape.start_time,
                                              new_process=known is None, fresh=fresh)
            delta = self._take_own(policy, delta, now)
            if reset:
                policy.resets += 1
            note = (_RESET_NOTE if reset else
                    _LOWER_NOTE.format(at=timestamp(now)) if lower else None)
            if policy.note is None:
                policy.note = note
            if delta:
                policy.window.append((now, delta))
            if policy.revision != revision:
                # What this read adds happened around the install: the old revision's.
                policy.revision, policy.since, policy.totals = revision, now, Counts()
                policy.resets, policy.probes_excluded, policy.note = 0, 0, None
            elif not fresh:
                policy.totals = policy.totals.plus(delta)
            policy.read_at = now
        self._remember(scrape, now)

    def _delta(self, policy: _Policy, raw: Counts, last: Counts | None,
               start_time: float | None, *, new_process: bool, fresh: bool,
               ) -> tuple[Counts, bool, bool]:
        """(what this read adds for `policy`, a reset was seen, the figures became a lower
        bound). `last`: this process's values at its previous read (None: not read since
        this Policy was counted)."""
        if last is not None:
            values = [raw.get(a) - last.get(a) if raw.get(a) >= last.get(a) else raw.get(a)
                      for a in ACTIONS]
            return Counts(*values), any(raw.get(a) < last.get(a) for a in ACTIONS), False
        started_after = (start_time is not None and policy.window_since is not None
                         and start_time >= policy.window_since.timestamp())
        if started_after and not fresh:
            # Started after counting began (a restart, or one more API server): all its
            # counts are new; a restart lost what the process before it counted last.
            return raw, new_process and bool(self._instances), False
        return Counts(), False, not fresh and bool(raw)

    def _take_own(self, policy: _Policy, delta: Counts, now: dt.datetime) -> Counts:
        """`delta` less the own probes it shows. One request's increments are counted by one
        API server at once, so a probe is taken out whole, when all of them are in `delta`."""
        while policy.own and (now - policy.own[0][0]).total_seconds() > self._own_ttl_s:
            policy.own.popleft()
        values = {a: delta.get(a) for a in ACTIONS}
        for pending in list(policy.own):
            counted = pending[1]
            if all(values[a] >= counted.get(a) for a in ACTIONS):
                for a in ACTIONS:
                    values[a] -= counted.get(a)
                policy.probes_excluded += 1
                policy.own.remove(pending)
        return Counts.of(values)

    def _remember(self, scrape: Scrape, now: dt.datetime) -> None:
        self._instances[scrape.start_time] = _Instance(
            {n: scrape.counts.get(n, Counts()) for n in self._policies}, now)
        if len(self._instances) > MAX_INSTANCES:
            oldest = min(self._instances, key=lambda k: self._instances[k].read_at)
            del self._instances[oldest]

    def report(self, name: str, *, now: dt.datetime) -> Report | None:
        """The figures of one Policy, None before its first read."""
        policy = self._policies.get(name)
        if policy is None or policy.read_at is None:
            return None
        horizon = now - dt.timedelta(seconds=self._window_s)
        while policy.window and policy.window[0][0] <= horizon:
            policy.window.popleft()
        last_hour = Counts()
        for _, delta in policy.window:
            last_hour = last_hour.plus(delta)
        window_since = max(horizon, policy.hour_since or policy.window_since or horizon)
        return Report(policy.revision, policy.since, policy.read_at, policy.totals, last_hour,
                      window_since, policy.resets, policy.probes_excluded, policy.note)

    def names(self) -> Iterable[str]:
        return tuple(self._policies)


# What says which figures these are: any change is written at once.
_IDENTITY = ("revision", "since", "resets")
# Written when one enters another reporting step: the counts (since the revision and in the
# last hour) and the own probes left out (one more every probe period).
_COUNTS = ("denied", "warned", "audited")
_STEPPED = (*_COUNTS, "probesExcluded")


def reporting_step(count: object) -> int:
    """The reporting step a count is in: 0 for none, then 1, 2-3, 4-7, 8-15, ... (one step per
    power of two). A count written at once when it enters a new step, so the first denial is
    news within one read and a flood of them costs a write per doubling, not per read."""
    return count.bit_length() if isinstance(count, int) and count > 0 else 0


def admission_differs(current: Any, new: Mapping[str, Any], *, now: dt.datetime,
                      refresh_s: float) -> bool:
    """A write is needed: what the figures are of changed (revision, since, resets), a count
    (since the revision, or in the last hour; or the own probes left out) entered another
    reporting step, or the last write is older than `refresh_s` (the heartbeat: the figures as
    they are then, and `readAt` saying counting still runs). Quiet when nothing changes, and
    a steady trickle of admissions is written at the heartbeat.

    The note alone is never a write: it says what the figures read since lack (a new leader's
    pause, a server first read late), and the figures already written lack nothing up to
    their `readAt`; it goes out with the next figures. So a new leader, which notes its pause
    at its first read, writes nothing until a count moves a step or the heartbeat is due."""
    if not isinstance(current, Mapping):
        return True
    if any(current.get(k) != new.get(k) for k in _IDENTITY):
        return True
    last_hour = current.get("lastHour")
    old_hour = last_hour if isinstance(last_hour, Mapping) else {}
    if any(reporting_step(current.get(k)) != reporting_step(new.get(k)) for k in _STEPPED) \
            or any(reporting_step(old_hour.get(k)) != reporting_step(new["lastHour"].get(k))
                   for k in _COUNTS):
        return True
    written = rfc3339(current.get("readAt"))
    return written is None or (now - written).total_seconds() >= refresh_s
