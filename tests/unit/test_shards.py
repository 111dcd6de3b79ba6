"""Shards: the stable cluster → shard function and the fair-share decision, as tables."""

from __future__ import annotations

from collections import Counter

import pytest

from convergerd.core.shards import (
    fair_shares,
    member_lease_name,
    orphaned,
    plan_shards,
    shard_lease_name,
    shard_of,
)


def test_shard_of_is_stable_and_spread() -> None:
    assert shard_of("anything", 1) == 0
    counts = Counter(shard_of(f"c{i:05d}", 12) for i in range(12_000))
    assert set(counts) == set(range(12))
    assert min(counts.values()) > 800  # about 1,000 each
    # Adding clusters never moves the others: the shard depends on the id alone.
    before = {f"c{i}": shard_of(f"c{i}", 12) for i in range(100)}
    after = {f"c{i}": shard_of(f"c{i}", 12) for i in range(200)}
    assert all(after[c] == k for c, k in before.items())


def test_shard_of_known_values() -> None:
    # Computed once: a change here would move every cluster on an upgrade.
    assert [shard_of(c, 12) for c in ("a", "b", "c0004", "c0005")] == [7, 5, 9, 0]


def test_shard_of_refuses_no_shards() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("c", 0)


def test_names() -> None:
    assert shard_lease_name(0) == "convergerd-shard-0"
    assert shard_lease_name(11) == "convergerd-shard-11"
    assert member_lease_name("pod-a-1x2") == "convergerd-member-pod-a-1x2"
    long = member_lease_name("x" * 400)
    assert len(long) == 253
    assert long != member_lease_name("x" * 399)


@pytest.mark.parametrize(("shards", "members", "held", "expected"), [
    (12, {"a", "b", "c"}, {}, {"a": 4, "b": 4, "c": 4}),
    (12, {"a", "b"}, {"a": 4, "b": 4}, {"a": 6, "b": 6}),
    (12, {"a", "b", "c", "d"}, {"a": 4, "b": 4, "c": 4}, {"a": 3, "b": 3, "c": 3, "d": 3}),
    # The remainder goes to who holds most now: no shard moves for it.
    (12, {"a", "b", "c", "d", "e"}, {"a": 3, "b": 3, "c": 2, "d": 2, "e": 2},
     {"a": 3, "b": 3, "c": 2, "d": 2, "e": 2}),
    (12, {"a", "b", "c", "d", "e"}, {"e": 3, "d": 3}, {"a": 2, "b": 2, "c": 2, "d": 3, "e": 3}),
    (5, {"a", "b"}, {}, {"a": 3, "b": 2}),
    (2, {"a", "b", "c"}, {"c": 1}, {"a": 1, "b": 0, "c": 1}),
    (3, set(), {}, {}),
])
def test_fair_shares(shards: int, members: set[str], held: dict[str, int],
                     expected: dict[str, int]) -> None:
    shares = fair_shares(shards, members, held)
    assert shares == expected
    assert sum(shares.values()) == (shards if members else 0)


def _holders(spec: str) -> list[str]:
    """'aab.' → ['a', 'a', 'b', ''] (a dot is a free or expired shard)."""
    return ["" if ch == "." else ch for ch in spec]


@pytest.mark.parametrize(("me", "members", "holders", "expected"), [
    # Start: nobody holds anything, three replicas: each takes its 4 lowest free.
    ("a", "abc", "............", (4, (0, 1, 2, 3), ())),
    ("b", "abc", "aaaa........", (4, (4, 5, 6, 7), ())),
    # Balanced: nothing to do.
    ("a", "abc", "aaaabbbbcccc", (4, (), ())),
    # c was killed (its Leases expired, membership too): a and b split its four.
    ("a", "ab", "aaaabbbb....", (6, (8, 9), ())),
    ("b", "ab", "aaaaaabb....", (6, (8, 9, 10, 11), ())),
    # d joins: everyone else hands back one (the highest numbered), d takes free ones only.
    ("a", "abcd", "aaaabbbbcccc", (3, (), (3,))),
    ("d", "abcd", "aaaabbbbcccc", (3, (), ())),
    ("d", "abcd", "aaa.bbb.ccc.", (3, (3, 7, 11), ())),
    # A holder without a membership Lease (`once`) gets no share; its shards are not free.
    ("a", "ab", "aaaabbbbcccc", (6, (), ())),
    ("a", "ab", "aaaabbbbccc.", (6, (11,), ())),
    # Alone: everything.
    ("a", "", "....", (4, (0, 1, 2, 3), ())),
    # More replicas than shards: who holds one keeps it, the others hold none.
    ("c", "abc", "ab", (0, (), ())),
    ("a", "abc", "a.", (1, (), ())),
])
def test_shard_plan(me: str, members: str, holders: str,
              expected: tuple[int, tuple[int, ...], tuple[int, ...]]) -> None:
    hs = _holders(holders)
    p = plan_shards(shards=len(hs), identity=me, members=set(members), holders=hs)
    assert (p.share, p.take, p.release) == expected


def test_shard_plan_scale_moves_only_what_must_move() -> None:
    """3 → 4 → 2 replicas with 12 shards, every replica following `plan_shards` in turn: the shards
    that change holder are exactly those the new shares require."""
    holders = [""] * 12

    def settle(members: str) -> None:
        for _ in range(4):
            for me in members:
                p = plan_shards(shards=12, identity=me, members=set(members), holders=holders)
                for k in p.release:
                    holders[k] = ""
                for k in p.take:
                    holders[k] = me

    settle("abc")
    assert Counter(holders) == {"a": 4, "b": 4, "c": 4}
    before = list(holders)
    settle("abcd")
    assert Counter(holders) == {"a": 3, "b": 3, "c": 3, "d": 3}
    assert sum(x != y for x, y in zip(before, holders, strict=True)) == 3
    before = list(holders)
    holders[:] = ["" if h in "cd" else h for h in holders]  # c and d go away
    settle("ab")
    assert Counter(holders) == {"a": 6, "b": 6}
    assert all(b == h for b, h in zip(before, holders, strict=True) if b in "ab")


@pytest.mark.parametrize(("age", "interval", "expected"), [
    (0.0, 30.0, False), (59.0, 30.0, False), (60.0, 30.0, False), (61.0, 30.0, True),
])
def test_orphaned(age: float, interval: float, expected: bool) -> None:
    assert orphaned(age, interval) is expected
