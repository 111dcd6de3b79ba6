"""The save and delete endpoints over HTTP (the daemon's app, a real store, the simulator):
bearer token, input checks before anything is read or written, and the answers."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck as Checks
from hypothesis import given, settings

from convergerd.api.app import make_app
from convergerd.api.mutations import MAX_BODY_BYTES
from convergerd.api.server import Handler, bound_port, serve
from convergerd.config import HttpLimits
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.integration.process_helpers import cli
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, objects, settings_for
from tests.integration.savedelete_helpers import make_saver
from tests.strategies import HOSTILE_BODIES

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Client = TestClient[web.Request, web.Application]
BODY_TIMEOUT_S = 1.0
# Longer than the slots' patience (1 s): a hung cluster is still unanswered when the save
# answers, so it is listed as pending (with 0.5 s it failed by its timeout first).
REQUEST_TIMEOUT_S = 3.0
# The requests the app has served, and when each was done (a test waits on these).
SERVED: list[tuple[web.Request, asyncio.Event]] = []


@web.middleware
async def _note_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    done = asyncio.Event()
    SERVED.append((request, done))
    try:
        return await handler(request)
    finally:
        done.set()


@pytest.fixture
async def app(fleet: Fleet, database_url: str, store: Store) -> AsyncIterator[web.Application]:
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN,
                            CONVERGERD_HTTP_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT_S),
                            CONVERGERD_REQUEST_TIMEOUT_SECONDS=str(REQUEST_TIMEOUT_S))
    rounds = Rounds(fleet, store, settings)
    state = StatusState(identity="t", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state,
                   store=store, settings=settings, health=HealthCheck(),
                   saver=make_saver(rounds, store))
    app.middlewares.insert(0, _note_requests)
    try:
        yield app
    finally:
        await rounds.close()


@pytest.fixture
async def client(app: web.Application) -> AsyncIterator[Client]:
    async with TestClient(TestServer(app)) as c:
        yield c


@pytest.fixture
async def port(app: web.Application) -> AsyncIterator[int]:
    """The app served as the daemon serves it (aiohttp's test server differs: it cancels a
    handler whose client went away)."""
    runner = await serve(app, "127.0.0.1", 0, HttpLimits(body_timeout_s=BODY_TIMEOUT_S))
    try:
        yield bound_port(runner)
    finally:
        await runner.cleanup()


async def call(client: Client, method: str, path: str, **kw: Any) -> tuple[int, Any]:
    async with client.request(method, path, **kw) as resp:
        return resp.status, await resp.json()


def nothing_written(fleet: Fleet) -> bool:
    return all(not objects(fleet, c) for c in fleet.member_ids)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {TOKEN}"}])
async def test_mutations_need_the_bearer_token(
    client: Client, fleet: Fleet, headers: dict[str, str]
) -> None:
    assert (await call(client, "POST", "/v1/policies/p-regs/apply", headers=headers))[0] == 401
    assert (await call(client, "DELETE", "/v1/policies/p-regs", headers=headers))[0] == 401
    assert nothing_written(fleet)


async def test_save_answers_per_cluster_results(client: Client, fleet: Fleet) -> None:
    status, body = await call(client, "POST", "/v1/policies/p-regs/apply", headers=AUTH)
    assert status == 200
    assert body["status"] == "ok"
    results = {c["cluster"]: c["result"] for c in body["clusters"]}
    assert results == dict.fromkeys(fleet.member_ids, "created")
    fleet.set_faults("c0002", Faults(hang=True))
    await call(client, "POST", "/v1/policies/p-latest/apply", headers=AUTH)
    status, body = await call(client, "POST", "/v1/policies/p-latest/apply", headers=AUTH)
    assert status == 200
    assert body["status"] == "partial"
    # Hung past the patience, so listed as still pending (recorded when done). A down
    # cluster is no such case: its resets may use up the retries within the patience.
    [pending] = [c for c in body["clusters"] if c["result"] == "pending"]
    assert pending["cluster"] == "c0002"
    assert pending["error"]


async def test_unknown_invalid_and_deleting(client: Client, fleet: Fleet,
                                            database_url: str) -> None:
    assert (await call(client, "POST", "/v1/policies/p-none/apply", headers=AUTH))[0] == 404
    assert (await call(client, "DELETE", "/v1/policies/p-none", headers=AUTH))[0] == 404
    from tests.integration.rounds_helpers import sql

    await sql(database_url, "UPDATE policies SET rule = '[]' WHERE id = 'p-regs'")
    status, body = await call(client, "POST", "/v1/policies/p-regs/apply", headers=AUTH)
    assert status == 422
    assert "rule" in body["error"]
    assert nothing_written(fleet)


async def test_delete_refused_then_done(client: Client, fleet: Fleet) -> None:
    await call(client, "POST", "/v1/policies/p-latest/apply", headers=AUTH)
    fleet.set_faults("c0003", Faults(down=True))
    status, body = await call(client, "DELETE", "/v1/policies/p-latest", headers=AUTH)
    assert status == 409
    assert "c0003" in body["error"]
    assert (await call(client, "POST", "/v1/policies/p-latest/apply", headers=AUTH))[0] == 409
    fleet.clear_faults("c0003")
    status, body = await call(client, "DELETE", "/v1/policies/p-latest", headers=AUTH)
    assert status == 200
    assert body["status"] == "ok"
    assert nothing_written(fleet)


@pytest.mark.parametrize(
    ("path", "data", "status", "names"),
    [
        ("/v1/policies/Bad_Id/apply", None, 400, "id"),
        ("/v1/policies/" + "a" * 51 + "/apply", None, 400, "id"),
        ("/v1/policies/p-regs/apply", b"{not json", 400, "JSON"),
        ("/v1/policies/p-regs/apply", b"[1, 2]", 400, "JSON object"),
        ("/v1/policies/p-regs/apply", b'{"allow_mass_removal": "yes"}', 400,
         "allow_mass_removal"),
        ("/v1/policies/p-regs/apply", b'{"force": true}', 400, "force"),
        ("/v1/policies/p-regs/apply", b"{" + b" " * MAX_BODY_BYTES + b"}", 413, "bytes"),
    ],
)
async def test_bad_input_is_refused_naming_the_problem(  # noqa: PLR0917 - parametrized
    client: Client, fleet: Fleet, path: str, data: bytes | None, status: int, names: str
) -> None:
    got, body = await call(client, "POST", path, headers=AUTH, data=data)
    assert got == status
    assert names in body["error"]
    assert nothing_written(fleet)


async def test_delete_takes_no_fields(client: Client, fleet: Fleet) -> None:
    got, body = await call(client, "DELETE", "/v1/policies/p-regs", headers=AUTH,
                           data=b'{"cascade": true}')
    assert got == 400
    assert "cascade" in body["error"]


# ---------------------------------------------------------------------------------------------
# `convergerd policy apply|delete`: the real command (a process) against this app on its port


async def test_policy_cli_apply_prints_the_clusters_and_exits_by_outcome(
    client: Client, fleet: Fleet
) -> None:
    code, out, _ = await cli(client, "policy", "apply", "p-regs", token=TOKEN)
    assert code == 0
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()
            if line.startswith("c000")}
    assert rows == dict.fromkeys(fleet.member_ids, "created")

    fleet.set_faults("c0002", Faults(hang=True))
    code, out, _ = await cli(client, "policy", "apply", "p-latest", "--json", token=TOKEN)
    assert code == 1
    doc = json.loads(out)
    assert doc["status"] == "partial"
    assert [c["cluster"] for c in doc["clusters"] if c["result"] == "pending"] == ["c0002"]


async def test_policy_cli_delete_refused_then_done(
    client: Client, fleet: Fleet, tmp_path: Path
) -> None:
    await cli(client, "policy", "apply", "p-latest", token=TOKEN)
    fleet.set_faults("c0003", Faults(down=True))
    code, out, _ = await cli(client, "policy", "delete", "p-latest", token=TOKEN)
    assert code == 1
    assert "c0003" in out
    fleet.clear_faults("c0003")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    code, out, _ = await cli(client, "policy", "delete", "p-latest", token=None,
                                    CONVERGERD_API_TOKEN_FILE=str(token_file))
    assert code == 0
    assert nothing_written(fleet)


@pytest.mark.parametrize(
    ("args", "token", "names"),
    [
        (("apply", "p-regs"), "wrong", "401"),
        (("apply", "p-regs"), None, "CONVERGERD_API_TOKEN"),
        (("delete", "p-none"), TOKEN, "404"),
        (("apply", "Bad_Id"), TOKEN, "DNS label"),
        (("apply", "p-regs", "--api-token-file", "/nonexistent/token"), None, "cannot read"),
    ],
)
async def test_policy_cli_usage_and_auth_errors_exit_2(
    client: Client, fleet: Fleet, args: tuple[str, ...], token: str | None, names: str
) -> None:
    code, _, err = await cli(client, "policy", *args, token=token)
    assert code == 2
    assert names in err
    assert nothing_written(fleet)
    assert TOKEN not in err


async def test_policy_cli_unreachable_daemon_exits_2() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "convergerd", "policy", "apply", "p-regs", "--addr",
        "127.0.0.1:1", env={**os.environ, "CONVERGERD_API_TOKEN": TOKEN},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"cannot reach convergerd" in err


# ---------------------------------------------------------------------------------------------
# Request bodies as clients really send them


async def raw_request(port: int, head: bytes, *parts: bytes,
                      between: Callable[[], Awaitable[None]] | None = None) -> bytes:
    """`head` and the body `parts` on one connection, `between()` awaited between parts; the
    whole answer (the server closes: `Connection: close`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        for i, part in enumerate(parts):
            if i and between is not None:
                await between()
            writer.write(part)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def post_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
            "Connection: close\r\n\r\n").encode()


def answer_of(data: bytes) -> tuple[int, Any]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"application/json" in head, head
    return int(head.split()[1]), json.loads(body)


async def test_a_body_in_two_segments_is_read_whole(port: int, fleet: Fleet) -> None:
    SERVED.clear()
    body = b'{"allow_mass_removal": false}'
    first, second = body[:10], body[10:]

    async def server_has_the_first_segment() -> None:
        # Not a pause: until the server has read what was sent (it may answer then).
        while not (SERVED and SERVED[-1][0].content.total_bytes >= len(first)):
            await asyncio.sleep(0.01)

    status, doc = answer_of(await raw_request(
        port, post_head("/v1/policies/p-regs/apply", len(body)), first, second,
        between=server_has_the_first_segment))
    assert status == 200, doc
    assert doc["status"] == "ok"
    assert not nothing_written(fleet)


@pytest.mark.parametrize(("body", "names"), [
    (b"[" * 1000 + b"]" * 1000, "nested deeper than"),
    (b'{"allow_mass_removal": ' + b"[" * 5000, "not JSON"),
    (b'{"allow_mass_removal": 1' + b"0" * 5000 + b"}", "digits"),
    (b'{"allow_mass_removal": 1e999}', "out of range"),
    (b'{"allow_mass_removal": tr', "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
])
async def test_hostile_bodies_are_400_naming_the_problem(
    client: Client, fleet: Fleet, caplog: pytest.LogCaptureFixture, body: bytes, names: str
) -> None:
    caplog.set_level(logging.DEBUG)
    status, doc = await call(client, "POST", "/v1/policies/p-regs/apply", headers=AUTH,
                             data=body)
    assert status == 400, doc
    assert names in doc["error"], doc
    assert nothing_written(fleet)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_body_that_stops_arriving_is_408(port: int, fleet: Fleet) -> None:
    started = time.monotonic()
    data = await raw_request(port, post_head("/v1/policies/p-regs/apply", 100), b'{"allow')
    status, doc = answer_of(data)
    assert status == 408, doc
    assert "body" in doc["error"]
    assert time.monotonic() - started >= BODY_TIMEOUT_S * 0.9
    assert nothing_written(fleet)


async def test_a_client_gone_mid_body_is_no_error(
    port: int, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    SERVED.clear()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(post_head("/v1/policies/p-regs/apply", 100))  # the body is still to come
    await writer.drain()
    while not SERVED:  # the request reached the app, then its client goes away
        await asyncio.sleep(0.01)
    writer.close()
    await asyncio.wait_for(SERVED[-1][1].wait(), 30)
    assert not [r.getMessage() for r in caplog.records
                if r.levelno >= logging.ERROR or r.exc_info]
    assert nothing_written(fleet)


# Bodies a client may send (`tests.strategies.HOSTILE_BODIES`): each is answered 400 with a
# JSON error naming the body, or is a good body (the policy is unknown: 404), never a 500.
@settings(max_examples=60, suppress_health_check=[Checks.function_scoped_fixture])
@given(body=HOSTILE_BODIES)
async def test_any_body_is_a_value_or_a_400_never_a_500(client: Client, body: bytes) -> None:
    for method, path in (("POST", "/v1/policies/p-none/apply"),
                         ("DELETE", "/v1/policies/p-none")):
        status, doc = await call(client, method, path, headers=AUTH, data=body)
        assert status in (400, 404), (status, doc)
        assert doc["error"]
        if status == 400:
            assert doc["error"].startswith("body"), doc
