"""Hostile soak: figures, not a test. The hostile-cluster cases of
tests/e2e/test_hostile_grammar.py, run back to back for `--minutes`, with the daemon's RSS and
event-loop lag over time.

    .venv/bin/python bench/hostile_soak.py [--minutes 10] [--seed 1] [--modes a,b]
                                           [--sweep] [--database-url postgresql://...]

The world is the test's (`tests/e2e/hostile_world.py`): the simulator in this process with four
members, `c0004` hostile, `convergerd run` as a process of its own (leader election on the
simulator's home cluster, two shards), a fresh database on `--database-url`'s server (dropped
at the end), a plain-http server a redirect may point at. Each case is drawn from the grammar
at random (`--seed`; `--modes` restricts it, and may name `healthy`, no fault: the control;
`--sweep` runs every mode with every value of its parameters once, in order, and ignores
`--minutes`), and its invariants are checked as the test
checks them, but a broken one is printed, not fatal: the soak goes on.

Output, one line per case on stdout: seconds since start, the case, the daemon's RSS at the end
of the case and its peak over the case (VmHWM, reset before each), the event-loop lag it exports
(`convergerd_event_loop_lag_seconds`), what /status says of c0004, the invariants broken. At
the end: RSS and lag first vs last, and per mode the invariants it broke. After a case that
broke an invariant the daemon is restarted (unless `--keep`), so one case's leftovers (memory
that is not given back) are not blamed on the next.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

# Run as a script, bench/ (not the repository) is on sys.path: reuse the test's world.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.rounds import fresh_database, log
from tests.e2e.hostile_world import GRAMMAR, HEALTHY_CASE, Case, Outcome, draw, open_world

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def sweep(modes: list[str]) -> Iterator[Case]:
    """Every mode with every combination of its parameters' values."""
    for mode in modes:
        if mode == HEALTHY_CASE:
            yield Case(mode)
            continue
        names = sorted(GRAMMAR[mode])
        for values in itertools.product(*(GRAMMAR[mode][n] for n in names)):
            yield Case.of(mode, dict(zip(names, values, strict=True)))


def kind(violation: str) -> str:
    """The invariant a violation broke (its first word), for the summary."""
    return violation.split(":", 1)[0]


async def soak(args: argparse.Namespace) -> int:
    modes = args.modes.split(",") if args.modes else list(GRAMMAR)
    unknown = sorted(set(modes) - set(GRAMMAR) - {HEALTHY_CASE})
    if unknown:
        log("unknown mode(s): %s (known: %s)", ", ".join(unknown), ", ".join(GRAMMAR))
        return 2
    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    async with fresh_database(args.database_url, "hostile_soak", migrated=True) as (dsn, _):
        with tempfile.TemporaryDirectory(prefix="hostile-soak-") as tmp:
            async with open_world(Path(tmp), dsn) as world:
                log("daemon pid %d leading and converged after %.1f s", world.pid,
                    time.monotonic() - started)
                cases = sweep(modes) if args.sweep else iter(lambda: draw(rng, modes), None)
                for case in cases:
                    if not args.sweep and time.monotonic() - started > args.minutes * 60:
                        break
                    outcome = await world.run(case)
                    outcomes.append(outcome)
                    print(f"{time.monotonic() - started:7.1f} s  {outcome.line()}", flush=True)
                    if outcome.violations and not args.keep:
                        # What the case broke stays broken (RSS above all): a fresh daemon,
                        # so that the next case is judged on its own.
                        await world.restart_daemon()
    summarize(outcomes)
    return 0


def summarize(outcomes: list[Outcome]) -> None:
    if not outcomes:
        return
    first, last = outcomes[0], outcomes[-1]
    print(f"\n{len(outcomes)} cases; RSS {first.rss_mb:.0f} -> {last.rss_mb:.0f} MB, peak "
          f"{max(o.peak_mb for o in outcomes):.0f} MB; loop lag max "
          f"{max(o.loop_lag_s for o in outcomes) * 1000:.0f} ms")
    broken: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    runs: dict[str, int] = defaultdict(int)
    for o in outcomes:
        runs[o.case.mode] += 1
        for v in o.violations:
            broken[o.case.mode][kind(v)].append(f"{o.case}: {v.split(': ', 1)[-1]}")
    for mode in sorted(runs):
        found = broken[mode]
        print(f"  {mode}: {runs[mode]} cases, broke {', '.join(sorted(found)) or 'nothing'}")
        for name, examples in sorted(found.items()):
            print(f"    {name} x{len(examples)}, e.g. {examples[0][:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="", help="comma-separated grammar modes (all)")
    parser.add_argument("--sweep", action="store_true",
                        help="every mode x every parameter value once, then stop")
    parser.add_argument("--keep", action="store_true",
                        help="keep the daemon after a case that broke an invariant (default: "
                             "a fresh one)")
    parser.add_argument("--database-url", default=DEFAULT_SERVER)
    return asyncio.run(soak(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
