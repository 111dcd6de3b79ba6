"""What one boundary's tenant sees (`scopes.Scope.BOUNDARY`: the admin token, or that
boundary's read token): `GET /v1/boundaries/{boundary}` and
`GET /v1/boundaries/{boundary}/policies/{id}`.

Built from the same state and views as `/status` and `/v1/policies/{id}/status`, restricted to
the boundary: its clusters (reached, lag, Kubernetes version, a cluster-level failure as its
reason slug only) with the phases, verification and violations of *its* policies there, its
policies with their roll-up over its clusters (phases, `Verified`, violations and the kept
samples), and its policies' live rollouts as `/status` shows them. Never another boundary's
policy, nor a count or an error message that includes one: a cluster's counts and messages in
`/status` cover every tenant's policies, so a cluster here shows only what its records of this
boundary's policies say.

Bounded like `/status`: up to `CONVERGERD_STATUS_MAX_CLUSTERS` clusters listed, past it pages
in id order (`?limit=&after=`, `listing.next`); at most `rows.BOUNDARY_POLICIES_LISTED` policies
(the count of all in `policies_total`). The roll-up reads every (cluster, policy) record of the
boundary in slices with the loop free between them, and costs the status budget by the rows it
read, as the other views do. It judges each record once, from its packed row, and a cluster's
records that agree on all a judgment reads (most of them: one round, one listing) as one
(`_Judge`). The view listing every cluster is kept per boundary and reused while fresh, by the
rule `/status` reuses its body by (`Built.fresh`): the JSON view's pages are cut from it and the
web page shows it; one build per boundary at a time; at most `KEPT_VIEWS` views listing at most
`KEPT_CLUSTERS` clusters together are kept (bench/RESULTS.md, "The web page").
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import datetime as dt
import urllib.parse
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.scopes import unknown_boundary
from convergerd.api.server import Built, Views, error_response, policy_id_from_request
from convergerd.core.errors import ConvergerdError
from convergerd.core.facts import READING_OWN, RECORD_ROW, ROW_DELIVERED_REVISION
from convergerd.core.model import ClusterId, PolicyId, RuleError, check_boundary_id
from convergerd.core.rows import BOUNDARY_POLICIES_LISTED, BoundaryPolicy, BoundaryRows
from convergerd.core.shown import shown
from convergerd.status.admissions import enforcement_label, known_admissions
from convergerd.status.document import audit_sample_view, rollouts_view
from convergerd.status.listing import Page, listing, page_ids, page_request
from convergerd.status.phases import (
    STALE,
    UNKNOWN_VERIFICATION,
    UNSUPPORTED,
    age_s,
    is_stale,
    known_violations,
    normalize_phase,
    probe_age_classes,
    verification_of,
)
from convergerd.status.reader import ClusterFacts
from convergerd.status.records import PolicyRecord, row_record
from convergerd.status.views import audit_view, iso, policy_audit_view, unsupported_rollup

# Clusters read between two turns of the loop while the roll-up is built.
SLICE_CLUSTERS = 200
# The boundaries' views kept for reuse: at most this many, listing at most this many clusters
# together (the least recently shown go first; the last built is kept whatever its size). A
# view keeps ~0.9 KB a cluster and at most ~0.35 MB for its policies (bench/RESULTS.md, "The
# web page"): ~60 MB at most, or one boundary's view when that is more.
KEPT_VIEWS = 64
KEPT_CLUSTERS = 40_000


class BoundarySource(Protocol):
    """What the boundary views read from the database (`convergerd.store.store.Store`)."""

    async def boundary_status(self, boundary: str, most: int) -> BoundaryRows | None: ...


def boundary_of(request: web.Request) -> str | web.Response:
    """The `{boundary}` of the path, or the 400 answer naming why it cannot be one."""
    value = request.match_info["boundary"]
    try:
        check_boundary_id(value)
    except RuleError as exc:
        return error_response(400, f"bad boundary id: {exc}",
                              boundary=shown(value, style="text"))
    return value


# A (cluster, policy) record as the roll-up counts it: in sync with the policy's revision,
# failed, the phase it counts under (None: no reading, nothing else counted), its
# verification, its known violations, the mode in force (`enforcement_label`) and its six
# admission counts (`known_admissions`; None: none read).
Judgment = tuple[bool, bool, str | None, str | None, int, str | None,
                 tuple[int, int, int, int, int, int] | None]
# What a record is judged by: its row but the reading's own fields, read only through whether
# it is in sync with the policy's revision and the probe's age class
# (`phases.probe_age_classes`); its observed revision and probe times are read no other way.
_ROW_PROBED_AT = RECORD_ROW.index("verified_probed_at")
# The own fields that key leaves out, checked at import: a reading field held per reading and
# added since (`facts.Field.shared`) may be one a judgment reads, and must be looked at here.
_LEFT_OUT = ("revision", "verified_probed_at", "verified_since", "admission_since",
             "admission_read_at", "admission_revision")
if READING_OWN != _LEFT_OUT:
    raise RuntimeError(f"api.boundaries: the reading's own fields are {READING_OWN}, the "
                       f"judgments' key was written for {_LEFT_OUT}")


@dataclass(slots=True)
class Tally:
    """Readings of some (cluster, policy) pairs counted as `/status` counts a cluster's."""

    phases: Counter[str] = field(default_factory=Counter)
    verification: Counter[str] = field(default_factory=Counter)
    in_sync: int = 0
    failed: int = 0
    violations: int = 0
    enforcement: Counter[str] = field(default_factory=Counter)  # modes in force, by name
    admissions: list[int] | None = None  # the six counts summed (None: none read)

    @classmethod
    def of(cls, counted: Mapping[Judgment | None, int]) -> Tally:
        """The tally of records judged `counted` (judgment: how many; None: no record)."""
        tally = cls()
        for judged, n in counted.items():
            if judged is None:
                continue
            in_sync, failed, phase, verification, violations, mode, counts = judged
            tally.in_sync += in_sync * n
            tally.failed += failed * n
            if phase is None:
                continue
            tally.phases[phase] += n
            tally.verification[verification or UNKNOWN_VERIFICATION] += n
            tally.violations += violations * n
            if mode is not None:
                tally.enforcement[mode] += n
            if counts is not None:
                tally.admissions = [a + b * n for a, b in zip(
                    tally.admissions or [0] * len(counts), counts, strict=True)]
        return tally

    def view(self) -> dict[str, Any]:
        verification = dict(self.verification)
        verification.pop(UNKNOWN_VERIFICATION, None)
        return {"phases": dict(sorted(self.phases.items())),
                "verification": dict(sorted(verification.items())),
                "in_sync": self.in_sync, "failed": self.failed, "violations": self.violations,
                "enforcement": dict(sorted(self.enforcement.items())),
                "admission": None if self.admissions is None else _admission(self.admissions)}


def _admission(counts: Sequence[int]) -> dict[str, Any]:
    """Six counts summed (since each cluster's revision, then the last hour's) as shown."""
    d, w, a, hd, hw, ha = counts
    return {"denied": d, "warned": w, "audited": a,
            "last_hour": {"denied": hd, "warned": hw, "audited": ha}}


def judged(record: PolicyRecord, revision: int, now: dt.datetime, *, interval_s: float,
           probe_period_s: float) -> tuple[Judgment, dict[str, Any] | None]:
    """How the roll-up counts `record` of a policy at `revision`, and its audit as
    `/v1/policies/{id}/status` shows it (None: none read)."""
    in_sync = record.delivered_revision == revision
    failed = record.last_result == "failed"
    reading = record.phase
    if reading is None:
        return (in_sync, failed, None, None, 0, None, None), None
    stale = is_stale(reading.seen_at, now, interval_s)
    verification = verification_of(reading, age_s(reading.seen_at, now), interval_s, now=now,
                                   probe_period_s=probe_period_s)
    return ((in_sync, failed, STALE if stale else normalize_phase(reading.phase), verification,
             known_violations(reading) or 0, enforcement_label(reading.enforcement_action),
             known_admissions(reading)),
            audit_view(reading, now, interval_s, probe_period_s=probe_period_s))


class _Judge:
    """The records of one cluster judged at `now` (`judged`), each once: records that agree on
    all a judgment reads (most of a cluster's: one round, one listing) are judged as one."""

    def __init__(self, now: dt.datetime, interval_s: float, probe_period_s: float) -> None:
        self._now, self._interval_s, self._probe_s = now, interval_s, probe_period_s
        self._probe_class = probe_age_classes(now, probe_period_s)
        # The cluster's judgments so far, by the rest of the row (`records.RecordRow`), then
        # in sync and the probe's age class: records of other clusters seldom agree (each is
        # listed at its own time), so it is emptied per cluster and holds at most its
        # policies.
        self._seen: dict[tuple[Any, ...],
                         dict[tuple[bool, int], tuple[Judgment, dict[str, Any] | None]]] = {}

    def cluster(self, cid: ClusterId, live: ClusterFacts, policies: Sequence[PolicyId],
                revisions: Sequence[int],
                ) -> tuple[list[Judgment | None], list[dict[str, Any] | None]]:
        """Per policy of `policies` (at `revisions`) its record's judgment on `live`, and its
        audit (None: no record, no audit read)."""
        seen = self._seen
        seen.clear()
        probe_class = self._probe_class
        judgments: list[Judgment | None] = []
        audits: list[dict[str, Any] | None] = []
        last_rest: tuple[Any, ...] | None = None
        by_head: dict[tuple[bool, int], tuple[Judgment, dict[str, Any] | None]] = {}
        for pid, revision, row in zip(policies, revisions, live.record_rows(policies),
                                      strict=True):
            if row is None:
                judgments.append(None)
                audits.append(None)
                continue
            head, rest = row
            if rest is not last_rest:  # most often the same object: hashed when it changes
                last_rest, by_head = rest, seen.setdefault(rest, {})
            key = (head[ROW_DELIVERED_REVISION] == revision, probe_class(head[_ROW_PROBED_AT]))
            found = by_head.get(key)
            if found is None:
                found = by_head[key] = judged(row_record(head + rest, cid, pid), revision,
                                              self._now, interval_s=self._interval_s,
                                              probe_period_s=self._probe_s)
            judgments.append(found[0])
            audits.append(found[1])
        return judgments, audits


# An error answer's status and JSON body (`server.error_response`'s), made into a response by
# each request it answers.
Refusal = tuple[int, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class BoundaryBuilt(Built):
    """A boundary's view listing every cluster (`document`, never changed: shared by every
    request it answers), and its clusters' ids in the order it lists them (`ids`)."""

    ids: Sequence[ClusterId]
    document: Mapping[str, Any]


class BoundaryViews:
    """The two views, over the server's `views` (its state, database gate and read budget)
    and `source` (None: no database, the views answer 503)."""

    def __init__(self, views: Views, source: BoundarySource | None, *,
                 kept_views: int = KEPT_VIEWS, kept_clusters: int = KEPT_CLUSTERS) -> None:
        self._views = views
        self._source = source
        self._kept_views, self._kept_clusters = kept_views, kept_clusters
        # boundary -> its last view, the least recently shown first (`_keep`).
        self._kept: collections.OrderedDict[str, BoundaryBuilt] = collections.OrderedDict()
        self._building: dict[str, asyncio.Task[BoundaryBuilt | Refusal]] = {}

    async def _rows(self, boundary: str) -> BoundaryRows | Refusal | None:
        source = self._source
        if source is None:
            return 503, {"error": "boundary views need the database", "reason": "database"}
        try:
            return await self._views.read(
                lambda: source.boundary_status(boundary, BOUNDARY_POLICIES_LISTED))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return 503, {"error": f"database unavailable: {self._views.read_error(exc)}",
                         "reason": "database"}

    async def boundary(self, request: web.Request) -> web.StreamResponse:
        boundary = boundary_of(request)
        if isinstance(boundary, web.Response):
            return boundary
        most = self._views.settings.status_max_clusters
        try:
            page = page_request(request.query, most) or Page(most, None)
        except RuleError as exc:
            return error_response(400, str(exc), reason="query")
        found = await self.document(boundary, page)
        return found if isinstance(found, web.Response) else web.json_response(found)

    async def document(self, boundary: str, page: Page) -> dict[str, Any] | web.Response:
        """The view of `boundary` listing the clusters of `page`, or the error answer (the
        404 of `unknown_boundary` when there is no such boundary): `whole`'s, paged."""
        found = await self.whole(boundary)
        if isinstance(found, web.Response):
            return found
        ids, whole = found.ids, found.document
        listed, more = page_ids(ids, page)
        start = bisect.bisect_left(ids, listed[0]) if listed else 0
        self._views.charge(len(listed))
        following = None
        if more:
            query = urllib.parse.urlencode({"limit": page.limit, "after": listed[-1]})
            following = f"/v1/boundaries/{boundary}?{query}"
        return {**whole,
                "listing": listing(order="id", listed=len(listed), after=page.after,
                                   complete=page.after is None and not more,
                                   following=following),
                "clusters": whole["clusters"][start:start + len(listed)]}

    async def whole(self, boundary: str) -> BoundaryBuilt | web.Response:
        """The view of `boundary` listing every cluster (what the JSON view pages and the web
        page shows), or the error answer: the one kept while fresh (`Built.fresh`, as `/status`
        reuses its body), else built anew (one build per boundary at a time: a request
        arriving during one waits for it)."""
        views = self._views
        kept = self._kept.get(boundary)
        if kept is not None and kept.fresh(views.clock(), views.state.version, views.tuning):
            self._kept.move_to_end(boundary)
            return kept
        building = self._building.get(boundary)
        if building is None:
            building = self._building[boundary] = asyncio.create_task(
                self._build(boundary), name="boundary view build")
        # A request that goes away does not stop the build the others wait for.
        found = await asyncio.shield(building)
        if isinstance(found, BoundaryBuilt):
            return found
        status, body = found  # each waiting request answers with its own response
        return web.json_response(body, status=status)

    async def _build(self, boundary: str) -> BoundaryBuilt | Refusal:
        try:
            views = self._views
            began, version = views.clock(), views.state.version
            rows = await self._rows(boundary)
            if isinstance(rows, tuple):
                return rows
            if rows is None:
                return unknown_boundary(boundary)
            document, cost_s = await self._document(boundary, rows)
            built = BoundaryBuilt(version, began, cost_s, b"", ids=rows.clusters,
                                  document=document)
            self._keep(boundary, built)
            return built
        finally:
            del self._building[boundary]

    def _keep(self, boundary: str, built: BoundaryBuilt) -> None:
        """`built` kept, and the least recently shown views dropped while past the bounds."""
        kept = self._kept
        kept[boundary] = built
        kept.move_to_end(boundary)
        clusters = sum(len(k.ids) for k in kept.values())
        while len(kept) > 1 and (len(kept) > self._kept_views
                                 or clusters > self._kept_clusters):
            clusters -= len(kept.popitem(last=False)[1].ids)

    async def _document(self, boundary: str,
                        rows: BoundaryRows) -> tuple[dict[str, Any], float]:
        """The view listing every cluster of `rows`, and the loop time its build took."""
        views = self._views
        clock = views.clock
        sliced = clock()
        state = views.state
        now = state.clock()
        interval_s, probe_s = state.interval_s, state.probe_period_s
        policies = rows.policies
        pids = [PolicyId(p.policy.id) for p in policies]
        revisions = [p.policy.revision for p in policies]
        judge = _Judge(now, interval_s, probe_s)
        counted: list[Counter[Judgment | None]] = [Counter() for _ in policies]
        audits: list[list[dict[str, Any] | None]] = [[] for _ in policies]
        clusters: list[dict[str, Any]] = []
        unsupported: list[tuple[str, str | None]] = []
        nothing = (None,) * len(policies)
        cost_s = 0.0
        for start in range(0, len(rows.clusters), SLICE_CLUSTERS):
            cost_s += clock() - sliced
            await asyncio.sleep(0)
            sliced = clock()
            judged_slice: list[Sequence[Judgment | None]] = []
            audits_slice: list[Sequence[dict[str, Any] | None]] = []
            for cid in rows.clusters[start:start + SLICE_CLUSTERS]:
                live = state.clusters.get(cid)
                judgments: Sequence[Judgment | None]
                cluster_audits: Sequence[dict[str, Any] | None]
                if live is None:
                    judgments, cluster_audits = nothing, nothing
                else:
                    judgments, cluster_audits = judge.cluster(cid, live, pids, revisions)
                judged_slice.append(judgments)
                audits_slice.append(cluster_audits)
                here = Tally.of(Counter(judgments))
                if here.phases.get(UNSUPPORTED):
                    unsupported.append((cid, live.server_version if live else None))
                clusters.append(_cluster_view(cid, live, here, now))
            # Per policy, its column of the slice (`zip(*...)`: counted in C).
            for i, column in enumerate(zip(*judged_slice, strict=True)):
                counted[i].update(column)
            for i, column in enumerate(zip(*audits_slice, strict=True)):
                audits[i].extend(column)
        views.charge(len(rows.clusters) * max(1, len(policies)))
        document = {
            "boundary": boundary,
            "now": iso(now),
            "identity": state.identity,
            "interval_seconds": interval_s,
            "policies_total": rows.policies_total,
            "policies": [_policy_summary(bp, Tally.of(counted[i]), audits[i],
                                         audit_sample_view(state, bp.policy.id), len(rows.clusters))
                         for i, bp in enumerate(policies)],
            "unsupported_by_version": unsupported_rollup(unsupported),
            "rollouts": rollouts_view(state, rows.rollouts),
            "listing": listing(order="id", listed=len(clusters), after=None, complete=True,
                               following=None),
            "clusters": clusters,
        }
        return document, cost_s + clock() - sliced

    async def policy(self, request: web.Request) -> web.StreamResponse:
        boundary = boundary_of(request)
        if isinstance(boundary, web.Response):
            return boundary
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        views = self._views
        try:
            found = await views.read(lambda: views.store.policy_status(pid))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return error_response(503, f"database unavailable: {views.read_error(exc)}",
                                  policy=pid, reason="database")
        # Another boundary's policy is not there: the same 404 as a policy that is not.
        if found is None or found.policy.boundary != boundary:
            return error_response(404, f"unknown policy {pid!r} in boundary {boundary!r}",
                                  policy=pid, boundary=boundary)
        view = views.policy_view(found)
        views.charge(len(view["clusters"]))
        return web.json_response({"boundary": boundary, **view})


def _cluster_view(cid: ClusterId, live: ClusterFacts | None, here: Tally,
                  now: dt.datetime) -> dict[str, Any]:
    """A cluster of the boundary: reached, lag, version, a cluster-level failure as its reason
    slug (its message may name another tenant's policy), and its readings of this boundary's
    policies."""
    if live is None:
        return {"id": cid, "reachable": None, "checked_at": None, "lag_seconds": None,
                "last_success_at": None, "server_version": None, "failure": None,
                **here.view()}
    failure = None
    if live.error is not None:
        failure = live.last_reason if live.error == live.last_error else "unreachable"
    return {"id": cid, "reachable": live.reachable, "checked_at": iso(live.checked_at),
            "lag_seconds": round(live.lag_s(now), 3),
            "last_success_at": iso(live.last_success_at),
            "server_version": live.server_version, "failure": failure or None,
            **here.view()}


def _policy_summary(bp: BoundaryPolicy, tally: Tally, audits: Sequence[dict[str, Any] | None],
                    sample: list[dict[str, Any]], clusters: int) -> dict[str, Any]:
    row = bp.policy
    rule_type = row.rule.get("type") if isinstance(row.rule, dict) else None
    return {
        "id": row.id, "revision": row.revision, "enabled": row.enabled,
        "rule_type": rule_type if isinstance(rule_type, str) else None,
        "invalid": bp.invalid,
        "deletion_requested_at": iso(bp.deletion_requested_at),
        "clusters": clusters,
        **tally.view(),
        "audit": policy_audit_view(audits, sample),
    }
