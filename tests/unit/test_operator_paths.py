"""Property: whatever a Policy's spec.policyId and metadata.name hold, the operator's requests
stay on the Policy API and on the admission objects named `stackship-<valid id>`.

The operator runs for real (`Operator.run`, no election) against a stand-in cluster that
answers the list, never sends a watch event, and records the URL of every request as the
client would send it (`server + Resource.path(...)`, parsed as aiohttp parses it)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from yarl import URL

from convergerd.core.model import check_policy_id
from convergerd.kube.api import Admitted, KubeObject, ObjectList, Resource, WatchEvent
from convergerd.leader.elector import NoElection
from convergerd.operator.controller import Operator, Timing
from convergerd.operator.metrics import OperatorMetrics

SERVER = "https://10.0.0.1:6443"
POLICY_API = "/apis/platform.stackship.se/v1alpha1/policies"
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1/"
# The lists of the operator's own admission objects (its clean-up), built from no Policy.
SWEEP = {f"{ADMISSION_API}validatingadmissionpolicies",
         f"{ADMISSION_API}validatingadmissionpolicybindings",
         "/api/v1/namespaces"}  # the workload cache's namespace list and watch
_ID = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class RecordingCluster:
    """Answers as an empty cluster serving ValidatingAdmissionPolicy, holding `policy`."""

    def __init__(self, policy: KubeObject) -> None:
        self.policy = policy
        self.urls: list[URL] = []
        self.status_written = asyncio.Event()

    def _sent(self, resource: Resource, name: str | None = None, *,
              namespace: str | None = None, subresource: str | None = None) -> None:
        self.urls.append(URL(SERVER + resource.path(name, namespace=namespace,
                                                    subresource=subresource)))

    async def get(self, resource: Resource, name: str, *, timeout_s: float,
                  namespace: str | None = None) -> KubeObject | None:
        self._sent(resource, name, namespace=namespace)
        return None

    async def list_objects(self, resource: Resource, *, label_selector: str | None,
                           timeout_s: float, namespace: str | None = None,
                           limit: int | None = None,
                           transform: Callable[[KubeObject], KubeObject | None] | None = None,
                           step_past: bool = False) -> ObjectList:
        self._sent(resource, namespace=namespace)
        items = [self.policy] if resource.plural == "policies" else []
        return ObjectList(items=items, resource_version="1", requests=1)

    async def watch(self, resource: Resource, *, resource_version: str,
                    label_selector: str | None, timeout_s: float) -> AsyncIterator[WatchEvent]:
        self._sent(resource)
        await asyncio.Event().wait()  # no events
        yield WatchEvent("BOOKMARK", {}, None, None)

    async def apply(self, resource: Resource, body: KubeObject, *, field_manager: str,
                    timeout_s: float, subresource: str | None = None) -> KubeObject:
        self._sent(resource, body["metadata"]["name"], subresource=subresource)
        if subresource == "status":
            self.status_written.set()
        return body

    async def delete(self, resource: Resource, name: str, *, timeout_s: float) -> bool:
        self._sent(resource, name)
        return False

    async def dry_run_create(self, resource: Resource, body: KubeObject, *, timeout_s: float,
                             namespace: str | None = None) -> Admitted:
        self._sent(resource, namespace=namespace)
        return Admitted(body)

    async def metrics(self, *, names: tuple[str, ...], timeout_s: float) -> bytes:
        return b""

    async def served_resources(self, group: str, version: str, *,
                               timeout_s: float) -> frozenset[str] | None:
        return frozenset({"validatingadmissionpolicies", "validatingadmissionpolicybindings"})


async def requests_for(name: str, policy_id: object) -> list[URL]:
    """The URLs the operator requests for one Policy, up to its status write (or, for a name
    no status can be written to, a settled moment: the worker idle with nothing due)."""
    policy = {"apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
              "metadata": {"name": name, "uid": "u1", "generation": 1,
                           "resourceVersion": "1"},
              "spec": {"policyId": policy_id, "boundary": "b1", "enabled": True,
                       "revision": 1, "rule": {"type": "ForbidLatestTag"}}}
    cluster = RecordingCluster(policy)
    metrics = OperatorMetrics()
    operator = Operator(cluster, leadership=NoElection(identity="t"), metrics=metrics,
                        timing=Timing(request_timeout_s=1.0, recheck_s=3600.0,
                                      probe_interval_s=600.0, probe_delay_s=300.0),
                        cluster="c1")
    task = asyncio.create_task(operator.run())
    try:
        async with asyncio.timeout(5):
            while not (cluster.status_written.is_set() or any(metrics.reconciles.values())
                       or (operator.informer.synced.is_set()  # a name the cache leaves out
                           and name not in operator.informer.objects)):
                await asyncio.sleep(0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return cluster.urls


def valid_id(value: object) -> bool:
    try:
        check_policy_id(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


hostile = st.sampled_from([
    "x/../../api/v1/namespaces/kube-system/secrets?watch=1&x=",
    "../../../api/v1/secrets", "p1?watch=true", "p1#frag", "p1/status", "p1%2F..%2Fx", "..",
    "p1\n", "P1", "p1 ", "", "a" * 51,
])
ids = st.one_of(hostile, st.text(max_size=60), st.from_regex(_ID, fullmatch=True),
                st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2))
names = st.one_of(st.just("policy-p"), st.text(max_size=40),
                  st.sampled_from(["policy-x/../../secrets", "a?b=c", "..", "policy-p#x"]))


@settings(max_examples=150, deadline=None)
@given(policy_id=ids, name=names)
async def test_no_policy_id_or_name_leads_a_request_off_the_policy_api(policy_id: object,
                                                                       name: str) -> None:
    urls = await requests_for(name, policy_id)
    allowed = {POLICY_API, *SWEEP}
    if "/" not in name:
        allowed.add(f"{POLICY_API}/{name}/status")  # one segment, and (below) as built
    for url in urls:
        # The path is what was built: no query, fragment or dot segment came out of it.
        assert (url.raw_query_string, url.raw_fragment) == ("", ""), url
        assert ".." not in url.raw_path.split("/"), url
        if url.path in allowed:
            continue
        assert valid_id(policy_id), (policy_id, url)
        assert url.path.startswith(ADMISSION_API) or url.path in (
            "/api/v1/namespaces", "/api/v1/namespaces/b1/pods"), url
        assert url.path.rsplit("/", 1)[1] == f"stackship-{policy_id}" or (
            url.path.startswith("/api/v1/namespaces")), url


async def test_a_hostile_policy_id_is_refused_before_any_request() -> None:
    """The issue's reproduction: the Policy is only listed, watched and given its status."""
    urls = await requests_for("policy-p",
                              "x/../../api/v1/namespaces/kube-system/secrets?watch=1&x=")
    assert {u.path for u in urls} - SWEEP == {POLICY_API, f"{POLICY_API}/policy-p/status"}
