"""The simulator's admin API (plain http on --listen): fault injection and request accounting.

    GET    /_sim/healthz                   {"status": "ok"}; it listens last, so = ready
    GET    /_sim/clusters                  ids, base URLs, CA group, current faults
    POST   /_sim/clusters/{id}/faults      JSON fields replace those fields of the faults
    DELETE /_sim/clusters/{id}/faults      back to a healthy, current cluster
        e.g. {"latencyMs": 50}, {"readOnly": true}, {"hostile": {"mode": "controlChars"}},
        {"hostile": {"mode": "trickle", "bytesPerSecond": 10}},
        {"hostile": {"mode": "redirect", "status": 302, "location": "http://127.0.0.1:8080"}},
        {"hostile": null}
    POST   /_sim/clusters/{id}/apiservers/restart   restart its API servers: their admission
        counters start from zero with a new process_start_time_seconds; {} all of them,
        {"replica": I} only the I-th (from 0), {"replicas": N} all, N of them from now on
        (1 to 16: a Service with N API servers answering in turn)
    GET    /_sim/stats[?cluster=ID]        requests per cluster and verb
    DELETE /_sim/stats                     zero the counters and the request log
    GET    /_sim/requests[?cluster=&verb=&since=UNIX&after=SEQ&limit=N]   recent requests
        (each with `tokenOf`: the cluster whose token it carried, "" none's, null no token)

Errors are `{"error": "<message naming the field>"}` with 400 (bad input) or 404 (no such
cluster). Tokens are never part of any answer: the kubeconfig file is where they live.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from convergerd.sim.accounting import Accounting
from convergerd.sim.apimetrics import MAX_REPLICAS
from convergerd.sim.faults import Faults, FaultsError, parse_json_object
from convergerd.sim.server import Cluster

CLUSTERS_KEY = web.AppKey("clusters", Mapping[str, Cluster])
ACCOUNTING_KEY = web.AppKey("accounting", Accounting)


def build_admin_app(clusters: Mapping[str, Cluster], accounting: Accounting) -> web.Application:
    app = web.Application()
    app[CLUSTERS_KEY] = clusters
    app[ACCOUNTING_KEY] = accounting
    app.router.add_get("/_sim/healthz", _healthz)
    app.router.add_get("/_sim/clusters", _list_clusters)
    app.router.add_post("/_sim/clusters/{id}/faults", _set_faults)
    app.router.add_delete("/_sim/clusters/{id}/faults", _clear_faults)
    app.router.add_post("/_sim/clusters/{id}/apiservers/restart", _restart_apiservers)
    app.router.add_get("/_sim/stats", _stats)
    app.router.add_delete("/_sim/stats", _reset_stats)
    app.router.add_get("/_sim/requests", _requests)
    return app


def cluster_json(cluster: Cluster) -> dict[str, Any]:
    return {
        "id": cluster.id,
        "baseUrl": cluster.base_url,
        "caGroup": cluster.listener.name,
        "faults": cluster.faults.to_json(),
        "objects": cluster.store.object_count() if cluster.store is not None else 0,
        "apiServers": cluster.apiservers.to_json(),
    }


def _error(code: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=code)


async def _healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _list_clusters(request: web.Request) -> web.Response:
    clusters = request.app[CLUSTERS_KEY]
    return web.json_response({"clusters": [cluster_json(c) for c in clusters.values()]})


def _cluster(request: web.Request) -> Cluster:
    cluster = request.app[CLUSTERS_KEY].get(request.match_info["id"])
    if cluster is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": f"no cluster {request.match_info['id']!r}"}),
            content_type="application/json",
        )
    return cluster


async def _set_faults(request: web.Request) -> web.Response:
    cluster = _cluster(request)
    try:
        cluster.faults = Faults.from_json_bytes(await request.read(), base=cluster.faults)
    except FaultsError as e:
        return _error(400, str(e))
    return web.json_response(cluster_json(cluster))


async def _clear_faults(request: web.Request) -> web.Response:
    cluster = _cluster(request)
    cluster.faults = Faults()
    return web.json_response(cluster_json(cluster))


async def _restart_apiservers(request: web.Request) -> web.Response:
    cluster = _cluster(request)
    try:
        doc = parse_json_object(await request.read())
    except FaultsError as e:
        return _error(400, str(e))
    unknown = sorted(str(k) for k in doc if k not in ("replica", "replicas"))
    if unknown or len(doc) > 1:
        return _error(400, "body: give {}, {\"replica\": I} or {\"replicas\": N}")
    replica, replicas = doc.get("replica"), doc.get("replicas")
    count = cluster.apiservers.replicas
    if replica is not None and not _int_in(replica, 0, count - 1):
        return _error(400, f"replica: must be an integer in [0, {count - 1}]")
    if replicas is not None and not _int_in(replicas, 1, MAX_REPLICAS):
        return _error(400, f"replicas: must be an integer in [1, {MAX_REPLICAS}]")
    cluster.apiservers.restart(replica=replica, replicas=replicas)
    return web.json_response(cluster_json(cluster))


def _int_in(value: object, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


async def _stats(request: web.Request) -> web.Response:
    clusters = request.app[CLUSTERS_KEY]
    wanted = request.query.get("cluster")
    if wanted is not None and wanted not in clusters:
        return _error(404, f"no cluster {wanted!r}")
    ids = [wanted] if wanted is not None else list(clusters)
    return web.json_response(request.app[ACCOUNTING_KEY].stats(ids))


async def _reset_stats(request: web.Request) -> web.Response:
    request.app[ACCOUNTING_KEY].reset()
    return web.json_response({"reset": True})


async def _requests(request: web.Request) -> web.Response:
    q = request.query
    try:
        since = float(q["since"]) if "since" in q else None
        after = int(q["after"]) if "after" in q else None
        limit = int(q["limit"]) if "limit" in q else None
    except ValueError as e:
        return _error(400, f"since/after/limit: {e}")
    records = request.app[ACCOUNTING_KEY].requests(
        cluster=q.get("cluster"), verb=q.get("verb"), since=since, after=after, limit=limit
    )
    return web.json_response({"requests": [r.to_json() for r in records]})
