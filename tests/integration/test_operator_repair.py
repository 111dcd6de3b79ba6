"""The operator against the simulator: admission objects deleted or edited by hand are put back
at once (the watch, not the next pass), and a probe that confirms what was known writes nothing
(issue 35, items 4 and 5)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from convergerd.operator.main import OperatorProcess
from convergerd.sim import resources
from convergerd.sim.fleet import Fleet
from convergerd.sim.store import Watcher
from tests.fixtures.fleet import kube_http
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    binding_path,
    condition,
    get,
    operator_settings,
    put_namespace,
    put_policy,
    running,
    vap_path,
    verified_when,
    wait_for,
    writes,
)


def status_writes(fleet: Fleet, after: int, *, manager: str = "stackship-operator") -> list[Any]:
    """The operator's writes of Policy status under `manager` (the reconcile's, or the
    audit's `stackship-operator-audit`) since request `after`."""
    return [r for r in writes(fleet, after)
            if "/status?" in r.path and f"fieldManager={manager}&" in r.path + "&"]


def watch_policy(fleet: Fleet, pid: str) -> Watcher:
    """Every version of the Policy from now on, in the simulator (a status that changes and
    changes back within a second is seen, which polling and the condition's times miss)."""
    store = fleet.store(CLUSTER)
    return store.watch(resources.POLICIES, None, resource_version=str(store.resource_version),
                       field_selector=f"metadata.name=policy-{pid}")


async def verified_seen(watcher: Watcher) -> list[tuple[str, str]]:
    """The (status, reason) of `Verified` in each version the watch has had so far, each change
    once."""
    seen: list[tuple[str, str]] = []
    while (event := await watcher.next(0)) is not None:
        found = condition(event["object"], "Verified")
        if found is not None and (not seen or seen[-1] != (found["status"], found["reason"])):
            seen.append((found["status"], found["reason"]))
    return seen


def mark(fleet: Fleet) -> int:
    return fleet.accounting.requests()[-1].seq


async def verified_true(fleet: Fleet, pid: str) -> dict[str, Any] | None:
    return await verified_when(fleet, pid,
                               lambda v: (v["status"], v["reason"]) == ("True", "Denied"))


async def enforcing_and_verified(fleet: Fleet, proc: OperatorProcess, pid: str,
                                 rule: dict[str, Any] | None = None) -> None:
    await put_policy(fleet, pid, rule=rule)
    await wait_for(lambda: verified_true(fleet, pid))
    # The guard watches once it is listed: a change before that is the first list's.
    assert proc.operator is not None
    guard = proc.operator.guard
    await wait_for(lambda: guard.synced)


async def test_a_binding_deleted_by_hand_is_put_back_and_verified_again(fleet: Fleet) -> None:
    """The default probe period (10 minutes) leaves the repair to the watch alone."""
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await enforcing_and_verified(fleet, proc, "p1")
        before = condition(await get(fleet, f"{POLICIES}/policy-p1"), "Verified")
        assert before is not None
        since = mark(fleet)
        resp = await kube_http(fleet, CLUSTER, "DELETE", binding_path("p1"))
        assert resp.status == 200, resp.body

        await wait_for(lambda: proc.metrics.repairs["binding"] == 1)
        assert await get(fleet, binding_path("p1")) is not None
        # What was enforced before the repair was probed: the violating pod was ADMITTED.
        assert proc.metrics.probes["Admitted"] == 1

        # Verified went False (Admitted) and back to True: both written, so the status shows
        # the transition (lastTransitionTime moved) and the daemon can read the gap.
        again = await wait_for(lambda: verified_true(fleet, "p1"))
        assert again["lastTransitionTime"] >= before["lastTransitionTime"]
        await wait_for(lambda: len(status_writes(fleet, since)) == 2)
        assert proc.metrics.repairs == {"policy": 0, "binding": 1}
        assert not proc.metrics.admitted


async def test_validation_actions_edited_by_hand_are_put_back(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await enforcing_and_verified(fleet, proc, "p1")
        since, watcher = mark(fleet), watch_policy(fleet, "p1")
        # As `kubectl edit`: an update by another field manager, Deny turned into Warn.
        resp = await kube_http(
            fleet, CLUSTER, "PATCH", binding_path("p1") + "?fieldManager=kubectl-edit",
            body={"spec": {"validationActions": ["Warn"]}},
            content_type="application/merge-patch+json")
        assert resp.status == 200, resp.body

        async def deny_again() -> bool:
            binding = await get(fleet, binding_path("p1"))
            return binding is not None and binding["spec"]["validationActions"] == ["Deny"]

        await wait_for(deny_again)
        await wait_for(lambda: proc.metrics.repairs["binding"] == 1)
        await wait_for(lambda: verified_true(fleet, "p1"))
        # What a user sees: the probe before the repair was admitted (with the policy's warning,
        # which under Deny is not enforcing it), written as Verified False Admitted; then True
        # Denied again. Two writes, so the gap is in the status and the daemon reads it back.
        assert proc.metrics.probes["Admitted"] == 1
        await wait_for(lambda: len(status_writes(fleet, since)) == 2)
        seen = await verified_seen(watcher)
        assert seen[-2:] == [("False", "Admitted"), ("True", "Denied")], seen
        watcher.close()

        # And the admission policy itself, deleted: put back, counted apart.
        resp = await kube_http(fleet, CLUSTER, "DELETE", vap_path("p1"))
        assert resp.status == 200, resp.body
        await wait_for(lambda: proc.metrics.repairs["policy"] == 1)
        assert await get(fleet, vap_path("p1")) is not None
        # A second edit of the binding: each repair is counted.
        resp = await kube_http(
            fleet, CLUSTER, "PATCH", binding_path("p1") + "?fieldManager=kubectl-edit",
            body={"spec": {"validationActions": ["Audit"]}},
            content_type="application/merge-patch+json")
        assert resp.status == 200, resp.body
        await wait_for(lambda: proc.metrics.repairs["binding"] == 2)
        await wait_for(deny_again)
        await wait_for(lambda: verified_true(fleet, "p1"))

        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{proc.port}/metrics") as resp_metrics:
            text = await resp_metrics.text()
        assert 'convergerd_operator_repairs_total{kind="binding"} 2.0' in text
        assert 'convergerd_operator_repairs_total{kind="policy"} 1.0' in text


async def test_our_own_writes_and_a_new_policy_are_no_repairs(fleet: Fleet) -> None:
    """Creating, disabling and re-enabling a Policy writes its admission objects: none of it is
    tampering."""
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await enforcing_and_verified(fleet, proc, "p1")
        await put_policy(fleet, "p1", enabled=False)
        await wait_for(lambda: verified_when(fleet, "p1", lambda v: v["reason"] == "NotEnforcing"))
        await put_policy(fleet, "p1")
        await wait_for(lambda: verified_true(fleet, "p1"))
        await enforcing_and_verified(fleet, proc, "p2",
                                     rule={"type": "RequiredLabels", "labels": ["team"]})
        assert proc.metrics.repairs == {"policy": 0, "binding": 0}


async def test_a_policy_deleted_by_hand_is_counted(fleet: Fleet) -> None:
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await enforcing_and_verified(fleet, proc, "p1")
        resp = await kube_http(fleet, CLUSTER, "DELETE", f"{POLICIES}/policy-p1")
        assert resp.status == 200, resp.body
        await wait_for(lambda: proc.metrics.policy_deletions == 1)

        async def objects_gone() -> bool:
            return (await get(fleet, binding_path("p1")) is None
                    and await get(fleet, vap_path("p1")) is None)

        await wait_for(objects_gone)
        assert proc.metrics.repairs == {"policy": 0, "binding": 0}


async def test_a_probe_that_confirms_what_was_known_writes_nothing(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Probes every 2.4 s (0.04 minutes): the probes in between write no status and log no
    INFO line; the probe time moves only at the heartbeat (2.5 probe periods)."""
    caplog.set_level(logging.INFO, logger="convergerd.operator")
    await put_namespace(fleet, "team-a", "b1")
    settings = operator_settings(fleet, CONVERGERD_OPERATOR_PROBE_MINUTES="0.04")
    async with running(settings) as proc:
        await enforcing_and_verified(fleet, proc, "p1")
        await wait_for(lambda: status_writes(fleet, 0, manager="stackship-operator-audit"))
        first = condition(await get(fleet, f"{POLICIES}/policy-p1"), "Verified")
        assert first is not None
        since = mark(fleet)
        caplog.clear()
        probes = proc.metrics.probes["Denied"]
        await wait_for(lambda: proc.metrics.probes["Denied"] >= probes + 1)
        assert status_writes(fleet, since) == []
        assert status_writes(fleet, since, manager="stackship-operator-audit") == []
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []

        # The heartbeat: the probe time is written again once it is 2.5 periods old, alone.
        async def heartbeat() -> dict[str, Any] | None:
            return await verified_when(
                fleet, "p1", lambda v: v["lastProbeTime"] != first["lastProbeTime"])

        beat = await wait_for(heartbeat)
        assert (beat["status"], beat["reason"], beat["lastTransitionTime"]) == (
            "True", "Denied", first["lastTransitionTime"])
        assert len(status_writes(fleet, since)) == 1
        assert proc.metrics.probes["Denied"] >= probes + 2
        assert [r.getMessage() for r in caplog.records
                if r.levelno >= logging.INFO and r.name.endswith("controller")] == []


async def test_a_restart_writes_nothing(fleet: Fleet) -> None:
    """A new leader probes every Enforcing policy once (it vouches only for its own probes);
    the probe confirms the verdict written before, so nothing is written."""
    await put_namespace(fleet, "team-a", "b1")
    async with running(operator_settings(fleet)) as proc:
        await enforcing_and_verified(fleet, proc, "p1")
        await put_policy(fleet, "p2", enabled=False)
        await wait_for(lambda: verified_when(fleet, "p2", lambda v: v["reason"] == "NotEnforcing"))
        await wait_for(lambda: len(status_writes(fleet, 0, manager="stackship-operator-audit"))
                       >= 2)
        # The Enforcing policy's first admission counts (a loaded machine may take a while).
        await wait_for(lambda: len(status_writes(fleet, 0,
                                                 manager="stackship-operator-admission")) >= 1)
    since = mark(fleet)
    async with running(operator_settings(fleet, identity="op-b")) as proc:
        await wait_for(lambda: proc.metrics.probes["Denied"] == 1)
        await wait_for(lambda: proc.metrics.reconciles["unchanged"] >= 2)
    assert writes(fleet, since) == []
