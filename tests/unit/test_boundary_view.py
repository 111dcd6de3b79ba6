"""A boundary's view (`boundaries.BoundaryViews`, `GET /v1/boundaries/{b}` and the web page's
boundary): its roll-up counts every (cluster, policy) record as that record judged alone
(`boundaries.judged`) counts, though a cluster's records that agree are judged once; its
probe-age rule is `verification_of`'s; and the view is read once while fresh, by one build at
a time, for the JSON pages and the page alike, with the views kept bounded. Time is a fake:
the monotonic clock the views judge reuse by, the state's wall clock apart."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from collections import Counter
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from convergerd.api.boundaries import BoundaryBuilt, BoundaryViews, Tally, judged
from convergerd.api.server import Views
from convergerd.config import StatusReadTuning, load_settings
from convergerd.core.decode import in_the_future
from convergerd.core.model import ClusterId, PolicyId, PolicyRow
from convergerd.core.report import (
    ApplyResult,
    Audit,
    AuditSample,
    ClusterOutcome,
    Delivery,
    Epoch,
    PhaseReading,
    RoundReport,
    Verification,
    audit_fields,
    verified_fields,
)
from convergerd.core.rows import (
    BoundaryPolicy,
    BoundaryRows,
    ClusterStatusRows,
    PolicyStatusRows,
)
from convergerd.status.listing import Page
from convergerd.status.phases import (
    age_s,
    probe_age_classes,
    verification_of,
    verified_stale_after_s,
)
from convergerd.status.state import StatusState
from convergerd.status.views import policy_audit_view
from convergerd.supervise import HealthCheck

T0 = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
INTERVAL_S = 300.0
PROBE_PERIOD_S = 600.0
STALE_PROBE_S = verified_stale_after_s(PROBE_PERIOD_S)
REUSE_S = StatusReadTuning().reuse_s


def s(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)


# Probe times around each edge the verification reads, to the microsecond: in the future
# (`in_the_future`), older than `verified_stale_after_s`.
PROBE_AGES = (None, 0.0, 10.0, -30.0, -60.0, -60.000001, -90.0, STALE_PROBE_S,
              STALE_PROBE_S + 0.000001, 9000.0)
VERIFIED = ("none", "denied", "admitted", "failed", "unknown", "denied-untimed")


def verified(kind: str, probed: dt.datetime | None) -> Verification | None:
    return {"none": None,
            "denied": Verification("True", "Denied", "m", probed, probed),
            "denied-untimed": Verification("True", "Denied", "m", None, None),
            "admitted": Verification("False", "Admitted", "m", probed, probed),
            "failed": Verification("False", "ProbeFailed", "m", probed, probed),
            "unknown": Verification("Unknown", None, None, probed, None)}[kind]


def audit(kind: str | None, seen: dt.datetime, violations: int, cluster: str) -> Audit | None:
    sample = (AuditSample("Pod", "ns", f"bad-{cluster}", "<b>latest</b>"),) if violations else ()
    return {None: None,
            "current": Audit(violations, seen - s(10), True, None, sample),
            "unsynced": Audit(violations, seen - s(10), False, None, sample),
            "unreadable": Audit(None, None, False, "violations: not an integer", ()),
            "after-reading": Audit(violations, seen + s(500), True, None, sample),
            "old": Audit(violations, seen - s(4000), True, None, sample)}[kind]


def a_round(rng: random.Random, clusters: list[ClusterId], policies: list[PolicyId],
            at: dt.datetime) -> RoundReport:
    """A round over `clusters` with a bit of everything: unreached and failing clusters,
    records without a delivery or a reading, failed deliveries, revisions behind, every
    phase, stale readings, each kind of Verified condition with probe times around each edge,
    each kind of audit. As in a real round, most of a cluster's records agree but on their
    probe times and revisions."""
    outcomes = []
    for cid in clusters:
        if rng.random() < 0.1:
            outcomes.append(ClusterOutcome(cid, reached=False, error="connection refused",
                                           reason="unreachable"))
            continue
        seen = at - s(rng.choice([0, 0, 30, 700]))  # one listing per cluster

        def pick(*choices: Any) -> Any:
            return rng.choice(choices)

        usual = (pick(ApplyResult.UNCHANGED, ApplyResult.CREATED),
                 pick("Enforcing", "Enforcing", "Inert", "Unsupported", "Error", None, "Pending"),
                 pick(*VERIFIED),
                 pick(None, None, "current", "unsynced", "unreadable", "after-reading", "old"),
                 pick(0, 2))
        phases, deliveries = [], []
        for pid in policies:
            if rng.random() < 0.1:
                continue
            result, phase, kind, audited, violations = usual if rng.random() < 0.7 else (
                pick(ApplyResult.UNCHANGED, ApplyResult.FAILED, ApplyResult.CREATED),
                pick("Enforcing", "Inert", "Unsupported", "Error", None, "Pending"),
                pick(*VERIFIED),
                pick(None, "current", "unsynced", "unreadable", "after-reading", "old"),
                pick(0, 2))
            if rng.random() < 0.9:
                failed = result is ApplyResult.FAILED
                deliveries.append(Delivery(cid, pid, pick(1, 1, 2), result, at,
                                           error="422 <x>" if failed else None,
                                           reason="invalid" if failed else None))
            if rng.random() < 0.1:
                continue
            age = pick(*PROBE_AGES)
            probed = None if age is None else at - s(age)
            phases.append(PhaseReading(
                cid, pid, phase, "r", "m", pick(1, 2), seen,
                **verified_fields(verified(kind, probed)),
                **audit_fields(audit(audited, seen, violations, cid))))
        broken = rng.random() < 0.05
        outcomes.append(ClusterOutcome(
            cid, reached=True, desired=len(policies), in_sync=len(policies),
            server_version=pick("v1.29.0", "v1.31.2", None), deliveries=deliveries,
            phases=phases, error="CRD missing" if broken else None,
            reason="crd" if broken else None))
    return RoundReport(started_at=at - s(60), finished_at=at, epoch=Epoch("rep-a", 1),
                       clusters=outcomes)


class Clock:
    """The views' monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Boundaries:
    """The database's boundaries (`BoundarySource`): each's clusters and policies, and how
    often each was read; `hold` keeps reads waiting until it is set, `fail` makes the next
    reads fail."""

    def __init__(self, boundaries: dict[str, BoundaryRows]) -> None:
        self.boundaries = boundaries
        self.reads: Counter[str] = Counter()
        self.hold = asyncio.Event()
        self.hold.set()
        self.fail = 0

    async def boundary_status(self, boundary: str, most: int) -> BoundaryRows | None:
        self.reads[boundary] += 1
        await self.hold.wait()
        if self.fail:
            self.fail -= 1
            raise OSError("connection reset")
        return self.boundaries.get(boundary)

    async def ping(self) -> None:
        return None

    async def cluster_status(self, cluster_id: str, policies: object, /) -> ClusterStatusRows:
        raise AssertionError("not read here")

    async def policy_status(self, policy_id: str, /) -> PolicyStatusRows | None:
        raise AssertionError("not read here")


def boundary_rows(clusters: list[ClusterId], policies: list[PolicyRow]) -> BoundaryRows:
    return BoundaryRows(tuple(sorted(clusters)),
                        tuple(BoundaryPolicy(p, None, None) for p in policies), len(policies))


def views_of(state: StatusState, source: Boundaries, clock: Clock, **kept: int,
             ) -> BoundaryViews:
    settings = load_settings({
        "CONVERGERD_DATABASE_URL": "postgresql://t@127.0.0.1:1/none",
        "CONVERGERD_LEADER_ELECTION": "false", "CONVERGERD_IDENTITY": "rep-a",
        "CONVERGERD_STATUS_READS_PER_SECOND": "1000000",
        "CONVERGERD_STATUS_MAX_CLUSTERS": "10"})
    views = Views(metrics=None, state=state, store=source,  # type: ignore[arg-type]
                  settings=settings, health=HealthCheck(), clock=clock)
    return BoundaryViews(views, source, **kept)


def fleet(seed: int, wall: list[dt.datetime]) -> tuple[StatusState, BoundaryRows]:
    """A state told two varied rounds, and a boundary of most of its policies over its
    clusters and two it does not know."""
    rng = random.Random(seed)
    clusters = [ClusterId(f"c{i:02d}") for i in range(24)]
    policies = [PolicyId(f"p{j}") for j in range(12)]
    state = StatusState(identity="rep-a", interval_s=INTERVAL_S, clock=lambda: wall[0],
                        probe_period_s=PROBE_PERIOD_S)
    state.set_clusters(clusters[:-2])
    state.observe_round(a_round(rng, clusters[:-2], policies, T0 - s(400)))
    state.observe_round(a_round(rng, rng.sample(clusters[:-2], 11), policies, T0))
    rows = [PolicyRow(p, "team-a", {"type": "ForbidLatestTag"}, True, rng.choice([1, 2]))
            for p in policies[:9]]
    return state, boundary_rows(clusters, rows)


def each_record_alone(state: StatusState, rows: BoundaryRows) -> dict[str, Any]:
    """The roll-up the plain way: every record read whole and judged alone."""
    now = state.clock()
    policies: dict[str, list[Any]] = {bp.policy.id: [Counter(), []] for bp in rows.policies}
    clusters = {}
    for cid in rows.clusters:
        live = state.clusters.get(cid)
        here: Counter[Any] = Counter()
        for bp in rows.policies:
            record = live.policies.get(PolicyId(bp.policy.id)) if live is not None else None
            if record is None:
                continue
            judgment, audit_seen = judged(record, bp.policy.revision, now,
                                          interval_s=INTERVAL_S, probe_period_s=PROBE_PERIOD_S)
            here[judgment] += 1
            policies[bp.policy.id][0][judgment] += 1
            policies[bp.policy.id][1].append(audit_seen)
        clusters[cid] = Tally.of(here).view()
    return {"policies": {p: {**Tally.of(counted).view(), "audit": policy_audit_view(audits, [])}
                         for p, (counted, audits) in policies.items()},
            "clusters": clusters}


def shown(doc: dict[str, Any]) -> dict[str, Any]:
    keys = ("phases", "verification", "in_sync", "failed", "violations", "enforcement",
            "admission")
    return {"policies": {p["id"]: {**{k: p[k] for k in keys},
                                   "audit": {**p["audit"], "sample": []}}
                         for p in doc["policies"]},
            "clusters": {c["id"]: {k: c[k] for k in keys} for c in doc["clusters"]}}


async def page(boundaries: BoundaryViews, boundary: str, page: Page) -> dict[str, Any]:
    found = await boundaries.document(boundary, page)
    assert isinstance(found, dict), found
    return found


async def whole(boundaries: BoundaryViews, boundary: str) -> BoundaryBuilt:
    found = await boundaries.whole(boundary)
    assert isinstance(found, BoundaryBuilt), found
    return found


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("later_s", [0.0, 100.0, 1000.0, 4000.0])
async def test_the_roll_up_counts_every_record_as_it_judged_alone_counts(
    seed: int, later_s: float,
) -> None:
    wall = [T0]
    state, rows = fleet(seed, wall)
    wall[0] = T0 + s(later_s)
    doc = await page(views_of(state, Boundaries({"team-a": rows}), Clock()), "team-a",
                     Page(100, None))
    assert shown(doc) == each_record_alone(state, rows)
    assert [c["id"] for c in doc["clusters"]] == list(rows.clusters)


@given(probed=st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                           timezones=st.just(dt.UTC)),
       now=st.sampled_from([T0, T0 + s(0.000001), T0 + s(STALE_PROBE_S)]),
       period=st.sampled_from([PROBE_PERIOD_S, 0.1234567, 7.0 / 3.0]))
def test_a_probe_times_age_class_is_the_tests_verification_makes_of_it(
    probed: dt.datetime, now: dt.datetime, period: float,
) -> None:
    cls = probe_age_classes(now, period)(probed)
    if in_the_future(probed, now):
        assert cls == 1
    elif age_s(probed, now) > verified_stale_after_s(period):
        assert cls == 2
    else:
        assert cls == 3
    assert probe_age_classes(now, period)(None) == 0


@given(first=st.sampled_from(PROBE_AGES), second=st.sampled_from(PROBE_AGES),
       kind=st.sampled_from(VERIFIED), seen_ago=st.sampled_from([0.0, 30.0, 700.0]))
def test_readings_whose_probe_times_are_of_one_class_are_verified_alike(
    first: float | None, second: float | None, kind: str, seen_ago: float,
) -> None:
    classes = probe_age_classes(T0, PROBE_PERIOD_S)
    one, other = ((None if a is None else T0 - s(a)) for a in (first, second))
    if classes(one) != classes(other):
        return
    seen = T0 - s(seen_ago)

    def verification(probed: dt.datetime | None) -> str:
        reading = PhaseReading(ClusterId("c1"), PolicyId("p1"), "Enforcing", None, None, 1, seen,
                               **verified_fields(verified(kind, probed)))
        return verification_of(reading, seen_ago, INTERVAL_S, now=T0,
                               probe_period_s=PROBE_PERIOD_S)

    assert verification(one) == verification(other)


# --- kept while fresh -------------------------------------------------------------------------


async def test_the_json_pages_and_the_web_page_share_one_read_while_it_is_fresh() -> None:
    wall = [T0]
    state, rows = fleet(1, wall)
    source = Boundaries({"team-a": rows})
    clock = Clock()
    boundaries = views_of(state, source, clock)
    first = await boundaries.boundary(make_mocked_request(
        "GET", "/v1/boundaries/team-a", match_info={"boundary": "team-a"}))
    second = await boundaries.boundary(make_mocked_request(
        "GET", "/v1/boundaries/team-a?limit=5&after=c09", match_info={"boundary": "team-a"}))
    shown_whole = await whole(boundaries, "team-a")
    assert (first.status, second.status) == (200, 200)
    assert source.reads["team-a"] == 1
    assert len(shown_whole.document["clusters"]) == len(rows.clusters)

    # The same state a second later (`reuse_s`): still the view read then.
    clock.now += REUSE_S
    wall[0] += s(REUSE_S)
    assert (await page(boundaries, "team-a", Page(5, None)))["now"] == \
        shown_whole.document["now"]
    assert source.reads["team-a"] == 1

    # The state changed since, and the view is older than its reuse: read again.
    state.observe_probe(rows.clusters[0], reachable=False, error="connection refused")
    clock.now += 0.001
    again = await page(boundaries, "team-a", Page(5, None))
    assert source.reads["team-a"] == 2
    assert again["clusters"][0]["reachable"] is False


async def test_requests_during_a_build_wait_for_it_and_a_failed_read_is_not_kept() -> None:
    wall = [T0]
    state, rows = fleet(2, wall)
    source = Boundaries({"team-a": rows})
    boundaries = views_of(state, source, Clock())
    source.hold.clear()
    source.fail = 1
    waiting = [asyncio.create_task(boundaries.document("team-a", Page(5, None)))
               for _ in range(3)]
    await asyncio.sleep(0)
    source.hold.set()
    failed = await asyncio.gather(*waiting)
    assert source.reads["team-a"] == 1
    assert [getattr(f, "status", None) for f in failed] == [503, 503, 503]
    assert len({id(f) for f in failed}) == 3  # each request answered with its own response

    await page(boundaries, "team-a", Page(5, None))
    assert source.reads["team-a"] == 2
    unknown = await boundaries.document("nobody", Page(5, None))
    assert getattr(unknown, "status", None) == 404


async def test_the_views_kept_are_bounded_the_least_recently_shown_going_first() -> None:
    wall = [T0]
    state, rows = fleet(3, wall)
    small = boundary_rows(list(rows.clusters[:4]), [bp.policy for bp in rows.policies])
    source = Boundaries({"a": small, "b": small, "c": small, "big": rows})
    boundaries = views_of(state, source, Clock(), kept_views=2,
                          kept_clusters=2 * len(small.clusters))

    async def read(*names: str) -> None:
        for name in names:
            await whole(boundaries, name)

    await read("a", "b", "a", "c")  # b is the least recently shown of three
    assert source.reads == {"a": 1, "b": 1, "c": 1}
    await read("a", "c", "b")
    assert source.reads == {"a": 1, "b": 2, "c": 1}
    # A view past the clusters' bound is kept, alone.
    await read("big", "big")
    assert source.reads["big"] == 1
    await read("c")
    assert source.reads == {"a": 1, "b": 2, "c": 2, "big": 1}
