"""Memory per cluster stays within its budget: `bench/memory.py` at 500 clusters (the daemon's
wiring against `convergerd sim`, in a fresh process so that nothing else is counted) after a
create and an in-sync round. Not a timing test: RSS, not seconds, is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
