"""What recording a round costs the replica (figures, not a test): CPU per delivery, and the
longest the event loop was held while one was built and written to PostgreSQL.

Rounds of CLUSTERS x POLICIES as `bench/status_memory.py` builds them (each cluster's list
answer decoded, every policy read back Enforcing, Ready and Verified, probed at its own time),
recorded with `Store.record_round` on a fresh database:

- `first`: the first round: every row is new;
- `in-sync`: the next round, 300 s later: the same facts, probes moved forward (the round a
  replica records every interval; what changed: the clusters' states).

Per round: the process's CPU (the database's aside) and wall time of the whole record, CPU per
delivery, the longest step the loop ran (`longest_step_cpu_ms`: how long the record held the
loop at once) and how late a 1 ms timer beside it woke (`timer_late_ms`). `--profile FILE`
writes a cProfile of the in-sync record.

    .venv/bin/python bench/record.py --clusters 2000 --policies 100
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime as dt
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rounds import fresh_database
from bench.status_memory import round_of
from convergerd.core.report import RoundReport
from convergerd.store.store import Store


class LoopWatch:
    """The longest step the loop ran (one callback: a task's step between two awaits), timed
    around every callback (`asyncio.Handle._run`, as asyncio's debug mode does), in CPU of
    this thread (other processes' turns on a busy machine left out); and the latest a 1 ms
    timer woke its task (what a prober's or a request's timer waits behind the record)."""

    def __init__(self) -> None:
        self.step_cpu_s = self.late_s = 0.0
        self._task: asyncio.Task[None] | None = None
        self._run: Any = None

    async def _tick(self) -> None:
        while True:
            due = time.perf_counter() + 0.001
            await asyncio.sleep(0.001)
            self.late_s = max(self.late_s, time.perf_counter() - due)

    def __enter__(self) -> LoopWatch:
        self._run = run = asyncio.Handle._run
        watch = self

        def timed(handle: asyncio.Handle) -> None:
            cpu = time.thread_time()
            run(handle)
            watch.step_cpu_s = max(watch.step_cpu_s, time.thread_time() - cpu)

        asyncio.Handle._run = timed  # type: ignore[method-assign,assignment]
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        asyncio.Handle._run = self._run  # type: ignore[method-assign]


async def record(store: Store, report: RoundReport, deliveries: int, name: str,
                 profile: Path | None) -> dict[str, object]:
    profiler = cProfile.Profile() if profile else None
    await asyncio.sleep(0.01)  # the ticker's first tick
    with LoopWatch() as watch:
        await asyncio.sleep(0.01)
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        await store.record_round(report, identity="bench")
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if profiler and profile:
        profiler.dump_stats(profile)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return {"bench": name, "deliveries": deliveries, "cpu_s": round(cpu, 2),
            "wall_s": round(wall, 2), "cpu_us_per_delivery": round(cpu / deliveries * 1e6, 2),
            "longest_step_cpu_ms": round(watch.step_cpu_s * 1e3, 1),
            "timer_late_ms": round(watch.late_s * 1e3, 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--profile", type=Path, help="a cProfile file of the in-sync record")
    args = parser.parse_args()
    deliveries = args.clusters * args.policies
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    async with fresh_database(args.database_url, "convergerd_bench_record",
                              migrated=True) as (dsn, _):
        store = await Store.connect(dsn)
        try:
            first = round_of(args.clusters, args.policies, at)
            print(json.dumps({"clusters": args.clusters, "policies": args.policies,
                              **await record(store, first, deliveries, "first", None)}))
            del first
            second = round_of(args.clusters, args.policies, at + dt.timedelta(seconds=300))
            print(json.dumps({"clusters": args.clusters, "policies": args.policies,
                              **await record(store, second, deliveries, "in-sync",
                                             args.profile)}))
        finally:
            await store.close()


if __name__ == "__main__":
    from convergerd.eventloop import run

    run(main())
