"""The converge round (docs/design.md, "Delivery semantics" and "Errors from a cluster")
against an in-memory fleet.

`FakeCluster` is a small `PolicyApi` written for these tests: a dict of Policy objects with
server-side-apply semantics (our labels and spec replaced, other labels kept, status untouched),
a record of every request, and injectable failures raised as our own `convergerd.core.errors`
classes. Time is fake (looptime): a hang or a backoff costs no real time.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import itertools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from convergerd.config import SlotTuning
from convergerd.core.errors import (
    ClusterApiError,
    ClusterError,
    ClusterLevelError,
    ClusterUnreachable,
    Fenced,
    NoCredentials,
    ObjectRejected,
    Throttled,
    TransientApiError,
)
from convergerd.core.model import (
    Boundary,
    BoundaryId,
    Cluster,
    ClusterId,
    Fleet,
    InvalidPolicy,
    Policy,
    PolicyRow,
)
from convergerd.core.render import render_policy, validate_policy
from convergerd.core.report import ApplyResult, ClusterOutcome, RoundReport, RoundResult
from convergerd.delivery.apply import ClusterCalls
from convergerd.delivery.converge import Round, RoundLimits, run_round
from convergerd.kube.api import Applied, KubeObject, ObjectList, PolicyApi
from convergerd.slots import suspect_slots

ASIDE_PER_SLOT = SlotTuning().aside_per_slot
PATIENCE_FLOOR_S = SlotTuning().patience_floor_s

pytestmark = pytest.mark.looptime

T = TypeVar("T")
WALL = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
REQUEST_TIMEOUT_S = 5.0
DEADLINE_S = 240.0


# --- the fake cluster ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    verb: str  # list, apply, delete, version
    name: str | None
    at: float  # loop time when sent
    timeout_s: float


@dataclass(slots=True)
class Fault:
    verb: str
    name: str | None  # None: any object
    error: ClusterError
    times: int | None  # None: every time


class FakeCluster:
    """One cluster's Policy API, in memory."""

    def __init__(
        self, cluster_id: str, *, latency_s: float = 0.0, apply_latency_s: float | None = None
    ) -> None:
        self._cluster = ClusterId(cluster_id)
        self.objects: dict[str, KubeObject] = {}
        self.calls: list[Call] = []
        self.completed: list[Call] = []  # requests that got an answer (success or error)
        self.latency_s = latency_s
        self.apply_latency_s = latency_s if apply_latency_s is None else apply_latency_s
        self.hang = False  # every request waits out its timeout, then fails as unreachable
        self.faults: list[Fault] = []
        self._rv = 100

    @property
    def cluster(self) -> ClusterId:
        return self._cluster

    def fail(
        self, verb: str, error: ClusterError, *, name: str | None = None, times: int | None = None
    ) -> None:
        self.faults.append(Fault(verb, name, error, times))

    def of(self, verb: str) -> list[Call]:
        return [c for c in self.calls if c.verb == verb]

    async def _request(self, verb: str, name: str | None, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        call = Call(verb, name, loop.time(), timeout_s)
        self.calls.append(call)
        if self.hang:
            await asyncio.sleep(timeout_s)
            raise ClusterUnreachable(f"{verb}: no answer within {timeout_s:g} s")
        latency = self.apply_latency_s if verb == "apply" else self.latency_s
        if latency:
            await asyncio.sleep(latency)
        self.completed.append(call)
        for fault in self.faults:
            if fault.verb == verb and fault.name in (None, name) and fault.times != 0:
                if fault.times is not None:
                    fault.times -= 1
                raise fault.error

    async def list_policies(self, *, label_selector: str, timeout_s: float) -> ObjectList:
        await self._request("list", None, timeout_s)
        key, _, value = label_selector.partition("=")
        items = [
            copy.deepcopy(o) for o in self.objects.values()
            if o["metadata"].get("labels", {}).get(key) == value
        ]
        return ObjectList(items=items, resource_version=str(self._rv), requests=1)

    async def apply_policy(self, body: KubeObject, *, timeout_s: float) -> Applied:
        name = body["metadata"]["name"]
        await self._request("apply", name, timeout_s)
        existing = self.objects.get(name)
        obj = copy.deepcopy(existing) if existing else {
            "apiVersion": body["apiVersion"], "kind": body["kind"],
            "metadata": {"name": name, "generation": 0, "uid": f"uid-{name}"},
        }
        obj["metadata"].setdefault("labels", {}).update(body["metadata"]["labels"])
        if obj.get("spec") != body["spec"]:
            obj["spec"] = copy.deepcopy(body["spec"])
            obj["metadata"]["generation"] += 1
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self.objects[name] = obj
        return Applied(object=copy.deepcopy(obj), created=existing is None)

    async def delete_policy(self, name: str, *, timeout_s: float) -> bool:
        await self._request("delete", name, timeout_s)
        return self.objects.pop(name, None) is not None

    async def server_version(self, *, timeout_s: float) -> str:
        await self._request("version", None, timeout_s)
        return "v1.31.0"


class Clusters:
    """The `ClusterSource`: fake clusters by id; an id without one has no kubeconfig context."""

    def __init__(self, *clusters: FakeCluster) -> None:
        self.by_id = {c.cluster: c for c in clusters}

    def get(self, cluster: ClusterId) -> PolicyApi:
        if cluster not in self.by_id:
            raise NoCredentials(f"no context {cluster!r} in the kubeconfig")
        return self.by_id[cluster]

    def __getitem__(self, cluster: str) -> FakeCluster:
        return self.by_id[ClusterId(cluster)]


# --- retries, fence, round ------------------------------------------------------------------


class Retrier:
    """Retries retryable errors a few times with a fixed backoff (or Retry-After), never
    starting a wait that would end past the deadline."""

    def __init__(self, attempts: int = 3, backoff_s: float = 1.0) -> None:
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.waits: list[float] = []

    async def __call__(
        self, fn: Callable[[], Awaitable[T]], *, cluster: str, deadline: float
    ) -> T:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await fn()
            except ClusterError as exc:
                if not exc.retryable or attempt >= self.attempts:
                    raise
                wait = self.backoff_s
                if isinstance(exc, ClusterApiError) and exc.retry_after_s is not None:
                    wait = exc.retry_after_s
                if loop.time() + wait >= deadline:
                    raise
                self.waits.append(wait)
                await asyncio.sleep(wait)


class Fence:
    """Grants `allow` write checks (None: unlimited), then refuses with `Fenced`."""

    def __init__(self, *, remaining_s: float = 60.0, allow: int | None = None) -> None:
        self.remaining = remaining_s
        self.allow = allow
        self.checks = 0

    def remaining_s(self) -> float:
        self.checks += 1
        if self.allow is not None and self.checks > self.allow:
            raise Fenced("the Lease was lost")
        return self.remaining


def make_round(
    clusters: Clusters,
    *,
    retrier: Retrier | None = None,
    fence: Fence | None = None,
    deadline_s: float = DEADLINE_S,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    apply_concurrency: int = 4,
    cluster_concurrency: int = 64,
    suspects: frozenset[ClusterId] = frozenset(),
    suspected: Callable[[ClusterId], bool] | None = None,
) -> Round:
    return Round(
        clusters=clusters,
        calls=ClusterCalls(retrier=retrier or Retrier(), request_timeout_s=request_timeout_s,
                           clock=asyncio.get_running_loop().time, wall=lambda: WALL),
        fence=fence or Fence(),
        limits=RoundLimits(
            deadline_s=deadline_s,
            cluster_concurrency=cluster_concurrency,
            apply_concurrency=apply_concurrency,
        ),
        suspects=suspects,
        suspected=suspected,
    )


# --- fleets ---------------------------------------------------------------------------------

RULES: dict[str, dict[str, Any]] = {
    "p-latest": {"type": "ForbidLatestTag"},
    "p-regs": {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
    "p-labels": {"type": "RequiredLabels", "labels": ["app", "team"]},
}


def make_fleet(
    clusters: Iterable[str],
    boundaries: dict[str, list[str]],
    rows: Iterable[tuple[str, str, dict[str, Any]]],
) -> Fleet:
    """rows: (policy id, boundary, rule) — validated as the store would."""
    policies: list[Policy] = []
    invalid: list[InvalidPolicy] = []
    for pid, boundary, rule in rows:
        result = validate_policy(PolicyRow(pid, boundary, rule, enabled=True, revision=1))
        if isinstance(result, Policy):
            policies.append(result)
        else:
            invalid.append(result)
    return Fleet(
        clusters=[Cluster(ClusterId(c)) for c in clusters],
        boundaries={
            BoundaryId(b): Boundary(BoundaryId(b), frozenset(ClusterId(c) for c in cs))
            for b, cs in boundaries.items()
        },
        policies=policies,
        invalid=invalid,
    )


def team_a(*clusters: str, rules: dict[str, dict[str, Any]] = RULES) -> Fleet:
    return make_fleet(clusters, {"team-a": list(clusters)},
                      [(pid, "team-a", rule) for pid, rule in rules.items()])


def outcome(report: RoundReport, cluster: str) -> ClusterOutcome:
    [found] = [c for c in report.clusters if c.cluster == cluster]
    return found


def results(o: ClusterOutcome) -> dict[str, ApplyResult]:
    return {d.policy: d.result for d in o.deliveries}


def fleet_of(*ids: str, latency_s: float = 0.0) -> Clusters:
    return Clusters(*(FakeCluster(i, latency_s=latency_s) for i in ids))


def expected_objects(fleet: Fleet, cluster: str) -> dict[str, dict[str, Any]]:
    return {
        render_policy(p)["metadata"]["name"]: render_policy(p)
        for p in fleet.desired_by_cluster()[ClusterId(cluster)]
    }


OUR_LABELS = ("platform.stackship.se/boundary", "app.kubernetes.io/managed-by")


def ours(obj: KubeObject) -> dict[str, Any]:
    """The part of a stored object that convergerd owns."""
    labels = obj["metadata"]["labels"]
    return {
        "apiVersion": obj["apiVersion"], "kind": obj["kind"],
        "metadata": {"name": obj["metadata"]["name"],
                     "labels": {k: labels[k] for k in OUR_LABELS if k in labels}},
        "spec": obj["spec"],
    }


# --- creating and keeping in sync ---------------------------------------------------------


async def test_first_round_creates_everything() -> None:
    clusters = fleet_of("c1", "c2")
    fleet = team_a("c1", "c2")
    report = await run_round(fleet, make_round(clusters))

    assert report.result is RoundResult.OK
    for cid in ("c1", "c2"):
        o = outcome(report, cid)
        assert results(o) == dict.fromkeys(RULES, ApplyResult.CREATED)
        assert (o.reached, o.error, o.desired, o.in_sync, o.failed) == (True, None, 3, 3, 0)
        stored = {name: ours(obj) for name, obj in clusters[cid].objects.items()}
        assert stored == expected_objects(fleet, cid)
    assert report.counts()["created"] == 6
    assert report.finished_at == WALL


async def test_second_round_makes_no_applies_and_one_list_per_cluster() -> None:
    clusters = fleet_of("c1", "c2", "c3")
    fleet = team_a("c1", "c2", "c3")
    await run_round(fleet, make_round(clusters))
    for c in clusters.by_id.values():
        c.calls.clear()

    report = await run_round(fleet, make_round(clusters))

    assert report.result is RoundResult.OK
    for cid in ("c1", "c2", "c3"):
        assert [c.verb for c in clusters[cid].calls] == ["list"]
        o = outcome(report, cid)
        assert results(o) == dict.fromkeys(RULES, ApplyResult.UNCHANGED)
        assert (o.in_sync, o.desired) == (3, 3)
    assert report.counts()["created"] == report.counts()["updated"] == 0


async def test_drift_is_corrected() -> None:
    clusters = fleet_of("c1")
    fleet = team_a("c1")
    await run_round(fleet, make_round(clusters))
    objs = clusters["c1"].objects
    objs["policy-p-regs"]["spec"]["rule"]["registries"] = ["evil.example.com"]
    objs["policy-p-labels"]["spec"]["enabled"] = False
    objs["policy-p-latest"]["metadata"]["labels"]["team.example.com/owner"] = "alice"  # not ours

    report = await run_round(fleet, make_round(clusters))

    assert results(outcome(report, "c1")) == {
        "p-regs": ApplyResult.UPDATED,
        "p-labels": ApplyResult.UPDATED,
        "p-latest": ApplyResult.UNCHANGED,
    }
    assert {n: ours(o) for n, o in objs.items()} == expected_objects(fleet, "c1")
    assert objs["policy-p-latest"]["metadata"]["labels"]["team.example.com/owner"] == "alice"
    assert report.result is RoundResult.OK


async def test_object_whose_managed_by_label_was_removed_is_taken_back() -> None:
    # Without our label it no longer shows in the label-selected list: it must be re-applied.
    clusters = fleet_of("c1")
    fleet = team_a("c1")
    await run_round(fleet, make_round(clusters))
    labels = clusters["c1"].objects["policy-p-regs"]["metadata"]["labels"]
    del labels["app.kubernetes.io/managed-by"]

    report = await run_round(fleet, make_round(clusters))

    assert results(outcome(report, "c1"))["p-regs"] is not ApplyResult.UNCHANGED
    restored = clusters["c1"].objects["policy-p-regs"]["metadata"]["labels"]
    assert restored["app.kubernetes.io/managed-by"] == "convergerd"


async def test_object_deleted_in_the_cluster_is_recreated() -> None:
    clusters = fleet_of("c1", "c2")
    fleet = team_a("c1", "c2")
    await run_round(fleet, make_round(clusters))
    del clusters["c2"].objects["policy-p-latest"]

    report = await run_round(fleet, make_round(clusters))

    assert results(outcome(report, "c2"))["p-latest"] is ApplyResult.CREATED
    assert [c.name for c in clusters["c2"].of("apply")][-1:] == ["policy-p-latest"]
    assert "policy-p-latest" in clusters["c2"].objects
    assert clusters["c1"].of("apply")[3:] == []  # c1 untouched in round 2


async def test_cluster_no_longer_covered_keeps_its_policies() -> None:
    clusters = fleet_of("c1", "c2")
    await run_round(team_a("c1", "c2"), make_round(clusters))
    narrowed = make_fleet(["c1", "c2"], {"team-a": ["c1"]},
                          [(pid, "team-a", rule) for pid, rule in RULES.items()])

    report = await run_round(narrowed, make_round(clusters))

    assert set(clusters["c2"].objects) == {f"policy-{pid}" for pid in RULES}
    assert clusters["c2"].of("delete") == clusters["c1"].of("delete") == []
    assert len(clusters["c2"].of("apply")) == 3  # only round 1's
    assert outcome(report, "c2").desired == 0
    assert report.result is RoundResult.OK


async def test_policy_moved_to_another_boundary_stays_in_the_old_clusters() -> None:
    clusters = fleet_of("c1", "c2")
    rows = [("p-latest", "team-a", RULES["p-latest"])]
    boundaries = {"team-a": ["c1"], "team-b": ["c2"]}
    await run_round(make_fleet(["c1", "c2"], boundaries, rows), make_round(clusters))
    moved = [("p-latest", "team-b", RULES["p-latest"])]

    await run_round(make_fleet(["c1", "c2"], boundaries, moved), make_round(clusters))

    assert "policy-p-latest" in clusters["c1"].objects  # not deleted by a round
    assert clusters["c1"].of("delete") == []
    on_c2 = clusters["c2"].objects["policy-p-latest"]
    assert on_c2["spec"]["boundary"] == "team-b"


async def test_compute_plans_and_invalid_policies_never_reach_a_cluster() -> None:
    clusters = fleet_of("c1")
    fleet = make_fleet(["c1"], {"team-a": ["c1"]}, [
        ("p-latest", "team-a", RULES["p-latest"]),
        ("p-plans", "team-a", {"type": "AllowedComputePlans", "plans": ["small"]}),
        ("Bad_Id", "team-a", RULES["p-latest"]),
        ("p-broken", "team-a", {"type": "AllowedRegistries", "registries": ["https://x"]}),
    ])

    report = await run_round(fleet, make_round(clusters))

    assert set(clusters["c1"].objects) == {"policy-p-latest"}
    assert [c.name for c in clusters["c1"].of("apply")] == ["policy-p-latest"]
    assert sorted(i.id for i in report.invalid) == ["Bad_Id", "p-broken"]
    assert report.counts()["invalid"] == 2
    assert report.result is RoundResult.OK  # the valid ones converged


# --- errors from a cluster (docs/design.md) -------------------------------------------------


async def test_rejected_policy_fails_alone() -> None:
    clusters = fleet_of("c1", "c2")
    clusters["c1"].fail("apply", ObjectRejected(
        'Policy.platform.stackship.se "policy-p-regs" is invalid: spec.rule: Invalid value',
        status=422, reason="invalid"), name="policy-p-regs")

    report = await run_round(team_a("c1", "c2"), make_round(clusters))

    o = outcome(report, "c1")
    assert results(o) == {"p-regs": ApplyResult.FAILED, "p-latest": ApplyResult.CREATED,
                          "p-labels": ApplyResult.CREATED}
    [failed] = [d for d in o.deliveries if d.result is ApplyResult.FAILED]
    assert failed.error is not None
    assert "spec.rule: Invalid value" in failed.error
    assert failed.reason == "invalid"
    assert len(clusters["c1"].of("apply")) == 3  # a 422 is not retried
    assert (o.reached, o.error, o.in_sync, o.failed) == (True, None, 2, 1)
    assert outcome(report, "c2").converged
    assert report.result is RoundResult.PARTIAL


@pytest.mark.parametrize(
    ("status", "reason", "message"),
    [
        (401, "unauthorized", "401 Unauthorized"),
        (403, "forbidden", 'policies.platform.stackship.se is forbidden: User "x" cannot list'),
        (404, "crd_missing", "the server could not find the requested resource (policies)"),
    ],
)
async def test_cluster_level_error_on_list_stops_that_cluster_with_one_reason(
    status: int, reason: str, message: str
) -> None:
    clusters = fleet_of("c1", "c2")
    clusters["c1"].fail("list", ClusterLevelError(message, status=status, reason=reason))

    report = await run_round(team_a("c1", "c2"), make_round(clusters))

    o = outcome(report, "c1")
    assert (o.error, o.reason, o.reached) == (message, reason, True)
    assert o.deliveries == []  # one reason, not one failure per policy
    assert o.failed == 0
    assert clusters["c1"].of("apply") == []
    assert len(clusters["c1"].of("list")) == 1  # not retried
    assert outcome(report, "c2").converged
    assert report.result is RoundResult.PARTIAL


def counted(o: ClusterOutcome) -> tuple[int, int]:
    """(in sync, failed) as the deliveries show them."""
    failed = sum(d.result is ApplyResult.FAILED for d in o.deliveries)
    return len(o.deliveries) - failed, failed


SIX = {f"p-{i}": {"type": "ForbidLatestTag"} for i in range(6)}


async def test_cluster_level_error_on_apply_stops_that_cluster() -> None:
    clusters = fleet_of("c1", latency_s=0.1)  # requests take time, as real ones do
    clusters["c1"].fail("apply", ClusterLevelError("403 Forbidden", status=403, reason="forbidden"),
                        name="policy-p-1")

    report = await run_round(team_a("c1", rules=SIX), make_round(clusters, apply_concurrency=1))

    o = outcome(report, "c1")
    assert (o.error, o.reason, o.reached) == ("403 Forbidden", "forbidden", True)
    sent = [c.name for c in clusters["c1"].of("apply")]
    assert sent[:2] == ["policy-p-0", "policy-p-1"]
    assert len(sent) <= 3  # at most the one already let through; not the other three
    assert results(o)["p-0"] is ApplyResult.CREATED  # done before the failure is kept
    assert ApplyResult.FAILED not in results(o).values()  # one reason, not per policy
    assert (o.in_sync, o.failed) == counted(o)  # what the status page shows as in sync
    assert not o.converged


async def test_counts_stay_true_when_a_cluster_fails_after_a_rejection() -> None:
    clusters = fleet_of("c1", latency_s=0.1)  # requests take time, as real ones do
    clusters["c1"].fail("apply", ObjectRejected("422 bad", status=422, reason="invalid"),
                        name="policy-p-0")
    clusters["c1"].fail("apply", ClusterLevelError("401", status=401, reason="unauthorized"),
                        name="policy-p-2")

    report = await run_round(team_a("c1", rules=SIX), make_round(clusters, apply_concurrency=1))

    o = outcome(report, "c1")
    assert results(o)["p-0"] is ApplyResult.FAILED
    assert results(o)["p-1"] is ApplyResult.CREATED
    assert "p-2" not in results(o)
    assert o.reason == "unauthorized"
    assert (o.in_sync, o.failed) == counted(o)
    assert o.failed == 1


async def test_transient_errors_are_retried() -> None:
    clusters = fleet_of("c1")
    clusters["c1"].fail("list", TransientApiError("503", status=503), times=1)
    clusters["c1"].fail("apply", TransientApiError("502", status=502), name="policy-p-regs",
                        times=2)
    retrier = Retrier(attempts=3, backoff_s=1.0)

    report = await run_round(team_a("c1"), make_round(clusters, retrier=retrier))

    o = outcome(report, "c1")
    assert o.converged
    [regs] = [d for d in o.deliveries if d.policy == "p-regs"]
    assert (regs.result, regs.attempts) == (ApplyResult.CREATED, 3)
    assert len(clusters["c1"].of("list")) == 2


async def test_throttled_request_waits_retry_after() -> None:
    clusters = fleet_of("c1")
    clusters["c1"].fail("apply", Throttled("429", status=429, retry_after_s=7.0),
                        name="policy-p-latest", times=1)
    loop = asyncio.get_running_loop()
    start = loop.time()

    report = await run_round(team_a("c1"), make_round(clusters))

    assert outcome(report, "c1").converged
    retry = clusters["c1"].of("apply")[-1]
    assert retry.name == "policy-p-latest"
    assert retry.at - start == pytest.approx(7.0)


async def test_persistent_server_errors_fail_the_cluster_within_the_round() -> None:
    clusters = fleet_of("c1", "c2")
    clusters["c1"].fail("list", TransientApiError("503 Service Unavailable", status=503))

    report = await run_round(team_a("c1", "c2"), make_round(clusters, retrier=Retrier(3)))

    o = outcome(report, "c1")
    assert (o.error, o.reason) == ("503 Service Unavailable", "server_error")
    assert o.reached  # it answered (with 503): reached, as the prober judges it too
    assert len(clusters["c1"].of("list")) == 3
    assert outcome(report, "c2").converged


async def test_cluster_without_credentials_is_reported_and_others_converge() -> None:
    clusters = fleet_of("c1")
    report = await run_round(team_a("c1", "c-nocreds"), make_round(clusters))

    o = outcome(report, "c-nocreds")
    assert (o.reached, o.reason) == (False, "no_context")
    assert o.error is not None
    assert "c-nocreds" in o.error
    assert outcome(report, "c1").converged
    assert report.result is RoundResult.PARTIAL


class BrokenClient(FakeCluster):
    """A client that breaks its contract: raises something that is not a `ClusterError` (a
    closed aiohttp session's RuntimeError, a KeyError on an odd answer, a library bug)."""

    def __init__(self, cluster_id: str, *, verb: str, error: Exception) -> None:
        super().__init__(cluster_id)
        self.verb = verb
        self.error = error

    async def _request(self, verb: str, name: str | None, timeout_s: float) -> None:
        await super()._request(verb, name, timeout_s)
        if verb == self.verb:
            raise self.error


@pytest.mark.parametrize("verb", ["list", "apply"])
async def test_unexpected_error_fails_that_cluster_only(
    verb: str, caplog: pytest.LogCaptureFixture
) -> None:
    broken = BrokenClient("c-broken", verb=verb, error=RuntimeError("Session is closed"))
    clusters = Clusters(FakeCluster("c1"), broken, FakeCluster("c2"))

    report = await run_round(team_a("c1", "c-broken", "c2"), make_round(clusters))

    o = outcome(report, "c-broken")
    assert (o.reason, o.error) == ("internal_error", "unexpected error (RuntimeError)")
    assert not o.converged
    assert outcome(report, "c1").converged
    assert outcome(report, "c2").converged
    assert report.result is RoundResult.PARTIAL
    assert "c-broken" in caplog.text


async def test_malformed_object_in_a_cluster_fails_that_cluster_only() -> None:
    clusters = fleet_of("c1", "c2")
    clusters["c2"].objects["policy-p-latest"] = {
        "apiVersion": "platform.stackship.se/v1alpha1", "kind": "Policy",
        "metadata": {"name": "policy-p-latest", "resourceVersion": "1",
                     "labels": {"app.kubernetes.io/managed-by": "convergerd"}},
        "spec": {}, "status": "not an object",
    }

    report = await run_round(team_a("c1", "c2"), make_round(clusters))

    assert outcome(report, "c2").reason == "internal_error"
    assert outcome(report, "c1").converged
    assert report.result is RoundResult.PARTIAL


async def test_fenced_still_wins_over_an_unexpected_error() -> None:
    broken = BrokenClient("c-broken", verb="apply", error=RuntimeError("boom"))
    clusters = Clusters(broken)
    with pytest.raises(Fenced):
        await run_round(team_a("c-broken", rules=SIX),
                        make_round(clusters, fence=Fence(allow=1), apply_concurrency=2))


# --- a down or hung cluster ------------------------------------------------------------------


async def test_unreachable_cluster_does_not_delay_the_others() -> None:
    clusters = fleet_of("c1", "c2", "c-down", latency_s=0.1)
    clusters["c-down"].hang = True
    loop = asyncio.get_running_loop()
    start = loop.time()

    report = await run_round(team_a("c1", "c2", "c-down"), make_round(clusters))

    down = outcome(report, "c-down")
    assert (down.reached, down.reason) == (False, "unreachable")
    assert down.deliveries == []
    assert clusters["c-down"].of("apply") == []  # no per-policy timeouts
    for cid in ("c1", "c2"):
        o = outcome(report, cid)
        assert o.converged
        assert o.duration_s == pytest.approx(0.2)  # one list + one wave of applies
        assert max(c.at for c in clusters[cid].calls) - start == pytest.approx(0.1)
    assert down.duration_s > 3 * REQUEST_TIMEOUT_S - 0.01  # it was hanging all along
    assert report.result is RoundResult.PARTIAL


async def test_down_cluster_costs_one_request_timeout_not_one_per_policy() -> None:
    many = {f"p-{i:02d}": {"type": "ForbidLatestTag"} for i in range(20)}
    clusters = fleet_of("c-down")
    clusters["c-down"].hang = True
    loop = asyncio.get_running_loop()
    start = loop.time()

    report = await run_round(team_a("c-down", rules=many),
                             make_round(clusters, retrier=Retrier(attempts=1)))

    assert loop.time() - start == pytest.approx(REQUEST_TIMEOUT_S)
    assert [c.verb for c in clusters["c-down"].calls] == ["list"]
    assert report.result is RoundResult.FAILED


async def test_round_deadline_bounds_a_hung_cluster() -> None:
    clusters = fleet_of("c1", "c-hung")
    clusters["c-hung"].hang = True
    loop = asyncio.get_running_loop()
    start = loop.time()

    # A request timeout longer than the round: only the deadline can end the wait.
    report = await run_round(
        team_a("c1", "c-hung"),
        make_round(clusters, deadline_s=30.0, request_timeout_s=1000.0),
    )

    assert loop.time() - start == pytest.approx(30.0)
    hung = outcome(report, "c-hung")
    assert (hung.reached, hung.reason) == (False, "deadline")
    assert hung.error is not None
    assert outcome(report, "c1").converged
    assert report.result is RoundResult.PARTIAL


async def test_retries_stop_at_the_deadline() -> None:
    clusters = fleet_of("c-down")
    clusters["c-down"].hang = True
    loop = asyncio.get_running_loop()
    start = loop.time()

    await run_round(team_a("c-down"), make_round(
        clusters, retrier=Retrier(attempts=100, backoff_s=1.0), deadline_s=20.0))

    assert loop.time() - start <= 20.0
    assert all(c.at - start < 20.0 for c in clusters["c-down"].calls)


# --- fencing --------------------------------------------------------------------------------


async def test_fenced_from_the_start_writes_nothing() -> None:
    clusters = fleet_of("c1", "c2")
    with pytest.raises(Fenced):
        await run_round(team_a("c1", "c2"), make_round(clusters, fence=Fence(allow=0)))
    assert clusters["c1"].of("apply") == clusters["c2"].of("apply") == []
    assert clusters["c1"].objects == clusters["c2"].objects == {}


async def test_fenced_mid_round_aborts_every_cluster_at_once() -> None:
    fast = FakeCluster("c-fast", apply_latency_s=1.0)
    slow = FakeCluster("c-slow", apply_latency_s=10.0)
    clusters = Clusters(fast, slow)
    loop = asyncio.get_running_loop()
    start = loop.time()

    # Write checks: fast#1 and slow#1 at t=0, fast#2 at t=1 is refused.
    with pytest.raises(Fenced):
        await run_round(team_a("c-fast", "c-slow"),
                        make_round(clusters, fence=Fence(allow=2), apply_concurrency=1))

    assert loop.time() - start == pytest.approx(1.0)  # did not wait for the slow apply
    assert [c.name for c in fast.of("apply")] == ["policy-p-latest"]
    assert [c.name for c in slow.of("apply")] == ["policy-p-latest"]
    assert [c.verb for c in slow.completed] == ["list"]  # its in-flight apply was cancelled
    assert list(slow.objects) == []


async def test_fenced_together_with_a_cluster_error_is_still_fenced() -> None:
    # The Lease is often lost when the network is in trouble: a member cluster's 403 or
    # timeout can land in the same moment. The caller must still get `Fenced`, not a group.
    clusters = fleet_of("c1")
    clusters["c1"].fail("apply", ClusterLevelError("403 Forbidden", status=403, reason="forbidden"),
                        name="policy-p-0")

    with pytest.raises(Fenced):
        await run_round(team_a("c1", rules=SIX),
                        make_round(clusters, fence=Fence(allow=1), apply_concurrency=2))


async def test_every_retry_asks_the_fence_again() -> None:
    clusters = fleet_of("c1")
    clusters["c1"].fail("apply", TransientApiError("503", status=503), times=1)

    with pytest.raises(Fenced):
        await run_round(team_a("c1", rules={"p-0": {"type": "ForbidLatestTag"}}),
                        make_round(clusters, fence=Fence(allow=1)))

    assert len(clusters["c1"].of("apply")) == 1  # the retry was never sent


async def test_a_write_never_outlives_the_fence() -> None:
    clusters = fleet_of("c1")
    await run_round(team_a("c1"), make_round(clusters, fence=Fence(remaining_s=1.5)))
    assert {c.timeout_s for c in clusters["c1"].of("apply")} == {1.5}

    clusters = fleet_of("c1")
    await run_round(team_a("c1"), make_round(clusters, fence=Fence(remaining_s=600.0)))
    assert {c.timeout_s for c in clusters["c1"].of("apply")} == {REQUEST_TIMEOUT_S}


# --- the report -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("down", "result"),
    [
        ((), RoundResult.OK),
        (("c2",), RoundResult.PARTIAL),
        (("c1", "c2"), RoundResult.FAILED),
    ],
)
async def test_round_result(down: tuple[str, ...], result: RoundResult) -> None:
    clusters = fleet_of("c1", "c2")
    for cid in down:
        clusters[cid].fail("list", ClusterUnreachable("connection refused"))

    report = await run_round(team_a("c1", "c2"), make_round(clusters))

    assert report.result is result
    assert report.counts()["unreached"] == len(down)


async def test_phases_are_read_back_from_the_listed_objects() -> None:
    clusters = fleet_of("c1")
    fleet = team_a("c1")
    await run_round(fleet, make_round(clusters))
    objs = clusters["c1"].objects
    objs["policy-p-latest"]["status"] = {
        "phase": "Enforcing", "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Installed",
                        "message": "admission policy and binding installed"}],
    }
    objs["policy-p-regs"]["status"] = {
        "phase": "Unsupported",
        "conditions": [{"type": "Ready", "status": "False", "reason": "NoAdmissionPolicyApi",
                        "message": "Kubernetes v1.29 has no ValidatingAdmissionPolicy"}],
    }
    clusters["c1"].calls.clear()

    report = await run_round(fleet, make_round(clusters))

    assert [c.verb for c in clusters["c1"].calls] == ["list"]  # no extra requests
    phases = {p.policy: (p.phase, p.ready_reason, p.ready_message, p.revision)
              for p in outcome(report, "c1").phases}
    assert phases == {
        "p-latest": ("Enforcing", "Installed", "admission policy and binding installed", 1),
        "p-regs": ("Unsupported", "NoAdmissionPolicyApi",
                   "Kubernetes v1.29 has no ValidatingAdmissionPolicy", 1),
        "p-labels": (None, None, None, 1),  # the operator has not reported yet
    }
    assert {p.cluster for p in outcome(report, "c1").phases} == {"c1"}
    assert report.result is RoundResult.OK  # status is not drift


async def test_status_is_left_alone_by_applies() -> None:
    clusters = fleet_of("c1")
    fleet = team_a("c1")
    await run_round(fleet, make_round(clusters))
    obj = clusters["c1"].objects["policy-p-regs"]
    obj["status"] = {"phase": "Enforcing"}
    obj["spec"]["revision"] = 0

    await run_round(fleet, make_round(clusters))

    assert clusters["c1"].objects["policy-p-regs"]["status"] == {"phase": "Enforcing"}
    assert clusters["c1"].objects["policy-p-regs"]["spec"]["revision"] == 1


# --- a round cut short still knows what it did ------------------------------------------------


async def test_a_fenced_round_still_reports_what_it_did() -> None:
    done = FakeCluster("c-done")
    fast = FakeCluster("c-fast", apply_latency_s=1.0)
    slow = FakeCluster("c-slow", apply_latency_s=10.0)
    clusters = Clusters(done, fast, slow)
    fleet = make_fleet(["c-done", "c-fast", "c-slow"],
                       {"one": ["c-done"], "team-a": ["c-fast", "c-slow"]},
                       [("p-only", "one", {"type": "ForbidLatestTag"}),
                        *[(pid, "team-a", rule) for pid, rule in RULES.items()]])
    report = RoundReport(started_at=WALL)

    # Write checks: c-done#1, c-fast#1, c-slow#1 at t=0; c-fast#2 at t=1 is refused.
    with pytest.raises(Fenced):
        await run_round(fleet, make_round(clusters, fence=Fence(allow=3), apply_concurrency=1),
                        report=report)

    assert [(c.cluster, results(c)) for c in report.clusters] == [
        ("c-done", {"p-only": ApplyResult.CREATED})]
    cut = {c.cluster: results(c) for c in report.cut_short}
    assert cut == {"c-fast": {"p-latest": ApplyResult.CREATED}}  # its first apply landed
    assert list(fast.objects) == ["policy-p-latest"]
    assert report.finished_at == WALL


async def test_a_cancelled_round_still_reports_what_it_did() -> None:
    clusters = Clusters(FakeCluster("c1", apply_latency_s=1.0))
    report = RoundReport(started_at=WALL)
    task = asyncio.create_task(run_round(
        team_a("c1"), make_round(clusters, apply_concurrency=1), report=report))
    await asyncio.sleep(2.5)  # fake time: two of the three applies finished
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert report.clusters == []
    [cut] = report.cut_short
    assert set(results(cut).values()) == {ApplyResult.CREATED}
    assert {f"policy-{p}" for p in results(cut)} == set(clusters["c1"].objects)
    assert len(cut.deliveries) == 2


async def test_a_hung_tenth_of_the_fleet_does_not_hold_the_healthy_clusters() -> None:
    """Issue 19, item 4: 8 slots, 40 healthy clusters and 8 hung ones that were unreachable
    last time. Without a lane of their own, the hung clusters (first in the fleet) took every
    slot for a whole request timeout before any healthy cluster ran; in their lane (one slot
    here) and behind the healthy clusters, the healthy part of the round takes what it takes
    alone."""
    hung = [f"a-hung-{i}" for i in range(8)]
    healthy = [f"c{i:02d}" for i in range(40)]
    clusters = fleet_of(*hung, *healthy, latency_s=0.1)
    for cid in hung:
        clusters[cid].hang = True
    env = make_round(clusters, retrier=Retrier(attempts=1), cluster_concurrency=8,
                     suspects=frozenset(ClusterId(c) for c in hung))
    loop = asyncio.get_running_loop()
    start = loop.time()

    report = await run_round(team_a(*hung, *healthy), env)

    # 40 healthy clusters in 7 slots: 6 waves of a list and a wave of applies, 0.2 s each.
    healthy_done = max(c.at for cid in healthy for c in clusters[cid].calls) - start
    assert healthy_done < 1.5
    assert all(outcome(report, c).converged for c in healthy)
    # One hung cluster in the lane from the start; the others waited behind the healthy
    # ones, then took all the slots at once: the round ends one timeout after the healthy
    # part, not after eight timeouts in a row (40 s).
    assert loop.time() - start == pytest.approx(healthy_done + REQUEST_TIMEOUT_S, abs=0.2)
    assert all(outcome(report, c).reason == "unreachable" for c in hung)


async def test_clusters_seen_unreachable_after_the_round_began_wait_behind_the_others() -> None:
    """A tenth of the fleet hangs just before a round: the round began without knowing, and the
    prober finds them out while the round runs. When a hung cluster's turn comes it is seen
    unreachable now, so it gives its slot back and waits behind the healthy ones: the healthy
    part of the round takes what it takes alone, not the hung clusters' timeouts."""
    first = [f"c{i:02d}" for i in range(20)]
    hung = [f"h{i}" for i in range(8)]
    rest = [f"d{i:02d}" for i in range(20)]
    healthy = first + rest
    clusters = fleet_of(*first, *hung, *rest, latency_s=0.1)
    for cid in hung:
        clusters[cid].hang = True
    seen_down: set[ClusterId] = set()

    async def prober() -> None:
        await asyncio.sleep(0.05)  # before their turn (the third wave, at 0.4 s)
        seen_down.update(ClusterId(c) for c in hung)

    env = make_round(clusters, retrier=Retrier(attempts=1), cluster_concurrency=8,
                     suspected=seen_down.__contains__)
    loop = asyncio.get_running_loop()
    start = loop.time()
    probing = asyncio.create_task(prober())

    report = await run_round(team_a(*first, *hung, *rest), env)

    await probing
    healthy_done = max(c.at for cid in healthy for c in clusters[cid].calls) - start
    assert healthy_done < 1.5  # 40 clusters in 8 slots, 0.2 s a wave
    assert all(outcome(report, c).converged for c in healthy)
    # Then the hung ones, 8 at once in all the slots: one timeout.
    assert loop.time() - start == pytest.approx(healthy_done + REQUEST_TIMEOUT_S, abs=0.3)
    assert all(outcome(report, c).reason == "unreachable" for c in hung)


async def test_fresh_hangs_give_their_slots_back_after_the_patience() -> None:
    """The same fleet without `suspected` (nobody has seen the hung clusters yet): each holds
    its slot until the patience runs out (`PATIENCE_FLOOR_S`, against answers of 0.1 s), not
    for its whole request timeout, then waits its timeout out aside while the healthy clusters
    after it take the slots; each hung one still fails as unreachable."""
    first = [f"c{i:02d}" for i in range(20)]
    hung = [f"h{i}" for i in range(8)]
    rest = [f"d{i:02d}" for i in range(20)]
    clusters = fleet_of(*first, *hung, *rest, latency_s=0.1)
    for cid in hung:
        clusters[cid].hang = True
    env = make_round(clusters, retrier=Retrier(attempts=1), cluster_concurrency=8)
    start = asyncio.get_running_loop().time()

    report = await run_round(team_a(*first, *hung, *rest), env)

    rest_done = max(c.at for cid in rest for c in clusters[cid].calls) - start
    # 40 healthy clusters at 0.2 s a wave in 8 slots, and the hung ones' patience once.
    assert rest_done < 1.5 + PATIENCE_FLOOR_S + 0.1
    assert rest_done < REQUEST_TIMEOUT_S
    assert all(outcome(report, c).converged for c in first + rest)
    assert all(outcome(report, c).reason == "unreachable" for c in hung)


async def test_clusters_that_hear_nothing_keep_their_slots_once_the_aside_is_full() -> None:
    """At most `ASIDE_PER_SLOT` clusters per slot wait aside: with more hung than that, the
    others keep their slots for their timeout (hung clusters never multiply the requests in
    flight without bound)."""
    hung = [f"h{i:02d}" for i in range(2 * ASIDE_PER_SLOT)]
    clusters = fleet_of(*hung, "ok", latency_s=0.1)
    for cid in hung:
        clusters[cid].hang = True
    env = make_round(clusters, retrier=Retrier(attempts=1), cluster_concurrency=1)

    report = await run_round(team_a(*hung, "ok"), env)

    # Each hung list is in flight from its start for its timeout.
    edges = sorted(e for cid in hung for c in clusters[cid].of("list")
                   for e in ((c.at, 1), (c.at + c.timeout_s, -1)))
    in_flight = list(itertools.accumulate(step for _, step in edges))
    assert max(in_flight) == 1 + ASIDE_PER_SLOT  # the one slot, and the aside full
    assert outcome(report, "ok").converged
    assert all(outcome(report, c).reason == "unreachable" for c in hung)


def test_the_suspects_lane_is_an_eighth_of_the_slots() -> None:
    assert suspect_slots(64) == (56, 8)
    assert suspect_slots(8) == (7, 1)
    assert suspect_slots(1) == (1, 1)


async def test_a_round_logs_its_failed_clusters_in_one_bounded_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fleet where most clusters fail (a deadline cut, a hung tenth at 10,000 clusters) gives
    the on-call engineer one warning with counts by reason and a few names, not one per
    cluster."""
    ids = [f"c{i:03d}" for i in range(30)]
    clusters = fleet_of(*ids[:5])  # the other 25 have no kubeconfig context

    with caplog.at_level("DEBUG", logger="convergerd.delivery.converge"):
        report = await run_round(team_a(*ids), make_round(clusters))

    assert report.counts()["converged"] == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    [line] = warnings
    assert line.startswith("round: 25 of 30 clusters failed (no_context 25): c005 (")
    assert line.endswith(" and 15 more")
    assert "c014" in line  # the first ten failed, in fleet order
    assert "c015" not in line
    per_cluster = [r for r in caplog.records if r.levelname == "DEBUG"
                   and r.getMessage().startswith("cluster ")]
    assert len(per_cluster) == 25  # each still there, at debug


async def test_clusters_the_last_round_left_in_sync_take_their_slots_last() -> None:
    """A first round at 10,000 x 100 outlasts its deadline: the next one must carry on with
    the clusters that still have work, not list the ones already in sync first."""
    clusters = fleet_of("c1", "c2", "c3", "c4", latency_s=0.001)
    round_ = dataclasses.replace(make_round(clusters, cluster_concurrency=1),
                                 caught_up=frozenset({ClusterId("c1"), ClusterId("c3")}))

    await run_round(team_a("c1", "c2", "c3", "c4"), round_)

    started = sorted(clusters.by_id, key=lambda c: clusters.by_id[c].of("list")[0].at)
    assert started == ["c2", "c4", "c1", "c3"]  # fleet order within each group
