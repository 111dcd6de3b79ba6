"""Serving `/status` (`server.Views.status`): one build shared by the requests that arrive
while it runs, bodies reused within the documented age (`STATUS_REUSE_S`,
`STATUS_REUSE_BUILDS`), built in slices that add up to `StatusState.snapshot`. Time is a fake:
the monotonic clock the views judge reuse by, and the state's wall clock tied to it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from convergerd import __version__
from convergerd.api.server import Views
from convergerd.config import StatusReadTuning, load_settings
from convergerd.core.model import ClusterId, PolicyId
from convergerd.core.report import ClusterOutcome, Epoch, PhaseReading, RoundReport
from convergerd.core.rows import ClusterStatusRows, PolicyStatusRows
from convergerd.status.document import snapshot
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState
from convergerd.status.views import iso
from convergerd.supervise import HealthCheck

TUNING = StatusReadTuning()
METRICS_REUSE_MAX_S = TUNING.metrics_reuse_max_s
STATUS_REUSE_BUILDS = TUNING.reuse_builds
STATUS_REUSE_S = TUNING.reuse_s

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
INTERVAL = 300.0


class Clocks:
    """The views' monotonic clock and the state's wall clock, one time. Reading the wall
    clock takes `build_s` (a build reads it once, as its `now`): what a build costs."""

    def __init__(self) -> None:
        self.now = 0.0
        self.build_s = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> dt.datetime:
        self.now += self.build_s
        return T0 + dt.timedelta(seconds=self.now)

    def age_of(self, body: dict[str, Any]) -> float:
        return self.now - (dt.datetime.fromisoformat(body["now"]) - T0).total_seconds()


class NoDatabase:
    async def ping(self) -> None:
        return None

    async def cluster_status(self, cluster_id: str, policies: object, /) -> ClusterStatusRows:
        raise AssertionError("/status never reads the database")

    async def policy_status(self, policy_id: str, /) -> PolicyStatusRows | None:
        raise AssertionError("/status never reads the database")


def fleet(clocks: Clocks, clusters: int) -> StatusState:
    """`clusters` clusters seen by one round; every third Unsupported on v1.29."""
    state = StatusState(identity="rep-a", interval_s=INTERVAL, clock=clocks.wall)
    ids = [f"c{i:02d}" for i in range(clusters)]
    state.set_clusters(ids)
    outcomes = [
        ClusterOutcome(ClusterId(c), reached=True, desired=1, in_sync=1,
                       server_version="v1.29.4" if i % 3 == 0 else "v1.31.0",
                       phases=[PhaseReading(ClusterId(c), PolicyId("p1"),
                                            "Unsupported" if i % 3 == 0 else "Enforcing",
                                            None, None, 1, T0)])
        for i, c in enumerate(ids)]
    state.observe_round(RoundReport(started_at=T0, finished_at=T0, epoch=Epoch("rep-a", 1),
                                    clusters=outcomes))
    return state


def views_of(state: StatusState, clocks: Clocks, *, reads_per_s: float = 1e6,
             max_clusters: int = 1000) -> Views:
    settings = load_settings({
        "CONVERGERD_DATABASE_URL": "postgresql://convergerd@db.example:5432/policies",
        "CONVERGERD_IDENTITY": "rep-a",
        "CONVERGERD_STATUS_READS_PER_SECOND": str(reads_per_s),
        "CONVERGERD_STATUS_MAX_CLUSTERS": str(max_clusters)})
    views = Views(metrics=Metrics(state=state, process_collectors=False), state=state,
                  store=NoDatabase(), settings=settings, health=HealthCheck(),
                  clock=clocks.monotonic)
    views.status_slice = 2
    return views


async def get_body(views: Views, path: str = "/status") -> bytes:
    response = await views.status(make_mocked_request("GET", path))
    assert response.status == 200, response.body
    assert isinstance(response.body, bytes)
    return response.body


async def get_status(views: Views, path: str = "/status") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(await get_body(views, path))
    return doc


def probe(state: StatusState, cluster: str, reachable: bool) -> None:
    """A reachability probe: the state changes (a new version)."""
    state.observe_probe(cluster, reachable=reachable, at=T0)


async def test_the_sliced_body_is_the_snapshot() -> None:
    clocks = Clocks()
    state = fleet(clocks, 9)
    probe(state, "c04", False)
    body = await get_status(views_of(state, clocks))
    expected = json.loads(json.dumps(snapshot(state, T0 + dt.timedelta(seconds=clocks.now))))
    assert body == {**expected, "version": __version__, "database": {
        "reachable": True, "error": None, "synced_at": None,
        "url": "postgresql://convergerd@db.example:5432/policies"}}
    assert body["clusters"][0]["id"] == "c04"  # unreached first
    assert body["unsupported_by_version"] == {"v1.29.4": ["c00", "c03", "c06"]}
    assert body["listing"] == {"complete": True, "order": "worst_first", "listed": 9,
                               "after": None, "next": None}
    assert body["fleet"] == {"clusters": 9, "unreached": 1, "unchecked": 0, "failing": 0,
                             "lagging": 0, "in_sync": 8, "unsupported": 3, "orphaned": 0}


async def test_past_the_threshold_a_summary_whose_size_does_not_grow_with_the_fleet() -> None:
    bodies = []
    for size in (40, 400):
        clocks = Clocks()
        state = fleet(clocks, size)
        for down in ("c07", "c31"):
            probe(state, down, False)
        bodies.append(await get_body(views_of(state, clocks, max_clusters=5)))
        doc = json.loads(bodies[-1])
        assert [c["id"] for c in doc["clusters"][:2]] == ["c07", "c31"]  # unreached first
        assert len(doc["clusters"]) == 5
        assert doc["listing"] == {"complete": False, "order": "worst_first", "listed": 5,
                                  "after": None, "next": "/status?limit=5"}
        assert doc["fleet"]["clusters"] == size
        assert doc["fleet"]["unreached"] == 2
        assert doc["fleet"]["unsupported"] == len(range(0, size, 3))
        assert sum(map(len, doc["unsupported_by_version"].values())) == 5
    small, large = bodies
    # Ten times the fleet, the same answer but for a few longer ids and counts.
    assert len(large) <= len(small) + 32, (len(small), len(large))


async def test_pages_walk_every_cluster_once_while_the_state_changes() -> None:
    clocks = Clocks()
    state = fleet(clocks, 23)
    views = views_of(state, clocks, max_clusters=5)
    path = (await get_status(views))["listing"]["next"]
    seen: list[str] = []
    pages = 0
    while path is not None:
        page = await get_status(views, path)
        assert page["listing"]["order"] == "id"
        assert page["listing"]["listed"] == len(page["clusters"]) <= 5
        assert page["fleet"]["clusters"] == 23  # every page carries the counts
        seen += [c["id"] for c in page["clusters"]]
        probe(state, f"c{pages:02d}", pages % 2 == 0)  # the order of the worst changes
        clocks.now += STATUS_REUSE_S + 0.1  # and the next page is under a new build
        path = page["listing"]["next"]
        pages += 1
    assert seen == sorted(state.clusters)
    assert pages == 5


@pytest.mark.parametrize("query", ["limit=0", "limit=6", "limit=-1", "limit=x", "limit=",
                                   "after=Bad_Id", "after=", "limit=1e3"])
async def test_a_page_that_cannot_be_served_is_refused_naming_the_parameter(query: str) -> None:
    clocks = Clocks()
    views = views_of(fleet(clocks, 3), clocks, max_clusters=5)
    response = await views.status(make_mocked_request("GET", f"/status?{query}"))
    assert response.status == 400
    assert isinstance(response.body, bytes)
    assert json.loads(response.body)["error"].startswith(query.partition("=")[0] + ":")


async def test_a_small_fleet_pages_too() -> None:
    clocks = Clocks()
    views = views_of(fleet(clocks, 3), clocks)
    page = await get_status(views, "/status?limit=2")
    assert [c["id"] for c in page["clusters"]] == ["c00", "c01"]
    assert page["listing"]["next"] == "/status?limit=2&after=c01"
    last = await get_status(views, page["listing"]["next"])
    assert [c["id"] for c in last["clusters"]] == ["c02"]
    assert last["listing"] == {"complete": False, "order": "id", "listed": 1,
                               "after": "c01", "next": None}
    whole = await get_status(views, "/status?limit=3")
    assert whole["listing"]["complete"] is True


async def test_requests_during_a_build_wait_for_it_instead_of_building_again() -> None:
    clocks = Clocks()
    state = fleet(clocks, 20)
    views = views_of(state, clocks)
    first = asyncio.create_task(get_status(views))
    for _ in range(3):  # the build begins, and yields between its slices of 2 clusters
        await asyncio.sleep(0)
    assert not first.done()
    probe(state, "c07", False)  # the state changes during the build
    clocks.now += 10  # and time passes
    bodies = await asyncio.gather(first, *(get_status(views) for _ in range(5)))
    assert all(body == bodies[0] for body in bodies)  # one build (one `now`) for all six
    assert bodies[0]["now"] == iso(T0)
    # The change made during that build is in the next one.
    again = await get_status(views)
    assert again["now"] == iso(T0 + dt.timedelta(seconds=10))
    assert next(c for c in again["clusters"] if c["id"] == "c07")["reachable"] is False


async def test_a_body_is_reused_while_unchanged_up_to_the_reuse_period() -> None:
    clocks = Clocks()
    state = fleet(clocks, 4)
    views = views_of(state, clocks)
    clocks.build_s = 0.001  # cheap: reused only while nothing changes, for at most 1 s
    built = await get_status(views)
    clocks.now += STATUS_REUSE_S / 2
    assert await get_status(views) == built
    probe(state, "c01", False)
    changed = await get_status(views)
    assert changed != built
    clocks.now += STATUS_REUSE_S + 0.01
    assert (await get_status(views))["now"] != changed["now"]


async def test_answers_stay_within_the_documented_age_and_builds_within_a_tenth_of_the_time(
) -> None:
    """The prober changes the state before every request; a build costs 0.5 s of the loop:
    each body is reused for 10 builds' time, never longer, so building takes ~1/10 of it."""
    clocks = Clocks()
    state = fleet(clocks, 6)
    views = views_of(state, clocks)
    clocks.build_s = 0.5
    bound = max(STATUS_REUSE_S, STATUS_REUSE_BUILDS * clocks.build_s)
    began = clocks.now
    nows = []
    for i in range(200):
        probe(state, f"c0{i % 6}", i % 2 == 0)
        body = await get_status(views)
        assert clocks.age_of(body) <= bound
        nows.append(body["now"])
        clocks.now += 0.1
    builds = len(set(nows))
    assert builds * clocks.build_s <= (clocks.now - began) / STATUS_REUSE_BUILDS + clocks.build_s


async def test_a_string_orjson_refuses_is_still_served() -> None:
    clocks = Clocks()
    state = fleet(clocks, 1)
    state.set_invalid([("p-odd", "bad \ud800 value")])
    body = await get_status(views_of(state, clocks))
    assert body["invalid_policies"] == [{"id": "p-odd", "reason": "bad \ud800 value"}]


async def test_a_scrape_is_reused_only_while_younger_than_ten_of_its_builds() -> None:
    clocks = Clocks()
    state = fleet(clocks, 3)
    views = views_of(state, clocks)

    async def scrape() -> bytes:
        response = await views.metrics_text(make_mocked_request("GET", "/metrics"))
        assert isinstance(response.body, bytes)
        return response.body

    first = await scrape()
    views.metrics.request_done("c01", "get", 200, 0.01)
    counted = b'convergerd_cluster_requests_total{cluster="c01",code="200",verb="get"} 1.0'
    assert counted in await scrape()  # a build that cost nothing is never reused
    clocks.build_s = 0.05  # a build reads the wall clock: now it costs time
    costly = await scrape()
    spent = clocks.now
    views.metrics.request_done("c01", "get", 200, 0.01)
    clocks.now = spent + STATUS_REUSE_BUILDS * 0.05  # younger than 10 of its builds
    assert await scrape() == costly
    clocks.now += 1.0
    assert b"verb=\"get\"} 2.0" in await scrape()
    assert first != costly


async def test_a_slow_scrape_is_reused_for_at_most_five_seconds() -> None:
    """A render slowed by a busy loop would be reused for ten times its cost; a cluster seen
    down meanwhile must read 0 within METRICS_REUSE_MAX_S all the same."""
    clocks = Clocks()
    state = fleet(clocks, 3)
    views = views_of(state, clocks)

    async def cluster_up() -> bytes:
        response = await views.metrics_text(make_mocked_request("GET", "/metrics"))
        assert isinstance(response.body, bytes)
        [line] = [line for line in response.body.splitlines()
                  if line.startswith(b'convergerd_cluster_up{cluster="c01"}')]
        return line.rsplit(b" ", 1)[1]

    clocks.build_s = 0.75  # per read of the wall clock: the render costs a few of them
    began = clocks.now
    assert await cluster_up() == b"1.0"
    cost = clocks.now - began
    assert STATUS_REUSE_BUILDS * cost > 2 * METRICS_REUSE_MAX_S  # the cost rule alone: 10 s+
    clocks.build_s = 0.0
    probe(state, "c01", reachable=False)
    clocks.now = began + METRICS_REUSE_MAX_S - 0.1
    assert await cluster_up() == b"1.0"  # reused: younger than 5 s
    clocks.now = began + METRICS_REUSE_MAX_S + 0.1
    assert await cluster_up() == b"0.0"
