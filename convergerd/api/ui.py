"""The web page (`/ui/`, the API's port): a sign-in form taking a token, then the fleet for the
admin token and one boundary for its read token: a policies-by-clusters grid coloured by phase
with `Verified` and violations, the live rollouts, a page per policy and one per policy's
rollout, the unreached and Unsupported clusters, and when the data was read. Server-rendered
(`convergerd.api.pages`) from the JSON views' own documents: `/status`'s
(`server.Views.status_built`: the fleet and its live rollouts), a boundary's
(`boundaries.BoundaryViews.whole`: its policies' live rollouts too), a policy's
(`server.Views.policy_view`), a policy's rollout (`rollouts.RolloutHandlers.document`, within
the read token's boundary) and `status.views.record_view` per cell; nothing is read another
way.

Who: the routes are `scopes.Scope.PAGE` (no `Authorization` header read); the page asks
`auth.Guard.principal_of` about the token kept in its cookie, and applies the same rules as
the API: the admin token sees everything; a boundary's read token sees its boundary and its
policies, and another boundary's, or its policy's, is the same 404 as one that does not
exist. Every page read is charged to the token's budget and to the status views' budget.

The token is typed into a form (POST `/ui/login`), never put in an address, and kept in a
cookie that is `HttpOnly`, `SameSite=Strict`, `Path=/ui/` and `Secure` when the request came
over TLS (or a proxy says `X-Forwarded-Proto: https`: a client lying about it only loses its
own cookie). The POSTs are refused unless their `Origin` is this server (with `SameSite`,
no other site can sign a browser in or out). Every answer carries a Content-Security-Policy
that allows nothing but this server's stylesheet (`CSP`), and is never cached.

Bounded like the views it shows: at most `CLUSTERS_PER_PAGE` clusters and
`POLICIES_PER_PAGE` policies on a grid (worst clusters first, like `/status`; links to the
next pages), at most `CLUSTERS_PER_PAGE` clusters on a policy's page (those that need a look
first), `UNREACHED_LISTED` unreached clusters named, `pages.ROLLOUTS_LISTED` live rollouts; a
rollout's page names per wave and revision at most `status.rollouts.CLUSTERS_NAMED` clusters and
counts the rest (the policy's page lists every cluster, page by page, with its revision).
"""

from __future__ import annotations

import importlib.resources
import math
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from convergerd.api.auth import Guard
from convergerd.api.boundaries import BoundaryViews
from convergerd.api.mutations import BadRequest, read_raw
from convergerd.api.pages import (
    Cell,
    Grid,
    Pager,
    Row,
    Viewer,
    boundary_page,
    cell_of,
    fleet_page,
    login_page,
    message_page,
    not_found_boundary,
    not_found_policy,
    not_found_rollout,
    plain_reason,
    policy_page,
    rollout_page,
    seg,
    url,
)
from convergerd.api.rollouts import RolloutHandlers
from convergerd.api.scopes import ANONYMOUS, Kind, Principal
from convergerd.api.server import Views
from convergerd.core.errors import ConvergerdError
from convergerd.core.model import (
    ClusterId,
    PolicyId,
    RuleError,
    check_boundary_id,
    check_policy_id,
)
from convergerd.status.document import cluster_summary, rollouts_view
from convergerd.status.listing import (
    UNSUPPORTED_LISTED,
    bounded_unsupported,
    worst_first_key,
)
from convergerd.status.phases import UNSUPPORTED, VERIFICATIONS
from convergerd.status.reader import ClusterFacts
from convergerd.status.views import iso, record_view, unsupported_rollup

COOKIE = "convergerd_token"
COOKIE_PATH = "/ui/"
CSP = ("default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # Not `no-referrer`: under it a browser sends `Origin: null` with the forms' POSTs, and
    # the Origin check could not tell this server's page from any other.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}
CLUSTERS_PER_PAGE = 50
POLICIES_PER_PAGE = 20
UNREACHED_LISTED = 100
# A token typed into the form longer than this is no token (ours are 49 characters; an admin
# token fits a header line).
TOKEN_FORM_MAX_CHARS = 1000
# The page numbers a query may ask for.
MAX_PAGE = 1_000_000
# The package's static files: name -> content type.
STATIC: Mapping[str, str] = {"ui.css": "text/css; charset=utf-8"}


def _headers(response: web.StreamResponse, *, cache: bool = False) -> web.StreamResponse:
    response.headers.update(SECURITY_HEADERS)
    response.headers["Cache-Control"] = "max-age=300" if cache else "no-store"
    return response


def html_response(text: str, status: int = 200) -> web.Response:
    response = web.Response(text=text, status=status, content_type="text/html",
                            charset="utf-8")
    _headers(response)
    return response


def _redirect(location: str) -> web.Response:
    response = web.Response(status=303, headers={"Location": location})
    _headers(response)
    return response


def _page_number(query: Mapping[str, str], key: str = "page") -> int:
    """`?page=` (1 when absent or not a page number)."""
    raw = query.get(key, "1")
    if raw.isascii() and raw.isdigit() and len(raw) <= 7:
        return min(max(1, int(raw)), MAX_PAGE)
    return 1


def _over_tls(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def same_origin(request: web.Request) -> bool:
    """Whether a POST's `Origin` is this server (the host the browser asked for)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    parts = urllib.parse.urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == request.host and not (
        parts.path or parts.query)


def next_page_of(value: str | None) -> str:
    """Where to go after signing in: a page of ours, else the home page."""
    if value and value.startswith("/ui/") and value.isascii() and len(value) < 2000 \
            and "\\" not in value and not value.startswith("/ui//"):
        return value
    return "/ui/"


def _unavailable(viewer: Viewer, status: int) -> web.Response:
    return html_response(message_page(
        "Not available", "The database did not answer: try again shortly.", viewer), status)


def viewer_of(who: Principal) -> Viewer:
    if who.kind is Kind.READER and who.boundary is not None:
        return Viewer(f"read token {who.name} of boundary {who.boundary}",
                      f"/ui/boundaries/{seg(who.boundary)}")
    return Viewer("admin token", "/ui/")


class UiPages:
    """The page's handlers, over the JSON views (`views`, `boundaries`) and the scope check of
    the API (`guard`, asked about the cookie's token)."""

    def __init__(self, guard: Guard, views: Views, boundaries: BoundaryViews,
                 rollouts: RolloutHandlers, *, body_timeout_s: float,
                 clusters_per_page: int = CLUSTERS_PER_PAGE,
                 policies_per_page: int = POLICIES_PER_PAGE) -> None:
        self._guard = guard
        self._views = views
        self._boundaries = boundaries
        self._rollouts = rollouts
        self._body_timeout_s = body_timeout_s
        self._clusters = clusters_per_page
        self._policies = policies_per_page
        files = importlib.resources.files("convergerd.api").joinpath("ui_static")
        self._static = {name: (files.joinpath(name).read_bytes(), kind)
                        for name, kind in STATIC.items()}

    # -- who -----------------------------------------------------------------------------

    def _who(self, request: web.Request) -> Principal:
        raw = request.cookies.get(COOKIE)
        if not raw:
            return ANONYMOUS
        return self._guard.principal_of(urllib.parse.unquote(raw))

    def _refused(self, request: web.Request, who: Principal) -> web.Response | None:
        """The sign-in form when `who` is nobody; a 429 page when over a budget."""
        if who.kind is Kind.ANONYMOUS:
            return html_response(login_page(next_page=request.path_qs))
        if who.kind is Kind.INVALID:
            response = html_response(login_page(
                "The token kept in this browser opens nothing any more (revoked or "
                "expired): type another.", next_page=request.path_qs))
            response.del_cookie(COOKIE, path=COOKIE_PATH)
            return response
        retry_after = self._guard.read_wait(who)
        if retry_after == 0:
            wait = self._views.read_budget.try_take()
            if wait <= 0:
                return None
            self._views.metrics.status_read_shed("/ui/")
            retry_after = max(1, math.ceil(wait))
        response = html_response(message_page(
            "Too many reads", f"Too many page reads: try again in {retry_after} s.",
            viewer_of(who)), 429)
        response.headers["Retry-After"] = str(retry_after)
        return response

    # -- signing in and out ----------------------------------------------------------------

    async def login(self, request: web.Request) -> web.StreamResponse:
        if not same_origin(request):
            return html_response(message_page(
                "Refused", "This form was not sent from this server's page (its Origin "
                "is not this server): sign in from the page itself."), 403)
        try:
            raw = await read_raw(request, timeout_s=self._body_timeout_s)
            fields = urllib.parse.parse_qs(raw.decode("utf-8", "replace"),
                                           keep_blank_values=True, max_num_fields=4)
        except BadRequest as exc:
            response = html_response(message_page("Refused", str(exc)), exc.status)
            response.force_close()
            return response
        except ValueError:
            return html_response(login_page("That form had too many fields."), 400)
        token = (fields.get("token") or [""])[0].strip()
        target = next_page_of((fields.get("next") or [""])[0])
        who = (self._guard.principal_of(token) if 0 < len(token) <= TOKEN_FORM_MAX_CHARS
               else ANONYMOUS)
        if who.kind not in (Kind.ADMIN, Kind.READER):
            return html_response(login_page(
                "That token opens nothing here: it is unknown, revoked or expired (or "
                "mistyped).", next_page=target), 403)
        response = _redirect(target)
        response.set_cookie(COOKIE, urllib.parse.quote(token, safe=""), path=COOKIE_PATH,
                            httponly=True, samesite="Strict", secure=_over_tls(request))
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        if not same_origin(request):
            return html_response(message_page(
                "Refused", "This form was not sent from this server's page."), 403)
        response = _redirect("/ui/")
        response.del_cookie(COOKIE, path=COOKIE_PATH)
        return response

    async def to_home(self, _: web.Request) -> web.StreamResponse:
        return _redirect("/ui/")

    async def static(self, request: web.Request) -> web.StreamResponse:
        found = self._static.get(request.match_info["name"])
        if found is None:
            return html_response(message_page("Not found", "No such file."), 404)
        body, kind = found
        response = web.Response(body=body, headers={"Content-Type": kind})
        _headers(response, cache=True)
        return response

    # -- the pages -----------------------------------------------------------------------

    async def home(self, request: web.Request) -> web.StreamResponse:
        who = self._who(request)
        if who.kind is Kind.READER and who.boundary is not None:
            return _redirect(f"/ui/boundaries/{seg(who.boundary)}")
        refused = self._refused(request, who)
        if refused is not None:
            return refused
        return html_response(await self._fleet(request, who))

    async def _fleet(self, request: web.Request, who: Principal) -> str:
        views = self._views
        built = await views.status_built()
        state = views.state
        now = state.clock()
        page = _page_number(request.query)
        start = (page - 1) * self._clusters
        live = [c for cid in built.worst[start:start + self._clusters]
                if (c := state.clusters.get(cid)) is not None]  # not removed since
        summaries = [cluster_summary(state, c, now) for c in live]
        held = sorted({pid for c in live for pid in c.policies})
        columns, column_pager = self._columns(held, request, "policies held by these clusters")
        rows = [Row(s["id"], s["reachable"], s["lag_seconds"],
                    s["last_reason"] if s["last_error"] else None,
                    self._cells(c, columns, now)) for s, c in zip(summaries, live, strict=True)]
        pager = self._pager(request, page, len(built.worst), "worst first", column_pager)
        unreached = []
        for cid in built.worst[:UNREACHED_LISTED]:  # the unreached come first
            cluster = state.clusters.get(cid)
            if cluster is None or cluster.reachable is not False:
                break
            summary = cluster_summary(state, cluster, now)
            unreached.append({**summary, "why": " ".join(filter(None, (
                plain_reason(summary["last_reason"]), summary["last_error"])))})
        g = Grid(f"Policies by clusters: phase, Verified, violations ({len(rows)} of "
                 f"{len(built.worst)} clusters, worst first)", columns, rows, pager)
        return fleet_page(viewer_of(who), built.summary, g, unreached, iso(now))

    def _cells(self, cluster: ClusterFacts | None, columns: Sequence[str],
               now: Any) -> list[Cell]:
        state = self._views.state
        cells = []
        for pid in columns:
            record = cluster.policies.get(PolicyId(pid)) if cluster is not None else None
            cells.append(cell_of(record_view(record, now, state.interval_s,
                                             probe_period_s=state.probe_period_s)
                                 if record is not None else None))
        return cells

    def _columns(self, policies: Sequence[str], request: web.Request,
                 what: str) -> tuple[Sequence[str], Pager]:
        """This page's policies (`?policies=`: which page of them) and where the others
        are."""
        page = _page_number(request.query, "policies")
        start = (page - 1) * self._policies
        shown = policies[start:start + self._policies]
        links = []
        if page > 1:
            links.append(("← previous policies", _link(request, policies=page - 1)))
        if start + self._policies < len(policies):
            links.append(("next policies →", _link(request, policies=page + 1)))
        text = (f"Policies {start + 1}-{start + len(shown)} of {len(policies)} ({what})."
                if shown else f"No policies on this page ({len(policies)} in all).")
        return shown, Pager(text, links)

    def _pager(self, request: web.Request, page: int, total: int, order: str,
               columns: Pager | None = None) -> Pager:
        start = (page - 1) * self._clusters
        shown = max(0, min(total, start + self._clusters) - start)
        links = []
        if page > 1:
            links.append(("← previous clusters", _link(request, page=page - 1)))
        if start + self._clusters < total:
            links.append(("next clusters →", _link(request, page=page + 1)))
        text = (f"Clusters {start + 1}-{start + shown} of {total}, {order}."
                if shown else f"No clusters on this page ({total} in all).")
        if columns is None:
            return Pager(text, links)
        return Pager(f"{text} {columns.text}", [*links, *columns.links])

    def _asked(self, request: web.Request, key: str, check: Callable[[str], object],
               not_found: Callable[[str, Viewer], str],
               ) -> tuple[Principal, Viewer, str] | web.Response:
        """Who asks, as whom the page shows them, and the id in the path (`key`, checked by
        `check`); else the answer already due: the sign-in form, a 429, or `not_found`'s
        page (404) for an id that is not one."""
        who = self._who(request)
        refused = self._refused(request, who)
        if refused is not None:
            return refused
        viewer = viewer_of(who)
        value = request.match_info[key]
        try:
            check(value)
        except RuleError:
            return html_response(not_found(value, viewer), 404)
        return who, viewer, value

    async def boundary(self, request: web.Request) -> web.StreamResponse:
        asked = self._asked(request, "boundary", check_boundary_id, not_found_boundary)
        if isinstance(asked, web.Response):
            return asked
        who, viewer, boundary = asked
        if not who.sees(boundary):  # another boundary: as unknown as one that is not
            return html_response(not_found_boundary(boundary, viewer), 404)
        # The boundary's view listing every cluster (the page sorts and pages them), kept
        # while fresh: its roll-up reads every (cluster, policy) record of the boundary
        # (bench/RESULTS.md, "The web page"), and people reload pages.
        found = await self._boundaries.whole(boundary)
        if isinstance(found, web.Response):
            if found.status == 404:
                return html_response(not_found_boundary(boundary, viewer), 404)
            return _unavailable(viewer, found.status)
        return html_response(self._boundary_page(request, viewer, found.document))

    def _boundary_page(self, request: web.Request, viewer: Viewer,
                       doc: Mapping[str, Any]) -> str:
        state = self._views.state
        now = state.clock()
        clusters = sorted(doc["clusters"], key=lambda c: worst_first_key(
            cluster=c["id"], reachable=c["reachable"],
            failing=bool(c["failure"]) or c["failed"] > 0, lag_s=c["lag_seconds"]))
        by_id = {p["id"]: p for p in doc["policies"]}
        columns, column_pager = self._columns(list(by_id), request, "by id")
        page = _page_number(request.query)
        start = (page - 1) * self._clusters
        rows = [Row(c["id"], c["reachable"], c["lag_seconds"], c["failure"],
                    self._cells(state.clusters.get(ClusterId(c["id"])), columns, now))
                for c in clusters[start:start + self._clusters]]
        pager = self._pager(request, page, len(clusters), "worst first", column_pager)
        unreached = [{**c, "why": plain_reason(c["failure"])}
                     for c in clusters if c["reachable"] is False]
        g = Grid(f"Policies by clusters: phase, Verified, violations ({len(rows)} of "
                 f"{len(clusters)} clusters, worst first)", columns, rows, pager)
        return boundary_page(viewer, doc, policies=[by_id[p] for p in columns], g=g,
                             unreached=unreached[:UNREACHED_LISTED],
                             total_unreached=len(unreached))

    async def policy(self, request: web.Request) -> web.StreamResponse:
        asked = self._asked(request, "id", check_policy_id, not_found_policy)
        if isinstance(asked, web.Response):
            return asked
        who, viewer, value = asked
        pid = PolicyId(value)
        views = self._views
        try:
            found = await views.read(lambda: views.store.policy_status(pid))
        except (TimeoutError, ConvergerdError, OSError):
            return _unavailable(viewer, 503)
        # Another boundary's policy is not there: the same page as a policy that is not.
        if found is None or not who.sees(found.policy.boundary):
            return html_response(not_found_policy(pid, viewer), 404)
        view = views.policy_view(found)
        views.charge(len(view["clusters"]))
        return html_response(self._policy_page(request, viewer, view))

    def _policy_page(self, request: web.Request, viewer: Viewer,
                     view: Mapping[str, Any]) -> str:
        state = self._views.state
        clusters: list[dict[str, Any]] = view["clusters"]
        cells = [cell_of(c) for c in clusters]
        order = sorted(range(len(clusters)), key=lambda i: _attention(clusters[i], cells[i]))
        page = _page_number(request.query)
        start = (page - 1) * self._clusters
        listed = [clusters[i] for i in order[start:start + self._clusters]]
        verification_order = {v: n for n, v in enumerate(VERIFICATIONS)}
        counts = {
            "Phase": dict(Counter(c.phase or "no reading" for c in cells).most_common()),
            "Verified": dict(sorted(Counter(c.verification for c in cells).items(),
                                    key=lambda kv: verification_order.get(kv[0], 99))),
            "Revision": dict(Counter("delivered" if c["in_sync"] else "behind"
                                     for c in clusters)),
            "Reached": dict(Counter({True: "yes", False: "no"}.get(c["cluster_reachable"],
                                                                  "not checked yet")
                                    for c in clusters)),
        }
        unsupported = bounded_unsupported(unsupported_rollup(
            (c["cluster"], _version(state.clusters.get(ClusterId(c["cluster"]))))
            for c, cell in zip(clusters, cells, strict=True) if cell.phase == UNSUPPORTED),
            UNSUPPORTED_LISTED)
        pager = self._pager(request, page, len(clusters), "those that need a look first")
        boundary = view["policy"]["boundary"]
        pid = view["policy"]["id"]
        live = next((r for r in rollouts_view(state) if r["policy"] == pid), None)
        return policy_page(viewer, view, clusters=listed, counts=counts,
                           unsupported=unsupported, pager=pager,
                           boundary_href=f"/ui/boundaries/{seg(boundary)}",
                           read_at=iso(state.clock()), rollout=live)

    async def rollout(self, request: web.Request) -> web.StreamResponse:
        asked = self._asked(request, "id", check_policy_id, not_found_rollout)
        if isinstance(asked, web.Response):
            return asked
        who, viewer, value = asked
        pid = PolicyId(value)
        # A read token asks within its boundary: another boundary's policy is the same 404
        # as a policy without a rollout, or one that does not exist.
        found = await self._rollouts.document(
            pid, None if who.kind is Kind.ADMIN else who.boundary)
        if isinstance(found, web.Response):
            if found.status == 404:
                return html_response(not_found_rollout(pid, viewer), 404)
            return _unavailable(viewer, found.status)
        return html_response(rollout_page(viewer, found,
                                          read_at=iso(self._views.state.clock())))


def _version(cluster: ClusterFacts | None) -> str | None:
    return cluster.server_version if cluster is not None else None


# A policy's clusters in the order its page lists them: what needs a look first.
_PHASE_RANK = {"Error": 0, None: 1, "Stale": 1, "Unknown": 1, UNSUPPORTED: 2, "Inert": 3,
               "Enforcing": 4}
_VERIFICATION_RANK = {"admitted": 0, "not_verified": 1, "stale": 2, "unknown": 3,
                      "verified": 4}


def _attention(cluster: Mapping[str, Any], cell: Cell) -> tuple[int, int, int, int, str]:
    return (0 if cluster["last_result"] == "failed" else 1,
            _PHASE_RANK.get(cell.phase, 1),
            _VERIFICATION_RANK.get(cell.verification, 3),
            0 if not cluster["in_sync"] else 1,
            cluster["cluster"])


def _link(request: web.Request, **changes: int) -> str:
    """This page's address with `changes` to its page numbers (the only query it keeps)."""
    query: dict[str, object] = {k: request.query[k] for k in ("page", "policies")
                                if k in request.query}
    query.update(changes)
    return url(request.path, **query)
