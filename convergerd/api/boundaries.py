"""What one boundary's tenant sees (`scopes.Scope.BOUNDARY`: the admin token, or that
boundary's read token): `GET /v1/boundaries/{boundary}` and
`GET /v1/boundaries/{boundary}/policies/{id}`.

Built from the same state and views as `/status` and `/v1/policies/{id}/status`, restricted to
the boundary: its clusters (reached, lag, Kubernetes version, a cluster-level failure as its
reason slug only) with the phases, verification and violations of *its* policies there, and its
policies with their roll-up over its clusters (phases, `Verified`, violations and the kept
samples). Never another boundary's policy, nor a count or an error message that includes one:
a cluster's counts and messages in `/status` cover every tenant's policies, so a cluster here
shows only what its records of this boundary's policies say.

Bounded like `/status`: up to `CONVERGERD_STATUS_MAX_CLUSTERS` clusters listed, past it pages
in id order (`?limit=&after=`, `listing.next`); at most `rows.BOUNDARY_POLICIES_LISTED` policies
(the count of all in `policies_total`). The roll-up reads every (cluster, policy) record of the
boundary in slices with the loop free between them, and costs the status budget by the rows it
read, as the other views do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.parse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.scopes import unknown_boundary
from convergerd.api.server import Views, error_response, policy_id_from_request
from convergerd.core.errors import ConvergerdError
from convergerd.core.model import ClusterId, PolicyId, RuleError, check_boundary_id
from convergerd.core.rows import BOUNDARY_POLICIES_LISTED, BoundaryPolicy, BoundaryRows
from convergerd.core.shown import shown
from convergerd.status.admissions import enforcement_label, known_admissions
from convergerd.status.document import audit_sample_view
from convergerd.status.listing import Page, listing, page_ids, page_request
from convergerd.status.phases import (
    STALE,
    UNKNOWN_VERIFICATION,
    UNSUPPORTED,
    age_s,
    is_stale,
    known_violations,
    normalize_phase,
    verification_of,
)
from convergerd.status.reader import ClusterFacts
from convergerd.status.records import PolicyRecord
from convergerd.status.views import audit_view, iso, policy_audit_view, unsupported_rollup

# Clusters read between two turns of the loop while the roll-up is built.
SLICE_CLUSTERS = 200


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


def _unknown(boundary: str) -> web.Response:
    status, body = unknown_boundary(boundary)
    return web.json_response(body, status=status)


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

    def add(self, record: PolicyRecord | None, revision: int, now: dt.datetime, *,
            interval_s: float, probe_period_s: float) -> None:
        if record is None:
            return
        delivered = record.delivered_revision
        self.in_sync += delivered == revision
        self.failed += record.last_result == "failed"
        reading = record.phase
        if reading is None:
            return
        stale = is_stale(reading.seen_at, now, interval_s)
        self.phases[STALE if stale else normalize_phase(reading.phase)] += 1
        self.verification[verification_of(reading, age_s(reading.seen_at, now), interval_s,
                                          now=now, probe_period_s=probe_period_s)] += 1
        self.violations += known_violations(reading) or 0
        mode = enforcement_label(reading.enforcement_action)
        if mode is not None:
            self.enforcement[mode] += 1
        counts = known_admissions(reading)
        if counts is not None:
            self.admissions = [a + b for a, b in zip(self.admissions or [0] * 6, counts,
                                                     strict=True)]

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


class BoundaryViews:
    """The two views, over the server's `views` (its state, database gate and read budget)
    and `source` (None: no database, the views answer 503)."""

    def __init__(self, views: Views, source: BoundarySource | None) -> None:
        self._views = views
        self._source = source

    async def _rows(self, boundary: str) -> BoundaryRows | web.Response | None:
        source = self._source
        if source is None:
            return error_response(503, "boundary views need the database", reason="database")
        try:
            return await self._views.read(
                lambda: source.boundary_status(boundary, BOUNDARY_POLICIES_LISTED))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return error_response(503, f"database unavailable: {self._views.read_error(exc)}",
                                  reason="database")

    async def boundary(self, request: web.Request) -> web.StreamResponse:
        boundary = boundary_of(request)
        if isinstance(boundary, web.Response):
            return boundary
        most = self._views.settings.status_max_clusters
        try:
            page = page_request(request.query, most) or Page(most, None)
        except RuleError as exc:
            return error_response(400, str(exc), reason="query")
        rows = await self._rows(boundary)
        if isinstance(rows, web.Response):
            return rows
        if rows is None:
            return _unknown(boundary)
        return web.json_response(await self._document(boundary, rows, page))

    async def _document(self, boundary: str, rows: BoundaryRows,
                        page: Page) -> dict[str, Any]:
        views = self._views
        state = views.state
        now = state.clock()
        interval_s, probe_s = state.interval_s, state.probe_period_s
        policies = rows.policies
        totals = {p.policy.id: Tally() for p in policies}
        audits: dict[str, list[dict[str, Any] | None]] = {p.policy.id: [] for p in policies}
        listed_ids, more = page_ids(rows.clusters, page)
        listed = set(listed_ids)
        clusters: list[dict[str, Any]] = []
        unsupported: list[tuple[str, str | None]] = []
        for start in range(0, len(rows.clusters), SLICE_CLUSTERS):
            await asyncio.sleep(0)
            for cid in rows.clusters[start:start + SLICE_CLUSTERS]:
                live = state.clusters.get(cid)
                here = Tally()
                for bp in policies:
                    pid = PolicyId(bp.policy.id)
                    record = live.policies.get(pid) if live is not None else None
                    for tally in (here, totals[pid]):
                        tally.add(record, bp.policy.revision, now, interval_s=interval_s,
                                  probe_period_s=probe_s)
                    audits[pid].append(_audit(record, now, interval_s, probe_s))
                if here.phases.get(UNSUPPORTED):
                    unsupported.append((cid, live.server_version if live else None))
                if cid in listed:
                    clusters.append(_cluster_view(cid, live, here, now))
        views.charge(len(rows.clusters) * max(1, len(policies)))
        following = None
        if more:
            query = urllib.parse.urlencode({"limit": page.limit, "after": listed_ids[-1]})
            following = f"/v1/boundaries/{boundary}?{query}"
        return {
            "boundary": boundary,
            "now": iso(now),
            "identity": state.identity,
            "interval_seconds": interval_s,
            "policies_total": rows.policies_total,
            "policies": [_policy_summary(bp, totals[bp.policy.id], audits[bp.policy.id],
                                         audit_sample_view(state, bp.policy.id), len(rows.clusters))
                         for bp in policies],
            "unsupported_by_version": unsupported_rollup(unsupported),
            "listing": listing(order="id", listed=len(clusters), after=page.after,
                               complete=page.after is None and not more, following=following),
            "clusters": clusters,
        }

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


def _audit(record: PolicyRecord | None, now: dt.datetime, interval_s: float,
           probe_period_s: float) -> dict[str, Any] | None:
    """One reading's audit as `/v1/policies/{id}/status` shows it (None: none read)."""
    reading = record.phase if record is not None else None
    if reading is None:
        return None
    return audit_view(reading, now, interval_s, probe_period_s=probe_period_s)


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
