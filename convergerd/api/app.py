"""The daemon's HTTP application: every path bound to its handler, and who may call it. The save
and delete paths are handled by `mutations.SaveHandlers` (over the `Saver`), the read tokens' by
`tokens.TokenHandlers`, a boundary's views by `boundaries.BoundaryViews`, the exceptions' by
`exceptions.ExceptionHandlers`, the others by `server.Views`, which only read. Every request
passes `auth.Guard` first: its route's scope (`scopes.ROUTE_SCOPES`) says which token it needs.

| path | answers |
|---|---|
| `GET /healthz` | liveness: the loop turns, no supervised task ended, none is stuck |
| `GET /readyz` | readiness: settings valid, election not blocked nor stalled, database answers |
| `GET /metrics` | Prometheus text exposition of the process's own registry |
| `GET /status` | JSON: identity, leader, rounds, clusters worst first (paged), Unsupported |
| `GET /v1/clusters/{id}` | that cluster's policies: delivered vs current revision, error, phase |
| `GET /v1/policies/{id}/status` | that policy per cluster: revisions, error, phase; its deletion |
| `GET /v1/policies/{id}/revisions` | its kept revisions, newest first, with what each changed |
| `POST /v1/policies/{id}/rollback` | an old revision's content as a new one, saved: admin token |
| `GET /v1/rollouts` | every live rollout: its wave, state and the gate that holds it |
| `GET /v1/policies/{id}/rollout` | its rollout: waves, clusters per revision, the gate, events |
| `POST /v1/policies/{id}/rollout/{pause,resume,approve,abort}` | operate it: the admin token |
| `POST /v1/policies/{id}/apply` | save (a new `enforcement` if asked): the admin token |
| `DELETE /v1/policies/{id}` | delete: the admin token |
| `POST /v1/tokens` | a boundary's read token, created (shown once): the admin token |
| `GET /v1/tokens` | the read tokens (never the tokens themselves): the admin token |
| `DELETE /v1/tokens/{name}` | a read token revoked: the admin token |
| `GET /v1/boundaries/{boundary}` | one boundary's clusters and policies: admin or its token |
| `GET /v1/boundaries/{boundary}/policies/{id}` | one of its policies per cluster: likewise |
| `GET /v1/boundaries/{boundary}/policies/{id}/revisions` | its revisions here: likewise |
| `GET /v1/boundaries/{boundary}/rollouts` | its policies' live rollouts: likewise |
| `GET /v1/boundaries/{boundary}/policies/{id}/rollout` | one of its policies' rollout: likewise |
| `GET /v1/exceptions` | every exception to a policy, soonest expiry first (`api.exceptions`) |
| `POST /v1/policies/{id}/exceptions` | grant one, then save: the admin token |
| `DELETE /v1/policies/{id}/exceptions/{eid}` | withdraw one, then save: the admin token |
| `GET /openapi.json` | this API as an OpenAPI 3 document (`convergerd.api.openapi`) |
| `/ui/...` | the web page (`ui.UiPages`): sign in, the fleet or a boundary, a policy, its rollout |
"""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from convergerd.api.auth import Guard, TokenBook, TokenSource
from convergerd.api.boundaries import BoundarySource, BoundaryViews
from convergerd.api.exceptions import ExceptionHandlers, ExceptionSource
from convergerd.api.mutations import ModeStore, SaveHandlers
from convergerd.api.revisions import RevisionHandlers, RevisionSource
from convergerd.api.rollouts import RolloutHandlers, RolloutSource
from convergerd.api.server import (
    STATUS_VIEWS,
    Health,
    StatusSource,
    Views,
    middlewares,
)
from convergerd.api.tokens import TokenHandlers, TokenStore
from convergerd.api.ui import UiPages
from convergerd.config import Settings
from convergerd.core.gates import Command
from convergerd.delivery.fanout import Saver
from convergerd.status.metrics import Metrics
from convergerd.status.reader import StatusReader


class TenantSource(TokenStore, TokenSource, BoundarySource, Protocol):
    """What the read tokens and the boundary views read and write in the database
    (`convergerd.store.store.Store`)."""


def make_app(
    *,
    metrics: Metrics,
    state: StatusReader,
    store: StatusSource,
    settings: Settings,
    health: Health,
    saver: Saver,
    modes: ModeStore | None = None,
    status_db_timeout_s: float | None = None,
    tenants: TenantSource | None = None,
    book: TokenBook | None = None,
    revisions: RevisionSource | None = None,
    exceptions: ExceptionSource | None = None,
    rollouts: RolloutSource | None = None,
) -> web.Application:
    """The aiohttp application. `saver` does the saves and deletions (`mutations.SaveHandlers`),
    `modes` stores the enforcement a save asks for (the daemon's `Store`);
    `status_db_timeout_s`: how long a cluster or policy view waits for its database read (by
    default `StatusReadTuning.db_timeout_s`); `tenants`: the read tokens and the boundaries
    (None: those endpoints answer 503); `book`: the live read tokens (the daemon runs it, to
    follow the database; by default one read only when a token is created or revoked here);
    `revisions`: the policies' kept revisions (None: those endpoints answer 503);
    `exceptions`: where the exception endpoints keep them (the daemon's `Store`; None: they
    answer 503); `rollouts`: the rollouts (None: those endpoints answer 503)."""
    views = Views(metrics=metrics, state=state, store=store, settings=settings, health=health)
    if status_db_timeout_s is not None:
        views.db_timeout_s = status_db_timeout_s
    book = book if book is not None else TokenBook(tenants)
    guard = Guard(admin_token=settings.api_token, book=book,
                  fleet_open=not settings.fleet_reads_need_token,
                  reads_per_s=settings.token_reads_per_s)
    body_timeout_s = settings.http.body_timeout_s
    saves = SaveHandlers(saver, body_timeout_s=body_timeout_s, modes=modes)
    tokens = TokenHandlers(tenants, book, body_timeout_s=body_timeout_s)
    boundaries = BoundaryViews(views, tenants)
    granting = ExceptionHandlers(exceptions, saver, body_timeout_s=body_timeout_s,
                                 max_days=settings.exception_max_days)
    history = RevisionHandlers(views, revisions, saver, retention=settings.revisions,
                               body_timeout_s=body_timeout_s)
    waves = RolloutHandlers(views, rollouts, saver, body_timeout_s=body_timeout_s)
    ui = UiPages(guard, views, boundaries, waves, body_timeout_s=body_timeout_s)
    app = web.Application(middlewares=[*middlewares(settings), guard.middleware()])
    # `Expect: 100-continue` is answered by each route's expect handler before any
    # middleware: the guard checks the route's scope first, none quotes the header.
    checked = guard.expect
    status_views = (views.status, views.cluster, views.policy, boundaries.boundary,
                    boundaries.policy, history.history, history.boundary_history, waves.list,
                    waves.policy, waves.boundary_list, waves.boundary_policy)
    app.add_routes([
        web.get("/healthz", views.healthz, expect_handler=checked),
        web.get("/readyz", views.readyz, expect_handler=checked),
        web.get("/metrics", views.metrics_text, expect_handler=checked),
        *(web.get(path, views.limited(path, handler), expect_handler=checked)
          for path, handler in zip(STATUS_VIEWS, status_views, strict=True)),
        web.post("/v1/policies/{id}/apply", saves.apply, expect_handler=checked),
        web.delete("/v1/policies/{id}", saves.delete, expect_handler=checked),
        web.post("/v1/policies/{id}/rollback", history.rollback, expect_handler=checked),
        *(web.post(f"/v1/policies/{{id}}/rollout/{command.value}", waves.command(command),
                   expect_handler=checked) for command in Command),
        web.post("/v1/tokens", tokens.create, expect_handler=checked),
        web.get("/v1/tokens", tokens.list, expect_handler=checked),
        web.delete("/v1/tokens/{name}", tokens.revoke, expect_handler=checked),
        web.get("/v1/exceptions", views.limited("/v1/exceptions", granting.listing),
                expect_handler=checked),
        web.post("/v1/policies/{id}/exceptions", granting.grant, expect_handler=checked),
        web.delete("/v1/policies/{id}/exceptions/{eid}", granting.withdraw,
                   expect_handler=checked),
        web.get("/openapi.json", views.openapi, expect_handler=checked),
        web.get("/ui", ui.to_home, expect_handler=checked),
        web.get("/ui/", ui.home, expect_handler=checked),
        web.post("/ui/login", ui.login, expect_handler=checked),
        web.post("/ui/logout", ui.logout, expect_handler=checked),
        web.get("/ui/boundaries/{boundary}", ui.boundary, expect_handler=checked),
        web.get("/ui/policies/{id}", ui.policy, expect_handler=checked),
        web.get("/ui/policies/{id}/rollout", ui.rollout, expect_handler=checked),
        web.get("/ui/static/{name}", ui.static, expect_handler=checked),
    ])
    return app
