"""What one hostile cluster's answer costs the client: figures, not a test.

    .venv/bin/python bench/answer_cost.py [--cap-mib 16] [--attacks amplification,version,...]

One `ClusterClient` (the code on `sys.path`: point PYTHONPATH at another checkout to take the
same figures for it) talks to a scripted cluster (`convergerd.sim.scripted`) that answers
each attack under the response cap; per attack it prints what the call ended in, its wall
time, the longest the event loop was blocked meanwhile (a 5 ms ticker), and the process's
RSS before, at its peak (sampled every 2 ms from another thread) and after (the call
returned, nothing collected by hand: what the daemon would keep).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

import convergerd
from convergerd.config import ClusterAccess
from convergerd.core.model import ClusterId
from convergerd.core.render import API_VERSION, MANAGED_SELECTOR
from convergerd.kube.client import ClusterClient
from convergerd.kube.kubeconfig import Credentials
from convergerd.kube.tlsctx import TlsContexts
from convergerd.sim.scripted import Handler, ScriptedCluster

PAGE_SIZE = 500
PAGE_HEAD = b'{"apiVersion":"%s","kind":"PolicyList","metadata":{},"items":[' % (
    API_VERSION.encode())


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRss:
    """The highest RSS seen between start and stop, sampled from a thread (the loop may be
    blocked: that is what is measured)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            self._stop.wait(0.002)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def longest_block(stop: asyncio.Event) -> float:
    loop = asyncio.get_running_loop()
    worst, last = 0.0, loop.time()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = loop.time()
        worst = max(worst, now - last - 0.005)
        last = now
    return worst


def fill(cap: int, item: bytes) -> bytes:
    """A page of `item`s, as many as fit under `cap`."""
    count = (cap - len(PAGE_HEAD) - 2) // (len(item) + 1)
    return PAGE_HEAD + b",".join([item] * count) + b"]}"


def raw(body: bytes, status: int = 200, **headers: str) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=status, headers=headers,
                            content_type="application/json")
    return handler


def endless() -> Handler:
    counter = iter(range(10**9))

    async def handler(_: web.Request) -> web.StreamResponse:
        doc = {"apiVersion": API_VERSION, "kind": "PolicyList", "items": [],
               "metadata": {"continue": f"t{next(counter)}"}}
        return web.Response(body=orjson.dumps(doc), content_type="application/json")
    return handler


def policy(name: str, revision: int) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Policy", "metadata": {"name": name},
            "spec": {"policyId": name, "revision": revision, "enabled": True,
                     "boundary": "b", "rule": {"type": "ForbidLatestTag"}}}


Call = Callable[[ClusterClient], Awaitable[Any]]


def attacks(cap: int, elsewhere: str) -> dict[str, tuple[Handler, Call]]:
    listing: Call = lambda c: c.list_policies(label_selector=MANAGED_SELECTOR,  # noqa: E731
                                              timeout_s=120)
    applying: Call = lambda c: c.apply_policy(policy("policy-p1", 3), timeout_s=30)  # noqa: E731
    return {
        "amplification (list of {} items)": (raw(fill(cap - 1, b"{}")), listing),
        "deep nesting under the cap (list)": (raw(b"[" * (cap // 2 - 1) + b"]" * (cap // 2 - 1)),
                                              listing),
        "strings of brackets in lists (list)": (raw(fill(cap - 1, b'["["]')), listing),
        "/version of {} items": (raw(fill(cap - 1, b"{}")),
                                 lambda c: c.server_version(timeout_s=30)),
        "endless continue (list)": (endless(), listing),
        "items beyond the limit (list)": (raw(orjson.dumps({
            "apiVersion": API_VERSION, "kind": "PolicyList", "metadata": {},
            "items": [policy(f"policy-x{i}", 1) for i in range(PAGE_SIZE * 4)]})), listing),
        "list without items": (raw(orjson.dumps({"apiVersion": API_VERSION,
                                                  "kind": "PolicyList"})), listing),
        "apply answered by another object": (raw(orjson.dumps(policy("policy-p2", 1))),
                                             applying),
        "redirect of an apply to http elsewhere": (
            raw(b"", status=302, Location=f"{elsewhere}/anything"), applying),
    }


def outcome(result: Any, error: BaseException | None) -> str:
    if error is not None:
        reason = getattr(error, "reason", "")
        return f"refused: {type(error).__name__} {reason}: {str(error)[:90]}"
    items = getattr(result, "items", None)
    if items is not None:
        return f"accepted: {len(items):,} items"
    return f"accepted: {str(result)[:60]}"


async def _delivered_elsewhere(_: web.Request) -> web.StreamResponse:
    return web.Response(body=orjson.dumps(policy("policy-p1", 3)),
                        content_type="application/json")


async def run(args: argparse.Namespace) -> None:
    cap = args.cap_mib * 2**20
    print(f"convergerd {convergerd.__version__} from {os.path.dirname(convergerd.__file__)}; "
          f"response cap {args.cap_mib} MiB")
    print("| attack | outcome | wall s | longest loop block s | RSS before MB | peak MB "
          "| after MB | elsewhere asked |")
    print("|---|---|---|---|---|---|---|---|")
    async with ScriptedCluster(_delivered_elsewhere) as cluster:
        creds = Credentials(name="c0001", server=cluster.server, ca_pem=cluster.ca_pem,
                            token="bench-token")  # noqa: S106 - a scripted server's
        access = ClusterAccess(kubeconfig=None, request_timeout_s=120.0, connect_timeout_s=5.0,
                               qps=10_000.0, burst=10_000, apply_concurrency=2,
                               max_response_bytes=cap)
        chosen = attacks(cap, cluster.elsewhere)
        for name in args.attacks or chosen:
            handler, call = chosen[name]
            cluster.answer = handler
            client = ClusterClient(ClusterId("c0001"), creds,
                                   ssl_context=TlsContexts().context_for(creds), access=access,
                                   agent="convergerd/bench (answer-cost)", page_size=PAGE_SIZE)
            before = rss_mb()
            asked_before = len(cluster.seen_elsewhere.requests)
            stop = asyncio.Event()
            ticker = asyncio.create_task(longest_block(stop))
            await asyncio.sleep(0.02)
            start = time.perf_counter()
            result: Any = None
            error: BaseException | None = None
            with PeakRss() as peak:
                try:
                    result = await call(client)
                except Exception as exc:  # every outcome is a figure here
                    error = exc
                wall = time.perf_counter() - start
                stop.set()
                blocked = await ticker
            await client.close()
            said = outcome(result, error)
            result = error = None
            after = rss_mb()
            asked = len(cluster.seen_elsewhere.requests) - asked_before
            print(f"| {name} | {said} | {wall:.2f} | {blocked:.2f} | {before:.0f} | "
                  f"{peak.peak:.0f} | {after:.0f} | {asked} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap-mib", type=int, default=16,
                        help="the response cap (CONVERGERD_MAX_RESPONSE_BYTES), MiB")
    parser.add_argument("--attacks", type=lambda s: s.split(","), default=None,
                        help="comma-separated attack names (default: all)")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
