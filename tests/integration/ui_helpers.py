"""A world for the web page's tests (`test_ui.py`, `tests/browser/`): `FLEET_DOC` delivered by a
real round to the simulator, Policy statuses written there as an operator writes them (phases,
Verified, an audit with a sample, an Error whose message is an XSS payload), read back by a
second round, a read token per boundary in the database, and a rollout of team-a's p-regs
(revision 2 saved with a two-wave strategy: the canary c0001 has it, the rest waits for an
approval, the reason and an event carrying the XSS payload) as the status state's last sync
saw it."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from convergerd.api.app import make_app
from convergerd.api.auth import TokenBook
from convergerd.core.rollout import State
from convergerd.core.tokens import new_token, token_digest
from convergerd.delivery.fanout import Saver
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from convergerd.supervise import HealthCheck
from tests.fixtures.fleet import kube_http
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, settings_for
from tests.integration.savedelete_helpers import make_saver

ADMIN = "ui-test-admin-token"
# Stored in a cluster's Policy status (the Ready message of an Error, an audit sample's
# message): a page must show it as text and run none of it.
XSS = ('<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
       "\"'><b>bold</b>")
POLICIES = "/apis/platform.stackship.se/v1alpha1/policies"
STRATEGY: dict[str, Any] = {
    "id": "careful", "bakeSeconds": 60, "approval": ["rest"],
    "waves": [{"name": "canary", "selector": {"ring": "canary"}},
              {"name": "rest", "fraction": 1.0}],
}
# The gate that holds p-regs' rollout, as the gate job writes it (`gate: detail`), with a
# payload in its detail.
ROLLOUT_REASON = f"approval: wave rest waits for approval {XSS}"


def rollout_doc() -> dict[str, Any]:
    """`FLEET_DOC` with c0001 labelled the canary and p-regs' revision 2 under `STRATEGY`."""
    policies = [({**p, "rolloutStrategy": "careful",
                  "rule": {"type": "AllowedRegistries",
                           "registries": ["registry.example.com", "mirror.example.com"]}}
                 if p["id"] == "p-regs" else p) for p in FLEET_DOC["policies"]]
    clusters = [{**c, "labels": {"ring": "canary"}} if c["id"] == "c0001" else c
                for c in FLEET_DOC["clusters"]]
    return {**FLEET_DOC, "clusters": clusters, "policies": policies,
            "rolloutStrategies": [STRATEGY]}


@dataclass
class UiWorld:
    app: web.Application
    rounds: Rounds
    tokens: dict[str, str]  # "team-a", "team-b", "admin"


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _status(phase: str, *, ready_message: str = "installed", verified: bool | None = True,
            violations: int | None = None, sample: list[dict[str, Any]] | None = None,
            ) -> dict[str, Any]:
    now = _now()
    conditions: list[dict[str, Any]] = [
        {"type": "Ready", "status": "True" if phase == "Enforcing" else "False",
         "reason": phase, "message": ready_message, "lastTransitionTime": now}]
    if verified is not None:
        conditions.append({"type": "Verified", "status": "True" if verified else "False",
                           "reason": "Denied" if verified else "Admitted",
                           "message": "a violating pod was denied" if verified
                           else "a violating pod was admitted",
                           "lastProbeTime": now, "lastTransitionTime": now})
    status: dict[str, Any] = {"phase": phase, "observedGeneration": 1,
                              "conditions": conditions}
    if violations is not None:
        status["audit"] = {"violations": violations, "auditedAt": now, "cacheSynced": True,
                           "sample": sample or []}
    return {"status": status}


# (cluster, policy) -> what its operator reports there.
STATUSES: dict[tuple[str, str], dict[str, Any]] = {
    ("c0001", "p-latest"): _status("Enforcing", violations=2, sample=[
        {"kind": "Pod", "namespace": "team-a-web", "name": "api-7f9c", "message": XSS}]),
    ("c0001", "p-regs"): _status("Enforcing", verified=False),
    ("c0001", "p-labels"): _status("Enforcing", violations=0),
    ("c0002", "p-latest"): _status("Enforcing"),
    ("c0002", "p-regs"): _status("Error", ready_message=XSS, verified=None),
    ("c0003", "p-latest"): _status("Unsupported", verified=None),
    ("c0003", "p-regs"): _status("Unsupported", verified=None),
}


async def ui_world(fleet: Fleet, database_url: str, store: Store) -> UiWorld:
    """The world; `rounds.close()` when done."""
    await import_doc(database_url, FLEET_DOC)
    settings = settings_for(fleet.kubeconfig_path, database_url, CONVERGERD_API_TOKEN=ADMIN,
                            CONVERGERD_TOKEN_READS_PER_SECOND="1000",
                            CONVERGERD_STATUS_READS_PER_SECOND="1000")
    rounds = Rounds(fleet, store, settings)
    rounds.state.observe_round(await rounds.run())
    for (cluster, policy), body in STATUSES.items():
        resp = await kube_http(fleet, cluster, "PATCH", f"{POLICIES}/policy-{policy}/status",
                               body=body, content_type="application/merge-patch+json")
        assert resp.status == 200, resp.body
    rounds.state.observe_round(await rounds.run())
    saver = make_saver(rounds, store)
    await _rollout(database_url, store, saver, rounds)
    tokens = {"admin": ADMIN}
    for boundary in ("team-a", "team-b"):
        token = new_token()
        digest = token_digest(token)
        assert digest is not None
        await store.create_token(name=f"{boundary}-reader", boundary=boundary, digest=digest,
                                 by="test", expires_at=None)
        tokens[boundary] = token
    book = TokenBook(store)
    await book.reload()
    app = make_app(metrics=rounds.metrics, state=rounds.state, store=store, settings=settings,
                   health=HealthCheck(), saver=saver, tenants=store, book=book,
                   revisions=store, rollouts=store)
    return UiWorld(app, rounds, tokens)


async def _rollout(database_url: str, store: Store, saver: Saver, rounds: Rounds) -> None:
    """p-regs' revision 2 saved with `STRATEGY` (the canary's wave written), then moved on as
    the gate job moves it (the canary passed, the rest waits for approval), a round that reads
    it back, and the live rollouts read into the status state as its database sync reads
    them."""
    await import_doc(database_url, rollout_doc())
    report = await saver.save("p-regs")
    assert report.rollout is not None, report
    assert report.rollout["started"], report
    staged = await store.staged_rollout("p-regs")
    assert staged is not None
    before = staged.rollout
    moved = await store.transition_rollout(
        before, dataclasses.replace(before, state=State.WAITING_APPROVAL, wave=1,
                                    reason=ROLLOUT_REASON),
        by="convergerd gate job (test)", what="advance", detail=XSS, remaining_s=lambda: 10.0)
    assert moved is not None
    rounds.state.observe_round(await rounds.run())  # reads the canary's revision 2 back
    rounds.state.absorb_rollouts(await store.live_rollouts())
