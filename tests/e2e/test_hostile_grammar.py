"""A hostile cluster, for good: Hypothesis draws what `c0004` answers from a grammar of the
attacks (`hostile_world.GRAMMAR`: amplified and deeply nested answers, endless `continue`,
more items than the `limit`, redirects to another cluster's path, to another origin and to
plain http, an apply answered with another object, lists of the wrong shape, a huge
`/version`, huge headers and values, garbage Leases in home) while a real `convergerd run`
serves four members, and after every case checks (`hostile_world.World.run`):

- the healthy members converge at the new revision within `CASE_S` of the case's start;
- the daemon keeps its Leases (leads both shards; holder and transitions unchanged);
- its RSS peak stays within `RSS_BUDGET_MB`;
- no request reaches the plain-http target, no token reaches another cluster's path;
- nothing is recorded or shown as delivered to `c0004` at a revision it does not hold;
- `c0004` converges again once the fault is cleared.

Bounded for the suite: 10 cases of ~3-4 s each (~45 s with the daemon's start), the same ones
every run (`derandomize`: the suite is reproducible; the soak draws at random), no shrinking (a
case costs seconds; the failing case is printed whole); and the garbage Leases, all three at
once, in a test of their own, so that they are tried whatever the draw (~20 s).
`bench/hostile_soak.py` runs the same cases for minutes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.e2e.harness import say
from tests.e2e.hostile_world import GRAMMAR, Case, MiB, World, open_world

pytestmark = pytest.mark.e2e


def cases() -> st.SearchStrategy[Case]:
    """A mode, then one value for each of its parameters."""
    return st.sampled_from(sorted(GRAMMAR)).flatmap(
        lambda mode: st.fixed_dictionaries(
            {k: st.sampled_from(v) for k, v in GRAMMAR[mode].items()}
        ).map(lambda params: Case.of(mode, params)))


@pytest.fixture
async def world(tmp_path: Path, database_url: str) -> AsyncIterator[World]:
    async with open_world(tmp_path, database_url) as w:
        try:
            yield w
        finally:
            say(f"----- the daemon's log (last lines) -----\n{w.log_tail(40)}")


# ~3 s a case when nothing breaks (a case that breaks something ends the test); the margin
# is for a loaded machine.
@pytest.mark.timeout(180)
@settings(max_examples=10, deadline=None, database=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
# Tried whatever the draw: the answer that once held the loop and the memory under the cap.
@example(case=Case.of("amplification", {"bytes": 15 * MiB, "shape": "bracketStrings"}))
async def test_a_hostile_cluster_harms_nothing_else(world: World, case: Case) -> None:
    outcome = await world.run(case)
    say(outcome.line())
    assert not outcome.violations, f"{case}:\n" + "\n".join(outcome.violations)


async def test_garbage_leases_in_home_harm_nothing(world: World) -> None:
    outcome = await world.run(Case.of("garbageLeases", {"leases": ("ghost", "big", "forever")}))
    say(outcome.line())
    assert not outcome.violations, "\n".join(outcome.violations)
