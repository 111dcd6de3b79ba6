"""`bench/daemon.py` runs end to end at a tiny size: exit 0, one JSON object per measurement
line, then the Markdown tables; the daemon, simulators and database are gone afterwards. The
fleet is split over two simulator processes, so the merged kubeconfig and the fault routing
run. Figures are printed by the bench, never asserted here (a 1 s settle is too short for
exact row counts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.fixtures.postgres import run_async

BENCH = Path(__file__).resolve().parents[2] / "bench" / "daemon.py"


async def _bench_databases(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE 'convergerd\\_benchd\\_%'")
    finally:
        await conn.close()
    return [r["datname"] for r in rows]


@pytest.mark.timeout(120)
def test_daemon_bench_runs_every_phase(postgres_server_dsn: str) -> None:
    before = set(run_async(_bench_databases(postgres_server_dsn)))
    done = subprocess.run(
        [sys.executable, str(BENCH), "--points", "5x3@3", "--sim-processes", "2",
         "--in-sync-rounds", "1",
         "--status-clients", "2", "--hung-share", "0.2", "--down-probes", "1", "--saves", "2",
         "--save-pause", "0.1", "--settle", "1", "--database-url", postgres_server_dsn,
         "--env", "CONVERGERD_PROBE_PERIOD_SECONDS=1",
         "--env", "CONVERGERD_REQUEST_TIMEOUT_SECONDS=1"],
        capture_output=True, text=True, timeout=100, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    benches = [r["bench"] for r in records]
    assert benches[0] == "create"
    assert {"in-sync", "in-sync, 2 /status clients", "/status", "hung 20%", "down detection",
            "save"} <= set(benches)
    for r in records:
        if "wall_s" in r:
            assert {"daemon_cpu_s", "rss_mb", "rows_written", "wal_bytes"} <= r.keys()
    # 2 saves x 5 clusters; a round may deliver the new revision just before a save does.
    results = next(r for r in records if r["bench"] == "save")["results"]
    assert sum(results.values()) == 10
    assert set(results) <= {"updated", "unchanged", "superseded"}
    assert "| round | clusters | policies | wall s |" in done.stdout
    assert "| measurement | clusters | policies | P50 |" in done.stdout
    assert set(run_async(_bench_databases(postgres_server_dsn))) <= before


@pytest.mark.timeout(120)
def test_daemon_bench_runs_a_save_point(postgres_server_dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--save-points", "4", "--saves", "2", "--save-pause", "0.1",
         "--settle", "1", "--database-url", postgres_server_dsn],
        capture_output=True, text=True, timeout=100, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["bench"] for r in records] == ["create", "save"]  # no other phase
    save = records[1]
    assert (save["clusters"], save["policies"], save["samples"]) == (4, 1, 2)
    assert save["results"] == {"updated": 8}  # no round runs beside the saves
    assert {"p50_s", "p99_s", "daemon_cpu_s", "sim_cpu_s", "daemon_cpu_ms_per_write"} <= save.keys()
    assert "| save | 4 | 1 |" in done.stdout
