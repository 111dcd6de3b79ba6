"""Who a request is, and whether its route serves it: every request's bearer token read once
(`Guard.principal`), the route's scope looked up in `scopes.ROUTE_SCOPES` and decided by
`scopes.decide`, in a middleware and in every route's `Expect: 100-continue` handler (a client
refused never sends its body). Reads by a token are rate-limited per token.

The admin token (`CONVERGERD_API_TOKEN`) is compared in constant time. A read token is looked
up by its SHA-256 in `TokenBook`, the live tokens kept in memory: a request never waits on the
database for its token, and made-up tokens cost a hash, not a query. The book is read again
when the `read_tokens` table changes (a NOTIFY on `convergerd_tokens`, at most once a
`MIN_GAP_S`), at once on the replica that created or revoked a token, and every `REFRESH_S`
whatever happens (a notification lost while the listener reconnected). So a revoked token
stops working at once on the replica that revoked it, within about a second on the others,
and within `REFRESH_S` when a replica's listener was down; an expired one stops at its expiry
(checked per request).

A page that keeps the token in a cookie asks `Guard.principal_of(token)`: the same check.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from convergerd.api.scopes import (
    ADMIN,
    ANONYMOUS,
    INVALID,
    Kind,
    Principal,
    Scope,
    Verdict,
    decide,
    refusal,
    scope_of,
    unknown_boundary,
)
from convergerd.api.server import error_response, expect_continue
from convergerd.core.errors import ConvergerdError
from convergerd.core.report import utc_now
from convergerd.core.tokens import TokenRecord, check_by, token_digest
from convergerd.delivery.listener import Channel, ConnectionObserver, NotifySource
from convergerd.logthrottle import LogThrottle
from convergerd.ratelimit import TokenBucket

log = logging.getLogger(__name__)

CHANNEL = "convergerd_tokens"
# The book is read again this often whatever happens (the bound on a revocation's delay when
# a replica missed the notification).
REFRESH_S = 30.0
# Notifications (anyone with a login can send them) make at most one read per this long.
MIN_GAP_S = 1.0
# Tokens with a rate-limit bucket at once (the least recently used one goes first).
MAX_BUCKETS = 4096
# The request key holding its `Principal`.
PRINCIPAL = web.RequestKey("principal", Principal)


class TokenSource(Protocol):
    """Where the live tokens are (`convergerd.store.store.Store`)."""

    async def live_tokens(self) -> list[tuple[bytes, TokenRecord]]: ...


class TokenBook:
    """The live read tokens, by SHA-256, as last read from `source` (None: no database, no
    read token opens anything)."""

    def __init__(self, source: TokenSource | None, *, clock: Callable[[], dt.datetime] = utc_now,
                 refresh_s: float = REFRESH_S) -> None:
        self._source = source
        self._clock = clock
        self._refresh_s = refresh_s
        self._by_digest: Mapping[bytes, TokenRecord] = {}
        self.loaded_at: dt.datetime | None = None  # the last read that answered
        self._wake = asyncio.Event()
        self._throttle = LogThrottle(log)

    def find(self, token: str) -> TokenRecord | None:
        """The live token `token` is (not expired now), or None."""
        digest = token_digest(token)
        if digest is None:
            return None
        found = self._by_digest.get(digest)
        if found is None or not found.live(self._clock()):
            return None
        return found

    async def reload(self) -> None:
        """Read the live tokens; `ConvergerdError` (the database) when it cannot."""
        if self._source is None:
            return
        rows = await self._source.live_tokens()
        self._by_digest = dict(rows)
        self.loaded_at = self._clock()

    def changed(self, _payload: str = "", _sender: int = 0) -> None:
        """A notification: read the tokens again soon."""
        self._wake.set()

    async def run(self, notifications: NotifySource | None, *,
                  observer: ConnectionObserver | None = None) -> None:
        """Forever: read the tokens now, on each notification (at most once a `MIN_GAP_S`)
        and every `refresh_s`; `observer` is told when the listener connects and loses its
        connection."""
        if self._source is None:
            return
        async with asyncio.TaskGroup() as tg:
            if notifications is not None:
                channel = Channel(notifications, CHANNEL, self.changed, observer=observer)
                tg.create_task(channel.run(), name="read tokens listener")
            tg.create_task(self._follow(), name="read tokens")

    async def _follow(self) -> None:
        while True:
            try:
                await self.reload()
            except (ConvergerdError, OSError) as exc:
                self._throttle.log("reload", logging.WARNING, "could not read the read tokens "
                                   "(the last ones read still apply): %s", exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh_s):
                    await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(MIN_GAP_S)


def bearer(header: str) -> str | None:
    """The token of a `Bearer` authorization header; None when it is not one or does not
    decode (aiohttp keeps undecodable header bytes as surrogates)."""
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = given.strip()
    try:
        token.encode()
    except UnicodeEncodeError:
        return None
    return token


class Guard:
    """The scope check of every route (`scopes.ROUTE_SCOPES`), and the per-token read budget:
    `reads_per_s` a second, in bursts of twice that."""

    def __init__(self, *, admin_token: str | None, book: TokenBook, fleet_open: bool,
                 reads_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._admin = admin_token.encode() if admin_token else None
        self._book = book
        self._fleet_open = fleet_open
        self._rate = reads_per_s
        self._clock = clock
        self._buckets: collections.OrderedDict[str, TokenBucket] = collections.OrderedDict()

    def principal_of(self, token: str) -> Principal:
        """Who `token` is: the admin, a boundary's reader, or `INVALID`."""
        try:
            given = token.encode()
        except UnicodeEncodeError:
            return INVALID
        if self._admin is not None and hmac.compare_digest(given, self._admin):
            return ADMIN
        found = self._book.find(token)
        if found is None:
            return INVALID
        return Principal(Kind.READER, boundary=found.boundary, name=found.name)

    def principal(self, request: web.BaseRequest) -> Principal:
        """Who the request's `Authorization` header says it is (`ANONYMOUS` without one)."""
        header = request.headers.get("Authorization")
        if header is None:
            return ANONYMOUS
        token = bearer(header)
        return INVALID if token is None else self.principal_of(token)

    def check(self, request: web.Request, *, charge: bool = True
              ) -> web.StreamResponse | None:
        """None when the request's route serves its token (the `Principal` kept in the
        request as `PRINCIPAL`), else the refusal; with `charge`, a read takes from its
        token's budget."""
        resource = request.match_info.route.resource
        if resource is None:  # no route: aiohttp's own 404 or 405
            return None
        scope = scope_of(request.method, resource.canonical) or Scope.ADMIN
        if scope in (Scope.PUBLIC, Scope.PAGE):  # the page reads its cookie itself
            return None
        who = self.principal(request)
        boundary = request.match_info.get("boundary")
        verdict = decide(scope, who, boundary=boundary, admin_configured=self._admin is not None,
                         fleet_open=self._fleet_open)
        if verdict is Verdict.HIDDEN:
            status, body = unknown_boundary(boundary or "")
            return web.json_response(body, status=status)
        if verdict is not Verdict.SERVE:
            status, message = refusal(verdict, scope)
            response = error_response(status, message)
            if status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="convergerd"'
            return response
        request[PRINCIPAL] = who
        if charge and who.kind is not Kind.ANONYMOUS and request.method in ("GET", "HEAD"):
            return self._limited(who)
        return None

    def _limited(self, who: Principal) -> web.Response | None:
        retry_after = self.read_wait(who)
        if retry_after == 0:
            return None
        response = error_response(
            429, f"too many reads with this token: {self._rate:g} per second "
            f"(CONVERGERD_TOKEN_READS_PER_SECOND); retry after {retry_after} s",
            retry_after_seconds=retry_after)
        response.headers["Retry-After"] = str(retry_after)
        return response

    def read_wait(self, who: Principal) -> int:
        """A read by `who` taken from its token's budget: 0, or when over it the whole
        seconds to wait (nothing taken). The page charges its reads here too."""
        key = who.name if who.kind is Kind.READER and who.name else "admin"
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(
                rate=self._rate, burst=max(1, round(2 * self._rate)), clock=self._clock)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        wait = bucket.try_take()
        return 0 if wait <= 0 else max(1, math.ceil(wait))

    def middleware(self) -> Any:
        @web.middleware
        async def guard(request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            refused = self.check(request)
            return refused if refused is not None else await handler(request)

        return guard

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """Every route's `Expect: 100-continue` handler: the scope is checked before the
        client is told to send its body, so a client refused never sends one."""
        refused = self.check(request, charge=False)  # the middleware charges the read
        if refused is not None:
            refused.force_close()  # the body it held back is not read
            return refused
        return await expect_continue(request)


def principal_of_request(request: web.Request) -> Principal:
    """The principal `Guard.check` found for the request (`ANONYMOUS` on a public route)."""
    found: Principal = request.get(PRINCIPAL, ANONYMOUS)
    return found


def asked_by(fields: Mapping[str, Any], request: web.Request) -> str:
    """Who asked for a change, as recorded: the body's `by` (`RuleError` unless printable ASCII
    of at most `tokens.BY_MAX_CHARS`), else the name of the request's token."""
    if "by" in fields:
        return check_by(fields["by"])
    return principal_of_request(request).label
