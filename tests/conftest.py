"""Shared fixtures: a real PostgreSQL and the fleet simulator (see tests/fixtures/)."""

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.fleet"]
