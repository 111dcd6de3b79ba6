"""What recording a round costs the replica (figures, not a test): CPU per delivery, and the
longest the event loop was held while one was built and written to PostgreSQL.

Rounds of CLUSTERS x POLICIES as `bench/status_memory.py` builds them (each cluster's list
answer decoded, every policy read back Enforcing, Ready and Verified, probed at its own time),
recorded with `Store.record_round` on a fresh database:

- `first`: the first round: every row is new;
- `in-sync`: the next round, 300 s later: the same facts, probes moved forward (the round a
  replica records every interval; what changed: the clusters' states).

Per round: the process's CPU (the database's aside) and wall time of the whole record, CPU per
delivery, and the longest stretch the loop did not run a 1 ms ticker beside the record (the
longest block, within ~1 ms). `--profile FILE` writes a cProfile of the in-sync record.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rounds import fresh_database  # noqa: E402
from bench.status_memory import round_of  # noqa: E402
from convergerd.core.report import RoundReport  # noqa: E402
from convergerd.store.store import Store  # noqa: E402


class LoopWatch:
    """A ticker every 1 ms: the longest gap between its ticks is the longest block."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest_s = max(self.longest_s, now - last)
            last = now

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


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
            "longest_block_ms": round(watch.longest_s * 1e3, 1)}


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
