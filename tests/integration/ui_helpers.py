"""A world for the web page's tests (`test_ui.py`, `tests/browser/`): `FLEET_DOC` delivered by a
real round to the simulator, Policy statuses written there as an operator writes them (phases,
Verified, an audit with a sample, an Error whose message is an XSS payload), read back by a
second round, and a read token per boundary in the database."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from convergerd.api.app import make_app
from convergerd.api.auth import TokenBook
from convergerd.core.tokens import new_token, token_digest
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
                   health=HealthCheck(), saver=make_saver(rounds, store), tenants=store,
                   book=book)
    return UiWorld(app, rounds, tokens)
