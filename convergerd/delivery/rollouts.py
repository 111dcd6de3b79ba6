"""The gate job: every `CONVERGERD_ROLLOUT_GATE_SECONDS`, on the leader (the holder of shard 0;
with one shard, of the Lease), each rollout in progress is judged (`core.gates.decide`) from
what the status state knows of its current wave's clusters, and what the decision moves is
written with a compare-and-set under the leader's fence, then fanned out at once: the clusters
whose due revision the move changed get it (`fanout.Saver.deliver_due`).

Why a failover neither repeats nor skips a wave: the rollout's state, wave and step are in
PostgreSQL, and a transition is written only where the row still is as it was read (id,
state, wave, step), inside a transaction that asks the fence before writing and again before
committing (`Store.transition_rollout`). An old leader that lost its Lease cannot commit; a
new leader reads the wave the last commit left and judges it from there, so each wave is
entered exactly once. A transition committed whose fan-out did not happen (the leader died in
between) is delivered by the next round, which keeps every cluster at its due revision.

A lost save (`start_unsaved`, every pass too): a revision of a policy with a strategy whose
save never ran (its notification lost while the listener reconnected or the leader changed,
or the replica that wrote it died before its fan-out) has no rollout, and rounds do not deliver
it (`core.rollout.follow`); the gate job saves it (`Saver.save`, trigger `unsaved`) once it is
`UNSAVED_AFTER_S` old, as its own save would have: its rollout starts (a compare-and-set in
PostgreSQL: the policy's row locked, a revision that has its rollout already is followed, so
two leaders saving it start one rollout) and its first wave is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from convergerd.core.errors import ConvergerdError, Fenced
from convergerd.core.facts import RECORD_ROW
from convergerd.core.gates import ClusterGate, Decision, GateView, Step, decide, moved
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import FanoutReport, utc_now
from convergerd.core.rollout import Rollout, Staged, State, newly_due
from convergerd.eventloop import Pacer
from convergerd.leader.elector import Leadership
from convergerd.leader.lease import Fence
from convergerd.status.reader import StatusReader

log = logging.getLogger(__name__)

# A rollout's placements and revision contents are read again at most this often (clusters
# that joined its scope since are placed then); always after a transition.
STAGED_REFRESH_S = 60.0
# Clusters read between two looks at the clock (`eventloop.Pacer`).
_PACED_EVERY = 64
# The longest a transition's write may take (its statement timeout, below the fence's bound).
WRITE_BOUND_S = 10.0
# A revision with a strategy and no rollout is saved by the gate job once it is this old (its
# own save, on the notification, comes within moments of the commit), at most this many a pass.
UNSAVED_AFTER_S = 10.0
UNSAVED_PER_PASS = 20
UNSAVED_TRIGGER = "unsaved"  # the save's trigger (`convergerd_saves_total`, the log)


class GateStore(Protocol):
    """What the gate job reads and writes (`convergerd.store.store.Store`)."""

    async def live_rollouts(self) -> list[Rollout]: ...
    async def staged_rollout(self, policy_id: str, /) -> Staged | None: ...
    async def unsaved_revisions(self, *, older_than_s: float, limit: int
                                ) -> list[tuple[PolicyId, int]]: ...
    async def transition_rollout(self, before: Rollout, after: Rollout, *, by: str, what: str,
                                 detail: str | None = None,
                                 remaining_s: Callable[[], float]) -> Rollout | None: ...


class DueSaver(Protocol):
    """Writes clusters their due revision, and saves (`convergerd.delivery.fanout.Saver`)."""

    async def save(self, policy_id: str, *, trigger: str = ...) -> FanoutReport: ...

    async def deliver_due(self, policy_id: str, clusters: Collection[ClusterId] | None = None,
                          *, trigger: str = ...) -> FanoutReport: ...


def bounded(fence: Fence) -> Callable[[], float]:
    """What a transition's write may take: what `fence` allows, at most `WRITE_BOUND_S` (the
    open fence of a single replica allows forever)."""
    return lambda: min(fence.remaining_s(), WRITE_BOUND_S)


class HaltObserver(Protocol):
    def rollout_halted(self, on_halt: str) -> None: ...


# What a gate reads of a (policy, cluster) record, by name in `core.facts.RECORD_ROW` (the
# mode in force and the admission counts among them: the denial and warning gates).
_GATE_FIELDS = ("seen_at", "last_result", "revision", "phase", "verified_status",
                "audit_violations", "enforcement_action", "admission_denied", "admission_warned",
                "admission_revision")
_MISSING = tuple(f for f in _GATE_FIELDS if f not in RECORD_ROW)
if _MISSING:  # a field renamed in core.facts must be renamed here too
    raise RuntimeError(f"delivery.rollouts: gate fields {_MISSING} are not in the record row")
_READ = _GATE_FIELDS
_POSITIONS = tuple(RECORD_ROW.index(f) for f in _READ)
_NOT_READ = (None,) * len(_READ)


def _at(name: str) -> Callable[[tuple[Any, ...]], Any]:
    """How a gate field is taken from `record_values`' answer."""
    i = _READ.index(name)
    return lambda values: values[i]


_SEEN_AT, _LAST_RESULT, _REVISION, _PHASE, _VERIFIED, _VIOLATIONS, _MODE, _DENIED, _WARNED, \
    _ADMISSION_REVISION = (_at(f) for f in _GATE_FIELDS)


def cluster_gate(state: StatusReader, policy: PolicyId, cluster: ClusterId) -> ClusterGate:
    """One cluster of a wave as the status state knows it: reached (its last round or probe
    answered, no cluster-level error, its last delivery of the policy not refused), and what
    its operator reported of the policy with the phase (revision, phase, Verified, the
    audit's violations; the mode in force and the admission counts when read back). Reads a
    few fields of the packed record, builds none (thousands per look)."""
    facts = state.clusters.get(cluster)
    if facts is None:
        return ClusterGate(cluster, reached=False)
    values = facts.record_values(policy, _POSITIONS) or _NOT_READ
    reached = (facts.reachable is not False and facts.last_error is None
               and _LAST_RESULT(values) != "failed")
    if _SEEN_AT(values) is None:  # no reading: nothing reported yet
        return ClusterGate(cluster, reached=reached)
    return ClusterGate(
        cluster, reached=reached, seen_at=_SEEN_AT(values), revision=_REVISION(values),
        phase=_PHASE(values),
        verified=_VERIFIED(values), violations=_VIOLATIONS(values), mode=_MODE(values),
        denied=_DENIED(values), warned=_WARNED(values),
        admission_revision=_ADMISSION_REVISION(values))


def gate_view(state: StatusReader, staged: Staged) -> GateView:
    """The rollout's current wave, cluster by cluster, and what its new revision asks."""
    return view_of(staged, [cluster_gate(state, staged.rollout.policy, c)
                            for c in wave_clusters(staged)])


def wave_clusters(staged: Staged) -> list[ClusterId]:
    """The clusters of the rollout's current wave, in id order."""
    wave = staged.rollout.wave
    return sorted(c for c, p in staged.placements.items() if p.wave == wave)


def view_of(staged: Staged, clusters: Sequence[ClusterGate]) -> GateView:
    """`clusters` (the current wave's) with what the rollout's new revision asks of them."""
    policy = staged.contents.get(staged.rollout.to_revision)
    return GateView(clusters, enabled=policy.enabled if policy is not None else True,
                    mode=policy.enforcement.value if policy is not None else "Deny")


def newly_due_clusters(before: Rollout, after: Rollout, staged: Staged) -> list[ClusterId]:
    """The clusters a move from `before` to `after` makes due something else (written at
    once: `Saver.deliver_due`)."""
    return sorted(newly_due(before, after, staged.placements))


@dataclass(frozen=True, slots=True)
class Look:
    """One rollout judged in a pass: what was decided and, if it moved, where to."""

    rollout: Rollout
    decision: Decision
    moved_to: Rollout | None = None


class RolloutGates:
    """The gate job (see the module's doc). `leader`: the elector of the leader's shard."""

    def __init__(self, *, store: GateStore, state: StatusReader, saver: DueSaver,
                 leader: Leadership, period_s: float, identity: str,
                 observer: HaltObserver | None = None,
                 clock: Callable[[], dt.datetime] = utc_now,
                 unsaved_after_s: float = UNSAVED_AFTER_S) -> None:
        """`observer` counts the halts (`status.metrics.Metrics`); `unsaved_after_s`: how
        old a revision with no rollout is before the job saves it (`start_unsaved`)."""
        self._store = store
        self._observer = observer
        self._state = state
        self._saver = saver
        self._leader = leader
        self._period_s = period_s
        self._by = f"convergerd gate job ({identity})"
        self._clock = clock
        # Per policy: its rollout's placements and contents, and when they were read.
        self._staged: dict[PolicyId, tuple[Staged, float]] = {}
        # Per (rollout, cluster): a count of violations at the new revision and the time of
        # the reading that first showed it (`_settled`); only for live rollouts' clusters.
        self._counted: dict[tuple[int, ClusterId], tuple[int | None, dt.datetime | None]] = {}
        self._unsaved_after_s = unsaved_after_s
        # Per policy: the unsaved revision this term saved already (a save that did not start
        # a rollout, an invalid policy say, is not tried again every pass).
        self._tried: dict[PolicyId, int] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            epoch = self._leader.epoch
            if epoch is None or not self._leader.is_leader():
                self._staged.clear()  # a later term reads everything again
                self._counted.clear()
                self._tried.clear()
                continue
            try:
                await self.once(bounded(self._leader.fence(epoch)))
                self._leader.fence(epoch).remaining_s()  # still leading (raises Fenced)
                await self.start_unsaved()
            except Fenced as exc:
                log.info("rollout gates: no longer leading, pass stopped (%s)", exc)
            except ConvergerdError as exc:
                log.warning("rollout gates: pass failed, tried again in %g s: %s",
                            self._period_s, exc)

    async def once(self, remaining_s: Callable[[], float]) -> list[Look]:
        """One look at every rollout in progress; `remaining_s` is the leader's fence (asked
        before and while each transition is written: raises `Fenced`)."""
        looks: list[Look] = []
        rollouts = await self._store.live_rollouts()
        live = {r.policy for r in rollouts}
        for gone in [p for p in self._staged if p not in live]:
            del self._staged[gone]
        ids = {r.id for r in rollouts}
        for key in [k for k in self._counted if k[0] not in ids]:
            del self._counted[key]
        for rollout in rollouts:
            if rollout.state is not State.PROGRESSING:
                continue  # held by a command or a halt: only a command moves it
            staged = await self._staged_of(rollout)
            if staged is None:
                continue
            view = await self._view(staged)
            decision = decide(rollout, view, self._clock())
            after = moved(rollout, decision, self._clock())
            look = Look(rollout, decision)
            if after is not None:
                look = Look(rollout, decision, await self._move(staged, after, decision,
                                                                remaining_s))
            looks.append(look)
        return looks

    async def start_unsaved(self) -> list[FanoutReport]:
        """Save each revision of a policy with a strategy whose save never ran (see the
        module's doc): its rollout starts as its save would have started it. Each revision is
        tried once a term (a save that fails to reach the database is tried next pass)."""
        found = await self._store.unsaved_revisions(older_than_s=self._unsaved_after_s,
                                                    limit=UNSAVED_PER_PASS)
        listed = dict(found)
        for gone in [p for p in self._tried if listed.get(p) != self._tried[p]]:
            del self._tried[gone]
        reports = []
        for policy, revision in found:
            if self._tried.get(policy) == revision:
                continue
            log.warning("policy %s: revision %d has a rollout strategy and no rollout: its save "
                        "never ran, or did not start one (a lost notification?); saving it now",
                        policy, revision,
                        extra={"policy": policy, "revision": revision})
            report = await self._saver.save(policy, trigger=UNSAVED_TRIGGER)
            self._tried[policy] = revision
            reports.append(report)
        return reports

    async def _view(self, staged: Staged) -> GateView:
        """`gate_view`, giving the loop back every slice (`eventloop.Pacer`: a wave of 5,000
        clusters is some 20 ms of reading), with each audit count `settled` (`_settled`)."""
        pacer = Pacer()
        rollout = staged.rollout
        clusters = []
        for i, cluster in enumerate(wave_clusters(staged)):
            gate = cluster_gate(self._state, rollout.policy, cluster)
            if gate.violations and gate.revision == rollout.to_revision:
                gate = dataclasses.replace(gate, settled=self._settled(rollout, gate))
            clusters.append(gate)
            if not i % _PACED_EVERY:
                await pacer.pause()
        return view_of(staged, clusters)

    def _settled(self, rollout: Rollout, gate: ClusterGate) -> bool:
        """Whether a count of violations at the new revision was read by an earlier round too
        (the reading's time moved on): the operator writes a new revision's phase before its
        audit of it, so the first reading may carry the old revision's count."""
        key = (rollout.id, gate.cluster)
        first = self._counted.setdefault(key, (gate.violations, gate.seen_at))
        if first[0] != gate.violations:
            self._counted[key] = (gate.violations, gate.seen_at)
            return False
        return gate.seen_at is not None and first[1] is not None and gate.seen_at > first[1]

    async def _staged_of(self, rollout: Rollout) -> Staged | None:
        """The rollout's placements and contents (cached, see `STAGED_REFRESH_S`), with the
        rollout as just read."""
        kept = self._staged.get(rollout.policy)
        now = time.monotonic()
        if (kept is None or kept[0].rollout.id != rollout.id
                or now - kept[1] > STAGED_REFRESH_S):
            staged = await self._store.staged_rollout(rollout.policy)
            if staged is None or staged.rollout.id != rollout.id:
                self._staged.pop(rollout.policy, None)
                return None
            kept = self._staged[rollout.policy] = (staged, now)
        return Staged(rollout, kept[0].placements, kept[0].contents)

    async def _move(self, staged: Staged, after: Rollout, decision: Decision,
                    remaining_s: Callable[[], float]) -> Rollout | None:
        before = staged.rollout
        written = await self._store.transition_rollout(
            before, after, by=self._by, what=decision.step.value, detail=decision.detail,
            remaining_s=remaining_s)
        if written is None:
            log.info("rollout %d of policy %s: moved by another writer meanwhile; judged "
                     "again next pass", before.id, before.policy)
            self._staged.pop(before.policy, None)
            return None
        if decision.step is Step.HALT and self._observer is not None:
            self._observer.rollout_halted(before.strategy.on_halt.value)
        if decision.step is not Step.WAIT:
            log.info("rollout %d of policy %s (revision %d): %s at wave %d -> %s, wave %d%s: "
                     "%s", before.id, before.policy, before.to_revision, decision.step.value,
                     before.wave, written.state.value, written.wave,
                     " (warn step)" if written.warn_step else "", decision.detail,
                     extra={"policy": before.policy, "rollout": before.id,
                            "rollout_step": decision.step.value})
        due = newly_due_clusters(before, written, staged)
        if due:
            await self.deliver(before.policy, due, f"rollout {decision.step.value}")
        return written

    async def deliver(self, policy: PolicyId, clusters: Sequence[ClusterId],
                      trigger: str) -> None:
        """The newly due clusters written at once; a failure is logged (rounds deliver what
        is due within an interval)."""
        try:
            await self._saver.deliver_due(policy, clusters, trigger=trigger)
        except ConvergerdError as exc:
            log.warning("policy %s: %d newly due cluster(s) not written now (%s); the next "
                        "round delivers them", policy, len(clusters), exc)


def revisions_held(state: StatusReader, policy: PolicyId,
                   clusters: Collection[ClusterId]) -> dict[int | None, int]:
    """How many of `clusters` report each revision of `policy` (None: none read)."""
    return {r: len(cs) for r, cs in clusters_by_revision(state, policy, clusters).items()}


def clusters_by_revision(state: StatusReader, policy: PolicyId, clusters: Iterable[ClusterId],
                         ) -> dict[int | None, list[ClusterId]]:
    """`clusters` (in their order) by the revision of `policy` each reports, else was last
    delivered (None: neither)."""
    held: dict[int | None, list[ClusterId]] = {}
    for c in clusters:
        facts = state.clusters.get(c)
        record = facts.policies.get(policy) if facts is not None else None
        revision = None
        if record is not None:
            revision = (record.phase.revision if record.phase is not None
                        else record.delivered_revision)
        held.setdefault(revision, []).append(c)
    return held
