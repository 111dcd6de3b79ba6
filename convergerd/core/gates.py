"""A rollout's gates: what one look at the current wave's clusters decides (pure; time passed
in). The gate job (`delivery.rollouts`) builds the view from the status state, calls `decide`,
and writes the transition it names with a compare-and-set on (id, state, wave).

A wave's clusters, each judged from its Policy's status as the last round read it back:

- **failing gates, judged at every look** (a halt comes within one gate period, bake or not):
  more clusters in `Error` at the new revision than `maxErrorClusters`; on any cluster, more
  audit violations reported at the new revision than `maxNewViolations` (a count `settled`:
  seen again in a later reading, as the audit of a new revision may lag its phase), more
  admission denials since the new revision was installed than `maxDenials`, and in a warn
  step more warnings than `maxWarnings` (when set). A failed gate halts the rollout: `reverted` (the
  wave's clusters sent back) or `halted` (left as they are), as the strategy's `onHalt` says.
- **reported**: the cluster's operator reports the new revision, in the phase its enabled
  state asks (`Enforcing`; `Inert` when disabled; `Unsupported` counts too: that cluster
  cannot enforce any revision), `Verified` True when enabled and supported, its audit count
  settled, and, when the mode in force is read back, in the mode of the step (`Warn` in a
  warn step).
- **in `Error`** within `maxErrorClusters`: tolerated, as the strategy says.
- **unreached**: not reached (or unable to take the policy: a cluster-level failure); up to
  `maxUnreachedShare` of the wave's clusters they do not hold it (rounds deliver to them
  later); more, and the wave waits (never a halt: the policy did not do that).
- When every cluster is reported or tolerated as unreached, the wave is **ready** (its bake
  starts: `wave_ready_at` is written once); after `bakeSeconds` a warn step turns into the
  policy's own mode (same wave, a new bake), else the rollout **advances** to the next wave
  (waiting for approval first if the strategy names it), or **completes** after the last.

What a gate cannot see is said in docs/design.md ("Rollouts: the state machine").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from convergerd.core.model import ClusterId
from convergerd.core.rollout import LIVE_STATES, OnHalt, Rollout, State, Strategy

ENFORCING = "Enforcing"
INERT = "Inert"
UNSUPPORTED = "Unsupported"
ERROR = "Error"
WARN = "Warn"
# Clusters named in a reason: at most this many, the rest counted.
NAMED = 3


class Gate(enum.StrEnum):
    """What holds a rollout, or which gate failed: `gate` in the API, `/status` and logs."""

    DELIVERING = "delivering"  # some clusters have not reported the new revision yet
    UNREACHED = "unreached"  # more of the wave unreached than the strategy tolerates
    BAKE = "bake"  # reported; the bake time runs
    ERROR_PHASES = "error_phases"
    NEW_VIOLATIONS = "new_violations"
    DENIALS = "denials"
    WARNINGS = "warnings"
    APPROVAL = "approval"  # the wave waits for `convergerd rollout approve`
    PAUSED = "paused"  # paused by a command
    HALTED = "halted"  # a gate failed and the strategy says pause
    DONE = "done"  # terminal


class Step(enum.StrEnum):
    """What to write after a look (`WAIT`: nothing but the reason)."""

    WAIT = "wait"
    READY = "ready"  # every cluster reported: write `wave_ready_at`, the bake starts
    ENFORCE = "enforce"  # the warn step baked: the same wave in the policy's own mode
    ADVANCE = "advance"  # the next wave (progressing, or waiting for approval)
    COMPLETE = "complete"
    HALT = "halt"


@dataclass(frozen=True, slots=True)
class ClusterGate:
    """One cluster of the wave, as the status state knows it (`delivery.rollouts` builds it
    from the cluster's facts and its record of the policy)."""

    cluster: ClusterId
    # Answered its last round or probe and took the policy (no cluster-level failure).
    reached: bool = True
    seen_at: dt.datetime | None = None  # when the round read its Policy back (None: never)
    revision: int | None = None  # the revision its operator reports (the phase's)
    phase: str | None = None
    verified: str | None = None  # the Verified condition's status ("True", "False", ...)
    mode: str | None = None  # the mode of the binding in force, when read back
    violations: int | None = None  # the audit's, as the Policy at `revision` carries it
    # Whether `violations` is known to be the new revision's audit: the operator writes the
    # phase of a new revision before its audit of it, so a count read with the new phase may
    # still be the old revision's; the gate job trusts one that a later reading shows too.
    settled: bool = True
    # The API server's admission counts since `admission_revision` was installed (None: not
    # read back).
    denied: int | None = None
    warned: int | None = None
    admission_revision: int | None = None


@dataclass(frozen=True, slots=True)
class GateView:
    """The current wave's clusters, and what the policy asks of them."""

    clusters: Sequence[ClusterGate]
    enabled: bool = True
    mode: str = "Deny"  # the policy's own mode (a warn step asks `Warn`)


@dataclass(frozen=True, slots=True)
class Decision:
    """What one look decided: `step` to write (with the `wave` and `warn_step` it leads to),
    `gate` holding the rollout or failed, `detail` in words. `approval`: an advance into a wave
    that waits for approval; `revert`: a halt that sends the wave's clusters back."""

    step: Step
    gate: Gate
    detail: str
    wave: int
    warn_step: bool = False
    approval: bool = False
    revert: bool = False

    @property
    def reason(self) -> str:
        """`gate: detail`, as the `reason` column and `/status` show it."""
        return f"{self.gate}: {self.detail}"


def _named(clusters: Sequence[str]) -> str:
    shown = ", ".join(clusters[:NAMED])
    more = len(clusters) - NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def _over(clusters: Sequence[ClusterGate], value: str,
          limit: int) -> list[tuple[ClusterId, int]]:
    """The clusters whose count `value` (a `ClusterGate` field) is above `limit`, with it."""
    found = []
    for c in clusters:
        n = getattr(c, value)
        if n is not None and n > limit:
            found.append((c.cluster, n))
    return found


def failed_gate(position: Rollout, view: GateView) -> tuple[Gate, str] | None:
    """The first failing gate over the clusters reporting the new revision, with what failed
    (bounded: at most `NAMED` clusters named); None when every one holds."""
    to = position.to_revision
    g = position.strategy.gates
    current = [c for c in view.clusters if c.revision == to]
    errors = [c.cluster for c in current if c.phase == ERROR]
    if len(errors) > g.max_error_clusters:
        return Gate.ERROR_PHASES, (f"{len(errors)} cluster(s) in Error at revision {to} "
                                   f"(at most {g.max_error_clusters}): {_named(errors)}")
    checks: list[tuple[Gate, str, int, Sequence[ClusterGate], str]] = [
        (Gate.NEW_VIOLATIONS, "violations", g.max_new_violations,
         [c for c in current if c.settled], "audit violation(s)"),
        (Gate.DENIALS, "denied", g.max_denials,
         [c for c in view.clusters if c.admission_revision == to], "denial(s)"),
    ]
    if position.warn_step and g.max_warnings is not None:
        checks.append((Gate.WARNINGS, "warned", g.max_warnings,
                       [c for c in view.clusters if c.admission_revision == to],
                       "warning(s)"))
    for gate, value, limit, clusters, words in checks:
        over = _over(clusters, value, limit)
        if over:
            worst = sorted(over, key=lambda x: (-x[1], x[0]))
            named = _named([f"{c} ({n})" for c, n in worst])
            return gate, (f"{len(over)} cluster(s) with more than {limit} {words} at "
                          f"revision {to}: {named}")
    return None


def reported(c: ClusterGate, to: int, view: GateView, *, warn_step: bool) -> bool:
    """Whether `c` reports the new revision as the step asks (see the module's doc)."""
    if not c.reached or c.revision != to or not c.settled:
        return False
    if c.phase == UNSUPPORTED:
        return True
    if not view.enabled:
        return c.phase == INERT
    if c.phase != ENFORCING or c.verified != "True":
        return False
    wanted = WARN if warn_step else view.mode
    return c.mode is None or c.mode == wanted


def decide(position: Rollout, view: GateView, now: dt.datetime) -> Decision:
    """One look at a rollout (its strategy is its snapshot) and its current wave (`view`): see
    the module's doc. A rollout that is not progressing only says what holds it."""
    wave, warn, strategy = position.wave, position.warn_step, position.strategy
    if position.state is not State.PROGRESSING:
        gate = _HELD.get(position.state, Gate.DONE)
        return Decision(Step.WAIT, gate, position.state.value, wave, warn)
    failed = failed_gate(position, view)
    if failed is not None:
        gate, detail = failed
        return Decision(Step.HALT, gate, detail, wave, warn,
                        revert=strategy.on_halt is OnHalt.REVERT)
    if not view.clusters:  # a wave no cluster falls in (no canary labelled): nothing to bake
        return advance(strategy, wave)
    return _holding(position, view) or _baked(position, now)


_HELD = {State.PAUSED: Gate.PAUSED, State.HALTED: Gate.HALTED,
         State.WAITING_APPROVAL: Gate.APPROVAL}


def _holding(position: Rollout, view: GateView) -> Decision | None:
    """A wait while clusters have not reported (or too many are unreached); None when every
    cluster reported or is tolerated."""
    to, wave, warn = position.to_revision, position.wave, position.warn_step
    clusters = view.clusters
    unreached = [c.cluster for c in clusters if not c.reached]
    # In Error within `maxErrorClusters` (the gate held): tolerated, as the strategy says.
    waiting = [c.cluster for c in clusters
               if c.reached and not reported(c, to, view, warn_step=warn)
               and not (c.revision == to and c.phase == ERROR)]
    tolerated = math.floor(position.strategy.gates.max_unreached_share * len(clusters) + 1e-9)
    if waiting:
        return Decision(Step.WAIT, Gate.DELIVERING,
                        f"{len(clusters) - len(waiting) - len(unreached)} of {len(clusters)} "
                        f"cluster(s) report revision {to}; waiting for {_named(waiting)}",
                        wave, warn)
    if len(unreached) > tolerated:
        return Decision(Step.WAIT, Gate.UNREACHED,
                        f"{len(unreached)} of {len(clusters)} cluster(s) unreached (at most "
                        f"{tolerated} tolerated): {_named(unreached)}", wave, warn)
    return None


def _baked(position: Rollout, now: dt.datetime) -> Decision:
    """Every cluster reported: the bake starts, runs, then the warn step ends or the wave
    passes."""
    wave, warn, ready = position.wave, position.warn_step, position.wave_ready_at
    strategy = position.strategy
    if ready is None:
        return Decision(Step.READY, Gate.BAKE,
                        f"every cluster reported; baking {strategy.bake_s:g} s", wave, warn)
    left = strategy.bake_s - (now - ready).total_seconds()
    if left > 0:
        return Decision(Step.WAIT, Gate.BAKE, f"baking, {math.ceil(left):d} s left", wave, warn)
    if warn:
        return Decision(Step.ENFORCE, Gate.DELIVERING, f"the warn step baked: revision "
                        f"{position.to_revision} in the policy's own mode", wave)
    return advance(strategy, wave)


def advance(strategy: Strategy, wave: int) -> Decision:
    """After wave `wave` passed: the next wave (in its warn step if it has one; waiting for
    approval if the strategy names it), or complete after the last."""
    nxt = wave + 1
    if nxt >= len(strategy.waves):
        return Decision(Step.COMPLETE, Gate.DONE, "every wave passed", wave)
    spec = strategy.waves[nxt]
    if spec.name in strategy.approval:
        return Decision(Step.ADVANCE, Gate.APPROVAL,
                        f"wave {spec.name} waits for approval", nxt, spec.warn_first,
                        approval=True)
    return Decision(Step.ADVANCE, Gate.DELIVERING, f"wave {spec.name} started", nxt,
                    spec.warn_first)


def moved(rollout: Rollout, decision: Decision, now: dt.datetime) -> Rollout | None:
    """The rollout `decision` moves it to (its reason the decision's), None when there is
    nothing to write: a wait whose gate is already the one the rollout's reason names (the
    detail, counts of clusters, changes every look and is not written)."""
    step = decision.step
    if step is Step.WAIT and held_by(rollout) == decision.gate:
        return None
    changes: dict[str, object] = {"reason": decision.reason}
    if step is Step.READY:
        changes["wave_ready_at"] = now
    elif step is Step.ENFORCE:
        changes.update(warn_step=False, wave_ready_at=None)
    elif step is Step.ADVANCE:
        changes.update(state=State.WAITING_APPROVAL if decision.approval else State.PROGRESSING,
                       wave=decision.wave, warn_step=decision.warn_step, wave_ready_at=None)
    elif step is Step.COMPLETE:
        changes["state"] = State.COMPLETED
    elif step is Step.HALT:
        changes["state"] = State.REVERTED if decision.revert else State.HALTED
    return dataclasses.replace(rollout, **changes)  # type: ignore[arg-type]


def held_by(rollout: Rollout) -> Gate | None:
    """The gate a rollout's `reason` names (`Decision.reason`: `gate: detail`); None for a
    reason of another kind (a command's)."""
    head, sep, _ = (rollout.reason or "").partition(":")
    if not sep:
        return None
    try:
        return Gate(head)
    except ValueError:
        return None


class Command(enum.StrEnum):
    """What an operator asks of a policy's rollout (`POST /v1/policies/{id}/rollout/{...}`,
    `convergerd rollout ...`)."""

    PAUSE = "pause"
    RESUME = "resume"
    APPROVE = "approve"
    ABORT = "abort"


# The states each command moves a rollout from.
COMMAND_FROM: Mapping[Command, frozenset[State]] = {
    Command.PAUSE: frozenset({State.PROGRESSING}),
    Command.RESUME: frozenset({State.PAUSED, State.HALTED}),
    Command.APPROVE: frozenset({State.WAITING_APPROVAL}),
    Command.ABORT: LIVE_STATES,
}
_DONE_BY = {Command.PAUSE: "paused", Command.RESUME: "resumed", Command.APPROVE: "approved",
            Command.ABORT: "aborted"}


def commanded(rollout: Rollout, command: Command, by: str) -> Rollout | str:
    """Where `command` takes `rollout`, or why it cannot (a sentence). Pausing a rollout that
    waits for approval is refused: its wave is not delivered, and a pause would make it due.
    A resumed rollout is judged again where it stopped (a gate that still fails halts it
    again); an approved wave starts (in its warn step, if it has one); an abort sends every
    cluster back to its previous revision."""
    if rollout.state not in COMMAND_FROM[command]:
        allowed = " or ".join(sorted(s.value for s in COMMAND_FROM[command]))
        return (f"rollout {rollout.id} of policy {rollout.policy} is {rollout.state.value}; "
                f"{command.value} applies to a rollout that is {allowed}")
    reason = f"{_DONE_BY[command]} by {by}"
    if command is Command.PAUSE:
        return dataclasses.replace(rollout, state=State.PAUSED, reason=reason)
    if command is Command.RESUME:
        return dataclasses.replace(rollout, state=State.PROGRESSING, reason=reason)
    if command is Command.APPROVE:
        warn = rollout.strategy.waves[rollout.wave].warn_first
        return dataclasses.replace(rollout, state=State.PROGRESSING, warn_step=warn,
                                   wave_ready_at=None, reason=reason)
    return dataclasses.replace(rollout, state=State.ABORTED, warn_step=False, reason=reason)
