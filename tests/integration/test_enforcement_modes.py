"""Enforcement modes end to end (docs/design.md, "Modes"): a save that asks for a mode (the API
and `convergerd policy apply --enforcement`), the Policy it writes, the operator's binding,
`status.enforcementAction` and `Verified` in each mode, and what kubectl sees: a Warn policy
admits a violating pod with the policy's warning, switching it to Deny by a save denies the
next one, an Audit policy admits silently."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from convergerd.api.app import make_app
from convergerd.sim.fleet import Fleet
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.fixtures.fleet import kube_http
from tests.integration.rounds_helpers import (
    FLEET_DOC,
    Rounds,
    import_doc,
    objects,
    settings_for,
    sql,
)
from tests.integration.savedelete_helpers import make_saver
from tests.integration.test_operator import (
    CLUSTER,
    POLICIES,
    binding_path,
    condition,
    get,
    operator_settings,
    put_namespace,
    running,
    verified_when,
    wait_for,
)
from tests.integration.test_operator_repair import status_writes

TOKEN = "modes-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Client = TestClient[web.Request, web.Application]
PID = "p-latest"  # ForbidLatestTag in team-a (c0001..c0003), beside p-regs (AllowedRegistries)
# Violates p-latest only: no tag means latest; the registry is the one p-regs allows.
VIOLATING_POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: team-a}}
spec:
  containers: [{{name: app, image: registry.example.com/app}}]
"""
WARNING = (f"Validation failed for ValidatingAdmissionPolicy 'stackship-{PID}' with binding "
           f"'stackship-{PID}': ")


@pytest.fixture
async def client(fleet: Fleet, database_url: str, store: Store) -> AsyncIterator[Client]:
    """The daemon's app over the real store (which stores the modes) and the simulator."""
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=TOKEN)
    rounds = Rounds(fleet, store, settings)
    state = StatusState(identity="t", interval_s=300)
    app = make_app(metrics=Metrics(state=state), state=state, store=store, settings=settings,
                   health=HealthCheck(), saver=make_saver(rounds, store), modes=store)
    try:
        async with TestClient(TestServer(app)) as c:
            yield c
    finally:
        await rounds.close()


async def save(client: Client, pid: str = PID, **body: Any) -> tuple[int, dict[str, Any]]:
    async with client.post(f"/v1/policies/{pid}/apply", headers=AUTH,
                           json=body or None) as resp:
        return resp.status, await resp.json()


async def policy_view(client: Client, pid: str = PID) -> dict[str, Any]:
    async with client.get(f"/v1/policies/{pid}/status") as resp:
        assert resp.status == 200
        view: dict[str, Any] = (await resp.json())["policy"]
        return view


def specs(fleet: Fleet, pid: str = PID) -> list[dict[str, Any]]:
    return [objects(fleet, c)[f"policy-{pid}"]["spec"] for c in fleet.member_ids]


async def test_a_save_that_asks_for_a_mode_stores_it_as_a_new_revision_and_delivers_it(
    client: Client, fleet: Fleet
) -> None:
    status, body = await save(client)
    assert (status, body["revision"], "enforcement" in body) == (200, 1, False)
    assert all("enforcement" not in s for s in specs(fleet))  # Deny: as before modes

    status, body = await save(client, enforcement="Warn")
    assert (status, body["status"], body["revision"], body["enforcement"]) == (
        200, "ok", 2, "Warn")
    assert {c["result"] for c in body["clusters"]} == {"updated"}
    assert [(s["enforcement"], s["revision"]) for s in specs(fleet)] == [("Warn", 2)] * 3
    view = await policy_view(client)
    assert (view["enforcement"], view["revision"]) == ("Warn", 2)

    # A save that does not ask keeps the stored mode; asking for it again changes nothing.
    status, body = await save(client)
    assert (status, body["revision"]) == (200, 2)
    status, body = await save(client, enforcement="Warn")
    assert (status, body["revision"], {c["result"] for c in body["clusters"]}) == (
        200, 2, {"unchanged"})

    status, body = await save(client, enforcement="Deny")
    assert (body["revision"], body["enforcement"]) == (3, "Deny")
    assert all("enforcement" not in s and s["revision"] == 3 for s in specs(fleet))
    assert (await policy_view(client))["enforcement"] == "Deny"


@pytest.mark.parametrize(("value", "words"), [
    ("deny", "body.enforcement: must be one of Deny, Warn, Audit, got 'deny' (the names are "
             "case-sensitive: Deny)"),
    ("Block", "body.enforcement: must be one of Deny, Warn, Audit, got 'Block'"),
    (1, "body.enforcement: expected str, got 1"),
    (None, "body.enforcement: expected str, got None"),
])
async def test_a_mode_that_is_not_one_is_refused_naming_it_and_nothing_changes(
    client: Client, fleet: Fleet, value: Any, words: str
) -> None:
    status, body = await save(client, enforcement=value)
    assert (status, body["error"]) == (400, words)
    assert all(not objects(fleet, c) for c in fleet.member_ids)
    assert ((await policy_view(client))["enforcement"], body.get("revision")) == ("Deny", None)


async def test_asking_a_mode_of_an_unknown_policy_is_404(client: Client) -> None:
    status, _ = await save(client, "p-none", enforcement="Warn")
    assert status == 404


async def policy_cli(client: Client, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVERGERD_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "convergerd", "policy", *args,
        "--addr", f"127.0.0.1:{client.server.port}",
        env={**env, "CONVERGERD_API_TOKEN": TOKEN},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_policy_apply_enforcement_from_the_command_line(client: Client) -> None:
    code, out, _ = await policy_cli(client, "apply", PID, "--enforcement", "Audit")
    assert code == 0
    assert out.startswith(f"save {PID} (revision 2, enforcement Audit): ok\n"), out
    code, out, _ = await policy_cli(client, "apply", PID, "--enforcement", "Audit", "--json")
    assert json.loads(out)["enforcement"] == "Audit"
    code, _, err = await policy_cli(client, "apply", PID, "--enforcement", "audit")
    assert code == 2
    assert "invalid choice: 'audit' (choose from" in err


# --- with the operator and kubectl ------------------------------------------------------------


async def kubectl(fleet: Fleet, workdir: Path, *args: str,
                  stdin: str | None = None) -> tuple[int, str, str]:
    """kubectl against c0001 of the in-process simulator (so never a blocking subprocess)."""
    proc = await asyncio.create_subprocess_exec(
        "kubectl", f"--kubeconfig={fleet.kubeconfig_path}", f"--context={CLUSTER}",
        f"--cache-dir={workdir / 'kube-cache'}", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def verified_in_mode(fleet: Fleet, mode: str, reason: str) -> dict[str, Any]:
    """The Policy once the operator reports `mode` installed and `Verified` True `reason`."""
    async def check() -> dict[str, Any] | None:
        found = await verified_when(fleet, PID, lambda v: (v["status"], v["reason"]) == (
            "True", reason))
        if found is None:
            return None
        policy = await get(fleet, f"{POLICIES}/policy-{PID}")
        status = (policy or {}).get("status") or {}
        return policy if status.get("enforcementAction") == mode else None

    policy: dict[str, Any] = await wait_for(check)
    return policy


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
async def test_warn_admits_with_the_warning_deny_denies_audit_admits_and_verified_proves_each(
    client: Client, fleet: Fleet, tmp_path: Path
) -> None:
    await put_namespace(fleet, "team-a", "team-a")
    async with running(operator_settings(fleet)):
        assert (await save(client, enforcement="Warn"))[0] == 200
        policy = await verified_in_mode(fleet, "Warn", "Warned")
        [verified] = [c for c in policy["status"]["conditions"] if c["type"] == "Verified"]
        assert WARNING in verified["message"]
        binding = await get(fleet, binding_path(PID))
        assert binding is not None
        assert binding["spec"]["validationActions"] == ["Warn", "Audit"]
        code, out, err = await kubectl(fleet, tmp_path, "create", "-f", "-",
                                       stdin=VIOLATING_POD.format(name="warned"))
        assert code == 0, err
        assert "pod/warned created" in out
        assert f"Warning: {WARNING}image(s) 'registry.example.com/app'" in err, err

        # A change of mode is a save like any other: the next pod is denied.
        assert (await save(client, enforcement="Deny"))[0] == 200
        await verified_in_mode(fleet, "Deny", "Denied")
        code, out, err = await kubectl(fleet, tmp_path, "create", "-f", "-",
                                       stdin=VIOLATING_POD.format(name="denied"))
        assert code == 1
        assert (f"ValidatingAdmissionPolicy 'stackship-{PID}' with binding 'stackship-{PID}' "
                "denied request") in err, err
        assert "Warning:" not in err

        assert (await save(client, enforcement="Audit"))[0] == 200
        await verified_in_mode(fleet, "Audit", "AuditOnly")
        code, out, err = await kubectl(fleet, tmp_path, "create", "-f", "-",
                                       stdin=VIOLATING_POD.format(name="audited"))
        assert (code, err) == (0, "")
        assert "pod/audited created" in out


async def verified_seen(fleet: Fleet, pid: str, after: str) -> list[dict[str, Any]]:
    """Every Verified condition the Policy held after resourceVersion `after`, as a watch
    (`kubectl get -w`) saw them, however briefly each one stood."""
    resp = await kube_http(fleet, CLUSTER, "GET",
                           f"{POLICIES}?watch=true&resourceVersion={after}&timeoutSeconds=1")
    assert resp.status == 200, resp.body
    seen: list[dict[str, Any]] = []
    for line in resp.body.splitlines():
        event = json.loads(line)
        obj = event["object"]
        if event["type"] == "MODIFIED" and obj["metadata"]["name"] == f"policy-{pid}":
            found = condition(obj, "Verified")
            if found is not None and (not seen or seen[-1] != found):
                seen.append(found)
    return seen


async def test_an_audit_binding_deleted_by_hand_is_not_verified(
    client: Client, fleet: Fleet
) -> None:
    """Admitted in silence is also what no binding at all does: the Audit probe reads its
    binding back, so a binding removed by hand is `Admitted`, not `AuditOnly`. The watch on
    the binding sees the deletion at once: that verdict is probed and written before the
    binding is put back, then the probe after the repair verifies the mode again."""
    await put_namespace(fleet, "team-a", "team-a")
    async with running(operator_settings(fleet)) as proc:
        assert (await save(client, enforcement="Audit"))[0] == 200
        before = await verified_in_mode(fleet, "Audit", "AuditOnly")
        assert proc.operator is not None
        guard = proc.operator.guard
        await wait_for(lambda: guard.synced)  # a change before its first list is not one
        since = fleet.accounting.requests()[-1].seq
        resp = await kube_http(fleet, CLUSTER, "DELETE", binding_path(PID))
        assert resp.status == 200, resp.body

        await wait_for(lambda: proc.metrics.repairs["binding"] == 1)
        assert await get(fleet, binding_path(PID)) is not None
        assert proc.metrics.probes["Admitted"] == 1
        await verified_in_mode(fleet, "Audit", "AuditOnly")
        # Both verdicts were written: the daemon, and anyone watching, saw the gap.
        await wait_for(lambda: len(status_writes(fleet, since)) == 2)
        seen = await verified_seen(fleet, PID, before["metadata"]["resourceVersion"])
        verdicts = [(v["status"], v["reason"]) for v in seen]
        gap = verdicts.index(("False", "Admitted"))
        assert verdicts[gap:] == [("False", "Admitted"), ("True", "AuditOnly")]
        assert "its binding is not installed with [Audit]" in seen[gap]["message"]
        assert proc.metrics.repairs == {"policy": 0, "binding": 1}


async def test_rounds_deliver_the_mode_and_put_it_back(
    rounds: Rounds, fleet: Fleet, database_url: str
) -> None:
    """A cluster that missed the save of a mode gets it from the next round, and one whose
    Policy lost it (edited by hand) gets it back: the mode is content, like the rule."""
    await sql(database_url, "UPDATE policies SET enforcement = 'Audit' WHERE id = $1", PID)
    report = await rounds.run()
    assert report.result == "ok"
    assert [(s["enforcement"], s["revision"]) for s in specs(fleet)] == [("Audit", 2)] * 3
    held = objects(fleet, "c0002")[f"policy-{PID}"]
    edited = {**held, "spec": {k: v for k, v in held["spec"].items() if k != "enforcement"}}
    edited["metadata"] = {k: v for k, v in held["metadata"].items()
                          if k in ("name", "labels")}
    resp = await kube_http(fleet, "c0002", "PATCH",
                           f"{POLICIES}/policy-{PID}?fieldManager=stackship-platform&force=true",
                           body=edited, content_type="application/apply-patch+yaml")
    assert resp.status == 200, resp.body
    assert "enforcement" not in objects(fleet, "c0002")[f"policy-{PID}"]["spec"]
    await rounds.run()
    assert [s["enforcement"] for s in specs(fleet)] == ["Audit"] * 3
