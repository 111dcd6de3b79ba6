"""The reachability prober with a fake cluster API: up/down into metrics and status."""

from __future__ import annotations

import asyncio

from convergerd.errors import (
    BadResponse,
    ClusterLevelError,
    ClusterUnreachable,
    NoCredentials,
    Throttled,
    TransientApiError,
)
from convergerd.kube.api import Applied, KubeObject, ObjectList, PolicyApi
from convergerd.metrics import Metrics
from convergerd.model import ClusterId
from convergerd.probe import Prober
from convergerd.state import StatusState


class FakeApi:
    def __init__(self, name: str, behaviour: str) -> None:
        self.name = name
        self.behaviour = behaviour

    @property
    def cluster(self) -> ClusterId:
        return ClusterId(self.name)

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        raise NotImplementedError

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        raise NotImplementedError

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        raise NotImplementedError

    async def server_version(self, *, timeout_s: float) -> str:
        if self.behaviour == "down":
            raise ClusterUnreachable("connect timeout")
        if self.behaviour == "401":
            raise ClusterLevelError("401 Unauthorized", status=401, reason="unauthorized")
        if self.behaviour == "429":
            raise Throttled("429 Too Many Requests", status=429, retry_after_s=1.0)
        if self.behaviour == "503":
            raise TransientApiError("503 Service Unavailable", status=503)
        if self.behaviour == "junk":
            raise BadResponse("200 answer is not JSON")
        if self.behaviour == "nocreds":
            raise NoCredentials("no context")
        if self.behaviour == "hang":
            await asyncio.sleep(3600)
        return "v1.31.0"


async def test_probe_sets_up_and_down() -> None:
    metrics = Metrics(process_collectors=False)
    state = StatusState(identity="r", interval_s=300)
    names = ("ok", "down", "401", "429", "503", "junk", "nocreds", "hang")
    apis: dict[str, PolicyApi] = {n: FakeApi(n, n) for n in names}
    prober = Prober(clusters=lambda: apis, metrics=metrics, state=state, timeout_s=0.05)
    result = await prober.probe_once()
    # Any answer (even 401, 429, 503 or junk) means the API server was reached.
    assert result == {"401": True, "429": True, "503": True, "junk": True,
                      "down": False, "nocreds": False, "hang": False, "ok": True}
    text = metrics.render().decode()
    assert 'convergerd_cluster_up{cluster="down"} 0.0' in text
    assert 'convergerd_cluster_up{cluster="ok"} 1.0' in text
    down = state.clusters[ClusterId("down")]
    assert (down.reachable, down.error) == (False, "connect timeout")
    assert state.clusters[ClusterId("hang")].error == "no answer within 0.05 s"
    assert state.clusters[ClusterId("ok")].server_version == "v1.31.0"


async def test_prober_forgets_clusters_it_no_longer_probes() -> None:
    metrics = Metrics(process_collectors=False)
    state = StatusState(identity="r", interval_s=300)
    apis: dict[str, PolicyApi] = {n: FakeApi(n, "ok") for n in ("a", "b", "c")}
    prober = Prober(clusters=lambda: apis, metrics=metrics, state=state, timeout_s=0.05)
    await prober.probe_once()
    assert len(prober) == 3
    del apis["b"], apis["c"]
    assert await prober.probe_once() == {"a": True}
    assert len(prober) == 1
