"""The daemon as a user runs it, with a file that is not what it should be: one cluster's
credentials fail, the process goes on and exits as usual."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from convergerd.core.model import ClusterId
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.fixtures.fifo import RESCUE_S, guarded_fifo
from tests.integration.rounds_helpers import DESIRED, FLEET_DOC, import_doc, objects


def _kubeconfig_with_token_file(fleet: Fleet, tmp_path: Path, context: str,
                                token_file: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(fleet.kubeconfig_path.read_text())
    user = next(c for c in doc["contexts"] if c["name"] == context)["context"]["user"]
    for entry in doc["users"]:
        if entry["name"] == user:
            entry["user"] = {"tokenFile": str(token_file)}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_once_with_a_pipe_as_token_file_reports_that_cluster_and_exits(
    fleet: Fleet, database_url: str, store: Store, tmp_path: Path
) -> None:
    """Issue 17, item 5: a named pipe as c0002's tokenFile blocked the whole process in open()
    (no round, no /healthz, no SIGTERM). Now c0002 fails on its own, named, and the others
    converge; the pipe guard fails the test instead of hanging if it still blocks."""
    await import_doc(database_url, FLEET_DOC)
    with guarded_fifo(tmp_path / "token") as fifo:
        kubeconfig = _kubeconfig_with_token_file(fleet, tmp_path, "c0002", fifo)
        env = {
            **{k: v for k, v in os.environ.items()
               if not k.startswith(("CONVERGERD_", "Policies__"))},
            "CONVERGERD_DATABASE_URL": database_url,
            "CONVERGERD_KUBECONFIG": str(kubeconfig),
            "CONVERGERD_LEADER_ELECTION": "false",
            "Policies__ConvergeIntervalMinutes": "1",
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "convergerd", "once", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60 + RESCUE_S)
    output = out.decode()

    assert proc.returncode == 1, output  # not every cluster converged
    assert "Traceback" not in output
    states = {s.cluster: s for s in await store.cluster_states()}
    assert states[ClusterId("c0002")].last_reason == "no_token"
    for cluster in ("c0001", "c0003"):
        assert set(objects(fleet, cluster)) == DESIRED[cluster]
    assert not objects(fleet, "c0002")
    assert f"tokenFile {str(fifo)!r}: not a regular file" in output
