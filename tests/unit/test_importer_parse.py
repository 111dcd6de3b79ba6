"""`convergerd import` file validation: pure, no database."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from convergerd.store.importer import (
    ImportedBoundary,
    ImportedPolicy,
    ImportFileError,
    ImportPlan,
    check_references,
    parse_import,
)

GOOD = """
clusters:   [{id: c0001}, {id: c0002}]
boundaries: [{id: team-a, clusters: [c0001, c0002]}]
policies:
  - {id: p-latest, boundary: team-a, enabled: true, rule: {type: ForbidLatestTag}}
  - id: p-regs
    boundary: team-a
    rule: {type: AllowedRegistries, registries: [registry.example.com]}
"""


def problems(data: Any) -> list[str]:
    with pytest.raises(ImportFileError) as caught:
        parse_import(data)
    return caught.value.problems


def test_the_example_file_parses() -> None:
    plan = parse_import(yaml.safe_load(GOOD))
    assert plan == ImportPlan(
        clusters=("c0001", "c0002"),
        boundaries=(ImportedBoundary("team-a", ("c0001", "c0002")),),
        policies=(
            ImportedPolicy("p-latest", "team-a", {"type": "ForbidLatestTag"}, True),
            ImportedPolicy(
                "p-regs",
                "team-a",
                {"type": "AllowedRegistries", "registries": ["registry.example.com"]},
                True,  # enabled defaults to true
            ),
        ),
    )


def test_every_section_is_optional() -> None:
    assert parse_import({}) == ImportPlan()
    assert parse_import({"clusters": None}) == ImportPlan()


def test_a_boundary_without_clusters_covers_none() -> None:
    plan = parse_import({"boundaries": [{"id": "empty"}]})
    assert plan.boundaries == (ImportedBoundary("empty", ()),)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, "file: must be a mapping with clusters, boundaries, policies, got an empty file"),
        ([1], "file: must be a mapping with clusters, boundaries, policies, got list"),
        ({"tenants": []}, "file: unknown key(s) tenants; known: clusters, boundaries, policies"),
        ({"clusters": {"id": "c1"}}, "clusters: must be a list, got dict"),
        ({"clusters": ["c1"]}, "clusters[0]: must be a mapping with id, got 'c1'"),
        ({"clusters": [{}]}, "clusters[0]: id: required"),
        ({"clusters": [{"id": 7}]}, "clusters[0] (id 7): id: must be a string, got 7"),
        (
            {"clusters": [{"id": "C_1"}]},
            "clusters[0] (id 'C_1'): id: 'C_1' is not a DNS label of at most 63 characters",
        ),
        (
            {"clusters": [{"id": "c1", "kubeconfig": "x"}]},
            "clusters[0] (id 'c1'): unknown field(s) kubeconfig; known: id",
        ),
        (
            {"clusters": [{"id": "c1"}, {"id": "c1"}]},
            "clusters[1] (id 'c1'): id: duplicate cluster id 'c1'",
        ),
        (
            {"boundaries": [{"id": "b", "clusters": "c1"}]},
            "boundaries[0] (id 'b'): clusters: must be a list of cluster ids, got 'c1'",
        ),
        (
            {"boundaries": [{"id": "b", "clusters": ["c1", "c1"]}]},
            "boundaries[0] (id 'b'): clusters[1]: duplicate cluster 'c1'",
        ),
        (
            {"boundaries": [{"id": "b", "clusters": ["Bad!"]}]},
            "boundaries[0] (id 'b'): clusters[0]: 'Bad!' is not a DNS label of at most 63 "
            "characters",
        ),
        (
            {"boundaries": [{"id": "-b"}]},
            "boundaries[0] (id '-b'): id: '-b' is not a valid label value",
        ),
        (
            {"boundaries": [{"id": "b"}, {"id": "b"}]},
            "boundaries[1] (id 'b'): id: duplicate boundary id 'b'",
        ),
        (
            {"policies": [{"id": "p", "boundary": "b"}]},
            "policies[0] (id 'p'): rule: required",
        ),
        (
            {"policies": [{"id": "p", "rule": {"type": "ForbidLatestTag"}}]},
            "policies[0] (id 'p'): boundary: required",
        ),
        (
            {"policies": [{"id": "P", "boundary": "b", "rule": {"type": "ForbidLatestTag"}}]},
            "policies[0] (id 'P'): id: 'P' is not a DNS label",
        ),
        (
            {"policies": [{"id": "p", "boundary": "b", "enabled": "yes please",
                           "rule": {"type": "ForbidLatestTag"}}]},
            "policies[0] (id 'p'): enabled: must be true or false, got 'yes please'",
        ),
        (
            {"policies": [{"id": "p", "boundary": "b", "rules": {},
                           "rule": {"type": "ForbidLatestTag"}}]},
            "policies[0] (id 'p'): unknown field(s) rules; known: id, boundary, enabled, rule",
        ),
        (
            {"policies": [{"id": "p", "boundary": "b", "rule": {"type": "Nope"}}]},
            "policies[0] (id 'p'): rule.type: unknown type 'Nope'",
        ),
        (
            {"policies": [
                {"id": "p", "boundary": "b", "rule": {"type": "ForbidLatestTag"}},
                {"id": "p", "boundary": "b", "rule": {"type": "ForbidLatestTag"}},
            ]},
            "policies[1] (id 'p'): id: duplicate policy id 'p'",
        ),
    ],
)
def test_each_problem_names_the_entry_and_field(data: Any, expected: str) -> None:
    found = problems(data)
    assert len(found) == 1, found
    assert found[0].startswith(expected), found[0]


def test_a_bad_rule_parameter_is_named_like_the_spec_example() -> None:
    data = yaml.safe_load(GOOD)
    data["policies"][1]["rule"]["registries"] = ["https://registry.example.com"]
    [problem] = problems(data)
    assert problem.startswith("policies[1] (id 'p-regs'): rule.registries: ")


def test_every_problem_is_listed_at_once() -> None:
    data = {
        "clusters": [{"id": "ok"}, {"id": "NOT OK"}],
        "policies": [{"id": "p", "boundary": "b", "rule": {"type": "AllowedRegistries"}}],
        "extra": 1,
    }
    found = problems(data)
    assert len(found) == 3
    assert str(ImportFileError("f.yaml", found)).startswith(
        "f.yaml: rejected, nothing imported (3 problems):"
    )


def test_references_may_point_into_the_database() -> None:
    plan = parse_import({
        "boundaries": [{"id": "b", "clusters": ["in-db", "in-file"]}],
        "clusters": [{"id": "in-file"}],
        "policies": [{"id": "p", "boundary": "db-boundary", "rule": {"type": "ForbidLatestTag"}}],
    })
    check_references(plan, known_clusters={"in-db"}, known_boundaries={"db-boundary"})


def test_unknown_references_are_errors() -> None:
    plan = parse_import({
        "boundaries": [{"id": "b", "clusters": ["ghost"]}],
        "policies": [{"id": "p", "boundary": "nowhere", "rule": {"type": "ForbidLatestTag"}}],
    })
    with pytest.raises(ImportFileError) as caught:
        check_references(plan, known_clusters=set(), known_boundaries=set())
    assert caught.value.problems == [
        "boundaries[0] (id 'b'): clusters[0]: unknown cluster 'ghost' (not in the file nor the "
        "database)",
        "policies[0] (id 'p'): boundary: unknown boundary 'nowhere' (not in the file nor the "
        "database)",
    ]
