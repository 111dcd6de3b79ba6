"""The real `convergerd` process as a user starts it: a clean environment and `convergerd demo`
with its banner read (shared by the CLI and demo tests)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

CONVERGERD = (sys.executable, "-m", "convergerd")
STARTUP_S = 60.0  # a cold start, 12 simulated clusters and a migration on a busy machine


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any convergerd setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CONVERGERD_") and not k.startswith("Policies__")}
    return {**env, **extra}


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
