"""A save spread over the shard holders: who writes which cluster, and what is left over. Pure.

With `CONVERGERD_SHARDS` > 1 a save's clusters are grouped by shard (`shards.shard_of`). The
replica that took the save writes the clusters of the shards it holds; the clusters of a shard
another live replica holds are that replica's *part*, asked through the database
(`convergerd.delivery.spread`); the clusters of a shard nobody holds are written by the
requester too, as a standby writes (`split`). When the parts are done, or their share of the
deadline has passed, whatever has no usable result from a peer is *left over*, and the
requester writes it itself (`leftover`), so the answer lists every cluster.

What a peer wrote back is read from the database: untrusted. A result row is used only for a
cluster and action of the part it was asked for, with a result that action can have, its texts
cleaned and capped (`result_of`); a payload or an item row that is not what this module wrote
is dropped (`parse_payload`, `work_item`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from convergerd.core.decode import MAX_MESSAGE_CHARS, MAX_REASON_CHARS, clean_text
from convergerd.core.model import ClusterId, RuleError, check_cluster_id
from convergerd.core.report import ClusterResult, FanoutResult
from convergerd.core.save import SaveAction, Work
from convergerd.core.shards import shard_of

# What a peer may answer for each action; anything else is no answer (left over).
_RESULTS: Mapping[SaveAction, frozenset[FanoutResult]] = {
    SaveAction.APPLY: frozenset({FanoutResult.CREATED, FanoutResult.UPDATED,
                                 FanoutResult.UNCHANGED, FanoutResult.SUPERSEDED,
                                 FanoutResult.FAILED}),
    SaveAction.REMOVE: frozenset({FanoutResult.REMOVED, FanoutResult.FAILED}),
}
# A peer's write refused by its own fence (it lost the shard's Lease meanwhile) is no answer:
# the requester writes that cluster itself.
FENCED_REASON = "fenced"
# The channel every replica listens on, and its payloads: "part <request id>" (parts are
# waiting) and "done <request id>" (a part of that request is done).
CHANNEL = "convergerd_saves"
PART, DONE = "part", "done"
_PAYLOAD = re.compile(r"(part|done) ([1-9][0-9]{0,17})")
MAX_PAYLOAD_CHARS = 32


@dataclass(frozen=True, slots=True)
class Part:
    """The clusters of one shard, asked of the replica holding it."""

    shard: int
    holder: str
    work: tuple[Work, ...]


@dataclass(frozen=True, slots=True)
class Split:
    here: dict[int, tuple[Work, ...]]  # by shard: the shards the requester holds
    parts: tuple[Part, ...]  # the shards other live replicas hold
    unheld: tuple[Work, ...]  # shards no member holds: written by the requester, unfenced


@dataclass(frozen=True, slots=True)
class Claimed:
    """A part this replica claimed (its shard's holder): write its clusters within
    `remaining_s` (what was left of the request's share of the deadline when it was claimed,
    on the database's clock)."""

    request_id: int
    shard: int
    policy_id: str  # as read: checked before use
    revision: int
    remaining_s: float


@dataclass(frozen=True, slots=True)
class Spread:
    """A save's results, every cluster, and how many of them its peers wrote."""

    results: list[ClusterResult]
    by_peers: int
    parts: int  # parts asked of peers


def split(
    work: Iterable[Work], *, shards: int, identity: str, holders: Sequence[str],
    members: Collection[str],
) -> Split:
    """Group a save's work by shard and say who writes what. `holders[k]` is the live holder
    of shard k as the requester sees it ("" when free or expired; `identity` for its own);
    only live `members` are asked (a `convergerd once` holding a shard serves no parts)."""
    if len(holders) != shards:
        raise ValueError(f"{len(holders)} holders for {shards} shards")
    by_shard: dict[int, list[Work]] = {}
    for w in work:
        by_shard.setdefault(shard_of(w.cluster, shards), []).append(w)
    here: dict[int, tuple[Work, ...]] = {}
    parts: list[Part] = []
    unheld: list[Work] = []
    for k in sorted(by_shard):
        holder = holders[k]
        if holder == identity:
            here[k] = tuple(by_shard[k])
        elif holder in members:
            parts.append(Part(k, holder, tuple(by_shard[k])))
        else:
            unheld.extend(by_shard[k])
    return Split(here, tuple(parts), tuple(unheld))


def result_of(
    cluster: object, action: object, result: object, reason: object, error: object
) -> ClusterResult | None:
    """One result row a peer wrote, decoded: None when it is not a result `action` can have
    (or not even a cluster id and an action); reason and error cleaned and capped."""
    if not isinstance(cluster, str) or not isinstance(action, str) or action not in _RESULTS:
        return None
    try:
        found = FanoutResult(result) if isinstance(result, str) else None
    except ValueError:
        return None
    if found is None or found not in _RESULTS[SaveAction(action)]:
        return None
    return ClusterResult(
        ClusterId(cluster), SaveAction(action), found,
        clean_text(reason, MAX_REASON_CHARS) if isinstance(reason, str) else None,
        clean_text(error, MAX_MESSAGE_CHARS) if isinstance(error, str) else None,
    )


def leftover(
    parts: Iterable[Part], done: Collection[int], results: Iterable[ClusterResult]
) -> tuple[list[ClusterResult], list[Work]]:
    """The peers' usable results, and the work the requester must do itself: every cluster of
    a part not done (its holder was slow, dead, or declined), and every cluster of a done part
    without a usable result (none, not one of that part's clusters, or refused by the peer's
    fence). A result is used once per cluster and action."""
    answered: dict[tuple[str, str], ClusterResult] = {}
    for r in results:
        if r.reason != FENCED_REASON:
            answered.setdefault((r.cluster, r.action), r)
    used: list[ClusterResult] = []
    left: list[Work] = []
    for part in parts:
        for w in part.work:
            found = answered.get((w.cluster, w.action)) if part.shard in done else None
            if found is None:
                left.append(w)
            else:
                used.append(found)
    return used, left


def work_item(cluster: object, action: object, read: object, *, shard: int,
              shards: int) -> Work | None:
    """One item row of a part, as the holder reads it: None unless a cluster id of `shard`,
    a known action and a boolean (the holder writes only what is its shard's)."""
    if not isinstance(cluster, str) or action not in _RESULTS or not isinstance(read, bool):
        return None
    try:
        check_cluster_id(cluster)
    except RuleError:
        return None
    if shard_of(cluster, shards) != shard:
        return None
    known = SaveAction(str(action))
    return Work(ClusterId(cluster), known, read and known is SaveAction.APPLY)


def payload(kind: str, request_id: int) -> str:
    return f"{kind} {request_id}"


def parse_payload(text: str) -> tuple[str, int] | None:
    """`("part", 12)` from "part 12", `("done", 12)` from "done 12"; None for anything else."""
    found = _PAYLOAD.fullmatch(text) if len(text) <= MAX_PAYLOAD_CHARS else None
    if found is None:
        return None
    return found[1], int(found[2])
