"""The event loop every convergerd process runs on: asyncio's, with a smaller TLS read buffer.

asyncio gives every TLS connection a 256 KiB read buffer (`asyncio.sslproto.SSLProtocol.
max_size`), allocated and zero-filled when the connection opens, so it is resident for the
connection's whole life. The daemon keeps one warm connection per cluster (and the simulator
one per client connection): at 10,000 clusters that is 2.5 GB of buffers alone. A TLS record
is at most 16 KiB of plaintext plus its overhead, so `TLS_READ_BUFFER_BYTES` still takes a
whole record per `recv` and a big list answer costs a few more `recv` calls, not more memory.

`run` also raises the garbage collector's young-generation threshold (`tune_gc`): a round
keeps each request's objects alive for milliseconds, long enough to outlive CPython's default
threshold (700 allocations) twice, so they were promoted to the oldest generation and set off
full collections of the whole heap, a large share of a create round's CPU. At
`GC_GEN0_THRESHOLD` they die young (bench/RESULTS.md, "Scale: 10,000 clusters", "Garbage
collection"). The price: garbage in a reference cycle
can wait long for a full collection, so nothing big may sit in one (a refused answer's body,
`kube.client.ClusterClient._read`); no collection is forced (docs/design.md, "Bounded over
time").

There is no public knob for the TLS buffer: `EventLoop` overrides the loop's private
`_make_ssl_transport` to build the same protocol with a smaller class attribute, so only loops
made here are affected, never a library's or a test runner's own loop. The override copies
asyncio's own body as of CPython 3.11-3.13 (3.12 added the `_ensure_fd_no_transport` check);
tests/unit/test_eventloop_internals.py pins that body per Python version and fails, naming
this module, on a version whose asyncio differs. `run` is `asyncio.run` on this loop; tests
run on it too (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import resource
import time
from asyncio import constants, selector_events, sslproto
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# 32 KiB: two full TLS records per read (16 KiB + 256 bytes each), 1/8 of asyncio's buffer.
TLS_READ_BUFFER_BYTES = 32 * 1024
# Allocations between young collections (CPython's default: 700). A young collection of this
# many objects takes a few milliseconds.
GC_GEN0_THRESHOLD = 50_000
# asyncio's message for accept() failing with EMFILE, ENFILE, ENOBUFS or ENOMEM.
_ACCEPT_OUT_OF_RESOURCES = "socket.accept() out of system resource"
ACCEPT_FAILURE_LOG_PERIOD_S = 60.0
# Work a long job does before it gives the loop a turn (`Pacer`): the prober's timers, HTTP
# requests and clusters' answers wait at most about this long behind it.
SLICE_S = 0.01


class _SSLProtocol(sslproto.SSLProtocol):
    max_size = TLS_READ_BUFFER_BYTES


class EventLoop(asyncio.SelectorEventLoop):
    """`asyncio.SelectorEventLoop` whose TLS connections read through a 32 KiB buffer, and
    that logs accept() failing for want of descriptors once a minute, not once per attempt."""

    def __init__(self, selector: Any = None) -> None:
        super().__init__(selector)
        self.accept_failures = 0  # since the loop started
        self._accept_failures_unlogged = 0
        self._accept_logged_at = -math.inf

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_OUT_OF_RESOURCES:
            super().call_exception_handler(context)
            return
        # asyncio reports every failed accept() (up to the listen backlog per attempt, an
        # attempt a second): out of descriptors, that is a flood of tracebacks.
        self.accept_failures += 1
        self._accept_failures_unlogged += 1
        now = self.time()
        if now - self._accept_logged_at < ACCEPT_FAILURE_LOG_PERIOD_S:
            return
        self._accept_logged_at = now
        count, self._accept_failures_unlogged = self._accept_failures_unlogged, 0
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        log.error("accept() failed %d time(s) since the last such line (at most one a minute): "
                  "%s; new connections wait in the listen backlog until descriptors free up "
                  "(this process may open %s)", count, context.get("exception"),
                  "any number" if soft == resource.RLIM_INFINITY else soft)

    def _make_ssl_transport(
        self, rawsock: Any, protocol: Any, sslcontext: Any, waiter: Any = None, *,
        server_side: bool = False, server_hostname: str | None = None, extra: Any = None,
        server: Any = None,
        ssl_handshake_timeout: Any = constants.SSL_HANDSHAKE_TIMEOUT,
        ssl_shutdown_timeout: Any = constants.SSL_SHUTDOWN_TIMEOUT,
    ) -> asyncio.Transport:
        # As asyncio's own (selector_events.BaseSelectorEventLoop), with our protocol class.
        ensure_fd_no_transport = getattr(self, "_ensure_fd_no_transport", None)
        if ensure_fd_no_transport is not None:  # Python 3.12 and later
            ensure_fd_no_transport(rawsock)
        ssl_protocol = _SSLProtocol(
            self, protocol, sslcontext, waiter, server_side, server_hostname,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout,
        )
        selector_events._SelectorSocketTransport(  # type: ignore[attr-defined]
            self, rawsock, ssl_protocol, extra=extra, server=server)
        transport: asyncio.Transport = ssl_protocol._app_transport
        return transport


def tune_gc() -> None:
    """Young collections every `GC_GEN0_THRESHOLD` allocations (never fewer than now)."""
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on an `EventLoop`, with the collector tuned (`tune_gc`)."""
    tune_gc()
    with asyncio.Runner(loop_factory=EventLoop) as runner:
        return runner.run(main)


# Loop turns a pause takes: a task woken by a timer or a socket runs two turns after the
# event (the callback, which resolves its future; then its step), so with fewer a long job's
# next slice would run before it (`asyncio.sleep(0)` alone: two slices before it).
_PAUSE_TURNS = 3


class Pacer:
    """Lets a long job on the loop (a round's record: 1,000,000 rows at 10,000 clusters x 100
    policies) give the other tasks a turn whenever `slice_s` of work passed since its last:
    none waits longer than about one slice behind it."""

    __slots__ = ("_slice_s", "_until")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self._slice_s = slice_s
        self._until = time.perf_counter() + slice_s

    async def pause(self) -> None:
        """A turn for the other tasks if the slice is over; else nothing."""
        if time.perf_counter() >= self._until:
            for _ in range(_PAUSE_TURNS):
                await asyncio.sleep(0)
            self._until = time.perf_counter() + self._slice_s
