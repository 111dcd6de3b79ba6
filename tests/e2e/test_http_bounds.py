"""The HTTP server is bounded (real `convergerd run`, the simulator, the real PostgreSQL): 1,000
idle connections and 100 slowloris ones against a daemon with the usual 1,024-descriptor limit
do not take its descriptors, its rounds go on, `/healthz` answers, and every one of those
connections is cut by the server.

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
    assert most_fds <= baseline + CAP + IN_FLIGHT
    assert "Too many open files" not in log
    assert "out of system resource" not in log
    assert len(log) < 200_000
