"""The denial and warning gates with real admission traffic (issue 37): the daemon as `convergerd
run` wires it, twelve simulated clusters, the real operator in each, counting admission from
the simulated API server's `apiserver_validating_admission_policy_check_total` into
`status.admission`. Requests made here on the canary are denied (or warned) by the new
revision; the daemon reads the counts back, and the gate job halts the rollout and sends the
canary back, while the clusters of the later wave never get the new revision."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from convergerd.sim.fleet import Fleet
from tests.fixtures.fleet import kube_http
from tests.integration.rounds_helpers import import_doc, objects, wait_for
from tests.integration.test_rollout_gates import (
    CANARY,
    CLUSTERS,
    GATE_S,
    NAME,
    Daemon,
    N,
    doc,
    revisions,
    rollout_daemon,
    writes,
)

OTHERS = [c for c in CLUSTERS if c != CANARY]
# Revision 2 leaves docker.io out: a pod from there is refused (or warned) on the canary. The
# canary's running pod from docker.io is one audit violation, tolerated, so only the
# admission gates can halt. The bake is long: a halt comes from a look, never after a bake.
STRATEGY: dict[str, Any] = {
    "id": "canary-then-rest",
    "waves": [{"name": "canary", "selector": {"ring": "canary"}}],  # then the implicit rest
    "bakeSeconds": 600, "onHalt": "revert",
    "gates": {"maxDenials": 1, "maxNewViolations": 5, "maxErrorClusters": 0},
}
BAD_REGISTRIES = ["registry.example.com"]


@pytest.fixture
async def twelve(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with Fleet(clusters=N, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(37), bookmark_interval_s=0.5) as f:
        yield f


@pytest.fixture
async def counting(twelve: Fleet, database_url: str) -> AsyncIterator[Daemon]:
    """`rollout_daemon` with operators that read the API server's counts every 0.2 s."""
    env = {"CONVERGERD_OPERATOR_ADMISSION_READ_SECONDS": "0.2"}
    async with rollout_daemon(twelve, database_url, operator_env=env) as running:
        yield running


async def admission(daemon: Daemon) -> dict[str, Any] | None:
    """The canary's admission counts as the daemon read them back (its status of p-regs)."""
    status, view = await daemon.get("/v1/policies/p-regs/status")
    assert status == 200, view
    found = {c["cluster"]: c for c in view["clusters"]}.get(CANARY) or {}
    shown: dict[str, Any] | None = found.get("admission")
    return shown


async def counted(daemon: Daemon, *, denied: int = 0, warned: int = 0) -> bool:
    shown = await admission(daemon)
    return shown is not None and (shown["revision"], shown["denied"], shown["warned"]) == (
        2, denied, warned)


async def baking(daemon: Daemon) -> bool:
    """The canary's wave reported (every gate passed so far): its bake runs."""
    status, view = await daemon.get("/v1/policies/p-regs/rollout")
    return status == 200 and (view["to_revision"], view["state"], view["wave"]["index"],
                              view["gate"]) == (2, "progressing", 0, "bake")


async def pod_from_docker_io(fleet: Fleet, name: str) -> Any:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team-a"},
           "spec": {"containers": [{"name": "app", "image": "docker.io/library/redis:7"}]}}
    return await kube_http(fleet, CANARY, "POST", "/api/v1/namespaces/team-a/pods", body=pod)


async def halted_within_a_gate_period(daemon: Daemon, read_back: float) -> None:
    """The rollout `reverted` within a gate period (and the time a look takes) of the daemon
    showing the counts (`read_back`, monotonic): the gate job reads the same status state."""
    await wait_for(lambda: daemon.at("reverted", 0, to=2), timeout_s=GATE_S + 2.0,
                   what="the gate job halts the rollout")
    assert time.monotonic() - read_back < GATE_S + 2.0


def never_given_revision_2(fleet: Fleet) -> None:
    """The rest's clusters hold revision 1, written once (at the start): never revision 2."""
    assert revisions(fleet) == dict.fromkeys(CLUSTERS, 1)
    for c in OTHERS:
        assert writes(fleet, c) == 1, c


async def test_denials_on_the_canary_halt_the_rollout_and_send_it_back(
    twelve: Fleet, counting: Daemon, database_url: str
) -> None:
    daemon = counting
    await import_doc_of(database_url, BAD_REGISTRIES, STRATEGY)
    await wait_for(lambda: baking(daemon), timeout_s=60, what="the canary reported revision 2")
    await wait_for(lambda: counted(daemon), timeout_s=30,
                   what="the canary's counts of revision 2 read back (none yet)")
    assert revisions(twelve)[CANARY] == 2
    assert all(revisions(twelve)[c] == 1 for c in OTHERS)

    # One denial: within `maxDenials: 1`.
    refused = await pod_from_docker_io(twelve, "first")
    assert refused.status == 422, refused.body
    await wait_for(lambda: counted(daemon, denied=1), timeout_s=30,
                   what="one denial read back")
    assert await daemon.at("progressing", 0, to=2)

    # A second one: more than the gate allows.
    assert (await pod_from_docker_io(twelve, "second")).status == 422
    await wait_for(lambda: counted(daemon, denied=2), timeout_s=30,
                   what="two denials read back")
    await halted_within_a_gate_period(daemon, time.monotonic())
    view = await daemon.rollout()
    assert view["gate"] == "denials"
    assert view["reason"] == ("denials: 1 cluster(s) with more than 1 denial(s) at revision 2: "
                              f"{CANARY} (2)")
    # onHalt revert: the canary's Policy is revision 1 again, in force (a pod from docker.io
    # is admitted), and the later wave never received revision 2.
    await wait_for(lambda: revisions(twelve)[CANARY] == 1, what="the canary sent back")
    assert "enforcement" not in objects(twelve, CANARY)[NAME]["spec"]
    never_given_revision_2(twelve)
    # Rounds and gate looks go by: it stays so.
    seen = writes(twelve, CANARY)
    await wait_for(lambda: daemon.at("reverted", 0, to=2), what="still reverted")
    never_given_revision_2(twelve)
    assert writes(twelve, CANARY) == seen
    assert [e for e in await daemon.events() if e != "wait"] == ["started", "ready", "halt"]


async def test_warnings_in_the_canary_s_warn_step_halt_the_rollout(
    twelve: Fleet, counting: Daemon, database_url: str
) -> None:
    daemon = counting
    strategy = {**STRATEGY, "waves": [{**STRATEGY["waves"][0], "warnFirst": True}],
                "gates": {**STRATEGY["gates"], "maxWarnings": 0}}
    await import_doc_of(database_url, BAD_REGISTRIES, strategy)
    await wait_for(lambda: baking(daemon), timeout_s=60, what="the canary reported its Warn step")
    assert objects(twelve, CANARY)[NAME]["spec"]["enforcement"] == "Warn"
    await wait_for(lambda: counted(daemon), timeout_s=30,
                   what="the canary's counts of revision 2 read back (none yet)")

    warned = await pod_from_docker_io(twelve, "warned")
    assert warned.status == 201, warned.body  # admitted, with the warning
    assert "stackship-p-regs" in warned.headers["Warning"]
    await wait_for(lambda: counted(daemon, warned=1), timeout_s=30, what="the warning read back")
    await halted_within_a_gate_period(daemon, time.monotonic())
    view = await daemon.rollout()
    assert view["gate"] == "warnings"
    assert CANARY in view["reason"]
    await wait_for(lambda: revisions(twelve)[CANARY] == 1, what="the canary sent back")
    assert "enforcement" not in objects(twelve, CANARY)[NAME]["spec"]  # Deny again
    never_given_revision_2(twelve)



async def import_doc_of(database_url: str, registries: list[str],
                        strategy: dict[str, Any]) -> None:
    """p-regs saved with `registries` and `strategy`, the canary labelled (the import, then
    the save on the database's notification)."""
    await import_doc(database_url, doc(registries, strategy))
