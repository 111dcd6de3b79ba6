"""`convergerd import FILE` against a real database."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import asyncpg
import pytest

from convergerd.core.errors import SchemaNotMigrated
from convergerd.core.model import BoundaryId, ClusterId, PolicyRow
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


# --- `convergerd import` on hostile files: one line, no traceback, nothing changed ----------

ALIAS_BOMB = "lol: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


async def snapshot(database_url: str) -> list[list[tuple[object, ...]]]:
    conn = await asyncpg.connect(database_url)
    try:
        return [
            [tuple(r) for r in await conn.fetch(query)]
            for query in (
                "SELECT * FROM clusters ORDER BY id",
                "SELECT * FROM boundaries ORDER BY id",
                "SELECT * FROM boundary_clusters ORDER BY boundary_id, cluster_id",
                "SELECT * FROM policies ORDER BY id",
            )
        ]
    finally:
        await conn.close()


async def run_import(
    database_url: str, path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    environment = {
        **{k: v for k, v in os.environ.items()
           if not k.startswith(("CONVERGERD_", "Policies__"))},
        "CONVERGERD_DATABASE_URL": database_url,
        **(env or {}),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "convergerd", "import", str(path), *args, env=environment,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (ALIAS_BOMB.encode(), "more than 1000000 values once YAML aliases are expanded at line "),
        (b"policies: " + b"[" * 50_000 + b"]" * 50_000, "nested deeper than 32 levels at line 1"),
        (b"clusters: [{id: c1}]\n" * 250_000, "5250000 bytes, more than 4194304 bytes, the limit "
                                              "set by CONVERGERD_IMPORT_MAX_BYTES"),
        (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 10, "not UTF-8 text: byte 0x80"),
        (b"clusters: [{id: c9}]\n---\nclusters: []\n", "more than one YAML document"),
    ],
    ids=["alias-bomb", "deep-nesting", "oversized", "binary", "two-documents"],
)
async def test_a_hostile_file_is_one_line_and_changes_nothing(
    database_url: str, tmp_path: Path, content: bytes, problem: str
) -> None:
    await import_file(database_url, write(tmp_path, EXAMPLE))
    before = await snapshot(database_url)
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)

    code, out, err = await run_import(database_url, path)

    assert code == 2
    assert out == ""
    assert err.startswith(f"convergerd: {path}: rejected, nothing imported: {problem}"), err
    assert err.count("\n") == 1, err  # one line
    assert "Traceback" not in err
    assert await snapshot(database_url) == before


async def test_the_size_limit_is_a_setting_and_a_flag(
    database_url: str, store: Store, tmp_path: Path
) -> None:
    path = write(tmp_path, EXAMPLE)
    size = path.stat().st_size

    code, _, err = await run_import(database_url, path, "--import-max-bytes", str(size - 1))
    assert (code, err) == (2, f"convergerd: {path}: rejected, nothing imported: {size} bytes, "
                              f"more than {size - 1} bytes, the limit set by "
                              "CONVERGERD_IMPORT_MAX_BYTES\n")
    code, _, err = await run_import(database_url, path, env={"CONVERGERD_IMPORT_MAX_BYTES": "1"})
    assert code == 2
    assert err.startswith(f"convergerd: {path}: rejected, nothing imported: {size} bytes")
    assert (await store.load_fleet()).clusters == []

    # The flag wins over the environment, as for every setting.
    code, out, err = await run_import(database_url, path, "--import-max-bytes", str(size),
                                      env={"CONVERGERD_IMPORT_MAX_BYTES": "1"})
    assert code == 0, err
    assert out.startswith("clusters: 2 created")


@pytest.mark.parametrize("value", ["abc", "0", "-5", "4MiB"])
async def test_a_bad_size_limit_is_a_setting_error(
    database_url: str, tmp_path: Path, value: str
) -> None:
    code, _, err = await run_import(database_url, write(tmp_path, EXAMPLE),
                                    env={"CONVERGERD_IMPORT_MAX_BYTES": value})
    assert code == 2
    assert err.startswith(f"convergerd: setting error: CONVERGERD_IMPORT_MAX_BYTES='{value}': ")
    assert "Traceback" not in err


async def test_a_key_given_twice_is_refused_naming_both_lines(
    database_url: str, tmp_path: Path
) -> None:
    """A second `policies:` used to replace the first list, and a repeated `enabled:` to keep
    the last value, exit 0: half a file imported with no word."""
    await import_file(database_url, write(tmp_path, EXAMPLE))
    before = await snapshot(database_url)
    path = write(tmp_path, """\
        clusters: [{id: c0001}]
        policies:
          - {id: p-latest, boundary: team-a, rule: {type: ForbidLatestTag}}
        policies:
          - id: p-new
            boundary: team-a
            enabled: true
            rule: {type: ForbidLatestTag}
            enabled: false
        """, "twice.yaml")

    code, out, err = await run_import(database_url, path)

    assert (code, out) == (2, "")
    assert err == (f"convergerd: {path}: rejected, nothing imported: duplicate key 'policies' "
                   "at line 4 (first at line 2); give each key once\n")
    assert await snapshot(database_url) == before
