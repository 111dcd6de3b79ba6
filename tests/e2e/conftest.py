"""The `world` fixture: simulator + fresh database + imported tenants; see harness.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import MEMBERS, TENANTS, World, open_world


@pytest.fixture
def world(tmp_path: Path, database_url: str) -> Iterator[World]:
    with open_world(tmp_path, database_url, clusters=len(MEMBERS), tenants=TENANTS) as w:
        yield w
