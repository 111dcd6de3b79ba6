"""Rollouts in waves: strategies, which wave a cluster is in, and which revision each cluster is
due (docs/design.md, "Rollouts: the revision model"). Pure.

A **strategy** (`parse_strategy`, from the import file's `rolloutStrategies[]` or the
database's `rollout_strategies.spec`) is an ordered list of waves, each choosing clusters by
labels (`selector`) or by a stable, cumulative fraction of the clusters no selector chose
(`fraction`), with a bake time, gates, what to do on a failed gate, and the waves that wait for
an approval. A **rollout** (`Rollout`) is one saved revision going through a strategy: its state
(`State`) and current wave are kept in PostgreSQL; each cluster of the policy's scope got a wave
and the revision it had when the rollout started (`Placement`).

Which wave (`wave_of`, `assign`): a cluster whose labels match a wave's selector is in the first
such wave; any other cluster is in the first fraction wave with `h < fraction`, where
`h = int.from_bytes(sha256(cluster_id).digest()[:8], "big") / 2**64` (`cluster_hash`): the
same clusters are early for every policy and every strategy with the same fractions, and a
cluster's wave does not depend on the other clusters.

Which revision (`due_revision`, `due`): while a rollout is live, a cluster whose wave has come
gets the new revision (`to_revision`), the others keep their previous one (None: the cluster had
no copy, and gets none until its wave comes). Rounds deliver exactly that, and repair drift to
it; they never move a rollout on.

For the gate job (wt/rollops), besides these:

- `newly_due(before, after, placements) -> dict[ClusterId, Due]`: after a transition (`before`
  and `after` the same rollout), the clusters whose due content changed and what it is now (a
  `Due` with `revision` None: the cluster is due no copy: the fan-out removes the one it got);
  fan these out at once (`fanout.Saver.deliver_due`).
- `due_by_cluster(rollout, placements) -> dict[ClusterId, Due]`: every cluster's.
- `Rollout.live`, `LIVE_STATES`, `IN_FORCE_STATES`, `TERMINAL_STATES`, `State`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from convergerd.core.model import (
    BoundaryId,
    ClusterId,
    Enforcement,
    Policy,
    PolicyId,
    PolicyRow,
    Position,
    RuleError,
    check_policy_id,
    field_names,
    is_label_value,
    label_key_problem,
)
from convergerd.core.render import validate_policy
from convergerd.core.shown import shown

# Bounds on a strategy, so a row or a file cannot make the per-cluster work grow without limit.
MAX_WAVES = 32
MAX_SELECTOR_LABELS = 16
MAX_APPROVALS = MAX_WAVES
MAX_BAKE_S = 7 * 24 * 3600.0
MAX_GATE_COUNT = 10**9
# A cluster's labels: at most this many (the import file; what the database holds is read with
# the same bound).
MAX_CLUSTER_LABELS = 64
# The wave a selector-only strategy ends with, taking every cluster no selector chose.
IMPLICIT_REST = "rest"

STRATEGY_FIELDS = ("id", "waves", "bakeSeconds", "gates", "onHalt", "approval")
WAVE_FIELDS = ("name", "selector", "fraction", "warnFirst")
GATE_FIELDS = ("maxNewViolations", "maxDenials", "maxWarnings", "maxErrorClusters",
               "maxUnreachedShare")
DEFAULT_BAKE_S = 300.0
DEFAULT_UNREACHED_SHARE = 0.1


class StrategyError(RuleError):
    """A strategy that cannot be used; the message names the field and the value."""


class State(StrEnum):
    """A rollout's state (the `rollouts.state` column)."""

    PROGRESSING = "progressing"  # its current wave is delivering, baking or being judged
    WAITING_APPROVAL = "waiting_approval"  # its current wave waits for `rollout approve`
    PAUSED = "paused"  # by a command (`rollout pause`)
    HALTED = "halted"  # a gate failed and the strategy says pause
    REVERTED = "reverted"  # a gate failed, the wave's clusters sent back (terminal)
    ABORTED = "aborted"  # every cluster back to its previous revision (terminal)
    COMPLETED = "completed"  # every wave passed (terminal)
    SUPERSEDED = "superseded"  # a newer save started another rollout (terminal)


LIVE_STATES = frozenset({State.PROGRESSING, State.WAITING_APPROVAL, State.PAUSED, State.HALTED})
# The states in which rounds deliver per cluster: live, and the two that send clusters back,
# which hold until the policy's next save ends them (at most one per policy: an index).
IN_FORCE_STATES = LIVE_STATES | {State.REVERTED, State.ABORTED}
TERMINAL_STATES = frozenset(State) - LIVE_STATES


class OnHalt(StrEnum):
    REVERT = "revert"  # send the wave's clusters back to their previous revision at once
    PAUSE = "pause"  # keep them, wait for a command


@dataclass(frozen=True, slots=True)
class Wave:
    """Exactly one of `selector` (labels, all of which a cluster must carry with these values)
    and `fraction` (cumulative share of the clusters no selector chose, in (0, 1])."""

    name: str
    selector: Mapping[str, str] | None = None
    fraction: float | None = None
    warn_first: bool = False  # install in Warn, switch to the policy's mode after the bake


@dataclass(frozen=True, slots=True)
class Gates:
    max_new_violations: int = 0
    max_denials: int = 0
    max_warnings: int | None = None  # None: warnings are not judged
    max_error_clusters: int = 0
    max_unreached_share: float = DEFAULT_UNREACHED_SHARE


@dataclass(frozen=True, slots=True)
class Strategy:
    id: str
    waves: tuple[Wave, ...]
    bake_s: float = DEFAULT_BAKE_S
    gates: Gates = Gates()
    on_halt: OnHalt = OnHalt.PAUSE
    approval: frozenset[str] = frozenset()

    def wave_named(self, name: str) -> int | None:
        return next((i for i, w in enumerate(self.waves) if w.name == name), None)


# ---- parsing -----------------------------------------------------------------------------------


def check_strategy_id(value: object, field: str = "id") -> str:
    """A strategy id: a DNS label of at most 50 characters, like a policy id."""
    try:
        check_policy_id(value)  # type: ignore[arg-type]  # checks the type itself
    except RuleError as exc:
        raise StrategyError(f"{field}{str(exc).removeprefix('id')}") from None
    assert isinstance(value, str)
    return value


def check_labels(value: object, field: str, *, most: int = MAX_CLUSTER_LABELS) -> dict[str, str]:
    """A label mapping (a cluster's labels, a selector): keys valid label keys, values valid
    label values, at most `most` entries; `StrategyError` naming `field` and the value."""
    if not isinstance(value, Mapping):
        raise StrategyError(f"{field}: must be a mapping of label keys to values, got "
                            f"{shown(value)}")
    if len(value) > most:
        raise StrategyError(f"{field}: {len(value)} labels, at most {most}")
    labels: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise StrategyError(f"{field}: label key must be a string, got {shown(key)}")
        problem = label_key_problem(key)
        if problem:
            raise StrategyError(f"{field}: label key {shown(key)} {problem}")
        if not is_label_value(item):
            raise StrategyError(
                f"{field}.{shown(key, 60, style='text')}: {shown(item)} is not a label value (at "
                "most 63 characters: letters, digits, '-', '_', '.', starting and ending with a "
                "letter or digit)")
        labels[key] = item
    return labels


def _known_fields(doc: Mapping[str, Any], fields: tuple[str, ...], where: str) -> None:
    unknown = [k for k in doc if k not in fields]
    if unknown:
        raise StrategyError(f"{where}: unknown field(s) {field_names(unknown)}; known: "
                            f"{', '.join(fields)}")


def _number(value: object, field: str, *, low: float, high: float, low_open: bool = False
            ) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StrategyError(f"{field}: must be a number, got {shown(value)}")
    if value > high or value < low or (low_open and value == low):
        side = f"above {low:g}" if low_open else f"at least {low:g}"
        raise StrategyError(f"{field}: must be {side} and at most {high:g}, got {shown(value)}")
    return float(value)


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GATE_COUNT:
        raise StrategyError(f"{field}: must be a whole number from 0 to {MAX_GATE_COUNT}, got "
                            f"{shown(value)}")
    return value


def _wave(doc: object, where: str) -> Wave:
    if not isinstance(doc, Mapping):
        raise StrategyError(f"{where}: must be a mapping with a name and a selector or a "
                            f"fraction, got {shown(doc)}")
    _known_fields(doc, WAVE_FIELDS, where)
    name = doc.get("name")
    if not isinstance(name, str) or not is_label_value(name) or not name:
        raise StrategyError(f"{where}.name: must be a name of letters, digits, '-', '_', '.' "
                            f"(at most 63 characters), got {shown(name)}")
    has_selector, has_fraction = doc.get("selector") is not None, doc.get("fraction") is not None
    if has_selector == has_fraction:
        raise StrategyError(f"{where} ({name}): needs exactly one of selector and fraction, got "
                            f"{'both' if has_selector else 'neither'}")
    warn_first = doc.get("warnFirst", False)
    if not isinstance(warn_first, bool):
        raise StrategyError(f"{where}.warnFirst: must be true or false, got {shown(warn_first)}")
    if has_selector:
        selector = check_labels(doc["selector"], f"{where}.selector", most=MAX_SELECTOR_LABELS)
        if not selector:
            raise StrategyError(f"{where}.selector: must name at least one label (an empty "
                                "selector would choose every cluster)")
        return Wave(name, selector=selector, warn_first=warn_first)
    fraction = _number(doc["fraction"], f"{where}.fraction", low=0.0, high=1.0, low_open=True)
    return Wave(name, fraction=fraction, warn_first=warn_first)


def _waves(value: object) -> tuple[Wave, ...]:
    if not isinstance(value, list) or not value:
        raise StrategyError(f"waves: must be a non-empty list of waves, got {shown(value)}")
    if len(value) > MAX_WAVES:
        raise StrategyError(f"waves: {len(value)} waves, at most {MAX_WAVES}")
    waves = [_wave(doc, f"waves[{i}]") for i, doc in enumerate(value)]
    seen: set[str] = set()
    last_fraction = 0.0
    for i, wave in enumerate(waves):
        if wave.name in seen:
            raise StrategyError(f"waves[{i}].name: duplicate wave name {shown(wave.name)}")
        seen.add(wave.name)
        if wave.fraction is not None:
            if wave.fraction < last_fraction:
                raise StrategyError(
                    f"waves[{i}].fraction: {wave.fraction:g} is below the wave before's "
                    f"{last_fraction:g} (fractions are cumulative: the share reached by the end "
                    "of the wave)")
            last_fraction = wave.fraction
    if any(w.fraction is not None for w in waves):
        if last_fraction != 1.0:
            raise StrategyError(f"waves: the last fraction wave must reach 1.0 (every cluster "
                                f"no selector chose), got {last_fraction:g}")
    elif IMPLICIT_REST in seen:
        raise StrategyError(f"waves: a wave named {IMPLICIT_REST!r} with a selector, and no "
                            "fraction wave: add one with fraction 1.0 for the other clusters")
    else:
        waves.append(Wave(IMPLICIT_REST, fraction=1.0))
    return tuple(waves)


def _gates(value: object) -> Gates:
    if value is None:
        return Gates()
    if not isinstance(value, Mapping):
        raise StrategyError(f"gates: must be a mapping, got {shown(value)}")
    _known_fields(value, GATE_FIELDS, "gates")
    defaults = Gates()
    warnings = value.get("maxWarnings")
    return Gates(
        max_new_violations=_count(value.get("maxNewViolations", defaults.max_new_violations),
                                  "gates.maxNewViolations"),
        max_denials=_count(value.get("maxDenials", defaults.max_denials), "gates.maxDenials"),
        max_warnings=None if warnings is None else _count(warnings, "gates.maxWarnings"),
        max_error_clusters=_count(value.get("maxErrorClusters", defaults.max_error_clusters),
                                  "gates.maxErrorClusters"),
        max_unreached_share=_number(value.get("maxUnreachedShare",
                                              defaults.max_unreached_share),
                                    "gates.maxUnreachedShare", low=0.0, high=1.0),
    )


def parse_strategy(doc: object) -> Strategy:
    """A strategy document (the import file's entry, the database's `spec`) validated;
    `StrategyError` naming the field and the value otherwise. Fields: `id`, `waves` (each
    `name`, `selector` or `fraction`, `warnFirst`), `bakeSeconds` (default 300),
    `gates` (`maxNewViolations` 0, `maxDenials` 0, `maxWarnings` none, `maxErrorClusters` 0,
    `maxUnreachedShare` 0.1), `onHalt` (`pause`, default, or `revert`), `approval` (names of
    the waves that wait for `rollout approve`)."""
    if not isinstance(doc, Mapping):
        raise StrategyError(f"strategy: must be a mapping with an id and waves, got "
                            f"{shown(doc)}")
    _known_fields(doc, STRATEGY_FIELDS, "strategy")
    ident = check_strategy_id(doc.get("id"))
    waves = _waves(doc.get("waves"))
    bake_s = _number(doc.get("bakeSeconds", DEFAULT_BAKE_S), "bakeSeconds", low=0.0,
                     high=MAX_BAKE_S)
    on_halt = doc.get("onHalt", OnHalt.PAUSE.value)
    if on_halt not in tuple(OnHalt):
        raise StrategyError(f"onHalt: must be one of {', '.join(OnHalt)}, got {shown(on_halt)}")
    approval = doc.get("approval", [])
    if not isinstance(approval, list) or len(approval) > MAX_APPROVALS:
        raise StrategyError(f"approval: must be a list of wave names, got {shown(approval)}")
    names = {w.name for w in waves}
    for i, name in enumerate(approval):
        if name not in names:
            raise StrategyError(f"approval[{i}]: no wave named {shown(name)}; the waves: "
                                f"{', '.join(w.name for w in waves)}")
    return Strategy(ident, waves, bake_s, _gates(doc.get("gates")), OnHalt(on_halt),
                    frozenset(approval))


def strategy_doc(strategy: Strategy) -> dict[str, Any]:
    """The strategy as a document `parse_strategy` reads back to the same strategy (what the
    database stores, and a rollout's snapshot): every default written out."""
    gates = strategy.gates
    gate_doc: dict[str, Any] = {
        "maxNewViolations": gates.max_new_violations, "maxDenials": gates.max_denials,
        "maxErrorClusters": gates.max_error_clusters,
        "maxUnreachedShare": gates.max_unreached_share,
    }
    if gates.max_warnings is not None:
        gate_doc["maxWarnings"] = gates.max_warnings
    return {
        "id": strategy.id,
        "waves": [{"name": w.name,
                   **({"selector": dict(w.selector)} if w.selector is not None else {}),
                   **({"fraction": w.fraction} if w.fraction is not None else {}),
                   **({"warnFirst": True} if w.warn_first else {})}
                  for w in strategy.waves],
        "bakeSeconds": strategy.bake_s,
        "gates": gate_doc,
        "onHalt": strategy.on_halt.value,
        "approval": sorted(strategy.approval),
    }


# ---- which wave --------------------------------------------------------------------------------


def cluster_hash(cluster: str) -> float:
    """A cluster's place in [0, 1): the first 8 bytes of the SHA-256 of its id, big-endian, over
    2**64. Stable across processes, versions and policies (no `hash()`: it is salted)."""
    return int.from_bytes(hashlib.sha256(cluster.encode()).digest()[:8], "big") / 2**64


def wave_of(strategy: Strategy, cluster: str, labels: Mapping[str, str]) -> int:
    """The index of the cluster's wave: the first wave whose selector its labels match, else the
    first fraction wave with `cluster_hash(cluster) < fraction` (the last fraction wave is 1.0,
    so there is always one)."""
    for index, wave in enumerate(strategy.waves):
        if wave.selector is not None and all(labels.get(k) == v
                                             for k, v in wave.selector.items()):
            return index
    h = cluster_hash(cluster)
    for index, wave in enumerate(strategy.waves):
        if wave.fraction is not None and h < wave.fraction:
            return index
    return len(strategy.waves) - 1  # not reached: a parsed strategy's last fraction is 1.0


def assign(strategy: Strategy, clusters: Mapping[ClusterId, Mapping[str, str]]
           ) -> dict[ClusterId, int]:
    """Every cluster's wave (`wave_of`), given each one's labels."""
    return {c: wave_of(strategy, c, labels) for c, labels in clusters.items()}


# ---- which revision ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """A cluster's part in a rollout, fixed when it started: its wave, and the revision it had
    then (None: no copy)."""

    wave: int
    previous_revision: int | None


@dataclass(frozen=True, slots=True)
class Rollout:
    """A `rollouts` row. `strategy` is the snapshot taken at start."""

    id: int
    policy: PolicyId
    to_revision: int
    from_revision: int | None
    strategy: Strategy
    state: State
    wave: int = 0
    warn_step: bool = False
    wave_started_at: dt.datetime | None = None
    wave_ready_at: dt.datetime | None = None
    reason: str | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    updated_by: str = ""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def in_force(self) -> bool:
        return self.state in IN_FORCE_STATES

    @property
    def last_wave(self) -> int:
        return len(self.strategy.waves) - 1

    @property
    def position(self) -> Position:
        return Position(self.id, self.state.value, self.wave, self.warn_step)


@dataclass(frozen=True, slots=True)
class Due:
    """What a cluster is due: a revision (None: no copy), in Warn (`warn`: the wave's Warn step)
    or in the policy's own mode."""

    revision: int | None
    warn: bool = False


def due_revision(rollout: Rollout, cluster_wave: int, previous_revision: int | None
                 ) -> int | None:
    """The revision a cluster in wave `cluster_wave` that had `previous_revision` is due:

    | state | the new revision (`to_revision`) when | else |
    |---|---|---|
    | progressing, paused, halted | its wave has come (`cluster_wave <= wave`) | previous |
    | waiting_approval | its wave is before the current one (the current one waits) | previous |
    | reverted | its wave is before the current one (the current one was sent back) | previous |
    | aborted | never | previous |
    | completed | always | |

    A superseded rollout is not asked: its successor holds each cluster's due as previous."""
    state = rollout.state
    if state is State.SUPERSEDED:
        raise ValueError(f"rollout {rollout.id} is superseded: its successor says what is due")
    if state is State.COMPLETED:
        return rollout.to_revision
    if state is State.ABORTED:
        return previous_revision
    if state in (State.WAITING_APPROVAL, State.REVERTED):
        reached = cluster_wave < rollout.wave
    else:
        reached = cluster_wave <= rollout.wave
    return rollout.to_revision if reached else previous_revision


def due(rollout: Rollout, placement: Placement) -> Due:
    """`due_revision`, with the Warn step: the current wave's clusters get the new revision in
    Warn while `warn_step` holds (and the rollout is not waiting or sent back)."""
    revision = due_revision(rollout, placement.wave, placement.previous_revision)
    warn = (rollout.warn_step and placement.wave == rollout.wave
            and rollout.state in (State.PROGRESSING, State.PAUSED, State.HALTED))
    return Due(revision, warn=warn and revision is not None)


def due_by_cluster(rollout: Rollout, placements: Mapping[ClusterId, Placement]
                   ) -> dict[ClusterId, Due]:
    """Every cluster's due content (`due`); one `Due` object per distinct answer."""
    cache: dict[Placement, Due] = {}
    out: dict[ClusterId, Due] = {}
    for cluster, placement in placements.items():
        found = cache.get(placement)
        if found is None:
            found = cache[placement] = due(rollout, placement)
        out[cluster] = found
    return out


def newly_due(before: Rollout, after: Rollout, placements: Mapping[ClusterId, Placement]
              ) -> dict[ClusterId, Due]:
    """The clusters whose due content differs after a transition of one rollout (`before` to
    `after`), with what they are due now: the clusters to fan out to at once."""
    if before.id != after.id:
        raise ValueError(f"rollouts {before.id} and {after.id}: a transition is of one rollout")
    was, now = due_by_cluster(before, placements), due_by_cluster(after, placements)
    return {c: d for c, d in now.items() if was[c] != d}


def placements_for(strategy: Strategy, clusters: Iterable[ClusterId],
                   labels: Callable[[ClusterId], Mapping[str, str]],
                   previous: Callable[[ClusterId], int | None]) -> dict[ClusterId, Placement]:
    """The placements of `clusters` at a rollout's start: each one's wave (`wave_of` with its
    labels) and the revision it is due now (`previous`). Equal placements are one object."""
    shared: dict[tuple[int, int | None], Placement] = {}
    out: dict[ClusterId, Placement] = {}
    for cluster in clusters:
        key = (wave_of(strategy, cluster, labels(cluster)), previous(cluster))
        placement = shared.get(key)
        if placement is None:
            placement = shared[key] = Placement(*key)
        out[cluster] = placement
    return out


def due_policies(rollout: Rollout, dues: Mapping[ClusterId, Due],
                 contents: Mapping[int, Policy | None]) -> dict[ClusterId, Policy | None]:
    """Each cluster's due Policy, from the revisions' contents (`contents`: revision -> the
    Policy it was, None when it is not a deliverable policy in the policy's boundary now, or not
    kept): a cluster due no copy, or a revision that cannot be delivered, gets None (a round
    leaves what it holds alone). A Warn step's content is the revision in Warn."""
    warned: dict[int, Policy | None] = {}

    def content(d: Due) -> Policy | None:
        if d.revision is None:
            return None
        policy = contents.get(d.revision)
        if not d.warn or policy is None:
            return policy
        if d.revision not in warned:
            warned[d.revision] = dataclasses.replace(policy, enforcement=Enforcement.WARN)
        return warned[d.revision]

    by_due: dict[Due, Policy | None] = {}
    out: dict[ClusterId, Policy | None] = {}
    for cluster, d in dues.items():
        if d not in by_due:
            by_due[d] = content(d)
        out[cluster] = by_due[d]
    return out


def policy_of_content(policy: PolicyId, revision: int, content: object, boundary: BoundaryId
                      ) -> Policy | None:
    """The Policy a kept revision's content (`policy_revisions.content`: the row's columns by
    name) was, if it is deliverable now in `boundary`, the policy's boundary now; else None. A
    revision from another boundary is not delivered: its object would select another boundary's
    namespaces."""
    if not isinstance(content, Mapping) or content.get("boundary_id") != boundary:
        return None
    enabled, enforcement = content.get("enabled"), content.get("enforcement", "Deny")
    rule = content.get("rule")
    if not isinstance(enabled, bool) or not isinstance(enforcement, str) or \
            not isinstance(rule, Mapping):
        return None
    found = validate_policy(PolicyRow(policy, boundary, rule, enabled, revision, enforcement))
    return found if isinstance(found, Policy) else None


@dataclass(frozen=True, slots=True)
class Staged:
    """A rollout rounds and saves deliver per cluster: the rollout, every cluster's placement
    (those that joined the scope since it started placed by `wave_of` with `from_revision`),
    and the contents of the revisions they may be due (revision -> Policy, None: not
    deliverable)."""

    rollout: Rollout
    placements: Mapping[ClusterId, Placement]
    contents: Mapping[int, Policy | None]

    def dues(self) -> dict[ClusterId, Due]:
        return due_by_cluster(self.rollout, self.placements)

    def policies(self) -> dict[ClusterId, Policy | None]:
        """Each cluster's due Policy (`due_policies`)."""
        return due_policies(self.rollout, self.dues(), self.contents)


@dataclass(frozen=True, slots=True)
class Start:
    """What a save delivers: `staged` (per cluster, its rollout: started now, or the one this
    revision already has) or, None, the revision everywhere as without rollouts; `refused`:
    the policy's strategy cannot be used (nothing written); `overtaken`: a newer revision is
    stored (save that one)."""

    staged: Staged | None = None
    started: bool = False
    refused: str | None = None
    overtaken: bool = False
    why_not: str | None = None  # why a policy with a strategy is delivered at once


class Follow(StrEnum):
    """What rounds deliver of a policy, given its revision, whether it has a strategy, and its
    newest rollout (`follow`)."""

    NEWEST = "newest"  # its revision everywhere, as without rollouts
    ROLLOUT = "rollout"  # each cluster its due revision under the newest rollout
    HOLD = "hold"  # nothing this round: its save has not started its rollout yet


def follow(revision: int, has_strategy: bool, newest: Rollout | None) -> Follow:
    """The rule rounds keep (docs/design.md, "Rollouts"): a rollout in force is followed; a
    policy with a strategy whose revision has no rollout yet (its save is on its way: a round
    read it between the write and the save) keeps what its newest rollout gave each cluster,
    or, with none to follow, is left alone for the round: a round never delivers a revision
    its save has not staged (a save that never ran is made by the leader's gate job:
    `delivery.rollouts.RolloutGates.start_unsaved`)."""
    if newest is not None and newest.in_force:
        return Follow.ROLLOUT
    if newest is not None and newest.to_revision == revision:
        return Follow.NEWEST if newest.state is State.COMPLETED or not has_strategy \
            else Follow.HOLD
    if not has_strategy:
        return Follow.NEWEST
    if newest is not None and newest.state is State.COMPLETED:
        return Follow.ROLLOUT  # every cluster keeps that rollout's revision until the save
    return Follow.HOLD
