"""The `world` fixture: simulator + fresh database + imported tenants; see harness.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import MEMBERS, TENANTS, World
from tests.fixtures.fleet import start_sim_process, stop_sim_process


@pytest.fixture
def world(tmp_path: Path, database_url: str) -> Iterator[World]:
    sim = start_sim_process(tmp_path, clusters=len(MEMBERS))
    w = World(tmp_path, sim, database_url)
    try:
        migrated = w.cli("migrate")
        assert migrated.returncode == 0, migrated.stderr
        tenants = tmp_path / "tenants.yaml"
        tenants.write_text(TENANTS)
        imported = w.cli("import", str(tenants))
        assert imported.returncode == 0, imported.stdout + imported.stderr
        yield w
    finally:
        w.kill_all()
        w.dump_logs()
        w.close()
        stop_sim_process(sim)
