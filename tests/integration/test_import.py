"""`convergerd import FILE` against a real database."""

from __future__ import annotations

import textwrap
from pathlib import Path

import asyncpg
import pytest

from convergerd.errors import SchemaNotMigrated
from convergerd.model import BoundaryId, ClusterId, PolicyRow
from convergerd.store.importer import ImportFileError, import_file
from convergerd.store.store import Store

EXAMPLE = """
clusters:   [{id: c0001}, {id: c0002}]
boundaries: [{id: team-a, clusters: [c0001, c0002]}]
policies:
  - {id: p-latest, boundary: team-a, enabled: true, rule: {type: ForbidLatestTag}}
  - id: p-regs
    boundary: team-a
    rule: {type: AllowedRegistries, registries: [registry.example.com]}
"""


def write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


async def test_first_import_creates_everything(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    summary = await import_file(database_url, write(tmp_path, EXAMPLE))
    assert str(summary) == (
        "clusters: 2 created, 0 updated, 0 unchanged\n"
        "boundaries: 1 created, 0 updated, 0 unchanged\n"
        "policies: 2 created, 0 updated, 0 unchanged"
    )
    fleet = await store.load_fleet()
    assert [c.id for c in fleet.clusters] == ["c0001", "c0002"]
    assert fleet.boundaries[BoundaryId("team-a")].clusters == {"c0001", "c0002"}
    assert {(p.id, p.revision, p.enabled) for p in fleet.policies} == {
        ("p-latest", 1, True),
        ("p-regs", 1, True),
    }
    assert fleet.invalid == []


async def test_reimporting_the_same_file_changes_nothing(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    path = write(tmp_path, EXAMPLE)
    await import_file(database_url, path)
    summary = await import_file(database_url, path)
    assert (summary.clusters.unchanged, summary.boundaries.unchanged,
            summary.policies.unchanged) == (2, 1, 2)
    assert summary.policies.updated == summary.policies.created == 0
    policy = await store.get_policy("p-regs")
    assert policy is not None
    assert policy.revision == 1


async def test_revision_increases_only_when_content_changes(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, EXAMPLE))
    changed = EXAMPLE.replace("enabled: true", "enabled: false").replace(
        "registry.example.com]", "registry.example.com, ghcr.io/acme]"
    )
    summary = await import_file(database_url, write(tmp_path, changed, "v2.yaml"))
    assert (summary.policies.updated, summary.policies.unchanged) == (2, 0)
    latest = await store.get_policy("p-latest")
    regs = await store.get_policy("p-regs")
    assert latest == PolicyRow("p-latest", "team-a", {"type": "ForbidLatestTag"}, False, 2)
    assert regs is not None
    assert regs.revision == 2
    assert regs.rule == {
        "type": "AllowedRegistries",
        "registries": ["registry.example.com", "ghcr.io/acme"],
    }


async def test_a_boundary_list_in_the_file_replaces_the_previous_one(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, EXAMPLE))
    narrowed = """
    clusters: [{id: c0003}]
    boundaries: [{id: team-a, clusters: [c0002, c0003]}]
    """
    summary = await import_file(database_url, write(tmp_path, narrowed, "v2.yaml"))
    assert (summary.boundaries.updated, summary.clusters.created) == (1, 1)
    assert await store.policy_scope("p-latest") == {ClusterId("c0002"), ClusterId("c0003")}
    # Moving clusters is not a policy change: revisions stay.
    policy = await store.get_policy("p-latest")
    assert policy is not None
    assert policy.revision == 1


async def test_references_to_the_database_are_accepted(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, EXAMPLE))
    later = """
    boundaries: [{id: team-b, clusters: [c0001]}]
    policies:
      - {id: p-labels, boundary: team-a, rule: {type: RequiredLabels, labels: [team]}}
    """
    await import_file(database_url, write(tmp_path, later, "later.yaml"))
    assert await store.policy_scope("p-labels") == {ClusterId("c0001"), ClusterId("c0002")}


async def test_a_bad_file_changes_nothing(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, EXAMPLE))
    bad = """
    clusters: [{id: c0009}]
    boundaries: [{id: team-a, clusters: [c0009]}]
    policies:
      - {id: p-latest, boundary: team-a, enabled: false, rule: {type: ForbidLatestTag}}
      - {id: p-new, boundary: team-z, rule: {type: ForbidLatestTag}}
    """
    path = write(tmp_path, bad, "bad.yaml")
    with pytest.raises(ImportFileError) as caught:
        await import_file(database_url, path)
    assert str(caught.value) == (
        f"{path}: rejected, nothing imported: "
        "policies[1] (id 'p-new'): boundary: unknown boundary 'team-z' "
        "(not in the file nor the database)"
    )
    fleet = await store.load_fleet()
    assert [c.id for c in fleet.clusters] == ["c0001", "c0002"]
    assert fleet.boundaries[BoundaryId("team-a")].clusters == {"c0001", "c0002"}
    assert {p.id: p.enabled for p in fleet.policies} == {"p-latest": True, "p-regs": True}


async def test_invalid_yaml_is_reported_with_the_file_name(
    database_url: str, tmp_path: Path
) -> None:
    path = write(tmp_path, "clusters: [{id: c1}\n")
    with pytest.raises(ImportFileError) as caught:
        await import_file(database_url, path)
    assert caught.value.problems == [
        "not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'"
    ]


async def test_import_refuses_an_unmigrated_database(
    empty_database_url: str, tmp_path: Path
) -> None:
    with pytest.raises(SchemaNotMigrated, match="run `convergerd migrate`"):
        await import_file(empty_database_url, write(tmp_path, EXAMPLE))


async def test_reimport_revives_a_policy_being_deleted(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    await import_file(database_url, write(tmp_path, EXAMPLE))
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("UPDATE policies SET deleted_at = now() WHERE id = 'p-latest'")
    finally:
        await conn.close()
    assert await store.get_policy("p-latest") is None
    summary = await import_file(database_url, write(tmp_path, EXAMPLE))
    assert summary.policies.updated == 1
    policy = await store.get_policy("p-latest")
    assert policy is not None
    assert policy.revision == 2
