"""Fixtures shared by the integration tests (their helpers: `rounds_helpers.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.integration.rounds_helpers import FLEET_DOC, Rounds, import_doc, settings_for


@pytest.fixture
async def rounds(fleet: Fleet, database_url: str, store: Store) -> AsyncIterator[Rounds]:
    """`FLEET_DOC` in the database, and rounds run the daemon's way on the fleet's kubeconfig."""
    await import_doc(database_url, FLEET_DOC)
    harness = Rounds(fleet, store, settings_for(fleet.kubeconfig_path, database_url))
    try:
        yield harness
    finally:
        await harness.close()
