"""Where a round's record spends its time in PostgreSQL (figures, not a test): each statement
of a record that changes nothing, timed from the client.

Three rounds of CLUSTERS x POLICIES as `bench/status_memory.py` builds them are recorded with
`Store.record_round` on a fresh database: the first (every row new), the next, 300 s later
(probes moved forward), then that one again: the record of an in-sync round whose readings
are all as recorded (what the daemon writes every interval: its rows are the clusters'
states; its readings are copied in, compared and found unchanged). Prints the third's
statements that took over 5 ms. `--explain PREFIX` prints the plan (EXPLAIN ANALYZE, in a
savepoint rolled back) of the third's statement starting with PREFIX.

    .venv/bin/python bench/record_statements.py --clusters 2000
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rounds import fresh_database
from bench.status_memory import round_of
from convergerd.store.store import Store

_execute = asyncpg.connection.Connection.execute
_copy = asyncpg.connection.Connection.copy_records_to_table


class Statements:
    """Every statement's wall time, by record; asyncpg's `execute` and `copy_records_to_table`
    wrapped for the bench's own process only."""

    def __init__(self, explain: str | None) -> None:
        self.record = 0
        self.times: list[tuple[int, float, str]] = []
        self.explain = explain

    def install(self) -> None:
        statements = self

        async def execute(conn: asyncpg.Connection, query: str, *args: Any,
                          **kw: Any) -> str:
            if (statements.explain and statements.record == 3
                    and query.lstrip().startswith(statements.explain)):
                await _execute(conn, "SAVEPOINT explained")
                plan = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + query, *args)
                print("\n".join(r[0] for r in plan), file=sys.stderr)
                await _execute(conn, "ROLLBACK TO SAVEPOINT explained")
            started = time.perf_counter()
            result: str = await _execute(conn, query, *args, **kw)
            statements.times.append((statements.record, time.perf_counter() - started,
                                     " ".join(query.split())[:60]))
            return result

        async def copy(conn: asyncpg.Connection, *args: Any, **kw: Any) -> str:
            started = time.perf_counter()
            result: str = await _copy(conn, *args, **kw)
            statements.times.append((statements.record, time.perf_counter() - started,
                                     "COPY (the readings, made and encoded as they go)"))
            return result

        asyncpg.connection.Connection.execute = execute  # type: ignore[method-assign,assignment]
        asyncpg.connection.Connection.copy_records_to_table = copy  # type: ignore[method-assign,assignment]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=2000)
    parser.add_argument("--policies", type=int, default=100)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--explain", metavar="PREFIX")
    args = parser.parse_args()
    statements = Statements(args.explain)
    statements.install()
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    later = at + dt.timedelta(seconds=300)
    async with fresh_database(args.database_url, "convergerd_bench_statements",
                              migrated=True) as (dsn, _):
        store = await Store.connect(dsn)
        try:
            for number, when in enumerate((at, later, later), start=1):
                report = round_of(args.clusters, args.policies, when)
                statements.record = number
                cpu, wall = time.process_time(), time.perf_counter()
                await store.record_round(report, identity="bench")
                print(f"record {number}: {time.perf_counter() - wall:.2f} s wall, "
                      f"{time.process_time() - cpu:.2f} s CPU of this process")
                del report
        finally:
            await store.close()
    print(f"the third record's statements over 5 ms ({args.clusters} x {args.policies}):")
    for number, seconds, what in statements.times:
        if number == 3 and seconds > 0.005:
            print(f"  {seconds:7.3f} s  {what}")


if __name__ == "__main__":
    asyncio.run(main())
