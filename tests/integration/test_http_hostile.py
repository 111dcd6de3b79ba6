"""Untrusted HTTP clients against the real app, served by a real aiohttp server with the daemon's
server options, over a real PostgreSQL: nothing a client sends causes a 500, an ERROR or a
traceback in the log, or a log line it wrote itself.

Requests go out as raw bytes where a well-behaved client library would refuse to send them
(undecodable header bytes, oversize lines)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import resource
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from convergerd.api.app import make_app
from convergerd.api.server import FRESH_GRACE_S, MAX_LINE_BYTES, bound_port, serve
from convergerd.config import HttpLimits, load_settings
from convergerd.core.errors import ConfigError
from convergerd.delivery.fanout import FanoutEnv, Saver
from convergerd.eventloop import EventLoop
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.rounds_helpers import TcpProxy, import_doc

TOKEN = "hostile-test-token-2c8e1a"
FLEET = {
    "clusters": [{"id": "c1"}],
    "boundaries": [{"id": "team-a", "clusters": ["c1"]}],
    "policies": [{"id": "p1", "boundary": "team-a", "rule": {"type": "ForbidLatestTag"}}],
}


@dataclass(frozen=True)
class Answer:
    status: int
    headers: str
    body: bytes

    def text(self) -> str:
        return self.body.decode(errors="replace")


# Short bounds, so that tests of them take seconds.
LIMITS = HttpLimits(max_connections=16, header_timeout_s=1.0, body_timeout_s=1.0,
                    idle_timeout_s=1.0)
SLACK_S = 4.0  # how much later than a bound a busy 2-core machine may enforce it


@dataclass
class Served:
    runner: web.AppRunner
    port: int
    proxy: TcpProxy
    host: str = "127.0.0.1"

    async def send(self, raw: bytes) -> Answer:
        """One request as raw bytes; the whole answer (the server closes the connection)."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(raw)
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
            await writer.wait_closed()
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, _, headers = head.decode("latin-1").partition("\r\n")
        return Answer(int(status_line.split()[1]), headers, body)

    async def get(self, target: str, *headers: bytes, method: str = "GET") -> Answer:
        lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: test", *headers,
                 b"Connection: close", b"Content-Length: 0"]
        return await self.send(b"\r\n".join(lines) + b"\r\n\r\n")


def _no_clusters() -> FanoutEnv:
    raise AssertionError("no request here gets as far as the clusters")


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[Served]:
    """The app over a `Store` that reaches PostgreSQL through a proxy (so a test can take the
    database away and see whether a request still needed it)."""
    await import_doc(database_url, FLEET)
    target = urllib.parse.urlsplit(database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.up()
    store = await Store.connect(
        database_url.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{proxy.port}"))
    settings = load_settings({"CONVERGERD_DATABASE_URL": database_url,
                              "CONVERGERD_API_TOKEN": TOKEN, "CONVERGERD_IDENTITY": "rep-a"})
    state = StatusState(identity="rep-a", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state,
                   store=store, settings=settings, health=HealthCheck(),
                   saver=Saver(store=store, env=_no_clusters, guard_share=0.5))
    runner = await serve(app, "127.0.0.1", 0, LIMITS)
    try:
        yield Served(runner, bound_port(runner), proxy)
    finally:
        await runner.cleanup()
        await proxy.down()
        await store.close()


def assert_clean_log(caplog: pytest.LogCaptureFixture) -> None:
    """No ERROR, no traceback, and every line the server or convergerd logged is one line with
    no terminal escape (asyncpg's own warnings about the database taken away are not ours)."""
    for record in caplog.records:
        if not record.name.startswith(("convergerd", "aiohttp")):
            continue
        message = record.getMessage()
        assert record.levelno < logging.ERROR, message
        assert record.exc_info is None, message
        for forbidden in ("\n", "\r", "\x1b", "\x00"):
            assert forbidden not in message, message


BAD_POLICY_IDS = [
    ("%00", "not a DNS label"),
    ("a%2Fb", "not a DNS label"),  # decoded to "a/b" before routing
    ("%ZZ", "not a DNS label"),
    ("%C3%28", "not a DNS label"),  # invalid UTF-8
    ("Bad_Id", "not a DNS label"),
    ("p" * 51, "at most 50"),
    ("x%0A2026-01-01%20ERROR%20FORGED", "not a DNS label"),
    ("%1B%5B31mFORGED", "not a DNS label"),
]


@pytest.mark.parametrize(("raw_id", "why"), BAD_POLICY_IDS)
async def test_a_bad_policy_id_is_400_before_the_database_is_asked(
    served: Served, caplog: pytest.LogCaptureFixture, raw_id: str, why: str
) -> None:
    caplog.set_level(logging.DEBUG)
    answer = await served.get(f"/v1/policies/{raw_id}/status")
    assert answer.status == 400, answer.text()
    assert "bad policy id" in answer.text()
    assert why in answer.text()
    await served.proxy.down()  # the database is gone: the answer must not change
    again = await served.get(f"/v1/policies/{raw_id}/status")
    assert (again.status, again.body) == (answer.status, answer.body)
    unknown = await served.get("/v1/policies/nope/status")  # a good id does need the database
    assert unknown.status == 503, unknown.text()
    for method, path in (("POST", f"/v1/policies/{raw_id}/apply"),
                         ("DELETE", f"/v1/policies/{raw_id}")):
        authorized = await served.get(path, f"Authorization: Bearer {TOKEN}".encode(),
                                      method=method)
        assert authorized.status == 400, authorized.text()
    assert_clean_log(caplog)


@pytest.mark.parametrize("raw_id", ["%00", "a%2Fb", "UPPER", "c" * 64, "a%0Ab", "%1B%5B2J"])
async def test_a_bad_cluster_id_is_400(
    served: Served, caplog: pytest.LogCaptureFixture, raw_id: str
) -> None:
    caplog.set_level(logging.DEBUG)
    answer = await served.get(f"/v1/clusters/{raw_id}")
    assert answer.status == 400, answer.text()
    assert "bad cluster id" in answer.text()
    assert "not a DNS label of at most 63 characters" in answer.text()
    assert (await served.get("/v1/clusters/c1")).status == 200
    assert (await served.get("/v1/clusters/c9")).status == 404
    assert_clean_log(caplog)


@pytest.mark.parametrize("header", [
    b"Authorization: Bearer \xff\xfe\xfd",
    b"Authorization: \xff\xfe " + TOKEN.encode(),
    b"Authorization: Bearer " + TOKEN.encode() + b"\xc3\x28",
    b"Authorization: Bearer \xed\xa0\x80",  # an encoded surrogate: not UTF-8 either
])
@pytest.mark.parametrize("method", ["POST", "DELETE"])
async def test_an_undecodable_authorization_header_is_401(
    served: Served, caplog: pytest.LogCaptureFixture, header: bytes, method: str
) -> None:
    caplog.set_level(logging.DEBUG)
    path = "/v1/policies/p1/apply" if method == "POST" else "/v1/policies/p1"
    answer = await served.get(path, header, method=method)
    assert answer.status == 401, answer.text()
    assert "a valid bearer token is required" in answer.text()
    assert "WWW-Authenticate: Bearer" in answer.headers
    assert_clean_log(caplog)


async def test_oversize_and_malformed_requests_are_4xx_with_one_warning(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    long_url = await served.get("/v1/clusters/" + "a" * (MAX_LINE_BYTES + 10))
    long_header = await served.get("/status", b"X-Big: " + b"a" * (MAX_LINE_BYTES + 10))
    many = await served.get("/status", *(b"X-%d: a" % i for i in range(200)))
    not_http_url = await served.get("/v1/clusters/\x1b[31mFORGED")
    not_utf8_url = await served.send(b"GET /v1/clusters/\xff\xfe HTTP/1.1\r\nHost: t\r\n\r\n")
    for answer in (long_url, long_header, many, not_http_url, not_utf8_url):
        assert 400 <= answer.status < 500, answer.text()
    assert "longer than 8190 bytes" in long_url.text()
    assert "a" * 20 not in long_url.text()  # nothing of the line is echoed
    assert "Too many headers" in many.text()
    refused = [r for r in caplog.records if "refused a malformed request" in r.getMessage()]
    assert len(refused) == 5, [r.getMessage() for r in caplog.records]
    assert_clean_log(caplog)
    # The server is still fine.
    assert (await served.get("/healthz")).status == 200


async def test_an_oversize_credential_header_is_never_logged_or_echoed(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """A 16 KB header is refused by the parser, whose message quotes the line's first 100
    bytes: for `Authorization`, a credential. None of it may reach the log or the answer."""
    caplog.set_level(logging.DEBUG)
    credential = "Sup3rSecretCredential"
    for header in (b"Authorization: Bearer " + credential.encode() + b"x" * 16_384,
                   b"Authorization: Basic " + credential.encode() + b"\x00\x01 x",
                   credential.encode() + b": " + b"x" * 16_384):
        answer = await served.get("/v1/policies/p1", header, method="DELETE")
        assert answer.status == 400, answer.text()
        assert credential not in answer.text() + answer.headers
        assert credential[:6] not in answer.text()
    logged = " ".join(f"{r.getMessage()} {r.exc_info}" for r in caplog.records)
    assert credential[:6] not in logged
    assert "refused a malformed request" in logged


async def test_expect_100_continue_is_sent_only_to_an_authenticated_mutation(
    served: Served
) -> None:
    """A client holding its body back until `100 Continue` gets the 401 first, and no 100;
    with the token it is told to continue; an unknown expectation is not quoted back."""
    head = ("POST /v1/policies/nope/apply HTTP/1.1\r\nHost: t\r\nContent-Type: "
            "application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\n")
    refused = await served.send(head.encode() + b"\r\n")  # the body is never sent
    assert refused.status == 401, refused.text()
    assert b"100 Continue" not in refused.body
    assert "a valid bearer token is required" in refused.text()
    for method, path in (("POST", "/v1/policies/nope/apply"), ("DELETE", "/v1/policies/nope")):
        wrong = await served.send(head.replace("POST /v1/policies/nope/apply", f"{method} {path}")
                                  .encode() + b"Authorization: Bearer wrong\r\n\r\n")
        assert wrong.status == 401, wrong.text()

    reader, writer = await asyncio.open_connection(served.host, served.port)
    try:
        writer.write(head.encode() + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"{}")
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert final.startswith(b"HTTP/1.1 404"), final  # no such policy: it did continue
    finally:
        writer.close()

    for path in ("/status", "/v1/policies/p1", "/no/such/path"):
        odd = await served.get(path, b"Expect: FORGED-expectation")
        assert odd.status == 417, odd.text()
        assert "FORGED" not in odd.text()
        assert json.loads(odd.body)["error"]


async def test_unknown_paths_and_methods_are_json_4xx(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    missing = await served.get("/v1/%0Anope%1B%5B2J")
    assert missing.status == 404
    assert "\\n" in missing.text()  # the path is shown, escaped
    wrong = await served.get("/status", method="PUT")
    assert wrong.status == 405
    # RFC 9110: a 405 names the methods the resource has.
    assert "\r\nAllow: GET,HEAD" in "\r\n" + wrong.headers, wrong.headers
    assert json.loads(wrong.body)["allowed_methods"] == ["GET", "HEAD"]
    assert_clean_log(caplog)


async def test_requests_the_parser_refuses_are_answered_in_json(served: Served) -> None:
    """The API document says every error is JSON: those aiohttp's parser answers too."""
    for answer in (await served.get("/status" + "a" * 9000),
                   await served.send(b"NOT HTTP AT ALL\r\n\r\n"),
                   await served.get("/status", *(b"X-%d: a" % i for i in range(200)))):
        assert answer.status == 400, answer.text()
        assert "Content-Type: application/json" in answer.headers, answer.headers
        assert json.loads(answer.body)["error"]


# ---------------------------------------------------------------------------------------------
# The server's bounds (CONVERGERD_HTTP_*): LIMITS above


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """What the server sent before closing the connection; fails if it is still open after
    `timeout_s`."""
    try:
        return await asyncio.wait_for(reader.read(), timeout_s)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        pytest.fail(f"the connection was still open after {timeout_s:g} s")


async def test_a_slowloris_connection_is_cut_after_the_header_timeout(served: Served) -> None:
    reader, writer = await asyncio.open_connection(served.host, served.port)
    writer.write(b"GET /status HTTP/1.1\r\nHost: t\r\n")

    async def trickle() -> None:  # one header byte every 0.1 s, never the end of the head
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.1)

    started = time.monotonic()
    trickling = asyncio.create_task(trickle())
    try:
        answer = await _closed_within(reader, LIMITS.header_timeout_s + SLACK_S)
    finally:
        trickling.cancel()
        writer.close()
    assert time.monotonic() - started >= LIMITS.header_timeout_s * 0.9
    if answer:  # it may be told why, in JSON, before the close
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"application/json" in answer
    assert (await served.get("/healthz")).status == 200


async def test_idle_connections_are_cut(served: Served) -> None:
    # Never a byte: cut by the header timeout.
    silent_reader, silent = await asyncio.open_connection(served.host, served.port)
    # One answered request, then nothing: kept alive for the idle timeout, then cut.
    kept_reader, kept = await asyncio.open_connection(served.host, served.port)
    kept.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    head = await asyncio.wait_for(kept_reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    try:
        await _closed_within(silent_reader, LIMITS.header_timeout_s + SLACK_S)
        await _closed_within(kept_reader, LIMITS.idle_timeout_s + SLACK_S)
    finally:
        silent.close()
        kept.close()


async def test_connections_are_capped_and_health_still_answers(served: Served) -> None:
    """Three times the cap in connections that send nothing: once they are past the grace a
    new connection gets (its request may be on the way), the server closes those idle the
    longest to make room, keeps at most the cap open, and a new client is still served."""
    cap = LIMITS.max_connections
    grace_s = min(FRESH_GRACE_S, LIMITS.header_timeout_s / 4)
    first = [await asyncio.open_connection(served.host, served.port) for _ in range(cap)]
    await asyncio.sleep(grace_s)  # the age that makes a silent connection idle
    opened = first + [await asyncio.open_connection(served.host, served.port)
                      for _ in range(cap)]
    try:
        # The oldest are closed at once to make room, well before any timeout.
        await asyncio.wait_for(
            asyncio.gather(*(_closed_within(r, LIMITS.header_timeout_s) for r, _ in first)),
            LIMITS.header_timeout_s * 0.9)
        await asyncio.sleep(grace_s)
        assert (await served.get("/healthz")).status == 200
        server = served.runner.server
        assert server is not None
        assert len(server.connections) <= cap
    finally:
        for _, writer in opened:
            writer.close()


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@contextlib.asynccontextmanager
async def slow_server(
    cap: int, metrics: Metrics, **serve_options: Any
) -> AsyncIterator[tuple[int, asyncio.Event, list[web.Request]]]:
    """A server of `cap` connections whose `/slow` answers once `release` is set; yields its
    port, `release` and the requests in the app."""
    release, entered = asyncio.Event(), []

    async def slow(request: web.Request) -> web.Response:
        entered.append(request)
        await release.wait()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/slow", slow)
    runner = await serve(app, "127.0.0.1", 0, HttpLimits(max_connections=cap),
                         observer=metrics, **serve_options)
    try:
        yield bound_port(runner), release, entered
    finally:
        release.set()
        await runner.cleanup()


async def test_at_the_cap_with_every_connection_serving_requests_are_answered_503() -> None:
    """Past the cap, a connection gets 503 with Retry-After at once, its request read and
    dropped before the close (past half the cap so waiting, one that sent nothing yet is
    closed at once after its 503); a busy connection is never closed for them."""
    metrics = Metrics(state=StatusState(identity="t", interval_s=300))
    async with slow_server(4, metrics) as (port, release, entered):
        busy = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        try:
            for _, writer in busy:
                writer.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
            while len(entered) < 4:  # every connection is in the app
                await asyncio.sleep(0.01)
            late = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            # 4 busy; of the late ones, half the cap were answered 503 and wait for their
            # request before closing, the others (nothing sent yet) were answered and closed at
            # once, as is one more.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                extra = await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
            assert extra.startswith(b"HTTP/1.1 503"), extra
            for _, writer in late:
                writer.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
            for reader, writer in late:
                answer = await asyncio.wait_for(reader.read(), 10)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 503"), answer
                assert b"\r\nRetry-After: 1\r\n" in answer, answer
                assert b"too many connections" in answer
            assert len(entered) == 4  # none of them reached the app
            release.set()
            for reader, _ in busy:  # the busy ones were not disturbed
                assert (await asyncio.wait_for(reader.readline(), 10)).startswith(
                    b"HTTP/1.1 200")
        finally:
            for _, writer in busy:
                writer.close()
    assert sample(metrics, "convergerd_http_connections_refused_total",
                  reason="over_capacity") == 5
    assert sample(metrics, "convergerd_http_connections_refused_total",
                  reason="evicted_idle") == 0


async def test_a_burst_of_clients_each_gets_an_answer_and_every_refusal_is_counted(
    caplog: pytest.LogCaptureFixture
) -> None:
    """Four times the cap in clients, each sending its request at once, the cap's worth kept
    in the app: every one is answered (200, or 503 with Retry-After), none is reset or closed
    unanswered as "idle"; every 503 is counted, the log has a few lines and, when the window
    ends, a summary of the rest."""
    caplog.set_level(logging.INFO, logger="convergerd.api.server")
    clients, cap = 1_000, 256  # the default cap
    metrics = Metrics(state=StatusState(identity="t", interval_s=300))
    window_s = 1.0  # short enough to wait for its summary
    started = time.monotonic()
    async with slow_server(cap, metrics, log_window_s=window_s) as (port, release, entered):
        loop = asyncio.get_running_loop()

        def handled() -> float:
            return sample(metrics, "convergerd_http_connections_refused_total",
                          reason="over_capacity") + len(entered)

        # As a crowd of other machines does it: each client connects and its request is in
        # the server's kernel before the server accepts it. 100 at a time (the listen backlog
        # is 128), the next ones once the server took those.
        socks: list[socket.socket] = []
        for batch in range(0, clients, 100):
            for _ in range(100):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                sock.setblocking(False)
                socks.append(sock)
            deadline = time.monotonic() + 30
            while handled() < batch + 100:  # each is in the app or was answered 503
                assert time.monotonic() < deadline, (len(entered), sample(
                    metrics, "convergerd_http_connections_refused_total", reason="reset"))
                await asyncio.sleep(0.01)
        release.set()

        async def answer(sock: socket.socket) -> bytes:
            data = b""
            try:
                while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 30):
                    data += chunk
            except ConnectionResetError:
                data = b"reset"
            finally:
                sock.close()
            return data

        answers = await asyncio.gather(*(answer(sock) for sock in socks))
        statuses = [a[:12] for a in answers]
        assert statuses.count(b"HTTP/1.1 200") == len(entered) == cap
        assert statuses.count(b"HTTP/1.1 503") == clients - cap, sorted(set(statuses))
        assert all(b"\r\nRetry-After: 1\r\n" in a for a in answers if a.startswith(
            b"HTTP/1.1 503"))
        refused = clients - cap

        def lines() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "convergerd.api.server"]

        def logged() -> int:
            """The refusals the log accounts for: its lines and its summaries' counts."""
            summaries = [re.fullmatch(r"suppressed (\d+) similar lines \(over_capacity\) .*", m)
                         for m in lines()]
            return (sum("answered 503" in m for m in lines())
                    + sum(int(m.group(1)) for m in summaries if m is not None))

        # Every refusal is in the log, as a line or in a summary written when its window
        # ended (no later event needed), in a few lines per window.
        deadline = time.monotonic() + window_s + 10
        while logged() < refused:
            assert time.monotonic() < deadline, lines()
            await asyncio.sleep(0.05)
        assert logged() == refused
        windows = (time.monotonic() - started) // window_s + 1
        assert len(lines()) <= 6 * windows, lines()


async def test_a_client_that_does_not_read_its_answers_is_cut(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Pipelined requests whose answers are never read: once they fill the socket's buffers,
    the connection is cut after the body timeout (the answers are not kept for ever)."""
    caplog.set_level(logging.DEBUG)
    server = served.runner.server
    assert server is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (served.host, served.port))
    try:
        request = b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n"
        for _ in range(400):  # ~10 MB of answers
            await asyncio.wait_for(loop.sock_sendall(sock, request), 10)
        deadline = time.monotonic() + 10 * (LIMITS.body_timeout_s + SLACK_S)
        while server.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not server.connections, "the connection is still open"
    finally:
        sock.close()
    assert_clean_log(caplog)


async def test_accept_failing_for_want_of_descriptors_is_logged_once_a_minute(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio logs every failed accept() (one per pending connection, each time it retries):
    out of descriptors, that was hundreds of MB of log a minute."""
    caplog.set_level(logging.DEBUG)
    clients = [socket.socket() for _ in range(20)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        # No descriptor left in this process: the server's accept() fails with EMFILE.
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open(os.devnull, os.O_RDONLY))
        for client in clients:
            client.setblocking(False)
            client.connect_ex((served.host, served.port))

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "accept" in r.getMessage()
                    or "Too many open files" in r.getMessage()]

        # asyncio retries accept() once a second: wait for three rounds of retries.
        loop = asyncio.get_running_loop()
        assert isinstance(loop, EventLoop)
        rounds, seen, deadline = 0, loop.accept_failures, time.monotonic() + 20
        while rounds < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if loop.accept_failures > seen:
                rounds, seen = rounds + 1, loop.accept_failures
        assert rounds == 3, f"accept() failed {seen} times"
        assert len(failures()) == 1, [r.getMessage() for r in failures()][:5]
        assert "Too many open files" in failures()[0].getMessage()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for client in clients:
            client.close()
    # Descriptors back: the pending connections are accepted; the server is full of them,
    # just opened and silent, so a new client is answered 503 (with Retry-After) until they
    # are old enough to be closed for it, then served.
    deadline = time.monotonic() + LIMITS.header_timeout_s + SLACK_S
    while (answer := await served.get("/healthz")).status != 200:
        assert answer.status == 503, answer
        assert "Retry-After: 1" in answer.headers, answer
        assert time.monotonic() < deadline, "/healthz never answered 200"
        await asyncio.sleep(0.05)


async def test_a_taken_address_is_a_setting_error_naming_it() -> None:
    """Issue 17, item 15: the daemon (and the operator, test_operator.py) on a port something
    else holds: a setting error naming the setting and the address, not an OSError traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as refused:
            await serve(web.Application(), "127.0.0.1", port, HttpLimits())
    assert str(refused.value) == (
        f"CONVERGERD_HTTP_ADDR='127.0.0.1:{port}': cannot listen there: Address already in "
        "use; choose another address (--http-addr)")
