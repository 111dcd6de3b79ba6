"""The daemon's HTTP application: every path bound to its handler. The save and delete paths
are handled by `mutations.SaveHandlers` (over the `Saver`), the others by `server.Views`, which only
read.

| path | answers |
|---|---|
| `GET /healthz` | liveness: the loop turns, no supervised task ended, none is stuck |
| `GET /readyz` | readiness: settings valid, election not blocked nor stalled, database answers |
| `GET /metrics` | Prometheus text exposition of the process's own registry |
| `GET /status` | JSON: identity, leader, rounds, clusters worst first (paged), Unsupported |
| `GET /v1/clusters/{id}` | that cluster's policies: delivered vs current revision, error, phase |
| `GET /v1/policies/{id}/status` | that policy per cluster: revisions, error, phase; its deletion |
| `POST /v1/policies/{id}/apply` | save: bearer token required |
| `DELETE /v1/policies/{id}` | delete: bearer token required |
| `GET /v1/exceptions` | every exception to a policy, soonest expiry first (`api.exceptions`) |
| `POST /v1/policies/{id}/exceptions` | grant one, then save: bearer token required |
| `DELETE /v1/policies/{id}/exceptions/{eid}` | withdraw one, then save: bearer token required |
| `GET /openapi.json` | this API as an OpenAPI 3 document (`convergerd.api.openapi`) |
"""

from __future__ import annotations

from aiohttp import web

from convergerd.api.exceptions import ExceptionHandlers, ExceptionSource
from convergerd.api.mutations import SaveHandlers
from convergerd.api.server import (
    STATUS_VIEWS,
    Health,
    StatusSource,
    Views,
    expect_continue,
    middlewares,
)
from convergerd.config import Settings
from convergerd.delivery.fanout import Saver
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState


def make_app(
    *,
    metrics: Metrics,
    state: StatusState,
    store: StatusSource,
    settings: Settings,
    health: Health,
    saver: Saver,
    status_db_timeout_s: float | None = None,
    exceptions: ExceptionSource | None = None,
) -> web.Application:
    """The aiohttp application. `saver` does the saves and deletions (`mutations.SaveHandlers`);
    `status_db_timeout_s`: how long a cluster or policy view waits for its database read (by
    default `StatusReadTuning.db_timeout_s`); `exceptions`: where the exception endpoints
    keep them (the daemon's `Store`; without it they are not served)."""
    views = Views(metrics=metrics, state=state, store=store, settings=settings, health=health)
    if status_db_timeout_s is not None:
        views.db_timeout_s = status_db_timeout_s
    saves = SaveHandlers(saver, token=settings.api_token,
                         body_timeout_s=settings.http.body_timeout_s)
    app = web.Application(middlewares=middlewares(settings))
    # `Expect: 100-continue` is answered by each route's expect handler before any
    # middleware: the mutations check the token first, none quotes the header.
    plain = expect_continue
    app.add_routes([
        web.get("/healthz", views.healthz, expect_handler=plain),
        web.get("/readyz", views.readyz, expect_handler=plain),
        web.get("/metrics", views.metrics_text, expect_handler=plain),
        *(web.get(path, views.limited(path, handler), expect_handler=plain) for path, handler
          in zip(STATUS_VIEWS, (views.status, views.cluster, views.policy), strict=True)),
        web.post("/v1/policies/{id}/apply", saves.apply, expect_handler=saves.expect),
        web.delete("/v1/policies/{id}", saves.delete, expect_handler=saves.expect),
        web.get("/openapi.json", views.openapi, expect_handler=plain),
    ])
    if exceptions is not None:
        granting = ExceptionHandlers(exceptions, saver, token=settings.api_token,
                                     body_timeout_s=settings.http.body_timeout_s,
                                     max_days=settings.exception_max_days)
        app.add_routes([
            web.get("/v1/exceptions", views.limited("/v1/exceptions", granting.listing),
                    expect_handler=plain),
            web.post("/v1/policies/{id}/exceptions", granting.grant,
                     expect_handler=granting.expect),
            web.delete("/v1/policies/{id}/exceptions/{eid}", granting.withdraw,
                       expect_handler=granting.expect),
        ])
    return app
