"""What the daemon remembers about invalid policies stays bounded: logged once per revision
while invalid, forgotten once fixed or deleted."""

from __future__ import annotations

from convergerd.core.model import InvalidPolicy
from convergerd.delivery.rounds import invalid_to_log


def bad(policy: str, revision: int) -> InvalidPolicy:
    return InvalidPolicy(id=policy, boundary="team-a", revision=revision, reason="rule: bad")


def test_invalid_policies_logged_once_per_revision_and_forgotten_when_gone() -> None:
    new, seen = invalid_to_log([bad("p1", 1), bad("p2", 1)], set())
    assert [b.id for b in new] == ["p1", "p2"]

    new, seen = invalid_to_log([bad("p1", 1), bad("p2", 1)], seen)
    assert new == []

    new, seen = invalid_to_log([bad("p1", 2)], seen)  # p1 edited, still bad; p2 fixed
    assert [(b.id, b.revision) for b in new] == [("p1", 2)]
    assert seen == {("p1", 2)}

    new, seen = invalid_to_log([], seen)  # p1 fixed or deleted
    assert (new, seen) == ([], set())
