"""`ClusterClient`: the `PolicyApi` (and, for the home cluster, `LeaseApi`) of one cluster over
kubernetes-asyncio, with one bounded connection pool (see "Connections" below).

What the library does by default, and what is done here instead:

- `RESTClientObject` builds an SSL context per client from the system CA store (time and
  memory per client: bench/RESULTS.md, "Figures once quoted in the code"): here one shared
  context per CA (`convergerd.kube.tlsctx`).
- its aiohttp session has `trust_env=True` (several times the CPU per request: proxy and netrc
  lookups): here our own session with `trust_env=False` and a bounded pool.
- no timeout on a request: here `sock_connect` + `total` on every request, and `timeout_s`
  bounds the whole call, the rate limiter's wait included.
- its generated request layer (`sanitize_for_serialization` of every body, parameter
  processing, `rest.request`) costs about as much client CPU as aiohttp's own request, and
  `patch_cluster_custom_object` sends merge-patch JSON and returns None on 201: here the
  Policy API and `/version` are plain requests on the cluster's aiohttp session (the body
  serialised once, `application/apply-patch+yaml`, the raw answer read, its status kept,
  `Applied.created`), and the library's API objects are built only for the Lease API, on
  first use, on the home cluster's client alone.
- `ApiException` with the raw body: here our error classes, chained, with messages built from
  the Status body.

Connections: an idle TLS connection costs its 32 KiB TLS read buffer on `convergerd.eventloop`
plus OpenSSL state (bench/RESULTS.md, "Figures once quoted in the code"), so only one per
cluster outlives a burst of work. The pool (`pool_size`
connections) is two aiohttp connectors: the *warm* one holds a single connection kept alive
for `WARM_KEEPALIVE_S`, which the prober (one `/version` every 10 s) keeps open between rounds,
so neither it nor the round's list handshakes again; a request takes it whenever no other
request holds it. The other `pool_size - 1` connections, opened only while requests overlap
(a round's applies), close `BURST_KEEPALIVE_S` to twice that after their last use: reused
throughout a cluster's part of a round, gone soon after it, never kept until the next round.

Every request carries `User-Agent: convergerd/<version> (<identity>)` and is reported to the
`RequestObserver` (cluster, verb, status or None, duration). Credentials are sent as a header
per request and never kept in the library's `Configuration`, logged, or put in a message.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio.client import ApiClient, Configuration, CoordinationV1Api
from kubernetes_asyncio.client.rest import RESTClientObject
from yarl import URL

from convergerd.config import ClusterAccess
from convergerd.core.decode import (
    ANSWER_MAX_CONTAINERS,
    MAX_REASON_PHRASE_CHARS,
    Cost,
    ListBudget,
    StatusBody,
    git_version,
    list_page,
    parse_object,
    same_object,
    seconds,
    short_text,
    status_body,
    warning_texts,
)
from convergerd.core.errors import (
    BadResponse,
    ClusterApiError,
    ClusterError,
    ClusterLevelError,
    ClusterUnreachable,
    NoCredentials,
    ObjectRejected,
    Superseded,
    TooLarge,
    classify_status,
)
from convergerd.core.model import ClusterId
from convergerd.core.render import (
    API_VERSION,
    CRD_NAME,
    FIELD_MANAGER,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
)
from convergerd.core.shown import shown
from convergerd.kube.api import (
    LEASE_API_VERSION,
    Applied,
    KubeObject,
    ObjectList,
    RequestObserver,
)
from convergerd.kube.kubeconfig import Credentials, read_token_file
from convergerd.kube.listhead import HEAD_BYTES
from convergerd.ratelimit import TokenBucket

log = logging.getLogger(__name__)

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain"  # what /metrics answers (Prometheus text format 0.0.4)
MERGE_PATCH_CONTENT_TYPE = "application/merge-patch+json"
LIST_PAGE_SIZE = 500
TOKEN_REREAD_S = 60.0  # a projected service-account token rotates; client-go re-reads each minute
READ_BUFSIZE = 2**21  # big list pages
# Keep-alive of the one warm connection per cluster: well above the prober's 10 s period.
WARM_KEEPALIVE_S = 60.0
# Keep-alive of the overflow connections: longer than the gaps between a cluster's requests
# within a round (and most retry backoffs), far shorter than the time between rounds.
BURST_KEEPALIVE_S = 2.0
# An error answer is read up to this much (the rest is left unread and the connection
# closed): its Status message is capped at MAX_MESSAGE_CHARS anyway.
ERROR_BODY_MAX_BYTES = 64 * 1024
# Of a success over the cap, this much is kept on the error (`TooLarge.head`).
TOO_LARGE_HEAD_BYTES = HEAD_BYTES
READ_CHUNK_BYTES = 2**20
# What each kind of answer may cost (`decode.Cost`; the table in docs/design.md, "Cluster
# answers"). `/version` is probed on every cluster by every replica: a few hundred bytes from
# an apiserver. A Lease is one small object (etcd keeps at most 1.5 MiB of any object).
ANSWER_COST = Cost()  # any other answer: the response cap, `decode.ANSWER_MAX_CONTAINERS`
VERSION_COST = Cost(max_bytes=64 * 1024, max_containers=64)
LEASE_COST = Cost(max_bytes=2 * 2**20, max_containers=1_024)
# A Policy as we write it and the operator reports it is about 30 objects and arrays (its
# managedFields included): 256 per item is room for any legitimate one.
POLICY_CONTAINERS = 256
POLICY_COST = Cost(max_containers=8 * POLICY_CONTAINERS)
# Every managed Policy a cluster holds, over all pages: far above the policies one database
# can have for a cluster (the scale the product is built for is 100 a cluster).
POLICY_LIST = ListBudget(max_items=10_000, max_pages=200)
# Reason slugs of `ClusterUnreachable` (metrics labels; `retry` keys decisions on them).
REASON_TIMEOUT = "timeout"
REASON_CONNECT = "connect_error"

Clock = Callable[[], float]
POLICIES_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
# Paths, query keys and values that need no percent-encoding (ours: fixed API paths,
# DNS-label names, an apply's fieldManager and force).
_PLAIN = re.compile(r"[A-Za-z0-9._~/-]+")
# Sends one request over the session it is given, with that timeout and those auth headers.
Send = Callable[[aiohttp.ClientSession, aiohttp.ClientTimeout, dict[str, str]],
                Awaitable[aiohttp.ClientResponse]]


def user_agent(version: str, identity: str) -> str:
    return f"convergerd/{version} ({identity})"


# --- pure: error translation -------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def status_message(status: int, reason_phrase: str | None, body: bytes) -> tuple[str, str | None]:
    """`"<code> <reason>: <message>"` from an error answer, and the Status `reason` if any.

    The body is a `Status` (JSON) from a real apiserver, but proxies and the usual 429 answer
    plain text: both are handled. The server's message is kept (it never holds our
    credentials), cleaned and shortened (`decode.status_body`)."""
    return _status_message(status, short_text(reason_phrase, MAX_REASON_PHRASE_CHARS),
                           status_body(body))


def _status_message(status: int, phrase: str | None, doc: StatusBody) -> tuple[str, str | None]:
    head = f"{status} {phrase}" if phrase else str(status)
    if not doc.message or doc.message == phrase:
        return head, doc.reason
    return f"{head}: {doc.message}", doc.reason


def retry_after(header: str | None, body: bytes) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds form), else from the Status body's
    `details.retryAfterSeconds`; finite and non-negative, or None."""
    from_header = seconds(header) if header is not None else None
    return from_header if from_header is not None else status_body(body).retry_after_s


def http_error(
    status: int, reason_phrase: str | None, headers: Mapping[str, str], body: bytes
) -> ClusterApiError:
    cls, reason = classify_status(status)
    doc = status_body(body)
    message, k8s_reason = _status_message(
        status, short_text(reason_phrase, MAX_REASON_PHRASE_CHARS), doc)
    if 300 <= status < 400:
        # Never followed (it could lead anywhere, in clear text, with the token): the
        # cluster's error, saying where it pointed.
        location = headers.get("Location")
        message = (f"{message}: redirect to {shown(location, 100, style='text')} not followed"
                   if location else f"{message}: redirect not followed")
    header = headers.get("Retry-After")
    wait = seconds(header) if header is not None else None
    return cls(
        message,
        status=status,
        k8s_reason=k8s_reason,
        retry_after_s=wait if wait is not None else doc.retry_after_s,
        reason=reason,
    )


def _not_found_object(body: bytes, name: str) -> bool:
    """A 404 about this object (NotFound with details.name), not about the resource type."""
    return status_body(body).details_name == name


def transport_error(exc: BaseException, *, elapsed_s: float, timeout_s: float) -> ClusterError:
    """A request that got no HTTP answer, as `ClusterUnreachable` (reason timeout or
    connect_error). Library messages are not reused: they may carry the URL."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ClusterUnreachable(
            f"connect timeout after {_seconds(elapsed_s)} s", reason=REASON_TIMEOUT
        )
    if isinstance(exc, TimeoutError):
        return ClusterUnreachable(
            f"no answer within {_seconds(min(elapsed_s, timeout_s))} s", reason=REASON_TIMEOUT
        )
    return ClusterUnreachable(_connect_message(exc), reason=REASON_CONNECT)


def _connect_message(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        detail = getattr(exc.certificate_error, "verify_message", None) or "invalid certificate"
        return f"TLS certificate verification failed: {detail}"
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return "connection reset"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _os_message(exc.os_error)
    if isinstance(exc, OSError):
        return _os_message(exc)
    return f"connection failed ({type(exc).__name__})"


def _os_message(exc: OSError) -> str:
    known = {
        errno.ECONNREFUSED: "connection refused",
        errno.ECONNRESET: "connection reset",
        errno.EPIPE: "connection reset",
        errno.EHOSTUNREACH: "host unreachable",
        errno.ENETUNREACH: "network unreachable",
        errno.ETIMEDOUT: "connect timeout",
    }
    if exc.errno in known:
        return known[exc.errno]
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if exc.errno is None and "Name or service not known" in str(exc):
        return "host name not found"
    return f"connection failed ({exc.strerror or type(exc).__name__})"


# --- the library, configured -------------------------------------------------------------------


class _RestClient(RESTClientObject):
    """kubernetes-asyncio's REST client over a session we built (shared SSL context,
    `trust_env=False`, bounded pool). The upstream constructor is not called: it would build
    its own SSL context from the system store and a `trust_env=True` session."""

    def __init__(self, session: aiohttp.ClientSession, server_hostname: str | None) -> None:
        self.pool_manager = _NoRedirects(session)  # type: ignore[assignment]
        # The upstream attributes are inferred as non-optional; None is what it checks for.
        self.server_hostname = server_hostname  # type: ignore[assignment]
        self.proxy = None  # type: ignore[assignment]
        self.proxy_headers = None  # type: ignore[assignment]


class _NoRedirects:
    """The session as kubernetes-asyncio's REST client uses it (`request` only), never
    following a redirect: aiohttp's default would, with the Authorization header."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    def request(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.request(*args, **kwargs, allow_redirects=False)


class _ApiClient(ApiClient):
    """`ApiClient` with our REST client; mirrors the upstream constructor's attributes."""

    def __init__(self, configuration: Any, rest_client: _RestClient, agent: str) -> None:
        self.configuration = configuration
        self.pool_threads = 1
        self.rest_client = rest_client
        self.default_headers = {"User-Agent": agent}
        self.cookie = None  # type: ignore[assignment]
        self.client_side_validation = configuration.client_side_validation


class _BearerToken:
    """The Authorization header: a static token, or a token file re-read every minute.

    The file is read off the event loop (`read_token_file`: a regular file only, capped, opened
    without blocking), one read at a time. A file that cannot be used once a token was read
    keeps the last good token (a rotation in progress); before that it is `NoCredentials`."""

    def __init__(self, creds: Credentials, clock: Clock) -> None:
        self._creds = creds
        self._clock = clock
        self._header: dict[str, str] = {}
        self._read_at: float | None = None
        self._reading = asyncio.Lock()
        if creds.token is not None:
            self._header = {"Authorization": f"Bearer {creds.token}"}

    def __repr__(self) -> str:
        return f"_BearerToken({self._creds.name!r})"

    async def headers(self) -> dict[str, str]:
        path = self._creds.token_file
        if self._creds.token is not None or path is None:
            return dict(self._header)
        async with self._reading:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= TOKEN_REREAD_S:
                try:
                    token = await asyncio.to_thread(read_token_file, self._creds.name, path)
                except NoCredentials as exc:
                    if not self._header:
                        raise
                    log.warning("keeping the last token of %s: %s", self._creds.name, exc,
                                extra={"cluster": self._creds.name})
                else:
                    self._header = {"Authorization": f"Bearer {token}"}
                self._read_at = now
        return dict(self._header)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    reason: str | None
    headers: Mapping[str, str]
    body: bytes

    verb: str = ""
    max_containers: int = ANSWER_MAX_CONTAINERS
    warnings: tuple[str, ...] = ()  # the `Warning` headers' texts (`decode.warning_texts`)

    def json(self) -> KubeObject:
        """The body as a JSON object; `BadResponse` when it is not one, or costs more than
        its request's `Cost`."""
        return parse_object(self.body, f"{self.verb or 'the'} answer ({self.status})",
                            max_containers=self.max_containers)


async def read_capped(
    content: aiohttp.StreamReader, limit: int, *, keep_cut: bool = True, keep_head: int = 0
) -> tuple[bytes, bool]:
    """At most `limit` bytes of a body, read in chunks until the end of the body (its declared
    length, or the end of a chunked one) or the cap; True when there was more (left unread:
    the caller closes the connection). Over the cap, the first `limit` bytes are returned only
    with `keep_cut` (else its first `keep_head` bytes: nothing more is joined for a body about
    to be refused). Memory stays within twice `limit` (the chunks and the joined body)
    whatever the peer sends, and a body trickled slowly is bounded by the request's timeout,
    not here. Every body read from
    a cluster goes through this (a watch reader would read each event line with the same
    cap)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await content.read(min(READ_CHUNK_BYTES, limit + 1 - size))
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
    if not keep_cut:
        head = bytearray()
        for chunk in chunks:
            if len(head) >= keep_head:
                break
            head += chunk[: keep_head - len(head)]
        return bytes(head), True
    chunks[-1] = chunks[-1][: len(chunks[-1]) - (size - limit)]  # one copy, not join + slice
    return b"".join(chunks), True


@dataclass(frozen=True, slots=True)
class KeptLines:
    """A text answer read for a few of its lines (`/metrics`: two metric names of the hundreds
    a kube-apiserver exports, often many MB in all): streamed, and only the lines that start
    with one of `prefixes` kept, so a body far over the response cap is read without holding
    it. The lines kept are bounded by the response cap, the body by `max_scanned_bytes` (and
    its time by the request timeout); a kept line over `max_line_bytes` is skipped."""

    prefixes: tuple[bytes, ...]
    max_scanned_bytes: int = 256 * 2**20
    max_line_bytes: int = 64 * 2**10

    @property
    def pattern(self) -> re.Pattern[bytes]:
        names = b"|".join(re.escape(p) for p in self.prefixes)
        return re.compile(rb"^(?:" + names + rb")[^\n]*", re.M)


async def read_kept_lines(content: aiohttp.StreamReader, keep: KeptLines, max_kept: int,
                          *, verb: str) -> bytes:
    """The lines of a streamed body that `keep` keeps, newline-terminated, joined; `TooLarge`
    when the body passes `keep.max_scanned_bytes` or the kept lines `max_kept` (the caller
    closes the connection). Memory: the kept lines, a chunk and at most one line."""
    pattern = keep.pattern
    kept = bytearray()
    buffer = bytearray()
    scanned = 0
    skipping = False  # inside a line already longer than max_line_bytes: to its newline

    def take(text: bytearray | bytes, start: int, end: int) -> None:
        for match in pattern.finditer(text, start, end):
            line = match.group()
            if len(line) <= keep.max_line_bytes:
                kept.extend(line)
                kept.extend(b"\n")
        if len(kept) > max_kept:
            raise TooLarge(f"{verb} answer: the lines kept of it ({b' '.join(keep.prefixes)!r}) "
                           f"are larger than {max_kept} bytes (CONVERGERD_MAX_RESPONSE_BYTES)")

    async for chunk in content.iter_any():
        scanned += len(chunk)
        if scanned > keep.max_scanned_bytes:
            raise TooLarge(f"{verb} answer larger than {keep.max_scanned_bytes} bytes (the "
                           f"most read of a {verb} answer for a few of its lines)")
        buffer += chunk
        end = buffer.rfind(b"\n")
        if end < 0:
            if len(buffer) > keep.max_line_bytes:
                buffer.clear()
                skipping = True
            continue
        start = 0
        if skipping:
            start = buffer.find(b"\n") + 1
            skipping = False
        take(buffer, start, end)
        del buffer[: end + 1]
        if len(buffer) > keep.max_line_bytes:
            buffer.clear()
            skipping = True
    if buffer and not skipping:
        take(buffer, 0, len(buffer))  # a last line without its newline
    return bytes(kept)


async def read_lines_capped(content: aiohttp.StreamReader, limit: int) -> AsyncIterator[bytes]:
    """The newline-terminated lines of a streamed body (a watch: one JSON event per line), each
    at most `limit` bytes: a longer one raises `TooLarge` (its first bytes kept: an event's
    type, name and resourceVersion, `kube.listhead.event_head`) without buffering more than
    `limit` plus one chunk. Blank lines are skipped; an unterminated tail (the stream was cut
    mid-event) is dropped, as it cannot be a whole event."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            if end > limit:
                break
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
        if len(buffer) > limit:
            raise TooLarge(f"watch event longer than {limit} bytes "
                           "(CONVERGERD_MAX_RESPONSE_BYTES)",
                           head=bytes(buffer[:TOO_LARGE_HEAD_BYTES]))


@dataclass(frozen=True, slots=True)
class Reply:
    """A successful answer of `ClusterClient.call`: its status, its JSON object and the texts
    of its `Warning` headers (kube-apiserver's warnings: a Warn binding's failures)."""

    status: int
    object: KubeObject
    warnings: tuple[str, ...] = ()


class ClusterClient:
    """One cluster: `PolicyApi`, and `LeaseApi` when it is the home cluster.

    Must be created inside the running event loop (it owns aiohttp sessions). `close()`
    releases the pool. At most `pool_size` connections: one warm, kept between rounds, and up
    to `pool_size - 1` (at least one) closed `burst_keepalive_s` after their last use."""

    def __init__(
        self,
        cluster: ClusterId,
        creds: Credentials,
        *,
        ssl_context: ssl.SSLContext | None,
        access: ClusterAccess,
        agent: str,
        observer: RequestObserver | None = None,
        clock: Clock | None = None,
        pool_size: int | None = None,
        page_size: int = LIST_PAGE_SIZE,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        burst_keepalive_s: float = BURST_KEEPALIVE_S,
    ) -> None:
        self._cluster = cluster
        self._server = creds.server
        self._clock = clock or asyncio.get_running_loop().time
        self._observer = observer
        self._page_size = page_size
        self._max_response_bytes = access.max_response_bytes
        self._request_timeout_s = access.request_timeout_s
        self._connect_timeout_s = access.connect_timeout_s
        self._auth = _BearerToken(creds, self._clock)
        self._agent = agent
        self._server_hostname = creds.tls_server_name
        self._bucket = TokenBucket(rate=access.qps, burst=access.burst, clock=self._clock)
        # Per request, yarl would parse and encode `server + path` again (every cluster's URL
        # differs, so its cache misses: bench/RESULTS.md, "Figures once quoted in the code");
        # the server is encoded once here, and a plain path appended to it is a URL already
        # encoded. Kept only where it gives the URL
        # yarl would build from the text (`_url`).
        encoded = str(URL(self._server))
        probe = "/apis/x"
        self._encoded_server = (
            encoded if URL(encoded + probe, encoded=True) == URL(self._server + probe)
            else None)
        # The usual request's timeout (the whole budget left): one object, not one each.
        self._full_timeout = aiohttp.ClientTimeout(
            total=access.request_timeout_s, sock_connect=access.connect_timeout_s)
        # Applies in flight, plus a list or a Lease call beside them.
        self.pool_size = pool_size or access.apply_concurrency + 2

        def session(limit: int, keepalive_s: float) -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(
                limit=limit,
                limit_per_host=0,
                # None: aiohttp's default verifying context (never "verification off").
                ssl=ssl_context if ssl_context is not None else True,
                keepalive_timeout=keepalive_s,
                ttl_dns_cache=300,
            )
            return aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                proxy=creds.proxy_url,  # the context's proxy-url, for every request
                read_bufsize=READ_BUFSIZE,
                trace_configs=list(trace_configs) or None,
                timeout=aiohttp.ClientTimeout(
                    total=access.request_timeout_s, sock_connect=access.connect_timeout_s
                ),
            )

        self._warm = session(1, WARM_KEEPALIVE_S)
        self._burst = session(max(1, self.pool_size - 1), burst_keepalive_s)
        # Watches: one connection each for as long as the watch runs, so not from the pools
        # short requests wait on (nine watches would starve a pool of four). Unbounded: the
        # callers run a fixed, small number of watches (the operator: Policies, Namespaces
        # and one per workload kind).
        self._streams = session(0, burst_keepalive_s)
        self._warm_busy = False
        self._leases: dict[aiohttp.ClientSession, CoordinationV1Api] = {}

    def __repr__(self) -> str:
        return f"ClusterClient({self._cluster!r}, {self._server!r})"

    @property
    def cluster(self) -> ClusterId:
        return self._cluster

    @property
    def closed(self) -> bool:
        return self._warm.closed and self._burst.closed and self._streams.closed

    async def close(self) -> None:
        await self._warm.close()
        await self._burst.close()
        await self._streams.close()

    # --- PolicyApi --------------------------------------------------------------------------

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        deadline = self._clock() + timeout_s
        items: list[KubeObject] = []
        requests = 0
        token: str | None = None
        restarted = False
        while True:
            try:
                query = {"labelSelector": label_selector, "limit": str(self._page_size)}
                if token is not None:
                    query["continue"] = token
                answer = await self._request(
                    "list", self._http("GET", POLICIES_PATH, query=query), deadline=deadline,
                    cost=Cost(max_containers=min(ANSWER_MAX_CONTAINERS,
                                                 self._page_size * POLICY_CONTAINERS + 16)))
            except ObjectRejected as exc:
                if exc.status != 410 or token is None or restarted:
                    raise
                # The continue token expired between pages: one fresh list, from the start.
                items, token, restarted = [], None, True
                requests += 1
                continue
            except ClusterLevelError as exc:
                raise self._policy_api_error(exc) from exc
            requests += 1
            page = list_page(answer.json(), api_version=API_VERSION, kind=f"{KIND}List",
                             limit=self._page_size)
            items.extend(page.items)
            if page.continue_token is not None and page.continue_token == token:
                raise BadResponse("list answer: metadata.continue: the same token again "
                                  "(the list would never end)")
            token = page.continue_token
            if token is None:
                return ObjectList(items=items, resource_version=page.resource_version,
                                  requests=requests)
            POLICY_LIST.check(pages=requests, items=len(items))

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        """A `metadata.resourceVersion` in `body` is a precondition: the object changed since
        (409) or deleted since (404 about it) raises `Superseded`."""
        name = body["metadata"]["name"]
        precondition = bool(body["metadata"].get("resourceVersion"))
        try:
            answer = await self._request(
                "apply", self._http(
                    "PATCH", f"{POLICIES_PATH}/{name}", body=orjson.dumps(body),
                    query={"fieldManager": FIELD_MANAGER, "force": "true"},
                    content_type=APPLY_CONTENT_TYPE),
                deadline=self._clock() + timeout_s,
                not_found=name if precondition else None,
                cost=POLICY_COST,
            )
        except _Gone:
            raise Superseded(f"{name} was deleted since it was read", status=404) from None
        except ObjectRejected as exc:
            if precondition and exc.status == 409:
                raise Superseded(f"{name} changed since it was read: {exc}", status=409,
                                 k8s_reason=exc.k8s_reason) from exc
            raise
        except ClusterLevelError as exc:
            raise self._policy_api_error(exc) from exc
        applied = answer.json()
        same_object(applied, body, "apply answer")
        return Applied(object=applied, created=answer.status == 201)

    async def get_policy(self, name: str, *, timeout_s: float) -> KubeObject | None:
        """The Policy object, or None when there is none."""
        answer = await self._one_policy("get", name, timeout_s)
        if answer is None:
            return None
        found = answer.json()
        same_object(found, {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}},
                    "get answer")
        return found

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        return await self._one_policy("delete", name, timeout_s) is not None

    async def _one_policy(self, verb: str, name: str, timeout_s: float) -> _Answer | None:
        """`verb` on the Policy `name`: the answer, or None when there is no such object."""
        try:
            return await self._request(
                verb, self._http(verb.upper(), f"{POLICIES_PATH}/{name}"),
                deadline=self._clock() + timeout_s, not_found=name, cost=POLICY_COST,
            )
        except _Gone:
            return None
        except ClusterLevelError as exc:
            raise self._policy_api_error(exc) from exc

    async def server_version(self, *, timeout_s: float) -> str:
        answer = await self._request(
            "version", self._http("GET", "/version"), deadline=self._clock() + timeout_s,
            cost=VERSION_COST)
        return git_version(answer.json())

    # --- LeaseApi ---------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str, *, timeout_s: float) -> KubeObject | None:
        try:
            answer = await self._request(
                "get", self._lease_call("read_namespaced_lease", name, namespace),
                deadline=self._clock() + timeout_s, not_found=name, cost=LEASE_COST,
            )
        except _Gone:
            return None
        except ClusterLevelError as exc:
            raise _lease_error(exc) from exc
        return _the_lease(answer, namespace, name)

    async def list_leases(self, namespace: str, *, timeout_s: float) -> list[KubeObject]:
        try:
            answer = await self._request(
                "list", self._lease_call("list_namespaced_lease", namespace),
                deadline=self._clock() + timeout_s,
            )
        except ClusterLevelError as exc:
            raise _lease_error(exc) from exc
        return list_page(answer.json(), api_version=LEASE_API_VERSION, kind="LeaseList").items

    async def create_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        namespace = body["metadata"]["namespace"]
        try:
            answer = await self._request(
                "create", self._lease_call("create_namespaced_lease", namespace, body),
                deadline=self._clock() + timeout_s, cost=LEASE_COST,
            )
        except ClusterLevelError as exc:
            raise _lease_error(exc) from exc
        return _the_lease(answer, namespace, body["metadata"]["name"])

    async def replace_lease(self, body: KubeObject, *, timeout_s: float) -> KubeObject:
        meta = body["metadata"]
        try:
            answer = await self._request(
                "update", self._lease_call("replace_namespaced_lease", meta["name"],
                                           meta["namespace"], body),
                deadline=self._clock() + timeout_s, cost=LEASE_COST,
            )
        except ClusterLevelError as exc:
            raise _lease_error(exc) from exc
        return _the_lease(answer, meta["namespace"], meta["name"])

    # --- any resource: JSON in, JSON out ------------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        timeout_s: float,
        query: Mapping[str, str] | None = None,
        body: KubeObject | None = None,
        content_type: str = JSON_CONTENT_TYPE,
        not_found: str | None = None,
        cost: Cost = ANSWER_COST,
    ) -> Reply | None:
        """One request to `path` (below the server URL) with a JSON body, its JSON answer;
        the same pool, bounds, rate limit and error classes as every other call. None when
        `not_found` names the object and the answer is a 404 about it."""
        send = self._http(method, path, query=query, content_type=content_type,
                          body=orjson.dumps(body) if body is not None else None)
        try:
            answer = await self._request(verb, send, deadline=self._clock() + timeout_s,
                                         not_found=not_found, cost=cost)
        except _Gone:
            return None
        return Reply(answer.status, answer.json(), answer.warnings)

    async def text(self, path: str, *, verb: str, timeout_s: float,
                   cost: Cost = ANSWER_COST, keep: KeptLines | None = None) -> bytes:
        """A GET of a non-JSON answer (`/metrics`: Prometheus text), its body as read: within
        `cost.max_bytes` and the response cap (over it: `TooLarge`), or with `keep` only the
        lines it keeps (`read_kept_lines`), with the same pool, rate limit and error classes
        as `call`."""
        send = self._http("GET", path, accept=TEXT_CONTENT_TYPE)
        answer = await self._request(verb, send, deadline=self._clock() + timeout_s, cost=cost,
                                     keep=keep)
        return answer.body

    async def stream(
        self,
        path: str,
        *,
        query: Mapping[str, str],
        timeout_s: float,
        max_line_bytes: int | None = None,
    ) -> AsyncIterator[bytes]:
        """The lines of a long answer (a watch), each capped at `max_line_bytes` (default: the
        response cap), for at most `timeout_s`. Goes over its own connections (one per watch),
        so a running watch never holds a connection that short requests wait for. An error
        status, a reset or the deadline raise our error classes, as `call` does."""
        limit = max_line_bytes or self._max_response_bytes
        start = self._clock()
        status: int | None = None
        try:
            # No asyncio.timeout here: it would cancel the consumer's task between two yields.
            # aiohttp's own total timeout ends the read instead.
            await self._bucket.acquire(start + timeout_s)
            timeout = aiohttp.ClientTimeout(total=max(0.0, start + timeout_s - self._clock()),
                                            sock_connect=self._connect_timeout_s)
            headers = {**await self._auth.headers(), "User-Agent": self._agent,
                       "Accept": JSON_CONTENT_TYPE}
            async with self._streams.get(
                self._server + path, params=dict(query), headers=headers, timeout=timeout,
                server_hostname=self._server_hostname, allow_redirects=False,
            ) as response:
                status = response.status
                if status >= 300:
                    answer = await self._read("watch", response)
                    raise http_error(answer.status, answer.reason, answer.headers, answer.body)
                async for line in read_lines_capped(response.content, limit):
                    yield line
        except ClusterError:
            raise
        except TimeoutError:
            if status is None:  # no answer at all: the cluster is unreachable
                raise ClusterUnreachable(
                    f"no answer within {_seconds(timeout_s)} s", reason=REASON_TIMEOUT
                ) from None
            return  # the stream's own deadline: a normal end, as when the server ends it
        except (aiohttp.ClientError, OSError) as exc:
            raise transport_error(exc, elapsed_s=self._clock() - start,
                                  timeout_s=timeout_s) from exc
        finally:
            if self._observer is not None:
                self._observer.request_done(self._cluster, "watch", status,
                                            self._clock() - start)

    # --- one request ------------------------------------------------------------------------

    async def _read(self, verb: str, response: aiohttp.ClientResponse,
                    cost: Cost = ANSWER_COST, keep: KeptLines | None = None) -> _Answer:
        """The answer, its body read up to the cap: the request's `cost.max_bytes` within
        `max_response_bytes` for a success (over it: `BadResponse`), `ERROR_BODY_MAX_BYTES`
        for an error or a redirect (over it: cut). What is left unread stays unread: the
        connection is closed, never reused."""
        status = response.status
        error = status >= 300
        cap = self._max_response_bytes
        limit = (ERROR_BODY_MAX_BYTES if error
                 else cap if cost.max_bytes is None else min(cost.max_bytes, cap))
        if keep is not None and not error:
            try:
                kept = await read_kept_lines(response.content, keep, limit, verb=verb)
            except TooLarge:
                response.close()
                raise
            return _Answer(status, response.reason, response.headers, kept, verb)
        declared = response.content_length
        if not error and declared is not None and declared > limit:
            head, _ = await read_capped(response.content, min(limit, TOO_LARGE_HEAD_BYTES))
            response.close()
            raise _too_big(verb, status, limit, head, setting=limit == cap)
        # An error answer's start is kept (its Status message); of a success over the cap,
        # only its head (a list's continue token and first item: `kube.listhead`).
        body, cut = await read_capped(response.content, limit, keep_cut=error,
                                      keep_head=TOO_LARGE_HEAD_BYTES)
        if cut:
            response.close()
            if not error:
                # No local here may hold the exception: its traceback holds this frame, and
                # that cycle (with whatever else the frame holds) would wait for a full
                # collection, rare under `eventloop.tune_gc`.
                raise _too_big(verb, status, limit, body, setting=limit == cap)
        return _Answer(status, response.reason, response.headers, body, verb,
                       cost.max_containers, warning_texts(response.headers.getall("Warning", ())))

    def _policy_api_error(self, exc: ClusterLevelError) -> ClusterLevelError:
        if exc.status != 404:
            return exc
        return ClusterLevelError(
            f"CRD {CRD_NAME} not installed", status=404, k8s_reason=exc.k8s_reason,
            reason="crd_missing",
        )

    def _http(
        self, method: str, path: str, *, query: Mapping[str, str] | None = None,
        body: bytes | None = None, content_type: str = JSON_CONTENT_TYPE,
        accept: str = JSON_CONTENT_TYPE,
    ) -> Send:
        """A plain request to `path` below the server URL, `body` already serialised."""
        url, params = self._url(path, query)

        async def send(session: aiohttp.ClientSession, limits: aiohttp.ClientTimeout,
                       auth: dict[str, str]) -> aiohttp.ClientResponse:
            headers = {**auth, "User-Agent": self._agent, "Accept": accept}
            if body is not None:
                headers["Content-Type"] = content_type
            return await session.request(method, url, params=params, data=body,
                                         headers=headers, timeout=limits,
                                         server_hostname=self._server_hostname,
                                         allow_redirects=False)

        return send

    def _url(
        self, path: str, query: Mapping[str, str] | None
    ) -> tuple[URL | str, dict[str, str] | None]:
        """`server + path` and `query` as aiohttp reads them: a URL built without parsing when
        the path and query are plain (see `_encoded_server`; an apply's), else the text and
        the parameters for aiohttp to encode."""
        if (self._encoded_server is not None and _PLAIN.fullmatch(path)
                and "/." not in path  # yarl resolves dot segments in a text
                and (not query or all(_PLAIN.fullmatch(k) and _PLAIN.fullmatch(v)
                                      for k, v in query.items()))):
            qs = "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
            return URL(f"{self._encoded_server}{path}?{qs}" if qs
                       else self._encoded_server + path, encoded=True), None
        return self._server + path, dict(query) if query else None

    def _lease_call(self, name: str, *args: Any) -> Send:
        """A call of kubernetes-asyncio's `CoordinationV1Api` over the session given."""

        async def send(session: aiohttp.ClientSession, limits: aiohttp.ClientTimeout,
                       auth: dict[str, str]) -> aiohttp.ClientResponse:
            api = self._leases.get(session)
            if api is None:
                api = self._leases[session] = CoordinationV1Api(_ApiClient(
                    Configuration(host=self._server),
                    _RestClient(session, self._server_hostname), self._agent))
            response: aiohttp.ClientResponse = await getattr(api, name)(
                *args, _preload_content=False, _request_timeout=limits, _headers=auth)
            return response

        return send

    async def _request(
        self,
        verb: str,
        send: Send,
        *,
        deadline: float,
        not_found: str | None = None,
        cost: Cost = ANSWER_COST,
        keep: KeptLines | None = None,
    ) -> _Answer:
        """One HTTP request, bounded by `deadline` (clock time) including the rate limiter's
        wait, over the warm session when no other request holds it, else the burst one.
        Raises our error classes only; `_Gone` for a 404 about object `not_found`."""
        start = self._clock()
        budget = deadline - start
        status: int | None = None
        warm = False
        try:
            if budget <= 0:
                raise ClusterUnreachable("no time left for the request", reason=REASON_TIMEOUT)
            # The rate limiter refuses a wait past `deadline`, and aiohttp's `total` bounds
            # the rest (connect, answer and the body read): no timeout scope of our own, which
            # would cost a timer per request on top of aiohttp's.
            await self._bucket.acquire(deadline)
            remaining = deadline - self._clock()
            timeout = self._full_timeout if (
                remaining >= self._request_timeout_s and remaining >= self._connect_timeout_s
            ) else aiohttp.ClientTimeout(
                total=min(self._request_timeout_s, remaining),
                sock_connect=min(self._connect_timeout_s, remaining),
            )
            # The warm session carries one request at a time (held until `finally`), so it
            # never queues there and never opens a second connection.
            warm = not self._warm_busy
            if warm:
                self._warm_busy = True
            response = await send(self._warm if warm else self._burst, timeout,
                                  await self._auth.headers())
            async with response:
                status = response.status
                answer = await self._read(verb, response, cost, keep)
        except ClusterError:
            raise
        except aiohttp.ClientResponseError as exc:
            if isinstance(exc, aiohttp.ClientHttpProxyError):
                raise transport_error(exc, elapsed_s=self._clock() - start,
                                      timeout_s=min(self._request_timeout_s, budget)) from exc
            # The status line or headers could not be read (over aiohttp's 8,190-byte line
            # and field limits, or malformed): it answered, with nothing usable. The
            # library's message quotes the bytes: not reused.
            raise BadResponse(f"{verb} answer: its status line or headers are malformed or "
                              "longer than 8,190 bytes") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            elapsed = self._clock() - start
            limit = min(self._request_timeout_s, budget)
            raise transport_error(exc, elapsed_s=elapsed, timeout_s=limit) from exc
        finally:
            if warm:
                self._warm_busy = False
            if self._observer is not None:
                self._observer.request_done(self._cluster, verb, status,
                                            self._clock() - start)
        if answer.status < 300:
            return answer
        if answer.status == 404 and not_found is not None and _not_found_object(answer.body,
                                                                               not_found):
            raise _Gone
        raise http_error(answer.status, answer.reason, answer.headers, answer.body)


def _too_big(verb: str, status: int, limit: int, head: bytes = b"", *,
             setting: bool = True) -> TooLarge:
    source = "CONVERGERD_MAX_RESPONSE_BYTES" if setting else f"the budget of a {verb} answer"
    return TooLarge(f"{verb} answer ({status}) larger than {limit} bytes ({source})", head=head)


def _the_lease(answer: _Answer, namespace: str, name: str) -> KubeObject:
    """The Lease an answer holds, checked to be the one asked for."""
    lease = answer.json()
    same_object(lease, {"apiVersion": LEASE_API_VERSION, "kind": "Lease",
                        "metadata": {"name": name, "namespace": namespace}}, "Lease answer")
    return lease


class _Gone(Exception):
    """Internal: the addressed object does not exist (never leaves this module)."""


def _lease_error(exc: ClusterLevelError) -> ClusterLevelError:
    if exc.status != 404:
        return exc
    return ClusterLevelError(str(exc), status=404, k8s_reason=exc.k8s_reason, reason="not_found")
