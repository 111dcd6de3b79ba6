"""Shared fixtures: a real PostgreSQL and the fleet simulator (see tests/fixtures/)."""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from convergerd.eventloop import EventLoop

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.fleet"]

# Property tests: no per-example deadline (two shared cores make timings noisy; performance
# lives in bench/), a fixed example budget so the suite's time is predictable.
settings.register_profile(
    "convergerd", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("convergerd")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test runs on the loop the processes run on (`convergerd.eventloop`)."""
    return {"convergerd": EventLoop}


@pytest.fixture(autouse=True)
def _close_stray_event_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """looptime's pytest hook asks the policy for an event loop even for plain (sync) tests;
    on Python 3.11 that creates a loop nobody closes, and the ResourceWarning (an error here)
    lands on the next async test. Close that loop after each sync test."""
    yield
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        policy = asyncio.get_event_loop_policy()
        loop = getattr(getattr(policy, "_local", None), "_loop", None)
    if isinstance(loop, asyncio.AbstractEventLoop) and not loop.is_running() \
            and not loop.is_closed():
        loop.close()
        policy.set_event_loop(None)
