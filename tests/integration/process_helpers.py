"""The real `convergerd` process as a user starts it: a clean environment, a command against a
test client's server, and `convergerd demo` with its banner read (shared by the CLI and demo
tests)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient

CONVERGERD = (sys.executable, "-m", "convergerd")
STARTUP_S = 60.0  # a cold start, 12 simulated clusters and a migration on a busy machine


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any convergerd setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CONVERGERD_") and not k.startswith("Policies__")}
    return {**env, **extra}


async def cli(client: TestClient[web.Request, web.Application], *args: str,
              token: str | None, **env: str) -> tuple[int, str, str]:
    """`convergerd ARGS --addr` the test server of `client`, in a clean environment plus `env`
    with `token` as CONVERGERD_API_TOKEN (None: no token): its exit code, stdout and stderr."""
    if token is not None:
        env = {"CONVERGERD_API_TOKEN": token, **env}
    proc = await asyncio.create_subprocess_exec(
        *CONVERGERD, *args, "--addr", f"127.0.0.1:{client.server.port}",
        env=clean_env(**env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def run_demo(tmp_path: Path, env: dict[str, str], *args: str
                   ) -> AsyncIterator[tuple[asyncio.subprocess.Process, list[str]]]:
    """`convergerd demo` running until the block ends (then SIGTERM); yields the process and
    its banner, read up to the API token line and two more. Its stderr is in demo.log."""
    log = (tmp_path / "demo.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *CONVERGERD, "demo", "--workdir", str(tmp_path / "demo"), *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=log,
    )
    try:
        assert proc.stdout is not None
        banner: list[str] = []
        async with asyncio.timeout(STARTUP_S):
            while not any(line.startswith("  API token:") for line in banner):
                line = await proc.stdout.readline()
                if not line:
                    raise AssertionError((tmp_path / "demo.log").read_text())
                banner.append(line.decode().rstrip("\n"))
            banner.extend([(await proc.stdout.readline()).decode().rstrip("\n")
                           for _ in range(2)])
        yield proc, banner
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
        log.close()
