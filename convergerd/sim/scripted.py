"""A scripted cluster: one TLS server that answers whatever its `answer` handler says, with a
plain-http "elsewhere" beside it, each recording the requests it got (path, Authorization).

For tests and benchmarks of the client's edge (`tests/integration/test_answer_provenance.py`,
`bench/answer_cost.py`): where the simulator is faithful to kube-apiserver, this one is
whatever an attacker in control of a cluster makes it. Loopback only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

from aiohttp import web

from convergerd.sim.tls import CertAuthority, server_ssl_context

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """Every request a server got: its path and its Authorization header."""

    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


class ScriptedCluster:
    """`async with ScriptedCluster() as cluster:` then set `cluster.answer`; `server` and
    `ca_pem` make its kubeconfig entry, `elsewhere` is the plain-http URL beside it."""

    def __init__(self, elsewhere_answer: Handler | None = None) -> None:
        self.answer: Handler | None = None
        self.seen = Seen()
        self.seen_elsewhere = Seen()
        self._elsewhere_answer = elsewhere_answer
        self._ca = CertAuthority.create("scripted")
        self.ca_pem = self._ca.cert_pem
        self.server = ""
        self.elsewhere = ""
        self._runners: list[web.AppRunner] = []

    async def __aenter__(self) -> ScriptedCluster:
        other = web.Application()
        other.router.add_route("*", "/{tail:.*}", self._elsewhere)
        self.elsewhere = f"http://127.0.0.1:{await self._serve(other, None)}"
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._scripted)
        tls = server_ssl_context(self._ca.issue_serving_cert())
        self.server = f"https://127.0.0.1:{await self._serve(app, tls)}"
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for runner in self._runners:
            await runner.cleanup()

    async def _serve(self, app: web.Application, ssl: object) -> int:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl)  # type: ignore[arg-type]
        await site.start()
        server = site._server  # aiohttp keeps the bound port only there
        assert server is not None
        port: int = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return port

    async def _scripted(self, request: web.Request) -> web.StreamResponse:
        self.seen.requests.append((request.path, request.headers.get("Authorization")))
        await request.read()
        if self.answer is None:
            return web.json_response({"kind": "Status", "code": 503}, status=503)
        return await self.answer(request)

    async def _elsewhere(self, request: web.Request) -> web.StreamResponse:
        self.seen_elsewhere.requests.append((request.path,
                                             request.headers.get("Authorization")))
        if self._elsewhere_answer is None:
            return web.json_response({})
        return await self._elsewhere_answer(request)
