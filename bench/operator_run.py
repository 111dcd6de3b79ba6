"""What the operator benchmarks share (`operator_memory.py`, `operator_writes.py`,
`operator_repair.py`): one simulated cluster in the bench's process with a namespace per
boundary, and `convergerd operator` in its own process against it, as deployed, until its
Policies have settled."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from bench.daemon import clean_env
from bench.rounds import _free_port
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import NAMESPACES

CLUSTER = "c0001"
BOUNDARY_LABEL = "platform.stackship.se/boundary"
READY_TIMEOUT_S = 300.0


def create_namespaces(fleet: Fleet, boundaries: int) -> None:
    """`team-N` of boundary `bN`, for N below `boundaries`."""
    store = fleet.store(CLUSTER)
    for b in range(boundaries):
        store.create(NAMESPACES, None, {"metadata": {
            "name": f"team-{b}", "labels": {BOUNDARY_LABEL: f"b{b}"}}}, manager="bench")


def operator_env(fleet: Fleet, extra: dict[str, str]) -> dict[str, str]:
    """The operator's environment: the simulated cluster, a free loopback port, `extra`."""
    return clean_env({"CONVERGERD_KUBECONFIG": str(fleet.kubeconfig_path),
                      "CONVERGERD_OPERATOR_CONTEXT": CLUSTER,
                      "CONVERGERD_OPERATOR_HTTP_ADDR": f"127.0.0.1:{_free_port()}",
                      "CONVERGERD_IDENTITY": "bench-operator", **extra})


@asynccontextmanager
async def settled_operator(env: dict[str, str], log_path: Path, settled: Callable[[], bool],
                           *, cwd: Path | None = None,
                           ) -> AsyncIterator[tuple[asyncio.subprocess.Process, float]]:
    """`convergerd operator` (run in `cwd`, its output in `log_path`), once `settled()`: the
    process and the seconds it took; an operator that exits or does not settle within
    `READY_TIMEOUT_S` is an error. Terminated on leaving."""
    with log_path.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "convergerd", "operator", env=env, cwd=cwd,
            stdout=out, stderr=out)
        try:
            began = time.monotonic()
            while not settled():
                if proc.returncode is not None:
                    raise RuntimeError(f"the operator exited {proc.returncode}")
                if time.monotonic() - began > READY_TIMEOUT_S:
                    raise RuntimeError("the operator did not settle")
                await asyncio.sleep(0.5)
            yield proc, time.monotonic() - began
        finally:
            if proc.returncode is None:
                proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)
