"""A rollout's gates (`core.gates.decide`), by table: every gate that fails, holds or lets a
wave pass, the bake, the warn step, approval waves, and the halt's revert or pause."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from convergerd.core.gates import (
    ClusterGate,
    Command,
    Decision,
    Gate,
    GateView,
    Step,
    commanded,
    decide,
    held_by,
    moved,
)
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.rollout import Gates, OnHalt, Rollout, State, Strategy, Wave

NOW = dt.datetime(2027, 1, 1, 12, 0, tzinfo=dt.UTC)
TO = 7


def wave(name: str, warn_first: bool = False) -> Wave:
    return Wave(name, fraction=1.0, warn_first=warn_first)


THREE = (wave("canary"), wave("half"), wave("rest"))


def strat(*, waves: tuple[Wave, ...] = THREE, bake_s: float = 60.0,
          gates: Gates | None = None, on_halt: str = "revert",
          approval: frozenset[str] = frozenset()) -> Strategy:
    return Strategy("careful", waves, bake_s, gates or Gates(), OnHalt(on_halt), approval)


def pos(*, state: str = "progressing", wave: int = 0, wave_ready_at: dt.datetime | None = None,
      warn_step: bool = False, strategy: Strategy | None = None) -> Rollout:
    return Rollout(1, PolicyId("regs"), TO, TO - 1, strategy or strat(), State(state), wave=wave,
                   warn_step=warn_step, wave_ready_at=wave_ready_at)


def ok(name: str, **kw: object) -> ClusterGate:
    """A cluster that reports the new revision, enforcing and verified, nothing found."""
    fields: dict[str, object] = {"revision": TO, "phase": "Enforcing", "verified": "True",
                                 "violations": 0, "denied": 0, "warned": 0,
                                 "admission_revision": TO}
    fields.update(kw)
    return ClusterGate(ClusterId(name), **fields)  # type: ignore[arg-type]


def fleet(n: int, **kw: object) -> list[ClusterGate]:
    return [ok(f"c{i:04d}", **kw) for i in range(n)]


def look(clusters: list[ClusterGate], position: Rollout | None = None,
         strategy: Strategy | None = None, *, enabled: bool = True, mode: str = "Deny",
         now: dt.datetime = NOW) -> Decision:
    position = position or pos()
    if strategy is not None:
        position = dataclasses.replace(position, strategy=strategy)
    return decide(position, GateView(clusters, enabled=enabled, mode=mode), now)


BAKED = pos(wave_ready_at=NOW - dt.timedelta(seconds=61))
BAKING = pos(wave_ready_at=NOW - dt.timedelta(seconds=10))


@pytest.mark.parametrize(("clusters", "position", "strategy", "step", "gate"), [
    # every cluster reported: the bake starts, then runs, then the next wave
    (fleet(3), pos(), strat(), Step.READY, Gate.BAKE),
    (fleet(3), BAKING, strat(), Step.WAIT, Gate.BAKE),
    (fleet(3), BAKED, strat(), Step.ADVANCE, Gate.DELIVERING),
    # the last wave passed: complete
    (fleet(3), dataclasses.replace(BAKED, wave=2), strat(), Step.COMPLETE, Gate.DONE),
    # Error phases: more than tolerated halts, during the bake too; at another revision not
    ([*fleet(2), ok("bad", phase="Error")], BAKING, strat(), Step.HALT, Gate.ERROR_PHASES),
    ([*fleet(2), ok("bad", phase="Error")], BAKING, strat(gates=Gates(max_error_clusters=1)),
     Step.WAIT, Gate.BAKE),
    ([*fleet(2), ok("old", phase="Error", revision=TO - 1)], pos(), strat(),
     Step.WAIT, Gate.DELIVERING),
    # a count read with the new phase but not seen again yet may be the old revision's
    # audit: it neither halts nor lets the wave pass
    ([*fleet(2), ok("v", violations=1, settled=False)], BAKING, strat(), Step.WAIT,
     Gate.DELIVERING),
    # new violations: the audit at the new revision; the old revision's do not count
    ([*fleet(2), ok("v", violations=1)], pos(), strat(), Step.HALT, Gate.NEW_VIOLATIONS),
    ([*fleet(2), ok("v", violations=3)], BAKED, strat(gates=Gates(max_new_violations=3)),
     Step.ADVANCE, Gate.DELIVERING),
    ([*fleet(2), ok("v", violations=9, revision=TO - 1)], pos(), strat(),
     Step.WAIT, Gate.DELIVERING),
    # denials since the new revision was installed (counts of an older one do not count)
    ([*fleet(2), ok("d", denied=2)], BAKING, strat(gates=Gates(max_denials=1)),
     Step.HALT, Gate.DENIALS),
    ([*fleet(2), ok("d", denied=2, admission_revision=TO - 1)], BAKING, strat(gates=Gates()),
     Step.WAIT, Gate.BAKE),
    # warnings: only in a warn step, and only when the strategy sets a limit
    ([*fleet(2, mode="Warn"), ok("w", warned=5, mode="Warn")],
     dataclasses.replace(BAKING, warn_step=True), strat(gates=Gates(max_warnings=4)),
     Step.HALT, Gate.WARNINGS),
    ([*fleet(2, mode="Warn"), ok("w", warned=5, mode="Warn")],
     dataclasses.replace(BAKING, warn_step=True), strat(), Step.WAIT, Gate.BAKE),
    ([*fleet(2), ok("w", warned=5)], BAKING, strat(gates=Gates(max_warnings=0)),
     Step.WAIT, Gate.BAKE),
    # unreached: within the share the wave is ready without them; beyond it the wave waits
    ([*fleet(9), ok("down", reached=False, revision=None)], pos(), strat(), Step.READY, Gate.BAKE),
    ([*fleet(8), ok("d1", reached=False), ok("d2", reached=False)], pos(), strat(),
     Step.WAIT, Gate.UNREACHED),
    ([*fleet(2), ok("d1", reached=False)], pos(), strat(gates=Gates(max_unreached_share=0.5)),
     Step.READY, Gate.BAKE),
    # not reported yet: the old revision, no phase, not verified, the wrong mode
    ([*fleet(2), ok("slow", revision=TO - 1)], pos(), strat(), Step.WAIT, Gate.DELIVERING),
    ([*fleet(2), ok("new", phase=None, verified=None)], pos(), strat(), Step.WAIT, Gate.DELIVERING),
    ([*fleet(2), ok("unverified", verified="False")], pos(), strat(), Step.WAIT, Gate.DELIVERING),
    ([*fleet(2), ok("still-warn", mode="Warn")], pos(), strat(), Step.WAIT, Gate.DELIVERING),
    # Unsupported holds the revision and cannot enforce any: it does not hold the wave
    ([*fleet(2), ok("old-k8s", phase="Unsupported", verified=None)], pos(), strat(),
     Step.READY, Gate.BAKE),
    # a wave no cluster falls in passes at once
    ([], pos(), strat(), Step.ADVANCE, Gate.DELIVERING),
])
def test_gates(clusters: list[ClusterGate], position: Rollout, strategy: Strategy, step: Step,
               gate: Gate) -> None:
    decision = look(clusters, position, strategy)
    assert (decision.step, decision.gate) == (step, gate), decision.reason


def test_a_halt_reverts_or_pauses_as_the_strategy_says() -> None:
    bad = [*fleet(2), ok("c-bad", violations=4)]
    revert = look(bad, pos(), strat(on_halt="revert"))
    pause = look(bad, pos(), strat(on_halt="pause"))
    assert revert.step is Step.HALT
    assert revert.revert
    assert pause.step is Step.HALT
    assert not pause.revert
    assert revert.wave == 0
    assert revert.reason == ("new_violations: 1 cluster(s) with more than 0 audit violation(s) "
                             "at revision 7: c-bad (4)")


def test_the_reason_names_a_few_clusters_worst_first_and_counts_the_rest() -> None:
    bad = [ok(f"c{i}", violations=i + 1) for i in range(6)]
    decision = look(bad)
    assert decision.detail.endswith("c5 (6), c4 (5), c3 (4) and 3 more")
    waiting = look([ok(f"s{i}", revision=None) for i in range(5)])
    assert waiting.detail == ("0 of 5 cluster(s) report revision 7; waiting for s0, s1, s2 "
                              "and 2 more")


def test_an_approval_wave_is_entered_waiting() -> None:
    decision = look(fleet(3), BAKED, strat(approval=frozenset({"half"})))
    assert (decision.step, decision.gate, decision.wave, decision.approval) == (
        Step.ADVANCE, Gate.APPROVAL, 1, True)
    # once approved the rollout is progressing again at that wave: its clusters are gated
    assert look(fleet(3), pos(wave=1), strat(approval=frozenset({"half"}))).step is Step.READY


def test_held_states_only_say_what_holds_them() -> None:
    bad = [ok("c", violations=100)]
    for state, gate in (("paused", Gate.PAUSED), ("halted", Gate.HALTED),
                        ("waiting_approval", Gate.APPROVAL), ("completed", Gate.DONE)):
        decision = look(bad, pos(state=state))
        assert (decision.step, decision.gate) == (Step.WAIT, gate)


def test_warn_first_wave_then_the_policys_own_mode() -> None:
    strategy = strat(waves=(wave("canary"), wave("half", warn_first=True), wave("rest")))
    into = look(fleet(2), BAKED, strategy)
    assert (into.step, into.wave, into.warn_step) == (Step.ADVANCE, 1, True)
    # in the warn step a cluster in Warn reports; one still in Deny does not
    warn = pos(wave=1, warn_step=True)
    assert look(fleet(2, mode="Warn"), warn, strategy).step is Step.READY
    assert look(fleet(2, mode="Deny"), warn, strategy).step is Step.WAIT
    # after its bake, the same wave in the policy's mode, then its own bake and the next wave
    baked = dataclasses.replace(warn, wave_ready_at=NOW - dt.timedelta(seconds=61))
    enforce = look(fleet(2, mode="Warn"), baked, strategy)
    assert (enforce.step, enforce.wave, enforce.warn_step) == (Step.ENFORCE, 1, False)
    later = look(fleet(2, mode="Deny"), pos(wave=1, wave_ready_at=baked.wave_ready_at),
                 strategy)
    assert (later.step, later.wave, later.warn_step) == (Step.ADVANCE, 2, False)


def test_a_disabled_policy_is_reported_inert_without_a_probe() -> None:
    inert = fleet(2, phase="Inert", verified=None)
    assert look(inert, enabled=False).step is Step.READY
    assert look(fleet(2), enabled=False).step is Step.WAIT  # still Enforcing there


def test_a_decision_moves_the_rollout_once_and_a_held_gate_is_written_once() -> None:
    ready = look(fleet(2))
    after = moved(pos(), ready, NOW)
    assert after is not None
    assert (after.wave_ready_at, after.reason) == (NOW, ready.reason)
    # the same gate holding it again (other counts): nothing to write
    waiting = look([ok("slow", revision=None)])
    held = moved(pos(), waiting, NOW)
    assert held is not None
    assert held_by(held) is Gate.DELIVERING
    assert moved(held, look([ok("slow", revision=None), ok("other", revision=None)]),
                 NOW) is None
    halted = moved(pos(), look([ok("bad", violations=2)], strategy=strat(on_halt="pause")), NOW)
    reverted = moved(pos(), look([ok("bad", violations=2)]), NOW)
    assert halted is not None
    assert reverted is not None
    assert (halted.state, reverted.state) == (State.HALTED, State.REVERTED)
    into = moved(pos(), look(fleet(1), BAKED, strat(approval=frozenset({"half"}))), NOW)
    assert into is not None
    assert (into.state, into.wave, into.wave_ready_at) == (State.WAITING_APPROVAL, 1, None)


@pytest.mark.parametrize(("state", "command", "to"), [
    ("progressing", Command.PAUSE, State.PAUSED),
    ("paused", Command.RESUME, State.PROGRESSING),
    ("halted", Command.RESUME, State.PROGRESSING),
    ("waiting_approval", Command.APPROVE, State.PROGRESSING),
    ("waiting_approval", Command.ABORT, State.ABORTED),
    ("halted", Command.ABORT, State.ABORTED),
    ("waiting_approval", Command.PAUSE, None),  # its wave would become due
    ("progressing", Command.APPROVE, None),
    ("reverted", Command.ABORT, None),
    ("completed", Command.RESUME, None),
])
def test_commands(state: str, command: Command, to: State | None) -> None:
    after = commanded(pos(state=state, wave=1), command, "admin token")
    if to is None:
        assert isinstance(after, str)
        assert f"is {state}" in after
        return
    assert not isinstance(after, str)
    assert after.state is to
    assert after.reason is not None
    assert after.reason.endswith(" by admin token")


def test_an_approved_wave_starts_in_its_warn_step_when_it_has_one() -> None:
    strategy = strat(waves=(wave("canary"), wave("half", warn_first=True)),
                     approval=frozenset({"half"}))
    after = commanded(pos(state="waiting_approval", wave=1, strategy=strategy), Command.APPROVE,
                      "admin token")
    assert not isinstance(after, str)
    assert (after.state, after.wave, after.warn_step) == (State.PROGRESSING, 1, True)
    assert after.reason == "approved by admin token"
