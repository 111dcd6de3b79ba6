"""The HTTP server is bounded (real `convergerd run`, the simulator, the real PostgreSQL): 1,000
idle connections and 100 slowloris ones against a daemon with the usual 1,024-descriptor limit
do not take its descriptors, its rounds go on, `/healthz` answers, and every one of those
connections is cut by the server; 2,000 clients at once on `/status` are each answered.

Before the bounds, the idle connections were kept for an hour (aiohttp's keep-alive timeout)
and the slowloris ones for as long as they trickled: the daemon ran out of descriptors, the
database pool failed with `Too many open files`, rounds stopped, and asyncio logged every
failed accept() (hundreds of MB a minute)."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import selectors
import socket
import time
import urllib.request

import pytest

from tests.e2e.harness import STARTUP_S, Daemon, World, say, wait_for

pytestmark = pytest.mark.e2e
IDLE, SLOWLORIS = 1000, 100
DAEMON_FD_LIMIT = 1024  # the usual soft limit
HEADER_TIMEOUT_S = 3.0
CAP = 256  # CONVERGERD_HTTP_MAX_CONNECTIONS' default
# Past the cap, a burst briefly holds the sockets asyncio accepted in the last loop turns (up
# to the listen backlog, 128, a turn) until each is admitted or closed.
IN_FLIGHT = 2 * 128
ATTACK_S = 60.0  # how long the test gives the daemon to shed every connection


def metric_sum(daemon: Daemon, name: str) -> float:
    """The sum of a metric's series (0 when /metrics does not answer)."""
    try:
        with urllib.request.urlopen(daemon.url + "/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(m.group(1)) for m in
               re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def healthz_status(daemon: Daemon) -> int:
    try:
        with urllib.request.urlopen(daemon.url + "/healthz", timeout=5) as resp:  # noqa: S310
            return int(resp.status)
    except OSError:
        return 0


class Attack:
    """`IDLE` connections that send nothing and `SLOWLORIS` that send a request line and then
    one header byte a second, never finishing; which of them the server has cut, and when."""

    def __init__(self, port: int) -> None:
        self.opened: dict[socket.socket, float] = {}
        self.slow: set[socket.socket] = set()
        self.trickling: set[socket.socket] = set()
        self.cut_after: list[float] = []
        self._readable = selectors.DefaultSelector()
        self._next_trickle = 0.0
        for batch in range(0, IDLE + SLOWLORIS, 100):  # a listen backlog's worth at a time
            self._connect(port, range(batch, min(batch + 100, IDLE + SLOWLORIS)))

    def _connect(self, port: int, numbers: range) -> None:
        connecting = selectors.DefaultSelector()
        for i in numbers:
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            self.opened[sock] = time.monotonic()
            connecting.register(sock, selectors.EVENT_WRITE)
            self._readable.register(sock, selectors.EVENT_READ)
            if i >= IDLE:
                self.slow.add(sock)
        deadline = time.monotonic() + 5
        while connecting.get_map() and time.monotonic() < deadline:
            for key, _ in connecting.select(timeout=0.1):
                connecting.unregister(key.fileobj)
        connecting.close()

    def step(self) -> None:
        """Trickle when due; note the connections the server closed (or answered 408)."""
        if time.monotonic() >= self._next_trickle:
            self._next_trickle = time.monotonic() + 1.0
            for sock in self.slow & self.opened.keys():
                with contextlib.suppress(OSError):
                    sock.send(b"X" if sock in self.trickling else b"GET /status HTTP/1.1\r\n")
                    self.trickling.add(sock)
        for key, _ in self._readable.select(timeout=0.1):
            sock = self.opened_socket(key.fileobj)
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data or data.startswith(b"HTTP/1.1 408"):
                self.cut_after.append(time.monotonic() - self.opened.pop(sock))
                self._readable.unregister(sock)
                sock.close()

    @staticmethod
    def opened_socket(obj: object) -> socket.socket:
        assert isinstance(obj, socket.socket)
        return obj

    def close(self) -> None:
        for sock in self.opened:
            sock.close()
        self._readable.close()


def test_idle_and_slowloris_connections_cannot_take_the_daemons_descriptors(
    world: World,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = IDLE + SLOWLORIS + 256  # this test's own sockets, plus what pytest holds
    if soft < needed:  # the clients need their descriptors too
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    daemon = world.start("bounded", CONVERGERD_HTTP_HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT_S))
    wait_for(daemon.is_leader, STARTUP_S, "the daemon to lead")
    pid = daemon.proc.pid
    resource.prlimit(pid, resource.RLIMIT_NOFILE,
                     (DAEMON_FD_LIMIT, resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]))
    wait_for(lambda: metric_sum(daemon, "convergerd_rounds_total") >= 1, STARTUP_S,
             "the first round")
    baseline = fds(pid)
    rounds_before = metric_sum(daemon, "convergerd_rounds_total")

    started = time.monotonic()
    attack = Attack(daemon.port)
    most_fds, health, rounds_after = fds(pid), 0, rounds_before
    try:
        while time.monotonic() - started < ATTACK_S and (
                attack.opened or not health or rounds_after < rounds_before + 2):
            most_fds = max(most_fds, fds(pid))
            attack.step()
            health = health or healthz_status(daemon)
            rounds_after = metric_sum(daemon, "convergerd_rounds_total")
    finally:
        attack.close()
    log = daemon.log()
    say(f"daemon fds: {baseline} before, at most {most_fds} under {IDLE} idle + "
        f"{SLOWLORIS} slowloris connections; {len(attack.cut_after)} cut, the last after "
        f"{max(attack.cut_after, default=0):.1f} s; /healthz {health}; rounds "
        f"{rounds_before:g} -> {rounds_after:g}; log {len(log)} bytes")
    assert daemon.proc.poll() is None, "the daemon exited"
    assert not attack.opened, f"{len(attack.opened)} connections still open after {ATTACK_S:g} s"
    assert max(attack.cut_after) <= HEADER_TIMEOUT_S + 10
    assert health == 200
    assert rounds_after >= rounds_before + 2, "rounds stopped"
    # The cap, the refused ones waiting for their request (half the cap) and those of the
    # last turns: under twice the cap and what is in flight.
    assert most_fds <= baseline + 2 * CAP + IN_FLIGHT
    assert "Too many open files" not in log
    assert "out of system resource" not in log
    assert len(log) < 200_000


BURST = 2000


def burst_of_requests(port: int, n: int) -> list[bytes]:
    """`n` clients connecting at once, each sending `GET /status` as soon as its connection is
    up and reading until the server closes; each one's answer (`reset`, `empty` or
    `unfinished` when there was none)."""
    sel = selectors.DefaultSelector()
    got: dict[socket.socket, bytes] = {}
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        got[sock] = b""
        sel.register(sock, selectors.EVENT_WRITE)
    done: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + 60
    try:
        while len(done) < n and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                sock = Attack.opened_socket(key.fileobj)
                try:
                    if key.events == selectors.EVENT_WRITE:
                        sock.send(b"GET /status HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                        sel.modify(sock, selectors.EVENT_READ)
                        continue
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data, got[sock] = b"", got[sock] or b"reset"
                if data:
                    got[sock] += data
                else:
                    done[sock] = got[sock] or b"empty"
                    sel.unregister(sock)
    finally:
        for sock in got:
            sock.close()
        sel.close()
    return [done.get(sock, b"unfinished") for sock in got]


def test_a_burst_of_clients_on_status_is_answered_every_one(world: World) -> None:
    """2,000 clients at once on `GET /status` (the default cap of 256 connections): each is
    answered, 200, 429 (the status read budget) or 503 with Retry-After (no connection free),
    never reset or closed unanswered; every 503 is counted, the log holds a few lines.

    Before, ~1,700 of them got no answer at all: the server closed their connections as idle
    to make room while their requests waited unread."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < BURST + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(BURST + 256, hard), hard))
    daemon = world.start("burst")
    wait_for(daemon.is_leader, STARTUP_S, "the daemon to lead")
    started = time.monotonic()
    answers = burst_of_requests(daemon.port, BURST)
    statuses: dict[bytes, int] = {}
    for answer in answers:
        key = answer[:12] if answer.startswith(b"HTTP/1.1 ") else answer
        statuses[key] = statuses.get(key, 0) + 1
    log = daemon.log()
    bounds_lines = [line for line in log.splitlines() if "convergerd.api.server" in line]
    say(f"{BURST} clients on /status in {time.monotonic() - started:.1f} s: "
        f"{ {k.decode(): v for k, v in sorted(statuses.items())} }; "
        f"{len(bounds_lines)} lines from the HTTP server")
    assert set(statuses) <= {b"HTTP/1.1 200", b"HTTP/1.1 429", b"HTTP/1.1 503"}, statuses
    refused = statuses.get(b"HTTP/1.1 503", 0)
    assert all(b"\r\nRetry-After: 1\r\n" in a for a in answers if a.startswith(b"HTTP/1.1 503"))
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=5) as resp:  # noqa: S310
        metrics = resp.read().decode()
    series = 'convergerd_http_connections_refused_total{reason="over_capacity"}'
    counted = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.MULTILINE)
    assert counted is not None
    assert float(counted.group(1)) == refused
    assert len(bounds_lines) <= 6 * 6  # a burst and a summary per reason and minute
