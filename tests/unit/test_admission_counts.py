"""Live admission counts (operator.admissioncounts): reading the API server's counter, and the
arithmetic over reads of several API servers that restart — never negative, never above what
was really counted, exact when nothing was lost."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.operator.admissioncounts import (
    MAX_VALUE,
    AdmissionCounts,
    Counts,
    MetricsError,
    Scrape,
    admission_differs,
    parse_metrics,
)

P = "stackship-p1"
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ACTIONS = ("deny", "warn", "audit")
START = EPOCH.timestamp()  # when the first API server started (before counting began)

CHECK = "apiserver_validating_admission_policy_check_total"


def series(action: str, error: str, policy: str, binding: str, value: str, *,
           name: str = CHECK) -> str:
    return (f'{name}{{enforcement_action="{action}",error_type="{error}",policy="{policy}",'
            f'policy_binding="{binding}"}} {value}')


TEXT = "\n".join([
    f"# HELP {CHECK} [BETA] Validation admission policy check total",
    f"# TYPE {CHECK} counter",
    series("deny", "invalid_error", P, P, "3"),
    series("deny", "compile_error", P, "by-hand", "1"),
    series("warn", "invalid_error", "stackship-p2", "stackship-p2", "1.234567e+06"),
    series("allow", "invalid_error", "stackship-p2", "stackship-p2", "7"),
    series("deny", "invalid_error", "someone-elses", "x", "9"),
    series("deny", "invalid_error", P, P, "3", name=f"{CHECK[:-6]}_duration_seconds_count"),
    "# TYPE process_start_time_seconds gauge",
    "process_start_time_seconds 1.71234567899e+09", ""]).encode()


def test_parse_sums_our_policies_over_bindings_and_error_types() -> None:
    scrape = parse_metrics(TEXT)
    assert scrape.start_time == 1712345678.99
    assert scrape.counts == {P: Counts(denied=4), "stackship-p2": Counts(warned=1234567)}


@pytest.mark.parametrize("value", [b"-1", b"NaN", b"+Inf", b"1e300", b"x"])
def test_a_value_that_is_not_a_count_is_refused(value: bytes) -> None:
    line = (b'apiserver_validating_admission_policy_check_total{enforcement_action="deny",'
            b'policy="stackship-p1"} ' + value + b"\n")
    with pytest.raises(MetricsError):
        parse_metrics(line)


def with_start(*lines: str) -> bytes:
    return "\n".join([*lines, "process_start_time_seconds 1.7e+09", ""]).encode()


def test_the_same_series_twice_is_not_an_api_server_s_answer() -> None:
    """Summed, our line repeated a thousand times was a thousand times the count."""
    with pytest.raises(MetricsError, match="twice"):
        parse_metrics(with_start(*[series("deny", "invalid_error", P, P, "3")] * 1000))


@pytest.mark.parametrize("value", [b"1.5", b"0.001"])
def test_a_counter_that_is_not_whole_is_refused(value: bytes) -> None:
    with pytest.raises(MetricsError):
        parse_metrics(with_start(series("deny", "invalid_error", P, P, value.decode())))


def test_an_answer_without_a_start_time_is_not_an_api_server_s_metrics() -> None:
    """An HTML page (a proxy's sign-in page) was a read of zero counts, and readAt moved."""
    with pytest.raises(MetricsError, match="process_start_time_seconds"):
        parse_metrics(b"<!DOCTYPE html>\n<html><body>Sign in</body></html>\n")


def test_only_the_policies_asked_for_are_read_so_made_up_ones_do_not_push_ours_out() -> None:
    fakes = [series("deny", "no_error", f"stackship-fake-{n:06d}", "x", "1")
             for n in range(20_000)]
    scrape = parse_metrics(with_start(*fakes, series("deny", "invalid_error", P, P, "3"),
                                      series("deny", "invalid_error", "stackship-q", P, "NaN")),
                           names={P})
    assert scrape.counts == {P: Counts(denied=3)}
    assert not scrape.truncated


def test_figures_never_pass_the_largest_count() -> None:
    """A counter far up that falls at every read is a reset at every read: the figures add
    its value each time, and stop at MAX_VALUE instead of growing past what JSON readers
    and the API's int64 hold."""
    tracker = AdmissionCounts()
    for n in range(6):
        value = MAX_VALUE - n
        tracker.observe(Scrape(START, {P: Counts(value, 0, 0)}),
                        now=EPOCH + dt.timedelta(seconds=n), revisions={P: "1"})
    report = tracker.report(P, now=EPOCH + dt.timedelta(seconds=6))
    assert report is not None
    assert report.totals.denied == MAX_VALUE
    assert report.last_hour.denied == MAX_VALUE
    assert report.resets == 5


@given(st.binary(max_size=2000))
def test_any_bytes_are_read_or_refused_never_crash(body: bytes) -> None:
    try:
        scrape = parse_metrics(body)
    except MetricsError:
        return
    assert all(n >= 0 for c in scrape.counts.values() for n in (c.denied, c.warned, c.audited))


# -- the arithmetic, against a model of API servers ----------------------------------------


@dataclass
class Process:
    start: float
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACTIONS, 0))


@dataclass
class World:
    """API servers behind one Service, the truth, and the operator's tracker."""

    processes: list[Process]
    tracker: AdmissionCounts = field(default_factory=AdmissionCounts)
    t: float = 1_000.0  # seconds after EPOCH
    counting: bool = False  # the first read happened: evaluations from now on are the truth
    truth: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ACTIONS, 0))
    lost: bool = False  # something was counted that no read can show (a restart, or unseen)

    @property
    def now(self) -> dt.datetime:
        return EPOCH + dt.timedelta(seconds=self.t)

    def step(self, op: tuple[str, int, str, int]) -> None:
        kind, i, action, n = op
        self.t += 1.0
        process = self.processes[i % len(self.processes)]
        if kind == "eval":
            process.counts[action] += n
            if self.counting:
                self.truth[action] += n
        elif kind == "own":  # the operator's probe, judged under `action`, told to the tracker
            process.counts[action] += 1
            self.tracker.expect_own(P, (action,), now=self.now)
        elif kind == "restart":
            self.processes[i % len(self.processes)] = Process(start=self.now.timestamp())
            self.lost = True  # what it counted since its last read is gone
        else:
            self.read(process)

    def read(self, process: Process) -> None:
        scrape = Scrape(process.start, {P: Counts(*(process.counts[a] for a in ACTIONS))})
        self.tracker.observe(scrape, now=self.now, revisions={P: "1"})
        self.counting = True

    def totals(self) -> Counts:
        report = self.tracker.report(P, now=self.now)
        assert report is not None
        return report.totals


OPS = st.lists(st.tuples(st.sampled_from(("eval", "eval", "own", "restart", "read", "read")),
                         st.integers(0, 3), st.sampled_from(ACTIONS), st.integers(0, 5)),
               max_size=60)


@given(st.integers(1, 3), OPS)
def test_never_negative_never_above_the_truth(replicas: int, ops: list[tuple[str, int, str, int]]
                                              ) -> None:
    world = World([Process(start=EPOCH.timestamp() + k) for k in range(replicas)])
    world.read(world.processes[0])
    for op in ops:
        world.step(op)
    for process in world.processes:
        world.read(process)
    totals = world.totals()
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    for action in ACTIONS:
        assert 0 <= totals.get(action) <= world.truth[action]
        assert report.last_hour.get(action) >= 0


@given(st.integers(1, 3), OPS.map(lambda ops: [op for op in ops if op[0] != "restart"]))
def test_exact_when_every_api_server_was_read_at_the_start_and_none_restarted(
    replicas: int, ops: list[tuple[str, int, str, int]]
) -> None:
    world = World([Process(start=EPOCH.timestamp() + k) for k in range(replicas)])
    for process in world.processes:  # every API server's baseline
        world.read(process)
    for op in ops:
        world.step(op)
    for process in world.processes:
        world.read(process)
    assert world.totals() == Counts(*(world.truth[a] for a in ACTIONS))
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    assert report.last_hour == world.totals()  # all within the hour
    assert report.resets == 0


def test_a_restart_counts_the_new_process_from_zero_and_says_so() -> None:
    world = World([Process(start=START)])
    world.read(world.processes[0])
    world.step(("eval", 0, "deny", 2))
    world.read(world.processes[0])
    world.step(("restart", 0, "deny", 0))
    world.step(("eval", 0, "deny", 1))
    world.read(world.processes[0])
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    assert report.totals == Counts(denied=3)
    assert report.resets == 1
    assert report.note is not None
    assert "restart" in report.note
    # The same start time with a lower value is a reset too, never a negative increase.
    world.processes[0].counts["deny"] = 0
    world.read(world.processes[0])
    world.step(("eval", 0, "deny", 1))
    world.read(world.processes[0])
    assert world.totals() == Counts(denied=4)


def test_own_probes_are_taken_out_and_a_new_revision_counts_from_zero() -> None:
    world = World([Process(start=START)])
    world.read(world.processes[0])
    world.step(("own", 0, "deny", 1))
    world.step(("eval", 0, "deny", 1))
    world.read(world.processes[0])
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    assert (report.totals, report.probes_excluded) == (Counts(denied=1), 1)
    world.step(("eval", 0, "warn", 1))
    world.tracker.observe(Scrape(START, {P: Counts(denied=2, warned=1)}),
                          now=world.now, revisions={P: "2"})
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    assert (report.revision, report.totals, report.since) == ("2", Counts(), world.now)
    assert report.last_hour == Counts(denied=1, warned=1)  # the hour spans revisions
    later = world.now + dt.timedelta(hours=1, seconds=1)
    gone = world.tracker.report(P, now=later)
    assert gone is not None
    assert gone.last_hour == Counts()


def test_a_new_leader_continues_the_figures_of_the_revision() -> None:
    world = World([Process(start=START)])
    world.read(world.processes[0])
    world.step(("eval", 0, "audit", 2))
    world.read(world.processes[0])
    written = world.tracker.report(P, now=world.now)
    assert written is not None
    status = written.as_status()
    successor = AdmissionCounts()
    successor.carry(P, "1", status, now=world.now + dt.timedelta(seconds=30))
    world.tracker = successor
    world.step(("eval", 0, "audit", 1))
    world.read(world.processes[0])  # the baseline of the new leader
    world.step(("eval", 0, "audit", 1))
    world.read(world.processes[0])
    report = successor.report(P, now=world.now)
    assert report is not None
    assert report.totals == Counts(audited=3)  # 2 carried + 1; the one in the gap is lost
    assert report.since == written.since
    assert report.note is not None
    assert "new operator leader" in report.note
    assert successor.report(P, now=world.now) is not None
    other = AdmissionCounts()
    other.carry(P, "2", status, now=world.now)  # another revision: nothing carried
    assert other.report(P, now=world.now) is None


def test_status_is_written_when_a_figure_changes_or_at_the_refresh() -> None:
    world = World([Process(start=START)])
    world.read(world.processes[0])
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    status = report.as_status()
    assert set(status) == {"denied", "warned", "audited", "since", "readAt", "revision",
                           "lastHour", "resets", "probesExcluded"}
    assert admission_differs(None, status, now=world.now, refresh_s=600)
    later = world.now + dt.timedelta(seconds=30)
    same = status | {"readAt": "2099-01-01T00:00:00Z",
                     "lastHour": status["lastHour"] | {"since": "x"}}
    assert not admission_differs(status, same, now=later, refresh_s=600)
    assert admission_differs(status, status | {"denied": 1}, now=later, refresh_s=600)
    # Past the first, a count is written when it enters another power of two (or at the
    # heartbeat): a flood of denials costs a write per doubling, not one per read.
    three = status | {"denied": 3}
    assert not admission_differs(status | {"denied": 2}, three, now=later, refresh_s=600)
    assert admission_differs(three, status | {"denied": 4}, now=later, refresh_s=600)
    assert admission_differs(status, status | {"lastHour": status["lastHour"] | {"warned": 1}},
                             now=later, refresh_s=600)
    assert admission_differs(status, status | {"resets": 1}, now=later, refresh_s=600)
    assert admission_differs(status, status, now=later + dt.timedelta(minutes=10),
                             refresh_s=600)


def test_a_warn_probe_is_one_probe_taken_out_of_warned_and_audited() -> None:
    """A Warn binding is [Warn, Audit]: its probe is counted under both, and taken out whole
    only when a read shows both (one request is counted by one API server at once)."""
    world = World([Process(start=START)])
    world.read(world.processes[0])
    world.tracker.expect_own(P, ("warn", "audit"), now=world.now)
    world.step(("eval", 0, "warn", 1))  # a tenant's warning alone does not match the probe
    world.read(world.processes[0])
    world.processes[0].counts["warn"] += 1  # the probe, counted under both
    world.processes[0].counts["audit"] += 1
    world.step(("eval", 0, "audit", 1))
    world.read(world.processes[0])
    report = world.tracker.report(P, now=world.now)
    assert report is not None
    assert (report.totals, report.probes_excluded) == (Counts(warned=1, audited=1), 1)


def test_a_new_leader_s_note_alone_is_not_written_the_next_figures_carry_it() -> None:
    world = World([Process(start=START)])
    world.read(world.processes[0])
    world.step(("eval", 0, "deny", 2))
    world.read(world.processes[0])
    written = world.tracker.report(P, now=world.now)
    assert written is not None
    status = written.as_status()
    successor = AdmissionCounts()
    later = world.now + dt.timedelta(seconds=30)
    successor.carry(P, "1", status, now=later)
    world.tracker = successor
    world.t += 30
    world.read(world.processes[0])
    first = successor.report(P, now=world.now)
    assert first is not None
    assert first.note is not None
    assert first.totals == Counts(denied=2)
    # The last hour goes on too (dropping it would be news no admission made).
    assert (first.last_hour, first.last_hour_since) == (written.last_hour,
                                                         written.last_hour_since)
    # Quiet: nothing but the note and readAt changed.
    assert not admission_differs(status, first.as_status(), now=world.now, refresh_s=600)
    # The next figures that are written (a step, or the heartbeat) carry it.
    world.step(("eval", 0, "deny", 2))
    world.read(world.processes[0])
    stepped = successor.report(P, now=world.now)
    assert stepped is not None
    assert admission_differs(status, stepped.as_status(), now=world.now, refresh_s=600)
    assert "new operator leader" in stepped.as_status()["note"]
    # The carried hour leaves the window an hour after its start, the new leader's reads later.
    gone = successor.report(P, now=written.last_hour_since + dt.timedelta(hours=1))
    assert gone is not None
    assert gone.last_hour == Counts(denied=2)  # the two read by the new leader


def test_own_probes_left_out_are_written_by_reporting_step_not_each_probe() -> None:
    status = {"denied": 0, "warned": 0, "audited": 0, "since": "s", "readAt":
              "2026-01-01T00:00:00Z", "lastHour": {"denied": 0, "warned": 0, "audited": 0},
              "resets": 0, "probesExcluded": 2, "revision": 1}
    now = EPOCH + dt.timedelta(seconds=60)
    assert not admission_differs(status, status | {"probesExcluded": 3}, now=now,
                                 refresh_s=600)
    assert admission_differs(status, status | {"probesExcluded": 4}, now=now, refresh_s=600)
