"""The demo's in-cluster operators: one `OperatorProcess` per simulated member cluster, as tasks
of the demo's own process, so `/status` shows the phases and the `Verified` probe a real fleet
reports.

- **One per member cluster**, against that cluster's kubeconfig context, with leader election
  ON, on the cluster's own Lease (`stackship-system/convergerd-operator` in that cluster), as
  `deploy/operator` runs it; one replica each, so it leads at once. Not on a cluster that is
  down or has no Policy CRD (an operator there could not do anything).
- **Namespaces of the tenants' boundaries** are created in every cluster a boundary covers
  (named after the boundary, labelled `platform.stackship.se/boundary=<boundary>`), so the
  enforcement probe has somewhere to run and the policies can be `Verified`.
- **Workloads that predate the policies** (`LEGACY_WORKLOADS`): pods and a deployment created
  in some boundary namespaces before the daemon delivers anything, some of which the policies
  would deny. Admission never sees them (they exist already); the operators' audit counts them,
  and `convergerd status` shows them in its VIOLATIONS column.
- The operators' settings are the demo's (short probe delay and period), overridable with the
  usual `CONVERGERD_OPERATOR_*` variables. A failed operator is logged and leaves the demo
  running; they all stop (and release their Leases) when the daemon stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

from convergerd.config import load_operator_settings
from convergerd.demo import DEMO_OPERATOR_PROBE_MINUTES
from convergerd.operator.main import OperatorProcess
from convergerd.operator.reconcile import BOUNDARY_LABEL
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import DEPLOYMENTS, NAMESPACES, PODS, ResourceType
from convergerd.sim.status import ApiError
from convergerd.store.importer import ImportPlan

log = logging.getLogger(__name__)

# The demo's operator settings, unless the environment sets them.
OPERATOR_DEFAULTS = {
    "CONVERGERD_OPERATOR_HTTP_ADDR": "127.0.0.1:0",
    "CONVERGERD_OPERATOR_PROBE_DELAY_SECONDS": "5",
    "CONVERGERD_OPERATOR_PROBE_MINUTES": DEMO_OPERATOR_PROBE_MINUTES,
    "CONVERGERD_OPERATOR_RECHECK_SECONDS": "60",
}
STOP_TIMEOUT_S = 15.0
_NAMESPACE_MANAGER = "convergerd-demo"


def operated(members: Iterable[str], faults: Mapping[str, Faults]) -> list[str]:
    """The member clusters that get an operator: not one that is down or has no Policy CRD."""
    return [c for c in members if not faults.get(c, Faults()).down and faults.get(c, Faults()).crd]


def create_boundary_namespaces(fleet: Fleet, plan: ImportPlan) -> int:
    """A namespace per boundary in every simulated cluster it covers; how many were made."""
    members = set(fleet.member_ids)
    made = 0
    for boundary in plan.boundaries:
        body = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": boundary.id, "labels": {BOUNDARY_LABEL: boundary.id}}}
        for cluster in boundary.clusters:
            if cluster not in members:
                continue
            try:
                fleet.store(cluster).create(NAMESPACES, None, body, manager=_NAMESPACE_MANAGER)
            except ApiError:  # it exists already (another boundary of the same name cannot)
                continue
            made += 1
    return made


def _pod(name: str, image: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": image}]}}


def _deployment(name: str, image: str, **labels: str) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": {**selector, **labels}},
            "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": {**selector, **labels}},
                                  "spec": {"containers": [{"name": "main", "image": image}]}}}}


# (cluster, namespace = boundary, resource, object): what already ran in the sample tenants'
# clusters before their policies were delivered. Against convergerd/demo/tenants.yaml:
LEGACY_WORKLOADS: tuple[tuple[str, str, ResourceType, dict[str, Any]], ...] = (
    # no-latest: an image without a tag (implicitly latest), and one tagged latest.
    ("c0001", "platform", PODS, _pod("legacy-cache", "redis")),
    ("c0002", "platform", DEPLOYMENTS, _deployment("legacy-web", "nginx:latest")),
    # team-a-registries and team-a-labels: an ad-hoc pod from Docker Hub, no labels.
    ("c0002", "team-a", PODS, _pod("adhoc-debug", "docker.io/library/busybox:1.36")),
    # team-a-labels only: from the team's registry, without the `team` label.
    ("c0004", "team-a", PODS, _pod("api-7f9c", "registry.team-a.example.com/api:2.1",
                                   **{"app.kubernetes.io/name": "api"})),
    # team-b-registries, and team-b-owner (disabled, so Inert, but audited all the same).
    ("c0005", "team-b", PODS, _pod("worker-0", "docker.io/library/python:3.12")),
    # Compliant, for contrast: counted by nobody.
    ("c0001", "team-a", PODS, _pod("web-1", "registry.team-a.example.com/web:1.4",
                                   **{"app.kubernetes.io/name": "web", "team": "a"})),
    ("c0008", "team-b", DEPLOYMENTS, _deployment("reports",
                                                 "registry.team-b.example.com/reports:1.0",
                                                 owner="team-b")),
    # team-c-registries allows it, until the demo's rollout story saves a revision without
    # the mirror: then the canary's audit finds it and the rollout is sent back.
    ("c0009", "team-c", PODS, _pod("web-0", "mirror.example.com/team-c/web:2.0")),
)


def create_legacy_workloads(fleet: Fleet) -> int:
    """`LEGACY_WORKLOADS` in the simulated clusters, before any policy is delivered; how many
    were made (none where the cluster or its boundary namespace is not there: other tenants)."""
    members = set(fleet.member_ids)
    made = 0
    for cluster, namespace, resource, body in LEGACY_WORKLOADS:
        if cluster not in members:
            continue
        try:
            fleet.store(cluster).create(resource, namespace, body, manager=_NAMESPACE_MANAGER)
        except ApiError:  # no such namespace there (another tenants file), or made already
            continue
        made += 1
    return made


async def _run(proc: OperatorProcess, cluster: str) -> None:
    try:
        await proc.main(signals=False)
    except Exception:
        log.exception("the demo's operator for cluster %s stopped; the demo goes on without it",
                      cluster, extra={"cluster": cluster})


@contextlib.asynccontextmanager
async def running_operators(
    clusters: Iterable[str], *, kubeconfig: Path, env: Mapping[str, str]
) -> AsyncIterator[list[OperatorProcess]]:
    """An operator per cluster in `clusters`, running until the block ends."""
    procs: list[OperatorProcess] = []
    tasks: list[asyncio.Task[None]] = []
    for cluster in clusters:
        settings = load_operator_settings({
            **OPERATOR_DEFAULTS,
            **{k: v for k, v in env.items() if k.startswith("CONVERGERD_OPERATOR_")},
            "CONVERGERD_KUBECONFIG": str(kubeconfig),
            "CONVERGERD_OPERATOR_CONTEXT": cluster,
            "CONVERGERD_IDENTITY": f"demo-operator-{cluster}",
        })
        proc = OperatorProcess(settings)
        procs.append(proc)
        tasks.append(asyncio.create_task(_run(proc, cluster), name=f"operator {cluster}"))
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stopping.set()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
