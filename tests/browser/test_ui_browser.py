"""The web page in a real browser: Debian's Chromium (`/usr/bin/chromium`, installed by
`.ci/install-tools`), headless, driven by Playwright for Python (never `playwright install`).
The daemon's app serves the `tests/integration/ui_helpers` world (phases read back from the
simulator, an XSS payload stored in a cluster's Policy status) from a thread of its own; one
browser for the module.

A screenshot of each page is kept in `artifacts/browser/` at the repository's root
(gitignored; `CONVERGERD_ARTIFACTS` sets another directory)."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from playwright.sync_api import Browser, Page, sync_playwright

from convergerd.api.server import server_options
from convergerd.eventloop import EventLoop
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.fixtures.postgres import _admin, _create, run_async, with_database
from tests.integration.ui_helpers import ROLLOUT_REASON, XSS, ui_world

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).parents[2]
ARTIFACTS = Path(os.environ.get("CONVERGERD_ARTIFACTS", ROOT / "artifacts")) / "browser"


@dataclass
class Served:
    """The app served on loopback from its own thread and event loop."""

    tmp: Path
    database_url: str
    base: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    _ready: threading.Event = field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _error: list[BaseException] = field(default_factory=list)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ui server", daemon=True)
        self._thread.start()
        if not self._ready.wait(90) or self._error:
            raise RuntimeError("the page's server did not start") from (
                self._error[0] if self._error else None)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            with asyncio.Runner(loop_factory=EventLoop) as runner:
                runner.run(self._main())
        except BaseException as exc:
            self._error.append(exc)
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with Fleet(clusters=3, kubeconfig_path=self.tmp / "kubeconfig",
                         rng=random.Random(20240601), bookmark_interval_s=1.0) as fleet:
            store = await Store.connect(self.database_url)
            world = await ui_world(fleet, self.database_url, store)
            runner = web.AppRunner(world.app, **server_options())
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                self.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
                self.tokens = world.tokens
                self._ready.set()
                await self._stop.wait()
            finally:
                await runner.cleanup()
                await world.rounds.close()
                await store.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, postgres_server_dsn: str,
           migrated_template: str) -> Iterator[Served]:
    name = f"convergerd_b_{secrets.token_hex(6)}"
    run_async(_create(postgres_server_dsn, name, migrated_template))
    server = Served(tmp_path_factory.mktemp("ui"), with_database(postgres_server_dsn, name))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        run_async(_admin(postgres_server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: .ci/install-tools installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing: run .ci/install-tools (Debian's chromium)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, served: Served, token: str) -> None:
    page.goto(f"{served.base}/ui/")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def test_a_tenant_signs_in_sees_its_boundary_opens_a_policy_and_nothing_else(
    served: Served, browser: Browser,
) -> None:
    context = browser.new_context()
    page = context.new_page()
    visited: list[str] = []
    page.on("request", lambda request: visited.append(request.url))
    token = served.tokens["team-a"]

    page.goto(f"{served.base}/ui/")
    shot(page, "sign-in")
    sign_in(page, served, token)
    assert page.url == f"{served.base}/ui/boundaries/team-a"
    shot(page, "boundary-team-a")
    grid = page.locator("table.grid")
    columns = grid.locator("thead th").all_inner_texts()
    assert columns == ["Cluster", "Reached", "Lag", "p-latest", "p-plans", "p-regs"]
    assert grid.locator("tbody th").all_inner_texts() == ["c0001", "c0002", "c0003"]
    text = page.locator("main").inner_text()
    assert "p-labels" not in text
    assert "team-b" not in text
    assert "Data read at" in page.locator("footer").inner_text()
    # The cookie keeps the token where no script can read it.
    (cookie,) = context.cookies()
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/ui/")

    page.get_by_role("link", name="p-regs").first.click()
    page.wait_for_load_state()
    assert page.url == f"{served.base}/ui/policies/p-regs"
    shot(page, "policy-p-regs")
    per_cluster = page.locator("table.clusters")
    assert per_cluster.locator("tbody th").all_inner_texts() == ["c0002", "c0003", "c0001"]
    phases = per_cluster.locator("tbody tr td:nth-child(3) .ph").all_inner_texts()
    assert phases == ["Error", "Unsupported", "Enforcing"]

    # Another boundary's policy typed into the address: 404, as one that does not exist.
    response = page.goto(f"{served.base}/ui/policies/p-labels")
    assert response is not None
    assert response.status == 404
    shot(page, "policy-of-another-boundary")
    assert "There is no policy 'p-labels' that you can see." in page.inner_text("main")
    response = page.goto(f"{served.base}/ui/boundaries/team-b")
    assert response is not None
    assert response.status == 404

    assert not [u for u in visited if token in u]
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_load_state()
    assert page.get_by_label("Token").is_visible()
    assert context.cookies() == []
    context.close()


def test_a_payload_stored_in_a_cluster_shows_as_text_and_runs_nothing(
    served: Served, browser: Browser,
) -> None:
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, served, served.tokens["team-a"])
    # An Error's Ready message, an audit sample; a rollout's gate reason (the boundary's list
    # and the rollout's page) and event detail. (Policy ids and wave names are checked where
    # they are read: a payload cannot be one.)
    for path in ("policies/p-regs", "policies/p-latest", "boundaries/team-a",
                 "policies/p-regs/rollout"):
        page.goto(f"{served.base}/ui/{path}")
        shot(page, "payload-" + path.replace("/", "-"))
        assert page.evaluate("() => window.__xss") is None
        assert page.locator("main script, main img, main b:text('bold')").count() == 0
        assert page.get_by_text(XSS).first.is_visible(), path
    context.close()


def test_the_admin_sees_the_fleet(served: Served, browser: Browser) -> None:
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, served, served.tokens["admin"])
    assert page.url == f"{served.base}/ui/"
    shot(page, "fleet")
    columns = page.locator("table.grid thead th").all_inner_texts()
    assert "p-labels" in columns
    assert "p-latest" in columns
    context.close()


def rollout_rows(page: Page) -> list[list[str]]:
    """The live rollouts table's rows, cell by cell."""
    rows = page.locator("table.rollouts tbody tr")
    return [rows.nth(i).locator("th, td").all_inner_texts() for i in range(rows.count())]


def check_rollout_page(page: Page) -> None:
    """p-regs' rollout: its waves (how chosen, bake, approval, where each is, which clusters
    hold which revision) and the gate that holds it."""
    assert page.locator("h1").inner_text() == "Rollout of policy p-regs"
    waves = page.locator("table.waves tbody tr")
    assert waves.locator("th").all_inner_texts() == ["1 canary", "2 rest"]
    canary = waves.nth(0).locator("td").all_inner_texts()
    rest = waves.nth(1).locator("td").all_inner_texts()
    assert canary[:5] == ["labels ring=canary", "60 s", "-", "done", "1"]
    assert canary[5] == "revision 2 (new): 1 (c0001)"
    assert rest[:5] == ["by share: 100% of the clusters no selector chose, by the end of "
                        "this wave", "60 s", "needed", "current: waiting approval", "2"]
    assert rest[5] == "revision 1: 2 (c0002, c0003)"
    held_by = page.locator("table tr", has=page.locator("th", has_text="Held by"))
    assert "the wave waits for an approval" in held_by.inner_text()
    assert ROLLOUT_REASON in held_by.inner_text()


def test_the_admin_sees_a_rollout_its_waves_and_the_gate_that_holds_it(
    served: Served, browser: Browser,
) -> None:
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, served, served.tokens["admin"])
    (row,) = rollout_rows(page)
    assert row[:5] == ["p-regs", "1 → 2", "waiting approval", "2 of 2: rest", "1 new, 2 old"]
    assert row[5].startswith("approval: the wave waits for an approval")
    page.locator("table.rollouts").get_by_role("link", name="p-regs").click()
    page.wait_for_load_state()
    assert page.url == f"{served.base}/ui/policies/p-regs/rollout"
    shot(page, "rollout-p-regs-admin")
    check_rollout_page(page)
    assert page.evaluate("() => window.__xss") is None
    context.close()


def test_the_tenant_of_the_policy_sees_its_rollout_and_another_tenant_does_not(
    served: Served, browser: Browser,
) -> None:
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, served, served.tokens["team-a"])
    assert page.url == f"{served.base}/ui/boundaries/team-a"
    (row,) = rollout_rows(page)
    assert row[:5] == ["p-regs", "1 → 2", "waiting approval", "2 of 2: rest", "1 new, 2 old"]
    page.locator("table.rollouts").get_by_role("link", name="p-regs").click()
    page.wait_for_load_state()
    assert page.url == f"{served.base}/ui/policies/p-regs/rollout"
    shot(page, "rollout-p-regs-team-a")
    check_rollout_page(page)
    context.close()

    context = browser.new_context()
    page = context.new_page()
    sign_in(page, served, served.tokens["team-b"])
    assert page.url == f"{served.base}/ui/boundaries/team-b"
    assert rollout_rows(page) == [["none"]]
    assert "p-regs" not in page.locator("main").inner_text()
    response = page.goto(f"{served.base}/ui/policies/p-regs/rollout")
    assert response is not None
    assert response.status == 404
    shot(page, "rollout-p-regs-team-b")
    assert ("There is no rollout of policy 'p-regs' that you can see."
            in page.inner_text("main"))
    context.close()
