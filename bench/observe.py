"""What observing a round costs the event loop (figures, not a test): CPU per delivery, and
the longest time the loop is held at a stretch.

Builds in-sync rounds of CLUSTERS x POLICIES as `status_memory.py` does (each cluster's list
answer decoded from JSON, every policy read back with its phase, Ready and Verified, each
probed at its own time), observes one to warm the state, then the next one twice over:

- at once (`Metrics.observe_round`, `StatusState.observe_round`): CPU per delivery;
- as the round loop does (`rounds.observe_round`, in slices), with another task that runs
  whenever the loop lets it: CPU per delivery, and the longest gap between its turns;
- then what the round loop does before recording (the log line's `counts()`, `summary()`).

CPU seconds of this process (the machine's load skews less than wall time); the gaps are wall
time. Compare runs made under the same load.

    .venv/bin/python bench/observe.py --clusters 2000 --policies 100
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import sys
import time
from pathlib import Path

# Run as a script, bench/ (not the repository) is on sys.path: reuse bench/status_memory.py's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.status_memory import round_of
from convergerd.core.report import RoundReport
from convergerd.delivery.rounds import observe_round
from convergerd.eventloop import tune_gc
from convergerd.status.metrics import Metrics
from convergerd.status.state import StatusState


async def sliced(report: RoundReport, metrics: Metrics, state: StatusState) -> tuple[float, float]:
    """(CPU seconds of observing `report` in slices, the longest wall time another task
    waited for its turn meanwhile)."""
    done = False
    longest = 0.0

    async def other() -> None:
        nonlocal longest
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest = max(longest, now - last)
            last = now

    ticker = asyncio.create_task(other())
    await asyncio.sleep(0)
    cpu = time.process_time()
    await observe_round(report, metrics=metrics, state=state)
    cpu = time.process_time() - cpu
    done = True
    await ticker
    return cpu, longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--policies", type=int, default=100)
    args = parser.parse_args()
    tune_gc()  # as the daemon runs
    deliveries = args.clusters * args.policies
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    state = StatusState(identity="bench", interval_s=300.0, clock=lambda: at)
    state.set_clusters(f"c{i:05d}" for i in range(args.clusters))
    metrics = Metrics(state=state, process_collectors=False)
    warm = round_of(args.clusters, args.policies, at)
    metrics.observe_round(warm)
    state.observe_round(warm)
    del warm
    report = round_of(args.clusters, args.policies, at + dt.timedelta(seconds=300))
    gc.collect()

    cpu = time.process_time()
    metrics.observe_round(report)
    state.observe_round(report)
    at_once_s = time.process_time() - cpu
    sliced_s, longest_s = asyncio.run(sliced(report, metrics, state))
    cpu = time.process_time()
    report.counts()
    counts_s = time.process_time() - cpu
    cpu = time.process_time()
    report.summary()
    summary_s = time.process_time() - cpu
    per = 1e6 / deliveries
    print(json.dumps({
        "clusters": args.clusters, "policies": args.policies,
        "at_once_us_per_delivery": round(at_once_s * per, 2),
        "at_once_s": round(at_once_s, 3),
        "sliced_us_per_delivery": round(sliced_s * per, 2),
        "longest_loop_block_ms": round(longest_s * 1e3, 1),
        "counts_ms": round(counts_s * 1e3, 1),
        "summary_ms": round(summary_s * 1e3, 1),
    }))


if __name__ == "__main__":
    main()
