"""What the rollouts' gate job and their status cost (figures, not a test): one pass of the gate
job (`delivery.rollouts.RolloutGates.once`: every live rollout's current wave read from the
status state, `core.gates.decide`) over a state fed as a round feeds it, and the status sync's
count of each rollout's clusters per revision (`StatusState.absorb_rollouts`), at CLUSTERS x
POLICIES with ROLLOUTS rollouts in progress.

The state holds an in-sync round of CLUSTERS x POLICIES (as `status_memory.py` builds it:
every policy Enforcing and Verified on every cluster). ROLLOUTS of the policies each roll out
the revision the clusters report (so every look reads every field of every wave cluster, and
finds the wave baking: no transition is written), with the strategy canary (1% of the
clusters, labelled) / half / rest, their current waves spread over the three (`--wave` puts
them all on one: `half` is the worst case, half of the fleet each). The database is an
in-memory stand-in of the gate job's `GateStore` (what it reads is the rollouts, cached
placements: no query per pass once warm).

CPU seconds of this process; the share of a core is per `CONVERGERD_ROLLOUT_GATE_SECONDS`
(default 10) for the gate job, per status sync period (30 s) for the count.

    .venv/bin/python bench/rollout_gates.py --clusters 10000 --policies 100 --rollouts 20
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.status_memory import round_of
from convergerd.core.model import ClusterId, Policy, PolicyId, PolicyRow
from convergerd.core.render import deliverable_policy
from convergerd.core.rollout import (
    Placement,
    Rollout,
    Staged,
    State,
    assign,
    parse_strategy,
)
from convergerd.delivery.rollouts import RolloutGates
from convergerd.eventloop import tune_gc
from convergerd.leader.elector import NoElection
from convergerd.status.state import StatusState

STRATEGY = {"id": "careful", "bakeSeconds": 600,
            "waves": [{"name": "canary", "selector": {"ring": "canary"}},
                      {"name": "half", "fraction": 0.5}, {"name": "rest", "fraction": 1.0}]}
GATE_PERIOD_S = 10.0
SYNC_PERIOD_S = 30.0


class Rollouts:
    """The gate job's database: the rollouts and their placements, in memory."""

    def __init__(self, staged: dict[PolicyId, Staged]) -> None:
        self.staged = staged
        self.reads = 0

    async def live_rollouts(self) -> list[Rollout]:
        return [s.rollout for s in self.staged.values()]

    async def staged_rollout(self, policy_id: str, /) -> Staged | None:
        self.reads += 1
        return self.staged.get(PolicyId(policy_id))

    async def transition_rollout(self, before: Rollout, after: Rollout, *, by: str, what: str,
                                 detail: str | None = None,
                                 remaining_s: Callable[[], float]) -> Rollout | None:
        raise AssertionError(f"no transition expected here: {what} {detail}")


class NoSaves:
    async def deliver_due(self, policy_id: str, clusters: object = None, *,
                          trigger: str = "") -> None:
        raise AssertionError("no delivery expected here")


def staged_rollouts(clusters: list[ClusterId], policies: int, rollouts: int, wave: int | None,
                    at: dt.datetime) -> dict[PolicyId, Staged]:
    strategy = parse_strategy(STRATEGY)
    canary = {c for i, c in enumerate(clusters) if i % 100 == 0}  # 1% labelled
    waves = assign(strategy, {c: {"ring": "canary"} if c in canary else {} for c in clusters})
    shared: dict[int, Placement] = {}
    out: dict[PolicyId, Staged] = {}
    for k in range(rollouts):
        j = k * policies // rollouts
        pid = PolicyId(f"p{j:03d}")
        revision = 1 + j % 7  # what `round_of`'s clusters report: every cluster reported
        placements = {c: shared.setdefault(w, Placement(w, revision - 1))
                      for c, w in waves.items()}
        policy = deliverable_policy(PolicyRow(pid, "everyone", {"type": "ForbidLatestTag"},
                                              True, revision), boundary_exists=True)
        assert isinstance(policy, Policy)
        rollout = Rollout(k + 1, pid, revision, revision - 1, strategy, State.PROGRESSING,
                          wave=wave if wave is not None else k % 3, wave_ready_at=at,
                          reason="bake: every cluster reported", updated_at=at)
        out[pid] = Staged(rollout, placements, {revision: policy})
    return out


async def passes(gates: RolloutGates, n: int) -> list[float]:
    remaining = NoElection(identity="bench").fence().remaining_s
    await gates.once(remaining)  # warm: reads every rollout's placements once
    cpu = []
    for _ in range(n):
        started = time.process_time()
        looks = await gates.once(remaining)
        cpu.append(time.process_time() - started)
        assert all(look.moved_to is None for look in looks)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=10_000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--wave", choices=["canary", "half", "rest"], default=None,
                        help="every rollout at this wave (default: spread over the three)")
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    tune_gc()
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    state = StatusState(identity="bench", interval_s=300.0, clock=lambda: at)
    ids = [ClusterId(f"c{i:05d}") for i in range(args.clusters)]
    state.set_clusters(ids)
    report = round_of(args.clusters, args.policies, at)
    state.observe_round(report)
    del report
    gc.collect()
    wave = None if args.wave is None else ["canary", "half", "rest"].index(args.wave)
    staged = staged_rollouts(ids, args.policies, args.rollouts, wave, at)
    store = Rollouts(staged)
    gates = RolloutGates(store=store, state=state, saver=NoSaves(),  # type: ignore[arg-type]
                         leader=NoElection(identity="bench"), period_s=GATE_PERIOD_S,
                         identity="bench", clock=lambda: at + dt.timedelta(seconds=1))
    cpu = asyncio.run(passes(gates, args.passes))
    wave_clusters = sum(sum(1 for p in s.placements.values() if p.wave == s.rollout.wave)
                        for s in staged.values())
    started = time.process_time()
    state.absorb_rollouts([dataclasses.replace(s.rollout) for s in staged.values()])
    absorb_s = time.process_time() - started
    best = min(cpu)
    print(json.dumps({
        "clusters": args.clusters, "policies": args.policies, "rollouts": args.rollouts,
        "wave": args.wave or "spread", "wave_clusters_judged": wave_clusters,
        "gate_pass_cpu_ms": round(best * 1e3, 1),
        "gate_pass_cpu_ms_all": [round(c * 1e3, 1) for c in cpu],
        "us_per_wave_cluster": round(best * 1e6 / max(1, wave_clusters), 2),
        "gate_share_of_a_core_at_10s": round(best / GATE_PERIOD_S, 4),
        "status_count_cpu_ms": round(absorb_s * 1e3, 1),
        "status_count_share_at_30s": round(absorb_s / SYNC_PERIOD_S, 4),
        "placement_reads_after_warm": store.reads - len(staged),
    }))


if __name__ == "__main__":
    main()
