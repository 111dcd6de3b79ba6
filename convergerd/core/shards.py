"""Shards: which clusters a Lease covers, and how many Leases each replica should hold. Pure.

The fleet is split into `CONVERGERD_SHARDS` = S shards, one Lease each (`shard_lease`): with
S = 1 (the default) the Lease users configure, with S > 1 shard k is `convergerd-shard-<k>`.
A cluster belongs to one shard by a stable hash of its id, so adding or removing a cluster
never moves another. With S > 1 each replica renews a membership Lease
`convergerd-member-<identity>`, so a replica that holds no shard yet (one that just joined) is
counted too; every replica then computes the same fair share from the same Leases
(`fair_shares`) and takes free shards up to its share or hands back the ones above it (the
shard plan: `plan_shards`).
One shard needs none of that: whoever can take its Lease holds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

SHARD_LEASE_PREFIX = "convergerd-shard-"
MEMBER_LEASE_PREFIX = "convergerd-member-"
# A Lease name is a DNS subdomain: at most 253 characters.
MAX_LEASE_NAME = 253


def shard_of(cluster_id: str, shards: int) -> int:
    """The shard (0-based) of `cluster_id` among `shards`: the sha256 of its UTF-8 id, as a
    big-endian integer, modulo `shards`. The same on every replica and every version."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    digest = hashlib.sha256(cluster_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest, "big") % shards


def shard_lease_name(k: int) -> str:
    """The Lease of shard `k` with more than one shard (`shard_lease` says which name)."""
    if k < 0:
        raise ValueError(f"a shard number is not negative, got {k}")
    return f"{SHARD_LEASE_PREFIX}{k}"


def shard_lease(k: int, *, shards: int, single: str) -> str:
    """The Lease of shard `k` among `shards`: the one Lease users configure (`single`,
    `CONVERGERD_LEASE_NAME`) when there is one shard, so `CONVERGERD_SHARDS=1` is the single
    Lease it always was; `convergerd-shard-<k>` with more."""
    return single if shards == 1 else shard_lease_name(k)


def member_lease_name(identity: str) -> str:
    """The membership Lease of the replica `identity` (an identity is a host name plus a
    suffix: already a valid name part; longer ones are cut, with a hash to stay distinct)."""
    name = f"{MEMBER_LEASE_PREFIX}{identity}".lower()
    if len(name) <= MAX_LEASE_NAME:
        return name
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{name[:MAX_LEASE_NAME - 17]}-{digest}"


def lease_names(shards: int) -> list[str]:
    return [shard_lease_name(k) for k in range(shards)]


def fair_shares(shards: int, members: Collection[str], held: dict[str, int]) -> dict[str, int]:
    """How many shards each member should hold: `shards // n` each, and the remainder, one
    each, to those holding the most now (then by identity), so the remainder moves as little
    as possible. Every replica computes the same answer from the same observations."""
    if not members:
        return {}
    base, extra = divmod(shards, len(members))
    order = sorted(members, key=lambda m: (-held.get(m, 0), m))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}


@dataclass(frozen=True, slots=True)
class ShardPlan:
    share: int  # how many shards this replica should hold
    take: tuple[int, ...]  # free shards it may acquire now
    release: tuple[int, ...]  # shards it holds above its share: hand back
    members: tuple[str, ...]  # the live replicas counted, sorted


def plan_shards(
    *, shards: int, identity: str, members: Collection[str], holders: Sequence[str]
) -> ShardPlan:
    """What `identity` does next, given the live `members` (membership Leases renewed within
    their duration) and each shard's live holder (`holders[k]`, "" when free or expired).

    `identity` counts itself. A shard holder without a live membership Lease (a `convergerd
    once`, which keeps none) gets no share: its shards are not free, so nobody takes them,
    and nobody hands shards back to make room for it. It takes free shards, the lowest first,
    up to its share, and hands back its highest-numbered shards above its share. It never
    takes a shard another live replica holds: the Lease would refuse it anyway, and a
    handoff is always the holder's own release."""
    if len(holders) != shards:
        raise ValueError(f"{len(holders)} holders for {shards} shards")
    live = set(members) | {identity}
    held: dict[str, int] = {}
    for holder in holders:
        if holder:
            held[holder] = held.get(holder, 0) + 1
    share = fair_shares(shards, live, held)[identity]
    mine = [k for k, h in enumerate(holders) if h == identity]
    if len(mine) > share:
        return ShardPlan(share, (), tuple(mine[share:]), tuple(sorted(live)))
    free = [k for k, h in enumerate(holders) if not h]
    return ShardPlan(share, tuple(free[:share - len(mine)]), (), tuple(sorted(live)))


def orphaned(since_round_s: float, interval_s: float) -> bool:
    """A cluster is orphaned when no round finished on it for more than two intervals (a round
    starts every interval: one late round is not an orphan). `since_round_s` counts from its
    last finished round, or from when it joined the fleet if it never had one."""
    return since_round_s > 2 * interval_s
