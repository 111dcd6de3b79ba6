"""How `GET /status` lists a fleet (`convergerd.api.server` builds the body): every cluster,
worst first, up to `Settings.status_max_clusters`; past it a summary, whose size does not grow
with the fleet (the fleet's counts, the worst `WORST_LISTED` clusters, at most
`UNSUPPORTED_LISTED` Unsupported clusters named), and pages in id order (`?limit=&after=`)
that walk every cluster once. Pure: the summaries in, the document's parts out.

Pages are in id order, not worst first: the order of the worst changes from one moment to the
next, so a walk in that order could show a cluster twice or never; an id cursor cannot. A
cluster added behind the cursor during a walk is in the next walk, one removed is skipped.
"""

from __future__ import annotations

import bisect
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from convergerd.core.model import ClusterId, RuleError, check_cluster_id
from convergerd.core.shown import shown
from convergerd.status.phases import UNSUPPORTED


def worst_first_key(
    *, cluster: str, reachable: bool | None, failing: bool, lag_s: float | None
) -> tuple[int, float, str]:
    """Sort key: unreached, never checked, failing, the rest; larger lag first; then by id."""
    if reachable is False:
        rank = 0
    elif reachable is None:
        rank = 1
    elif failing:
        rank = 2
    else:
        rank = 3
    return rank, -(lag_s or 0.0), cluster


# A summary lists this many of the worst clusters (fewer when the threshold is lower).
WORST_LISTED = 100
# A summary names at most this many Unsupported clusters (`unsupported_by_version`; fewer when
# the threshold is lower); the count of them all is `fleet.unsupported`.
UNSUPPORTED_LISTED = 100
# What `fleet` counts, in the order it shows them.
FLEET_COUNTS = ("clusters", "unreached", "unchecked", "failing", "lagging", "in_sync",
                "unsupported", "orphaned")


@dataclass(frozen=True, slots=True)
class Page:
    """A page asked for: at most `limit` clusters whose id sorts after `after`."""

    limit: int
    after: ClusterId | None


def page_request(query: Mapping[str, str], max_clusters: int) -> Page | None:
    """The page `?limit=&after=` asks for (None: neither given, the usual document). `limit`
    defaults to, and may not exceed, `max_clusters`. Raises `RuleError` naming the parameter."""
    if "limit" not in query and "after" not in query:
        return None
    limit = max_clusters
    if "limit" in query:
        raw = query["limit"]
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 9
                and 1 <= int(raw) <= max_clusters):
            raise RuleError(f"limit: must be a whole number from 1 to {max_clusters} "
                            f"(CONVERGERD_STATUS_MAX_CLUSTERS), got {shown(raw)}")
        limit = int(raw)
    after = query.get("after")
    if after is not None:
        try:
            check_cluster_id(after)
        except RuleError as exc:
            raise RuleError(f"after: {exc}") from None
    return Page(limit, ClusterId(after) if after is not None else None)


def page_ids(ids: Sequence[ClusterId], page: Page) -> tuple[Sequence[ClusterId], bool]:
    """The ids of `page` out of `ids` (sorted), and whether any id follows them."""
    start = bisect.bisect_right(ids, page.after) if page.after is not None else 0
    return ids[start:start + page.limit], start + page.limit < len(ids)


def page_url(limit: int, after: str | None = None) -> str:
    """The relative URL of the page of `limit` clusters after `after` (None: the first)."""
    query = {"limit": limit} if after is None else {"limit": limit, "after": after}
    return f"/status?{urllib.parse.urlencode(query)}"


def listing(*, order: str, listed: int, complete: bool, following: str | None,
            after: str | None = None) -> dict[str, Any]:
    """The document's `listing`: what its `clusters` are and where the rest is."""
    return {"complete": complete, "order": order, "listed": listed, "after": after,
            "next": following}


class FleetTally:
    """The fleet's counts (`FLEET_COUNTS`), from the clusters' `/status` summaries."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self.counts = dict.fromkeys(FLEET_COUNTS, 0)

    def add(self, summaries: Iterable[Mapping[str, Any]]) -> None:
        counts = self.counts
        for s in summaries:
            counts["clusters"] += 1
            reachable = s["reachable"]
            failing = bool(s["last_error"]) or bool(s["failed"])
            counts["unreached"] += reachable is False
            counts["unchecked"] += reachable is None
            counts["failing"] += reachable is not False and failing
            counts["lagging"] += s["lag_seconds"] > self.stale_after_s
            counts["in_sync"] += reachable is True and not failing \
                and s["in_sync"] == s["desired"]
            counts["unsupported"] += bool(s["phases"].get(UNSUPPORTED))
            counts["orphaned"] += bool(s["orphaned"])


def bounded_unsupported(rollup: Mapping[str, list[str]], most: int) -> dict[str, list[str]]:
    """`unsupported_rollup`'s versions and clusters, at most `most` clusters named in all."""
    bounded: dict[str, list[str]] = {}
    left = most
    for version, clusters in rollup.items():
        if left <= 0:
            break
        bounded[version] = clusters[:left]
        left -= len(bounded[version])
    return bounded
