"""Memory per cluster stays within its budget: `bench/memory.py` at 500 clusters (the daemon's
wiring against `convergerd sim`, in a fresh process so that nothing else is counted) after a
create and an in-sync round. And memory returns after a fault clears: rounds against clusters
answering over the size cap, in this process (differences of RSS, not levels). Not timing
tests: RSS, not seconds, is asserted."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from convergerd.eventloop import tune_gc
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.integration.rounds_helpers import DESIRED, FLEET_DOC, Rounds, import_doc, settings_for

MEMORY = Path(__file__).resolve().parents[2] / "bench" / "memory.py"
CLUSTERS = 500
# Measured 0.28 MB per cluster 5 s after the round (2026-12-02, on `convergerd.eventloop`: the
# warm connection of each cluster with its 32 KiB TLS buffer, plus the high-water mark of the
# round's overflow connections, which the allocator keeps). On asyncio's own loop (256 KiB
# TLS buffers) the same run measures 0.94 MB: the budget fails that, and leaves ~60% for noise.
BUDGET_MB_PER_CLUSTER = 0.45


@pytest.mark.timeout(300)
def test_rss_per_cluster_after_an_in_sync_round_is_within_budget() -> None:
    done = subprocess.run(
        [sys.executable, str(MEMORY), "--clusters", str(CLUSTERS), "--policies", "10",
         "--probe-passes", "0", "--settle", "5",
         "--budget-mb-per-cluster", str(BUDGET_MB_PER_CLUSTER)],
        capture_output=True, text=True, timeout=280, check=False,
    )
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    in_sync = [r for r in records if r["bench"] == "in-sync"]
    assert len(in_sync) == 1, done.stdout + done.stderr[-4000:]
    per_cluster = in_sync[0]["settled_mb_per_cluster"]
    assert done.returncode == 0, (
        f"{per_cluster} MB per cluster after the in-sync round at {CLUSTERS} clusters, "
        f"budget {BUDGET_MB_PER_CLUSTER} MB\n{done.stderr[-4000:]}"
    )
    assert 0 < per_cluster <= BUDGET_MB_PER_CLUSTER


# --- memory returns after a fault clears ---------------------------------------------------------

MiB = 2**20
CAP_BYTES = 4 * MiB
FAULTY_ROUNDS = 10
# Before the fix each refused body stayed alive (a reference cycle through the exception's
# traceback): 10 rounds x 3 clusters x 4 MiB, measured +150 MB (2026-12-03). After it, what is
# left is the allocator's high-water mark of the bodies read at once (each cluster's chunks,
# and the in-process simulator's writes), which glibc keeps: +5 to +18 MB after 10 rounds,
# flat at +24 MB from 40 to 150 rounds. The margin sits between, at a quarter of the leak.
MARGIN_MB = 40


def rss_mb() -> float:
    """This process's current resident set (not the peak)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture
def daemon_gc() -> Iterator[None]:
    """The collector as the daemon runs it (`eventloop.tune_gc`: young collections every 50,000
    allocations, no collection forced after a round), restored afterwards."""
    before = gc.get_threshold()
    gc.collect()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*before)


async def test_memory_returns_after_a_cluster_stops_answering_too_much(
    fleet: Fleet, database_url: str, store: Store, daemon_gc: None
) -> None:
    """Every cluster answers over `CONVERGERD_MAX_RESPONSE_BYTES` for 10 rounds, then is healthy
    again: RSS after the next round is back within `MARGIN_MB` of what it was before. A refused
    body must be freed when its request ends, by reference counting, not wait for a
    collection of the whole heap."""
    await import_doc(database_url, FLEET_DOC)
    rounds = Rounds(fleet, store, settings_for(
        fleet.kubeconfig_path, database_url,
        CONVERGERD_MAX_RESPONSE_BYTES=str(CAP_BYTES), CONVERGERD_REQUEST_TIMEOUT_SECONDS="5"))
    clusters = sorted(DESIRED)
    try:
        assert (await rounds.run()).counts()["converged"] == len(clusters)
        base = rss_mb()
        for cluster in clusters:
            fleet.set_faults(cluster, Faults.from_mapping(
                {"hostile": {"mode": "oversized", "bytes": 2 * CAP_BYTES}}))
        for _ in range(FAULTY_ROUNDS):
            report = await rounds.run()
            assert {c.reason for c in report.clusters} == {"bad_response"}
        faulty = rss_mb()
        for cluster in clusters:
            fleet.set_faults(cluster, Faults())
        assert (await rounds.run()).counts()["converged"] == len(clusters)
        after = rss_mb()
    finally:
        await rounds.close()
    print(f"RSS {base:.1f} MB, after {FAULTY_ROUNDS} rounds of oversized answers "  # noqa: T201
          f"{faulty:.1f} MB, after the fault cleared {after:.1f} MB")
    assert after - base <= MARGIN_MB, (
        f"RSS {after - base:.1f} MB above its level before the fault, margin {MARGIN_MB} MB")
