"""The HTTP server (aiohttp, one port): its bounds, the health, metrics and status views, and
what every handler shares (the JSON error answer, ids read from the path). Which path is served
by which handler is `convergerd.api.app`; the save and delete handlers are
`convergerd.api.mutations`.

Status works on every replica: what this replica observed is merged with what the database
recorded (whoever led), the newer fact winning, so a standby shows the leader's results. The
handlers only read: `/status` is the live state (`convergerd.status.state`, fed by rounds and the
periodic database sync, `convergerd.status.sync`), seen through its read-only face
(`convergerd.status.reader.StatusReader`) and shown by `convergerd.status.document`; the
per-cluster and per-policy views add that one cluster's or policy's rows, read in one query
through a small gate with a short timeout, so status requests cannot take the database
connections the round needs.

Liveness: a heartbeat task notes the loop time every second and how late it woke up (the
event-loop lag, also a metric). A fully blocked loop cannot answer `/healthz` at all, which fails
the probe by timeout; a loop that was blocked for longer than `stale_after_s` answers 500 on the
first request after it recovers; a supervised task that ended (crashed or stopped) answers 500
naming it, and so does one that runs but is stuck (`HealthCheck.check`: the elector's loop,
the round loop). Readiness (`/readyz`) fails for what a restart would not fix: invalid
settings, a database that does not answer, a home cluster this replica cannot elect through, a
Lease held by someone who does not renew it (`HealthCheck.ready_check`); standbys behind a live
leader are ready.

Secrets (the API token, the DSN password, the DSN itself) never appear in a response: handlers
only show redacted values, and a last middleware replaces any that slipped into a body.

Every request is untrusted, authenticated or not: an id that is not a valid policy id (a DNS
label of at most 50 characters) or cluster id is refused with 400 before the database is asked;
an `Authorization` header that does not decode is a wrong token (401); a request line or header
longer than `MAX_LINE_BYTES` is refused by the server (400, JSON) with a fixed text that quotes
nothing of the request (a header's first bytes may be a credential), logged without a
traceback; ids and paths are escaped (`shown`) wherever they are logged, so a request cannot
forge a line. `Expect: 100-continue` is answered by each route's expect handler
(`expect_continue`; the mutations check the token first).

The server is bounded (`serve`, `HttpLimits`): a cap on open connections (at the cap the one
idle the longest is closed for a new one; a connection whose request arrived is never idle,
and with none idle the new one is answered 503 with Retry-After), a deadline for a
request's line and headers, one for its body (`convergerd.api.mutations`) and for an answer
left unread, and an idle keep-alive timeout. What the bounds do is counted (`BoundsObserver`)
and logged through a `LogThrottle`, anyone can set them off.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import logging
import math
import os
import re
import resource
import socket
import struct
import termios
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import (
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    PayloadEncodingError,
)
from aiohttp.web_protocol import RequestHandler

from convergerd import __version__
from convergerd.api.openapi import document
from convergerd.config import (
    SETTINGS_BY_KEY,
    HttpLimits,
    Settings,
    StatusReadTuning,
    check_settings,
    dsn_secrets,
)
from convergerd.core.errors import ConfigError, ConvergerdError
from convergerd.core.model import (
    DELIVERED_RULE_TYPES,
    ClusterId,
    PolicyId,
    RuleError,
    check_cluster_id,
    check_policy_id,
)
from convergerd.core.rows import ClusterStatusRows, PolicyStatusRows
from convergerd.core.shown import SHOWN_MAX_CHARS, describe, shown
from convergerd.logthrottle import WINDOW_S, LogThrottle
from convergerd.ratelimit import TokenBucket
from convergerd.status.document import (
    audit_sample_view,
    cluster_summary,
    merged_policies,
    snapshot_head,
    sorted_clusters,
)
from convergerd.status.listing import (
    UNSUPPORTED_LISTED,
    WORST_LISTED,
    FleetTally,
    Page,
    bounded_unsupported,
    listing,
    page_ids,
    page_request,
    page_url,
)
from convergerd.status.metrics import CONTENT_TYPE, HTTP_BOUNDS_REASONS, Metrics
from convergerd.status.phases import age_s, stale_after_s
from convergerd.status.reader import StatusReader
from convergerd.status.records import PolicyRecord, merge_records
from convergerd.status.views import (
    iso,
    policy_admission_view,
    policy_audit_view,
    record_view,
    unsupported_of,
)

log = logging.getLogger(__name__)

# How long /readyz waits for the database.
DB_TIMEOUT_S = 5.0
# The status views share one token bucket (`Settings.status_reads_per_s`; its burst and what a
# view costs: `StatusReadTuning`). The paths, as the shed counter labels them:
STATUS_VIEWS = ("/status", "/v1/clusters/{id}", "/v1/policies/{id}/status",
                "/v1/boundaries/{boundary}", "/v1/boundaries/{boundary}/policies/{id}",
                "/v1/policies/{id}/revisions", "/v1/boundaries/{boundary}/policies/{id}/revisions",
                "/v1/rollouts", "/v1/policies/{id}/rollout", "/v1/boundaries/{boundary}/rollouts",
                "/v1/boundaries/{boundary}/policies/{id}/rollout")

# The server's parser limits: a longer request line (the URL) or header line is refused (400).
MAX_LINE_BYTES = 8190
MAX_HEADERS = 64
T = TypeVar("T")
Id = TypeVar("Id", PolicyId, ClusterId)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class StatusSource(Protocol):
    """What the HTTP server reads from the database (`convergerd.store.store.Store`): one
    cluster or one policy at a time, never the whole fleet."""

    async def ping(self) -> None: ...
    async def cluster_status(
        self, cluster_id: str, policies: Sequence[str], /
    ) -> ClusterStatusRows: ...
    async def policy_status(self, policy_id: str, /) -> PolicyStatusRows | None: ...


# ---------------------------------------------------------------------------------------------
# Liveness


class Health(Protocol):
    """What `/healthz` and `/readyz` report (`convergerd.supervise.HealthCheck`)."""

    lag_s: float

    def problems(self) -> list[str]: ...
    def not_ready(self) -> list[tuple[str, str]]: ...


# ---------------------------------------------------------------------------------------------
# Helpers


def json_bytes(value: Any) -> bytes:
    """Compact JSON (orjson: several times the standard library's speed, which matters
    for a `/status` of a large fleet); the standard library's, which escapes them, for a value
    orjson refuses (a string with a lone surrogate)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, separators=(",", ":")).encode()


def secrets_of(settings: Settings) -> list[str]:
    """Every secret value a response must never carry."""
    found: list[str] = []
    if settings.api_token:
        found.append(settings.api_token)
    if settings.database_url and settings.database_url_redacted != settings.database_url:
        # Only a DSN carrying a password is a secret; a password-less one is what status shows.
        found.append(settings.database_url)
        found.extend(dsn_secrets(settings.database_url))
    return [s for s in found if len(s) >= 4]  # a 1-3 character "secret" would shred text


def error_response(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _bad_id(kind: str, value: str, exc: RuleError) -> web.Response:
    why = shown(str(exc), 2 * SHOWN_MAX_CHARS, style="text")
    return error_response(400, f"bad {kind} id: {why}", **{kind: shown(value, style="text")})


def policy_id_from_request(request: web.Request) -> PolicyId | web.Response:
    """The `{id}` of a policy path, or the 400 answer naming why it cannot be one."""
    return _path_id(request, "policy", check_policy_id, PolicyId)


def cluster_id_of(request: web.Request) -> ClusterId | web.Response:
    """The `{id}` of a cluster path, or the 400 answer naming why it cannot be one."""
    return _path_id(request, "cluster", check_cluster_id, ClusterId)


def _path_id(request: web.Request, kind: str, check: Callable[[str], object],
             make: Callable[[str], Id]) -> Id | web.Response:
    value = request.match_info["id"]
    try:
        check(value)
    except RuleError as exc:
        return _bad_id(kind, value, exc)
    return make(value)


# A request the HTTP parser refused is answered and logged with a fixed text per kind: aiohttp's
# messages quote the line (up to 100 bytes of it, an `Authorization` header's credential
# included), and that must never reach a log or go back out.
_MALFORMED: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (LineTooLong, f"a request line or header is longer than {MAX_LINE_BYTES} bytes"),
    (InvalidHeader, "a header is malformed"),
    (BadHttpMethod, "not an HTTP request (bad method)"),
    (BadStatusLine, "not an HTTP request line"),
    (InvalidURLError, "the request target is not a valid URL"),
    (PayloadEncodingError, "the body's length or encoding is malformed"),
)
# aiohttp's messages that quote nothing of the request.
_FIXED_MESSAGES = frozenset({
    "Too many headers received", "Missing 'Host' header in request.",
    "Bad line ending, expected CRLF", "Data after `Connection: close`",
    "Request has invalid `Transfer-Encoding`",
})


def malformed_text(exc: HttpProcessingError) -> str:
    """What to say of a request the parser refused: never a byte of the request."""
    for kind, text in _MALFORMED:
        if isinstance(exc, kind):
            return text
    if exc.message in _FIXED_MESSAGES:
        return exc.message
    return "a malformed request"


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, but a request the HTTP parser refused (too long a line, too many
    headers, bytes that are not HTTP) is a warning with a fixed text, not an ERROR with a
    traceback and the request's bytes, and a few a minute (`LogThrottle`): anyone can send
    them."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})
        self.throttle = LogThrottle(logger)

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            remote = shown(str(args[0]), style="text") if args else "?"
            self.throttle.log("malformed", logging.WARNING, "refused a malformed request from "
                              "%s: %s %s", remote, exc_info.code, malformed_text(exc_info))
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


def server_options() -> dict[str, Any]:
    """Keyword arguments for `web.AppRunner` (and aiohttp's `TestServer`): no access log, the
    parser's limits, and the server logger that does not dump a traceback per bad request."""
    return {
        "access_log": None,
        "max_line_size": MAX_LINE_BYTES,
        "max_field_size": MAX_LINE_BYTES,
        "max_headers": MAX_HEADERS,
        "logger": _ServerLog(logging.getLogger("aiohttp.server")),
    }


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """The `expect_handler` of every route: `100 Continue`, or a 417 that does not quote an
    unknown expectation. Routes that need a token check it first
    (`mutations.SaveHandlers.expect`)."""
    if request.version != HttpVersion11:
        return None
    if request.headers.get("Expect", "").lower() != "100-continue":
        response = error_response(417, "the only expectation understood is 100-continue")
        response.force_close()
        return response
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # what follows is the answer's head, as aiohttp does
    return None


def _known_expectations(
    handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """`handler` (the app's), with an `Expect` other than 100-continue refused first, on every
    path: aiohttp's own answer for unknown paths quotes the header back, in plain text."""

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        expect = request.headers.get("Expect")
        if expect is not None and expect.lower() != "100-continue":
            refused = error_response(417, "the only expectation understood is 100-continue")
            refused.force_close()
            return refused
        return await handler(request)

    return handle


# ---------------------------------------------------------------------------------------------
# The server's bounds (`HttpLimits`, the CONVERGERD_HTTP_* settings)

# What the bounds did, by reason (`HTTP_BOUNDS_REASONS`): each counted (`BoundsObserver`),
# logged through a `LogThrottle` (a few lines a minute per reason, then a summary when the
# minute ends).
_BOUNDS_TEXT = {
    "over_capacity": "answered 503 (over capacity: every connection up to "
                     "CONVERGERD_HTTP_MAX_CONNECTIONS is serving or sending a request)",
    "evicted_idle": "closed an idle connection to make room for a new one",
    "header_timeout": "closed a connection whose request line and headers were late",
    "answer_unread": "cut a connection that left its answer unread",
}
# Over capacity: a request is answered 503 with this Retry-After.
RETRY_AFTER_S = 1
# Past the cap (no connection idle), a connection gets 503 written at once, and what the
# client sends is read and dropped until its request's head is in (one loop turn when it came
# with the connection) or for at most this long: closing on a request that arrives unread would
# reset the connection, and the client could lose the answer. At most half the cap wait so for
# a request that has not come (one whose request is in waits its turn whatever the count);
# past that, a connection that brought nothing of a request yet gets its 503 and is closed at
# once (a client that reads before its request's reset comes back still has the answer).
REFUSED_LINGER_S = 2.0
# A request head that says a body follows (which we would not read): linger for the timer.
_DECLARES_BODY = re.compile(rb"(?im)^(content-length:[ \t]*0*[1-9]|transfer-encoding:)")
# A connection that has not sent a byte yet is idle (may be closed for a new one) only once it
# is this old (and at most a quarter of the header timeout): a client sends its request just
# after connecting, and in a burst the loop accepts many connections before it reads any.
FRESH_GRACE_S = 1.0
# Connections the kernel holds before the loop accepts them (net.core.somaxconn caps it).
LISTEN_BACKLOG = 1024


class BoundsObserver(Protocol):
    """Counts what the server's bounds did (`convergerd.status.metrics.Metrics`)."""

    def http_connection_refused(self, reason: str) -> None:
        """`reason`: one of `HTTP_BOUNDS_REASONS`."""
        ...


def _bytes_waiting(transport: asyncio.BaseTransport | None) -> int:
    """Bytes the kernel holds for us on this connection that we have not read yet: a request
    may have arrived there before the loop read it."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    waiting: int = struct.unpack("i", raw)[0]
    return waiting


class _Connections:
    """The open connections of one server: the cap, those past it being answered 503, and
    what the bounds did, counted and logged."""

    def __init__(self, limits: HttpLimits, observer: BoundsObserver | None,
                 log_window_s: float = WINDOW_S) -> None:
        self.limits = limits
        self.open: dict[_Connection, None] = {}  # oldest first
        self.lingering: set[_Connection] = set()  # past the cap: 503 written, closing
        self._observer = observer
        self.throttle = LogThrottle(log, window_s=log_window_s)

    def admit(self, connection: _Connection) -> str:
        """Where `connection` goes: `open` (at the cap, the connection idle the longest is
        closed for it; idle: `_Connection.quiet` and no byte of a request waiting in the
        kernel), `refused` (no connection idle: 503, then closed once its request is
        in) or `refused_at_once` (half the cap lingering already, and nothing of a request
        came with it: 503, then closed at once)."""
        cap = self.limits.max_connections
        if len(self.open) >= cap:
            oldest = self._idle_the_longest()
            if oldest is None:
                self.note("over_capacity")
                # A request already in lingers whatever the count (it closes within a turn).
                if (len(self.lingering) < max(1, cap // 2)
                        or _bytes_waiting(connection.transport) > 0):
                    self.lingering.add(connection)
                    return "refused"
                return "refused_at_once"
            self.note("evicted_idle")
            self.forget(oldest)  # now: it is gone before its connection_lost comes
            oldest.force_close()  # a FIN: nothing of a request waits to be reset
        self.open[connection] = None
        return "open"

    def _idle_the_longest(self) -> _Connection | None:
        """The open connection idle the longest; the kernel is asked (a system call) only
        about the candidates in that order, until one has no byte waiting."""
        now = time.monotonic()
        quiet = sorted((c for c in self.open if c.quiet(now)), key=lambda c: c.idle_since)
        return next((c for c in quiet if _bytes_waiting(c.transport) == 0), None)

    def forget(self, connection: _Connection) -> None:
        self.open.pop(connection, None)
        self.lingering.discard(connection)

    def note(self, why: str, *, logged: bool = True) -> None:
        assert why in HTTP_BOUNDS_REASONS, why
        if self._observer is not None:
            self._observer.http_connection_refused(why)
        if logged:
            lim = self.limits
            self.throttle.log(why, logging.WARNING, "HTTP server %s; cap %d, header timeout "
                              "%g s, answer left unread %g s", _BOUNDS_TEXT.get(why, why),
                              lim.max_connections, lim.header_timeout_s, lim.body_timeout_s,
                              extra={"reason": why})


def _raw_error(status: int, message: str, *, retry_after_s: int | None = None) -> bytes:
    """A whole JSON error answer, for a connection no request handler owns."""
    body = json.dumps({"error": message}).encode()
    phrase = HTTPStatus(status).phrase
    retry = f"Retry-After: {retry_after_s}\r\n" if retry_after_s is not None else ""
    return (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n").encode() + body


_OVER_CAPACITY = ("too many connections: every one is serving a request; retry in "
                  f"{RETRY_AFTER_S} s")


class _Connection(RequestHandler):
    """aiohttp's connection handler, bounded: the request line and headers must arrive within
    the header timeout (counted from the opening, or from the first byte of a later request);
    an answer the client leaves unread for the body timeout cuts the connection; the server's
    cap is checked on opening (`_Connections.admit`). aiohttp's own keep-alive timeout is the
    idle timeout. Requests refused by the parser are answered in JSON, as every other error,
    with a fixed text."""

    __slots__ = (
        "_head_started",
        "_head_timer",
        "_linger_timer",
        "_lingering_head",
        "_unread_timer",
        "busy",
        "connections",
        "idle_since",
        "served",
    )

    def __init__(self, manager: Any, connections: _Connections, **options: Any) -> None:
        super().__init__(manager, loop=asyncio.get_running_loop(), **options)
        self.connections = connections
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False
        self._unread_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._lingering_head: bytearray | None = None  # refused: what came of the request
        self.busy = 0  # requests in the app now
        self.served = False  # a request was answered (then it is a kept-alive connection)
        self.idle_since = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        admitted = self.connections.admit(self)
        if admitted != "open":
            self._refuse(transport, linger=admitted == "refused")
            return
        self._start_head_timer()

    def _refuse(self, transport: asyncio.BaseTransport, *, linger: bool) -> None:
        """503 at once; with `linger`, what the client sends is then read and dropped (the
        parser is off) until its request's head is in, it closes, or `REFUSED_LINGER_S`
        passes: closing on a request that arrives unread would reset the connection, and the
        client could lose the answer."""
        assert isinstance(transport, asyncio.Transport)
        self.close()  # aiohttp parses nothing more on it
        transport.write(_raw_error(503, _OVER_CAPACITY, retry_after_s=RETRY_AFTER_S))
        if transport.can_write_eof():
            transport.write_eof()
        if not linger:
            transport.close()
            return
        self._lingering_head = bytearray()
        self._linger_timer = self._loop.call_later(REFUSED_LINGER_S, transport.close)

    def _linger(self, data: bytes) -> None:
        """Drop what a refused client sends; close once its request's head is in and says no
        body follows (nothing more comes to be reset by the close)."""
        head = self._lingering_head
        assert head is not None
        head += data[: MAX_LINE_BYTES - len(head)]  # enough to find the head's end
        end = head.find(b"\r\n\r\n")
        if end >= 0 and not _DECLARES_BODY.search(head, 0, end) and self.transport is not None:
            self.transport.close()

    def quiet(self, now: float) -> bool:
        """No request in the app, none being read, and not just opened (its request may be on
        the way). Idle, closing it loses no request, when no byte of one waits in the kernel
        either (`_bytes_waiting`)."""
        grace_s = min(FRESH_GRACE_S, self.connections.limits.header_timeout_s / 4)
        return (self.busy == 0 and not self._head_started and self.transport is not None
                and (self.served or now - self.idle_since >= grace_s))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.connections.forget(self)
        for timer in (self._head_timer, self._unread_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering_head is not None:
            self._linger(data)
            return
        if self.busy == 0 and data:
            self._head_started = True
            if self._head_timer is None:  # the first byte of a later request
                self._start_head_timer()
        super().data_received(data)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._unread_timer is None:
            self._unread_timer = self._loop.call_later(
                self.connections.limits.body_timeout_s, self._unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._unread_timer is not None:
            self._unread_timer.cancel()
            self._unread_timer = None

    def request_started(self) -> None:
        self.busy += 1
        self._head_started = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def request_ended(self) -> None:
        self.busy -= 1
        self.served = True
        self.idle_since = time.monotonic()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _start_head_timer(self) -> None:
        self._head_timer = self._loop.call_later(self.connections.limits.header_timeout_s,
                                                 self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.busy or self.transport is None:
            return
        self.connections.note("header_timeout")
        if self._head_started:  # a client that is sending something is told why
            self.transport.write(_raw_error(
                408, "the request line and headers did not arrive within "
                f"{self.connections.limits.header_timeout_s:g} s"))
        self.force_close()

    def _unread(self) -> None:
        self._unread_timer = None
        self.connections.note("answer_unread")
        self.abort()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs, checks nothing was sent
        if isinstance(exc, HttpProcessingError):  # the parser refused it: anyone can send one
            self.connections.note("malformed", logged=False)  # `_ServerLog` logs it
            text = malformed_text(exc)
        else:
            text = message if message and status < 500 else HTTPStatus(status).phrase.lower()
        response = error_response(status, shown(text, 2 * SHOWN_MAX_CHARS, style="text"))
        response.force_close()
        return response


@web.middleware
async def _track_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tells the connection a request is in the app or its answer is being sent: it is not
    idle, its header timeout does not run (and cannot write into the answer)."""
    connection = request.protocol
    if not isinstance(connection, _Connection):
        return await handler(request)
    connection.request_started()
    try:
        response = await handler(request)
        # Sent here rather than by aiohttp just after (which then finds it sent), so that the
        # connection is busy until the answer is out; a client gone meanwhile is aiohttp's.
        with contextlib.suppress(ConnectionError):
            await response.prepare(request)
            await response.write_eof()
        return response
    finally:
        connection.request_ended()


class _Site(web.BaseSite):
    """A TCP site whose connections are `_Connection`s (aiohttp's `TCPSite` makes plain
    ones)."""

    __slots__ = ("_factory", "_host", "_port")

    def __init__(self, runner: web.AppRunner, host: str, port: int,
                 factory: Callable[[], _Connection]) -> None:
        super().__init__(runner)
        self._host, self._port, self._factory = host, port, factory

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._server = await asyncio.get_running_loop().create_server(
            self._factory, self._host, self._port, backlog=self._backlog)
        # The kernel may hold more pending connections than the loop accepts a turn (asyncio
        # accepts `backlog` a turn, and listens with as many): a burst then waits there with
        # its requests, instead of having its handshakes and requests dropped and resent
        # seconds later, when their connections look silent.
        for listening in server.sockets:
            with socket.socket(fileno=os.dup(listening.fileno())) as same:
                same.listen(LISTEN_BACKLOG)


async def serve(app: web.Application, host: str, port: int, limits: HttpLimits, *,
                address_setting: str = "http_addr",
                observer: BoundsObserver | None = None,
                log_window_s: float = WINDOW_S) -> web.AppRunner:
    """`app` served on `host:port` within `limits`, with `server_options()`;
    `runner.cleanup()` stops it. The one server setup of the daemon and the operator (it adds
    the middleware that tells a connection when a request is in the app: serve an app once).
    An address it cannot listen on is a `ConfigError` naming `address_setting`. What the
    bounds do is counted by `observer` and logged a few lines per `log_window_s` and reason."""
    _check_descriptors(limits)
    connections = _Connections(limits, observer, log_window_s)
    app.middlewares.insert(0, _track_requests)  # outermost: the whole time in the app
    options = {**server_options(), "keepalive_timeout": limits.idle_timeout_s,
               "lingering_time": limits.body_timeout_s}
    runner = web.AppRunner(app, **options)
    await runner.setup()
    manager = runner.server
    assert manager is not None
    manager.request_handler = _known_expectations(manager.request_handler)

    def connection() -> _Connection:
        return _Connection(manager, connections, **options)

    try:
        await _Site(runner, host, port, connection).start()
    except OSError as exc:
        await runner.cleanup()
        # A taken or unusable port is a setting to change, not a crash to debug.
        setting = SETTINGS_BY_KEY[address_setting]
        why = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else (
            exc.strerror or str(exc))  # errno's text: asyncio's repeats the address
        raise ConfigError(setting.env, f"{host}:{port}",
                          f"cannot listen there: {why}; choose another address "
                          f"({setting.flag})") from None
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _check_descriptors(limits: HttpLimits) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and limits.max_connections > soft // 2:
        log.warning("CONVERGERD_HTTP_MAX_CONNECTIONS is %d, more than half of this process's "
                    "descriptor limit (%d): HTTP clients could take the descriptors the "
                    "database pool and the clusters need", limits.max_connections, soft)


def bound_port(runner: web.AppRunner) -> int:
    """The port `serve` listens on (the one the system chose for port 0)."""
    port: int = runner.addresses[0][1]
    return port


# ---------------------------------------------------------------------------------------------
# The views that only read


@dataclass(frozen=True, slots=True)
class Built:
    """A body built for many requests: the state's version and the clock when its build
    began, the loop time the build took, the body."""

    version: int
    at: float
    cost_s: float
    body: bytes

    def young(self, now: float, tuning: StatusReadTuning) -> bool:
        """Younger at `now` than `tuning.reuse_builds` times what its build cost."""
        return now - self.at < tuning.reuse_builds * self.cost_s

    def fresh(self, now: float, version: int, tuning: StatusReadTuning) -> bool:
        """Whether to serve it at `now` to a state at `version` (see
        `StatusReadTuning.reuse_s`)."""
        return self.young(now, tuning) or (version == self.version
                                           and now - self.at <= tuning.reuse_s)


@dataclass(frozen=True, slots=True)
class StatusBuilt(Built):
    """A `/status` body, and what its pages reuse: the document but its listing and clusters
    (`head`, an unclosed JSON object; `summary`, the same as data, never changed), the state's
    time it was built at, every id in order and in the body's order (`worst`, worst first)."""

    head: bytes
    now: dt.datetime
    ids: Sequence[ClusterId]
    summary: Mapping[str, Any]
    worst: Sequence[ClusterId]


def _status_body(head: bytes, shown_listing: Mapping[str, Any], pieces: list[bytes]) -> bytes:
    return b"".join((head, b',"listing":', json_bytes(shown_listing), b',"clusters":[',
                     b",".join(pieces), b"]}"))


class Views:
    """The handlers that only read: health, readiness, metrics, status, the OpenAPI document."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        state: StatusReader,
        store: StatusSource,
        settings: Settings,
        health: Health,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the monotonic clock the reuse of built bodies is judged by (their age and
        what their build cost)."""
        self.metrics = metrics
        self.state = state
        self.store = store
        self.settings = settings
        self.health = health
        self.tuning = settings.tuning.status_reads
        self.db_gate = asyncio.Semaphore(self.tuning.db_concurrency)
        self.clock = clock
        self._status_built: StatusBuilt | None = None
        self._status_building: asyncio.Task[StatusBuilt] | None = None
        self._metrics_built: Built | None = None
        self.status_slice = self.tuning.slice_clusters
        self.db_timeout_s = self.tuning.db_timeout_s
        self.openapi_doc = document()
        rate = settings.status_reads_per_s
        self.read_budget = TokenBucket(rate=rate,
                                       burst=max(1, round(self.tuning.burst_factor * rate)),
                                       clock=time.monotonic)

    def limited(self, path: str, handler: Handler) -> Handler:
        """`handler` behind the status views' budget: over it, 429 with Retry-After (whole
        seconds, as HTTP has it), counted per `path`."""

        async def serve(request: web.Request) -> web.StreamResponse:
            wait = self.read_budget.try_take()
            if wait <= 0:
                return await handler(request)
            self.metrics.status_read_shed(path)
            retry_after = max(1, math.ceil(wait))
            response = error_response(
                429, f"too many status reads: this replica serves "
                f"{self.read_budget.rate:g} per second (CONVERGERD_STATUS_READS_PER_SECOND); "
                f"retry after {retry_after} s", retry_after_seconds=retry_after)
            response.headers["Retry-After"] = str(retry_after)
            return response

        return serve

    # -- health ----------------------------------------------------------------------------

    async def healthz(self, _: web.Request) -> web.Response:
        problems = self.health.problems()
        if problems:
            return error_response(500, "; ".join(problems), problems=problems)
        return web.json_response({"ok": True, "loop_lag_seconds": round(self.health.lag_s, 4)})

    async def readyz(self, request: web.Request) -> web.Response:
        """As kube-apiserver's: `?exclude=<reason>` (repeatable) leaves that check out, so a
        sidecar's pod need not leave its Service over the election (the metric still shows
        it); the settings are always checked."""
        excluded = set(request.query.getall("exclude", ()))
        try:
            check_settings(self.settings)
        except ConfigError as exc:
            return error_response(503, f"settings invalid: {exc}", reason="settings")
        failing = [(r, p) for r, p in self.health.not_ready() if r not in excluded]
        if failing:
            return error_response(503, "; ".join(problem for _, problem in failing),
                                  reason=failing[0][0], problems=[p for _, p in failing])
        if "database" in excluded:
            return web.json_response({"ready": True})
        try:
            async with asyncio.timeout(DB_TIMEOUT_S), self.db_gate:
                await self.store.ping()
        except TimeoutError:
            return error_response(503, f"database did not answer within {DB_TIMEOUT_S:g} s",
                                  reason="database")
        except (ConvergerdError, OSError) as exc:
            return error_response(503, f"database unreachable: {describe(exc)}",
                                  reason="database")
        return web.json_response({"ready": True})

    async def openapi(self, _: web.Request) -> web.Response:
        return web.json_response(self.openapi_doc)

    async def metrics_text(self, _: web.Request) -> web.Response:
        """The exposition, reused while younger than `StatusReadTuning.reuse_builds` times what
        it cost to write and at most `StatusReadTuning.metrics_reuse_max_s` old (a scrape of a
        large fleet holds the loop a noticeable time: bench/RESULTS.md, "Figures once quoted in
        the code"; a Prometheus that scrapes every 15 s always gets a new one)."""
        built = self._metrics_built
        began = self.clock()
        if (built is None or not built.young(began, self.tuning)
                or began - built.at > self.tuning.metrics_reuse_max_s):
            body = self.metrics.render()
            built = self._metrics_built = Built(0, began, self.clock() - began, body)
        return web.Response(body=built.body, headers={"Content-Type": CONTENT_TYPE})

    # -- status ----------------------------------------------------------------------------
    # /status only reads the live state (kept by rounds and the periodic database sync). The
    # per-cluster and per-policy views read that one cluster or policy in one query, through
    # `_read` (a few at a time, short timeout): the rounds' database connections stay free.

    async def read(self, query: Callable[[], Awaitable[T]]) -> T:
        async with asyncio.timeout(self.db_timeout_s), self.db_gate:
            return await query()

    def _database(self, error: str | None) -> dict[str, Any]:
        return {"reachable": error is None, "error": error,
                "url": self.settings.database_url_redacted,
                "synced_at": iso(self.state.synced_at)}

    def read_error(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"the database did not answer within {self.db_timeout_s:g} s"
        return describe(exc)

    async def status(self, request: web.Request) -> web.Response:
        """The document (every cluster, or past `status_max_clusters` a summary), or with
        `?limit=&after=` a page of it (`convergerd.status.listing`)."""
        try:
            page = page_request(request.query, self.settings.status_max_clusters)
        except RuleError as exc:
            return error_response(400, str(exc), reason="query")
        built = await self.status_built()
        body = built.body if page is None else await self._status_page(built, page)
        return web.Response(body=body, content_type="application/json")

    async def status_built(self) -> StatusBuilt:
        """The `/status` document last built, or a new one when it is no longer fresh (one
        build at a time: a request arriving during one waits for it); what `/status` and the
        web page's fleet show."""
        built = self._status_built
        if built is None or not built.fresh(self.clock(), self.state.version, self.tuning):
            if self._status_building is None:
                self._status_building = asyncio.create_task(self._build_status(),
                                                            name="status build")
                self.charge(len(self.state.clusters))
            # Requests arriving during a build wait for that one; a request that goes away
            # does not stop it.
            built = await asyncio.shield(self._status_building)
        return built

    async def _status_page(self, built: StatusBuilt, page: Page) -> bytes:
        """`page` of the clusters in id order, under the head of `built` (its `now`, counts,
        roll-ups): built per request, at most `status_max_clusters` summaries, in slices."""
        ids, more = page_ids(built.ids, page)
        self.charge(len(ids))
        state = self.state
        pieces: list[bytes] = []
        listed = 0
        for start in range(0, len(ids), self.status_slice):
            await asyncio.sleep(0)
            summaries = [cluster_summary(state, c, built.now)
                         for cid in ids[start:start + self.status_slice]
                         if (c := state.clusters.get(cid)) is not None]  # not removed since
            listed += len(summaries)
            if summaries:
                pieces.append(json_bytes(summaries)[1:-1])
        following = page_url(page.limit, ids[-1]) if more else None
        shown_listing = listing(order="id", listed=listed, after=page.after,
                                complete=page.after is None and not more, following=following)
        return _status_body(built.head, shown_listing, pieces)

    async def _build_status(self) -> StatusBuilt:
        try:
            built = self._status_built = await self.build_status()
            return built
        finally:
            self._status_building = None

    async def build_status(self) -> StatusBuilt:
        """The `/status` document (`status.document.snapshot`, and this server's version and
        database), built in slices of `status_slice` clusters with the loop free between them,
        each slice encoded as it is made. A body thus shows the state as it was during its
        build, from when it began (its `now`). Past `status_max_clusters` clusters, a summary:
        every cluster counted, the worst `WORST_LISTED` listed, `UNSUPPORTED_LISTED` named
        (fewer under a lower threshold)."""
        state, clock = self.state, self.clock
        began = clock()
        version, now = state.version, state.clock()
        order = sorted_clusters(state, now)
        ids = state.cluster_ids()  # the pages' order
        cost = clock() - began
        most = self.settings.status_max_clusters
        complete = len(order) <= most
        listed = len(order) if complete else min(WORST_LISTED, most)
        counted = FleetTally(stale_after_s(state.interval_s))
        pieces: list[bytes] = []
        unsupported: list[tuple[str, str | None]] = []
        for start in range(0, len(order), self.status_slice):
            await asyncio.sleep(0)
            sliced = clock()
            summaries = [cluster_summary(state, c, now)
                         for c in order[start:start + self.status_slice]]
            counted.add(summaries)
            unsupported.extend(unsupported_of(summaries))
            if start < listed:
                pieces.append(json_bytes(summaries[:listed - start])[1:-1])
            cost += clock() - sliced
        await asyncio.sleep(0)
        sliced = clock()
        head = {**snapshot_head(state, now, unsupported), "version": __version__,
                "database": self._database(state.sync_error), "fleet": counted.counts}
        if not complete:
            head["unsupported_by_version"] = bounded_unsupported(
                head["unsupported_by_version"], min(UNSUPPORTED_LISTED, most))
        head_bytes = json_bytes(head)[:-1]
        shown_listing = listing(order="worst_first", listed=listed, complete=complete,
                                following=None if complete else page_url(most))
        body = _status_body(head_bytes, shown_listing, pieces)
        return StatusBuilt(version, began, clock() - sliced + cost, body,
                           head=head_bytes, now=now, ids=ids, summary=head,
                           worst=[c.id for c in order])

    async def cluster(self, request: web.Request) -> web.Response:
        cluster = cluster_id_of(request)
        if isinstance(cluster, web.Response):
            return cluster
        live = self.state.clusters.get(cluster)
        error: str | None = None
        try:
            stored = await self.read(lambda: self.store.cluster_status(
                cluster, sorted(live.policies) if live is not None else ()))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            error, stored = self.read_error(exc), None
        known = stored.known if stored is not None else live is not None
        if not known:
            return error_response(404, f"unknown cluster {cluster!r}", cluster=cluster)
        now = self.state.clock()
        records = merged_policies(self.state, cluster, stored.deliveries if stored else ())
        policies = []
        for pid, record in sorted(records.items()):
            current = stored.current.get(pid) if stored is not None else None
            view = record_view(record, now, self.state.interval_s,
                               probe_period_s=self.state.probe_period_s)
            policies.append({
                "id": pid,
                "in_database": current is not None if stored is not None else None,
                "current_revision": current,
                **view,
                "in_sync": current is not None and view["delivered_revision"] == current,
            })
        self.charge(len(policies))
        return web.json_response({
            "cluster": cluster_summary(self.state, self.state.cluster_or_new(cluster), now),
            "policies": policies,
            "database": self._database(error),
        })

    async def policy(self, request: web.Request) -> web.Response:
        pid = policy_id_from_request(request)
        if isinstance(pid, web.Response):
            return pid
        try:
            found = await self.read(lambda: self.store.policy_status(pid))
        except (TimeoutError, ConvergerdError, OSError) as exc:
            return error_response(503, f"database unavailable: {self.read_error(exc)}",
                                  policy=pid, reason="database")
        if found is None:
            return error_response(404, f"unknown policy {pid!r}", policy=pid)
        view = self.policy_view(found)
        self.charge(len(view["clusters"]))
        return web.json_response(view)

    def charge(self, rows: int) -> None:
        self.read_budget.charge(rows // self.tuning.rows_per_token)

    def policy_view(self, found: PolicyStatusRows) -> dict[str, Any]:
        row, scope = found.policy, found.scope
        stored_by_cluster = {r.cluster: PolicyRecord.from_row(r) for r in found.deliveries}
        now = self.state.clock()
        # module-policies may have stored any JSON as the rule: report it, do not crash on it.
        rule_type = row.rule.get("type") if isinstance(row.rule, Mapping) else None
        delivered_type = found.invalid is None and rule_type in DELIVERED_RULE_TYPES
        clusters = []
        pid = PolicyId(row.id)
        names = scope | set(stored_by_cluster) | {
            c for c, s in self.state.clusters.items() if pid in s.policies}
        for cluster in sorted(names):
            live = self.state.clusters.get(ClusterId(cluster))
            record = merge_records(live.policies.get(pid) if live else None,
                                   stored_by_cluster.get(cluster))
            view = record_view(record, now, self.state.interval_s,
                               probe_period_s=self.state.probe_period_s)
            clusters.append({
                "cluster": cluster,
                "in_scope": cluster in scope,
                "current_revision": row.revision,
                **view,
                "in_sync": view["delivered_revision"] == row.revision,
                "cluster_reachable": live.reachable if live else None,
            })
        return {
            "policy": {
                "id": row.id, "boundary": row.boundary, "revision": row.revision,
                "enabled": row.enabled, "enforcement": row.enforcement, "rule_type": rule_type,
                "delivered_to_clusters": delivered_type,
                "invalid": found.invalid,
                "deletion": _deletion_view(found, now),
            },
            "audit": policy_audit_view((c["audit"] for c in clusters),
                                       audit_sample_view(self.state, pid)),
            # Beside the audit: what admission did, summed over the clusters below.
            "admission": policy_admission_view(clusters),
            "clusters": clusters,
        }


def _deletion_view(found: PolicyStatusRows, now: dt.datetime) -> dict[str, Any] | None:
    """A pending deletion: when it began and the clusters still recorded as holding the policy
    (what a retry of the DELETE removes it from, with the clusters in scope)."""
    began = found.deletion_requested_at
    if began is None:
        return None
    return {"requested_at": iso(began), "pending_seconds": round(age_s(began, now), 3),
            "held_by": sorted(r.cluster for r in found.deliveries)}


def _json_errors() -> Any:
    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            if not isinstance(exc, web.HTTPMethodNotAllowed):
                return error_response(exc.status, exc.reason,
                                      path=shown(request.path, style="text"))
            # RFC 9110: a 405 names the methods the resource has.
            response = error_response(exc.status, exc.reason,
                                      path=shown(request.path, style="text"),
                                      allowed_methods=sorted(exc.allowed_methods))
            response.headers["Allow"] = exc.headers["Allow"]
            return response
        except ConnectionResetError:  # the client went away: nobody to answer, nothing wrong
            log.debug("client gone during %s %s", request.method,
                      shown(request.path, style="text"))
            return error_response(400, "the client closed the connection")
        except Exception:
            log.exception("unhandled error serving %s %s", request.method,
                          shown(request.path, style="text"))
            return error_response(500, "internal error (see the daemon's log)")

    return middleware


def _scrub(secrets: Sequence[str]) -> Any:
    encoded = [s.encode() for s in secrets]

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if isinstance(response, web.Response) and isinstance(response.body, bytes):
            body = response.body
            for secret in encoded:
                if secret in body:
                    body = body.replace(secret, b"***")
            if body is not response.body:
                log.error("a secret was about to be sent in the response to %s %s; redacted",
                          request.method, shown(request.path, style="text"))
                response.body = body
        return response

    return middleware


def middlewares(settings: Settings) -> list[Any]:
    """The app's middlewares, outermost first: errors become JSON first, then every body is
    checked for secrets."""
    return [_scrub(secrets_of(settings)), _json_errors()]
