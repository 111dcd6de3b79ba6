"""The live rollouts as status and the metrics show them (`RolloutFacts`: where each is, the
gate that holds it, how many of the fleet's clusters report its new revision and how many
another one), made by the status state from the database's rows at each sync. Pure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from convergerd.core.gates import Gate, held_by
from convergerd.core.model import PolicyId
from convergerd.core.rollout import Rollout, State

# A rollout's view names per wave and revision at most this many clusters (the first by id;
# the others counted), so the view and the web page stay small at 10,000 clusters.
CLUSTERS_NAMED = 20
# What holds a rollout its reason does not name (a command's reason): said by its state.
_STATE_GATES = {State.PAUSED: Gate.PAUSED, State.HALTED: Gate.HALTED,
                State.WAITING_APPROVAL: Gate.APPROVAL}


@dataclass(frozen=True, slots=True)
class RolloutFacts:
    id: int
    policy: PolicyId
    to_revision: int
    from_revision: int | None
    strategy: str
    state: State
    wave: int
    wave_name: str
    waves: int
    warn_step: bool
    gate: Gate | None
    reason: str | None
    since: dt.datetime | None  # its last change (a transition or a command)
    clusters_new: int  # clusters reporting (else delivered) the new revision
    clusters_old: int  # another revision


def gate_of(rollout: Rollout) -> Gate | None:
    """The gate that holds `rollout`: the one its reason names, else its state's."""
    return held_by(rollout) or _STATE_GATES.get(rollout.state)


def rollout_facts(rollout: Rollout,
                  held: Callable[[PolicyId], Iterable[int | None]]) -> RolloutFacts:
    """`rollout` with its clusters per revision (`held(policy)`: the revision each cluster
    holds, None for none)."""
    new = old = 0
    for revision in held(rollout.policy):
        if revision == rollout.to_revision:
            new += 1
        elif revision is not None:
            old += 1
    wave = rollout.strategy.waves[rollout.wave]
    return RolloutFacts(
        rollout.id, rollout.policy, rollout.to_revision, rollout.from_revision,
        rollout.strategy.id, rollout.state, rollout.wave, wave.name,
        len(rollout.strategy.waves), rollout.warn_step, gate_of(rollout), rollout.reason,
        rollout.updated_at, new, old)
