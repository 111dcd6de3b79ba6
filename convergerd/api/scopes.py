"""Who may call which route (pure): the scope of every route, in one table, and the decision
for a caller. `convergerd.api.auth` applies it to every request (a middleware and every
route's expect handler), the OpenAPI document lists each route's answers from it, and
`tests/integration/test_scopes.py` asks every route with every kind of token: a route
missing from `ROUTE_SCOPES` fails that test (and is served as `ADMIN` meanwhile: closed).

- `PUBLIC`: anyone; the `Authorization` header is not read.
- `FLEET` (what shows more than one boundary): the admin token, and no token at all unless
  `CONVERGERD_FLEET_READS_NEED_TOKEN`; a read token is 403, a token that opens nothing
  (unknown, revoked, expired) 401.
- `ADMIN` (what changes anything): the admin token; none or one that opens nothing 401, a read
  token 403, 503 when no admin token is configured.
- `BOUNDARY`: the admin token, or the read token of the path's `{boundary}`; none or one that
  opens nothing 401; another boundary's read token gets the 404 of a boundary that does not
  exist (`unknown_boundary`), so it learns nothing of other boundaries.
- `PAGE`: the web page (`/ui/...`, `convergerd.api.ui`): the `Authorization` header is not
  read; the page decides from the token kept in its cookie, by the same rules (the fleet for
  the admin token, one boundary for its read token, another boundary's as unknown as one that
  does not exist). Its POSTs (sign in, sign out) change nothing but the cookie.

A read token is never accepted by a route that changes anything or shows more than one
boundary: those are `ADMIN` or `FLEET`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from convergerd.core.shown import shown


class Scope(enum.StrEnum):
    PUBLIC = "public"
    FLEET = "fleet"
    ADMIN = "admin"
    BOUNDARY = "boundary"
    PAGE = "page"


# Every route the app serves, by method and path as aiohttp writes it (HEAD goes with GET).
# A new route gets its row here (docs/design.md, "Where a change goes").
ROUTE_SCOPES: Mapping[tuple[str, str], Scope] = {
    ("GET", "/healthz"): Scope.PUBLIC,
    ("GET", "/readyz"): Scope.PUBLIC,
    ("GET", "/openapi.json"): Scope.PUBLIC,
    ("GET", "/metrics"): Scope.FLEET,
    ("GET", "/status"): Scope.FLEET,
    ("GET", "/v1/clusters/{id}"): Scope.FLEET,
    ("GET", "/v1/policies/{id}/status"): Scope.FLEET,
    ("POST", "/v1/policies/{id}/apply"): Scope.ADMIN,
    ("DELETE", "/v1/policies/{id}"): Scope.ADMIN,
    ("GET", "/v1/exceptions"): Scope.FLEET,  # every boundary's policies' exceptions
    ("POST", "/v1/policies/{id}/exceptions"): Scope.ADMIN,
    ("DELETE", "/v1/policies/{id}/exceptions/{eid}"): Scope.ADMIN,
    ("POST", "/v1/tokens"): Scope.ADMIN,
    ("GET", "/v1/tokens"): Scope.ADMIN,
    ("DELETE", "/v1/tokens/{name}"): Scope.ADMIN,
    ("GET", "/v1/rollouts"): Scope.FLEET,
    ("GET", "/v1/policies/{id}/rollout"): Scope.FLEET,
    ("POST", "/v1/policies/{id}/rollout/pause"): Scope.ADMIN,
    ("POST", "/v1/policies/{id}/rollout/resume"): Scope.ADMIN,
    ("POST", "/v1/policies/{id}/rollout/approve"): Scope.ADMIN,
    ("POST", "/v1/policies/{id}/rollout/abort"): Scope.ADMIN,
    ("GET", "/v1/boundaries/{boundary}"): Scope.BOUNDARY,
    ("GET", "/v1/boundaries/{boundary}/policies/{id}"): Scope.BOUNDARY,
    ("GET", "/ui"): Scope.PAGE,
    ("GET", "/ui/"): Scope.PAGE,
    ("POST", "/ui/login"): Scope.PAGE,
    ("POST", "/ui/logout"): Scope.PAGE,
    ("GET", "/ui/boundaries/{boundary}"): Scope.PAGE,
    ("GET", "/ui/policies/{id}"): Scope.PAGE,
    ("GET", "/ui/static/{name}"): Scope.PAGE,
    ("GET", "/v1/policies/{id}/revisions"): Scope.FLEET,
    ("POST", "/v1/policies/{id}/rollback"): Scope.ADMIN,
    ("GET", "/v1/boundaries/{boundary}/policies/{id}/revisions"): Scope.BOUNDARY,
    ("GET", "/v1/boundaries/{boundary}/rollouts"): Scope.BOUNDARY,
    ("GET", "/v1/boundaries/{boundary}/policies/{id}/rollout"): Scope.BOUNDARY,
    ("GET", "/ui/policies/{id}/rollout"): Scope.PAGE,
}


def scope_of(method: str, path: str) -> Scope | None:
    """The route's scope; None when the table has no row for it."""
    return ROUTE_SCOPES.get(("GET" if method == "HEAD" else method, path))


class Kind(enum.Enum):
    ANONYMOUS = "anonymous"  # no Authorization header
    ADMIN = "admin"  # CONVERGERD_API_TOKEN
    READER = "reader"  # a live read token of one boundary
    INVALID = "invalid"  # a token that opens nothing: unknown, revoked, expired, undecodable


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request's token says it is. `boundary` and `name`: a read token's."""

    kind: Kind
    boundary: str | None = None
    name: str | None = None

    def sees(self, boundary: str) -> bool:
        """Whether it may read `boundary`."""
        return self.kind is Kind.ADMIN or (self.kind is Kind.READER
                                           and self.boundary == boundary)

    @property
    def label(self) -> str:
        """How logs and records name it (never the token)."""
        if self.kind is Kind.READER:
            return f"read token {self.name} ({self.boundary})"
        return f"{self.kind.value} token" if self.kind is not Kind.ANONYMOUS else "anonymous"


ANONYMOUS = Principal(Kind.ANONYMOUS)
ADMIN = Principal(Kind.ADMIN)
INVALID = Principal(Kind.INVALID)


class Verdict(enum.Enum):
    SERVE = "serve"
    UNAUTHENTICATED = "unauthenticated"  # 401
    FORBIDDEN = "forbidden"  # 403
    HIDDEN = "hidden"  # 404, as for a boundary that does not exist
    NO_ADMIN_TOKEN = "no_admin_token"  # noqa: S105 - a verdict's name. 503: no admin token


def decide(scope: Scope, who: Principal, *, boundary: str | None, admin_configured: bool,
           fleet_open: bool) -> Verdict:
    """Whether `who` is served a route of `scope`; `boundary`: the path's `{boundary}`."""
    if scope in (Scope.PUBLIC, Scope.PAGE) or (who.kind is Kind.ADMIN and (
            admin_configured or scope is not Scope.ADMIN)):
        return Verdict.SERVE
    if scope is Scope.ADMIN and not admin_configured:
        return Verdict.NO_ADMIN_TOKEN
    return _DECISIONS[scope, who.kind](boundary is not None and who.sees(boundary), fleet_open)


def _always(verdict: Verdict) -> Callable[[bool, bool], Verdict]:
    return lambda _sees, _open: verdict


# (scope, kind) -> the verdict, given whether the principal sees the path's boundary and
# whether the fleet views are open. The admin, the public routes and the page are decided
# above.
_DECISIONS: Mapping[tuple[Scope, Kind], Callable[[bool, bool], Verdict]] = {
    (Scope.FLEET, Kind.ANONYMOUS): lambda _sees, fleet_open: (
        Verdict.SERVE if fleet_open else Verdict.UNAUTHENTICATED),
    (Scope.FLEET, Kind.READER): _always(Verdict.FORBIDDEN),
    (Scope.FLEET, Kind.INVALID): _always(Verdict.UNAUTHENTICATED),
    (Scope.ADMIN, Kind.ANONYMOUS): _always(Verdict.UNAUTHENTICATED),
    (Scope.ADMIN, Kind.READER): _always(Verdict.FORBIDDEN),
    (Scope.ADMIN, Kind.INVALID): _always(Verdict.UNAUTHENTICATED),
    (Scope.BOUNDARY, Kind.ANONYMOUS): _always(Verdict.UNAUTHENTICATED),
    (Scope.BOUNDARY, Kind.READER): lambda sees, _open: (
        Verdict.SERVE if sees else Verdict.HIDDEN),
    (Scope.BOUNDARY, Kind.INVALID): _always(Verdict.UNAUTHENTICATED),
}


def unknown_boundary(boundary: str) -> tuple[int, dict[str, Any]]:
    """The answer for a boundary that does not exist, and for another boundary's paths asked
    with a read token: the same status and body, so a token tells nothing of other
    boundaries."""
    name = shown(boundary, style="text")
    return 404, {"error": f"unknown boundary {name!r}", "boundary": name}


def refusal(verdict: Verdict, scope: Scope) -> tuple[int, str]:
    """The status and message of a refusal (not `HIDDEN`: `unknown_boundary`)."""
    if verdict is Verdict.NO_ADMIN_TOKEN:
        return 503, "mutating endpoints are disabled: CONVERGERD_API_TOKEN is not set"
    if verdict is Verdict.FORBIDDEN:
        return 403, ("a boundary's read token reads only /v1/boundaries/{boundary}: this "
                     "route needs the admin token")
    if scope is Scope.BOUNDARY:
        return 401, "the admin token or this boundary's read token is required"
    return 401, "a valid bearer token is required"
