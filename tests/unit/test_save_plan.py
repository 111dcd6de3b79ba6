"""Which clusters a save reads before writing (`removal.read_first`, `removal.plan_save`): only
those recorded with this revision or a newer one; a new revision is written at once."""

from __future__ import annotations

import pytest

from convergerd.core.model import ClusterId, PolicyRow
from convergerd.core.removal import Target, plan_save, read_first

A, B, C = ClusterId("a"), ClusterId("b"), ClusterId("c")


@pytest.mark.parametrize(("delivered", "revision", "read"), [
    ({}, 5, set()),  # nothing recorded: written at once
    ({A: 4, B: 4, C: 4}, 5, set()),  # a new revision: every cluster written at once
    ({A: 5, B: 4}, 5, {A}),  # a holds it already: read first (unchanged, most likely)
    ({A: 6, B: 5, C: 4}, 5, {A, B}),  # a holds a newer one: read first (superseded)
])
def test_only_clusters_recorded_with_this_revision_or_newer_are_read_first(
    delivered: dict[ClusterId, int], revision: int, read: set[ClusterId]
) -> None:
    assert read_first(frozenset({A, B, C}), delivered, revision) == read


def test_a_save_plan_reads_first_only_within_its_scope() -> None:
    row = PolicyRow("p", "b", {"type": "ForbidLatestTag"}, enabled=True, revision=2)
    target = Target(row=row, deleting=False, boundary_exists=True, scope=frozenset({A, B}),
                    holders=frozenset({A, B, C}), delivered={A: 2, B: 1, C: 2})
    plan = plan_save(target, delivered=True, guard_share=0.5, allow_mass_removal=False)
    assert plan.apply_to == {A, B}
    assert plan.remove_from == {C}
    assert plan.read_first == {A}
