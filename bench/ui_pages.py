"""What the web page (`/ui/`) costs at fleet scale (figures, not a test): the admin's fleet page,
one boundary's page, one policy's page and that policy's rollout page (a three-wave rollout
over every cluster, `bench/rollout_gates.py`'s), rendered by the daemon's handlers
(`convergerd.api.ui.UiPages`) over a `StatusState` fed one in-sync round of CLUSTERS x
POLICIES (`bench/serving.py`'s state) and a stand-in database that answers at once (the
boundary covers every cluster and holds every policy: the worst case of one tenant); and the
boundary's JSON view (`GET /v1/boundaries/{b}`, its first page of
`CONVERGERD_STATUS_MAX_CLUSTERS` clusters, then 100 clusters further on) from views of its
own. Printed: wall milliseconds of each answer's first render and the median of the
`--renders` after it (the first fleet render includes the `/status` build the next ones
reuse; the first boundary render, JSON or page, the boundary's view the next ones reuse while
fresh), the CPU milliseconds of the first (this process's: less swayed by other work on a
shared machine), and its size.

    .venv/bin/python bench/ui_pages.py                         # 10,000 x 100
    .venv/bin/python bench/ui_pages.py --clusters 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rollout_gates import NoSaves, staged_rollouts
from bench.serving import NoDatabase, fed
from convergerd.api.auth import Guard, TokenBook
from convergerd.api.boundaries import BoundaryViews
from convergerd.api.rollouts import RolloutHandlers
from convergerd.api.server import Views
from convergerd.api.ui import COOKIE, UiPages
from convergerd.config import load_settings
from convergerd.core.model import ClusterId, PolicyId, PolicyRow
from convergerd.core.report import utc_now
from convergerd.core.rollout import Rollout, Staged
from convergerd.core.rows import BoundaryPolicy, BoundaryRows, PolicyStatusRows
from convergerd.delivery.fanout import Saver
from convergerd.status.state import StatusState
from convergerd.supervise import HealthCheck

ADMIN = "bench-admin-token"


class Rows(NoDatabase):
    """The database's answers for a boundary covering every cluster with every policy."""

    def __init__(self, clusters: list[ClusterId], policies: int) -> None:
        self.clusters = tuple(sorted(clusters))
        self.rows = [PolicyRow(f"p{j:03d}", "team-a", {"type": "ForbidLatestTag"}, True, 1)
                     for j in range(policies)]
        # One rollout (p000's), at its last wave: every cluster in one of its three waves.
        self.staged = staged_rollouts(list(clusters), policies, 1, 2, utc_now())

    async def staged_rollout(self, policy_id: str, /, *,
                             boundary: str | None = None) -> Staged | None:
        return self.staged.get(PolicyId(policy_id))

    async def rollout_of(self, policy_id: str, /, *,
                         boundary: str | None = None) -> Rollout | None:
        found = self.staged.get(PolicyId(policy_id))
        return found.rollout if found is not None else None

    async def rollout_events(self, rollout_id: int, limit: int, /) -> list[Any]:
        return []

    async def live_rollouts(self) -> list[Rollout]:
        return [s.rollout for s in self.staged.values()]

    async def boundary_rollouts(self, boundary: str, /) -> list[Rollout] | None:
        return [s.rollout for s in self.staged.values()]

    async def transition_rollout(self, before: Rollout, after: Rollout, *, by: str, what: str,
                                 detail: str | None = None,
                                 remaining_s: Callable[[], float]) -> Rollout | None:
        raise AssertionError("no transition here")

    async def policy_status(self, policy_id: str, /) -> PolicyStatusRows | None:
        row = next((r for r in self.rows if r.id == policy_id), None)
        return None if row is None else PolicyStatusRows(row, None, frozenset(self.clusters), ())

    async def boundary_status(self, boundary: str, most: int) -> BoundaryRows | None:
        return BoundaryRows(self.clusters,
                            tuple(BoundaryPolicy(r, None, None) for r in self.rows[:most]),
                            len(self.rows))


def pages_of(state: StatusState, views: Views, rows: Rows) -> UiPages:
    guard = Guard(admin_token=ADMIN, book=TokenBook(None), fleet_open=True, reads_per_s=1e6)
    # (The rollout commands are not asked here: no saves.)
    waves = RolloutHandlers(views, rows, cast(Saver, NoSaves()), body_timeout_s=5)
    return UiPages(guard, views, BoundaryViews(views, rows), waves, body_timeout_s=5)


async def render(handler: Any, path: str, match: dict[str, str], renders: int
                 ) -> dict[str, Any]:
    spent, cpu, size = [], [], 0
    for _ in range(renders):
        request = make_mocked_request(
            "GET", path, headers={"Cookie": f"{COOKIE}={urllib.parse.quote(ADMIN)}"},
            match_info=match)
        started, started_cpu = time.perf_counter(), time.process_time()
        response: web.Response = await handler(request)
        spent.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
        assert response.status == 200, (path, response.status, response.text)
        assert isinstance(response.body, bytes)
        size = len(response.body)
    return {"ms_first": round(spent[0]), "ms_median_after": round(statistics.median(spent[1:])),
            "cpu_ms_first": round(cpu[0]), "kb": round(size / 1000)}


async def main_async(args: argparse.Namespace) -> None:
    state, metrics = fed(args.clusters, args.policies)
    settings = load_settings({
        "CONVERGERD_DATABASE_URL": "postgresql://bench@127.0.0.1:1/none",
        "CONVERGERD_LEADER_ELECTION": "false", "CONVERGERD_IDENTITY": "bench",
        "CONVERGERD_STATUS_READS_PER_SECOND": "1000000", "CONVERGERD_API_TOKEN": ADMIN,
    })
    rows = Rows(list(state.clusters), args.policies)
    views = Views(metrics=metrics, state=state, store=rows, settings=settings,
                  health=HealthCheck())
    pages = pages_of(state, views, rows)
    json_views = BoundaryViews(views, rows)  # its own: its first answer builds the view
    print(json.dumps({
        "clusters": args.clusters, "policies": args.policies,
        "boundary_json": await render(json_views.boundary, "/v1/boundaries/team-a",
                                      {"boundary": "team-a"}, args.renders),
        "boundary_json_page_3": await render(
            json_views.boundary, "/v1/boundaries/team-a?limit=100&after=" + rows.clusters[199],
            {"boundary": "team-a"}, args.renders),
        "fleet": await render(pages.home, "/ui/", {}, args.renders),
        "fleet_page_3": await render(pages.home, "/ui/?page=3&policies=2", {}, args.renders),
        "boundary": await render(pages.boundary, "/ui/boundaries/team-a",
                                 {"boundary": "team-a"}, args.renders),
        "policy": await render(pages.policy, "/ui/policies/p007", {"id": "p007"},
                               args.renders),
        "rollout": await render(pages.rollout, "/ui/policies/p000/rollout", {"id": "p000"},
                                args.renders),
    }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--renders", type=int, default=5)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
