"""A hostile API server in the operator's own cluster, for good: Hypothesis draws what `/metrics`
and the `Warning` headers of dry-run answers carry from a grammar of the attacks
(`operator_world.GRAMMAR`: tens of MB of other series, our lines repeated, a 10 MB line,
values that are not counts, 100,000 made-up policies, a trickled body, an HTML page, a start
time or counters that move at every read, label values with escapes and controls; hundreds of
Warning headers, huge ones, malformed ones, with controls or bytes that are not UTF-8) while a
real `convergerd operator` runs, and after every case checks (`operator_world.World`):

- it keeps leading and reconciling: both Policies, saved at a new revision in the case, are
  Enforcing at it with a Verified decided by a probe of the case (Denied and Warned when the
  answers can be read at all), and their admission counts are read again once the fault is
  cleared;
- its RSS peak stays within `RSS_BUDGET_MB`, its /healthz answers within `LOOP_BUDGET_S`;
- `status.admission` holds counts only (integers from 0 to 2^53), none a tenant did not make
  (no tenant sends a request here), and is left as it was by answers that cannot be used, or,
  for a lie no reader can tell from the truth, marked (`resets`, `note`);
- the Verified messages and the operator's log are bounded and clean, and the log is a few
  lines a case, not one per bad line.

Bounded for the suite: 8 cases of ~3-4 s each (~35 s with the operator's start), the same ones
every run (`derandomize`), no shrinking (the failing case is printed whole); and the answers
each fix made here was for, in a test of their own, so that they are tried whatever the draw
(~20 s).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.e2e.harness import say
from tests.e2e.hostile_world import Case
from tests.e2e.operator_world import GRAMMAR, World, case_of, open_world

pytestmark = pytest.mark.e2e


def cases() -> st.SearchStrategy[Case]:
    """A mode, then one value for each of its parameters (those its shape reads kept)."""
    return st.sampled_from(sorted(GRAMMAR)).flatmap(
        lambda mode: st.fixed_dictionaries(
            {k: st.sampled_from(v) for k, v in GRAMMAR[mode].items()}
        ).map(lambda params: case_of(mode, params)))


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with open_world(tmp_path) as w:
        try:
            yield w
        finally:
            say(f"----- the operator's log (last lines) -----\n{w.log_tail(40)}")


@pytest.mark.timeout(180)
@settings(max_examples=8, deadline=None, database=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=cases())
async def test_a_hostile_api_server_harms_no_operator_figure(world: World, case: Case) -> None:
    outcome = await world.run(case)
    say(outcome.line())
    assert not outcome.violations, f"{case}:\n" + "\n".join(outcome.violations)


# The answers each fix of this grammar was for, tried whatever the draw (~20 s).
ALWAYS = (
    ("hostileMetrics", {"shape": "repeated", "count": 1_000}),  # a series summed 1,000 times
    ("hostileMetrics", {"shape": "manyPolicies", "count": 20_000}),  # ours pushed out
    ("hostileMetrics", {"shape": "backwards"}),  # figures past 2^53
    ("hostileMetrics", {"shape": "notText"}),  # an HTML page read as zero counts
    ("hostileWarnings", {"shape": "huge", "count": 20, "bytes": 20_000}),  # a probe's count
)


@pytest.mark.timeout(120)
async def test_the_answers_each_fix_was_for_harm_nothing(world: World) -> None:
    broke = []
    for mode, params in ALWAYS:
        outcome = await world.run(case_of(mode, params))
        say(outcome.line())
        broke += [f"{outcome.case}: {v}" for v in outcome.violations]
    assert not broke, "\n".join(broke)
