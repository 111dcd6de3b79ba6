"""What a save or a deletion writes where, decided from the database's view. Pure.

A save applies the policy to every cluster in its scope and removes it from the clusters that
hold it but left the scope (the only way, besides deletion, that a policy leaves a cluster).
A deletion removes it from every cluster that may hold it. The mass-removal guard: reading
nothing is not "covers nothing" — a scope that came back empty, or could not be read, never
removes the policy from more than `guard_share` of the clusters holding it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from convergerd.core.model import ClusterId, PolicyRow, Position


@dataclass(frozen=True, slots=True)
class Current:
    """A policy as the database holds it at write time: its revision, whether its deletion has
    begun and where its newest rollout stands (None: it has none). Not the policy itself: a
    round asks this of every cluster it writes to, and validating each row's rule there cost a
    tenth of a create round's CPU (bench/RESULTS.md, "The write-time check reads no rules")."""

    revision: int
    deleting: bool
    rollout: Position | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """A policy row with where it should be and where it may be, read in one snapshot.

    `scope`: the known clusters its boundary covers (None: could not be read).
    `holders`: clusters with a delivery record (it may be installed there).
    `delivered`: the revision each holder is recorded as having accepted (none: not known).
    """

    row: PolicyRow
    deleting: bool
    boundary_exists: bool
    scope: frozenset[ClusterId] | None
    holders: frozenset[ClusterId]
    delivered: Mapping[ClusterId, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SavePlan:
    apply_to: frozenset[ClusterId]
    remove_from: frozenset[ClusterId]
    skipped: frozenset[ClusterId]  # removals the guard refused
    skipped_reason: str | None = None
    # Of `apply_to`, the clusters read before they are written (`read_first`).
    read_first: frozenset[ClusterId] = frozenset()


def plan_save(
    target: Target, *, delivered: bool, guard_share: float, allow_mass_removal: bool
) -> SavePlan:
    """Apply in scope; remove where it is held but out of scope, unless the guard refuses.
    A policy whose rule never leaves the control plane (`delivered` False) is applied nowhere
    and removed wherever it is still held."""
    if not delivered:
        return SavePlan(frozenset(), target.holders, frozenset())
    scope = target.scope if target.scope is not None else frozenset()
    leaving = target.holders - scope
    first = read_first(scope, target.delivered, target.row.revision)
    reason = _guard(target, leaving, guard_share=guard_share, allowed=allow_mass_removal)
    if reason is not None:
        return SavePlan(scope, frozenset(), frozenset(leaving), reason, first)
    return SavePlan(scope, frozenset(leaving), frozenset(), read_first=first)


def read_first(
    clusters: frozenset[ClusterId], delivered: Mapping[ClusterId, int], revision: int
) -> frozenset[ClusterId]:
    """The clusters a save of `revision` reads before writing: those recorded as having
    accepted this revision or a newer one, where the write may be needless (`unchanged`) or
    wrong (`superseded`). The others, recorded with an older revision or none (the usual case
    of a save: a new revision), are written at once, one request each; a newer revision that
    reaches one of them meanwhile is caught after the fan-out (`fanout.Saver`)."""
    return frozenset(c for c in clusters if delivered.get(c, 0) >= revision)


def _guard(
    target: Target, leaving: frozenset[ClusterId], *, guard_share: float, allowed: bool
) -> str | None:
    if not leaving:
        return None
    if target.scope is None:
        return "the policy's scope could not be read: nothing is removed"
    if target.scope or allowed:
        return None
    share = len(leaving) / len(target.holders)
    if share <= guard_share:
        return None
    return (
        f"the scope read came back empty (boundary {target.row.boundary!r} covers no known "
        f"cluster) and removing from {len(leaving)} of {len(target.holders)} holding clusters "
        f"is more than the guard allows ({guard_share:.0%}): nothing is removed; send "
        '{"allow_mass_removal": true} if the boundary really covers no cluster'
    )


def delete_targets(target: Target) -> frozenset[ClusterId]:
    """Every cluster where the policy may be installed: delivered to, or in scope now."""
    return target.holders | (target.scope or frozenset())
