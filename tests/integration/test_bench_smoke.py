"""`bench/rounds.py --quick` runs end to end: exit 0, one JSON object per measurement line, then
the Markdown table. Figures are printed by the bench, never asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rounds.py"
EXPECTED = {"create", "in-sync", "down-10%", "hang-10%", "bare-aiohttp"}


@pytest.mark.timeout(600)
def test_quick_bench_runs_and_prints_json_lines() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True, text=True, timeout=540, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records, done.stdout
    for record in records:
        assert isinstance(record, dict)
        assert {"bench", "clusters", "policies", "wall_s"} <= record.keys()
    points = {(r["clusters"], r["policies"]) for r in records}
    assert points == {(10, 10), (100, 10)}
    for point in points:
        assert {r["bench"] for r in records if (r["clusters"], r["policies"]) == point} == EXPECTED
    in_sync = [r for r in records if r["bench"] == "in-sync"]
    assert all(r["patches"] == 0 and r["lists_per_cluster"] == 1 for r in in_sync)
    assert "| bench | clusters |" in done.stdout
