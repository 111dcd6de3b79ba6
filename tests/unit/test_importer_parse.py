"""`convergerd import` file reading and validation: no database."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.model import InvalidPolicy, PolicyRow
from convergerd.core.render import validate_policy
from convergerd.store.importer import (
    MAX_PROBLEMS_LISTED,
    POLICY_FIELDS,
    TOP_LEVEL_KEYS,
    ImportedBoundary,
    ImportedPolicy,
    ImportFileError,
    ImportPlan,
    check_references,
    load_file,
    parse_file_bytes,
    parse_import,
)
from convergerd.store.yamlfile import YAML_MAX_DEPTH, YAML_MAX_NODES

GOOD = """
clusters:   [{id: c0001}, {id: c0002}]
boundaries: [{id: team-a, clusters: [c0001, c0002]}]
policies:
  - {id: p-latest, boundary: team-a, enabled: true, rule: {type: ForbidLatestTag}}
  - id: p-regs
    boundary: team-a
    rule: {type: AllowedRegistries, registries: [registry.example.com]}
"""


KEYS = "clusters, boundaries, rolloutStrategies, policies"


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
        labels={"c0001": {}, "c0002": {}},
    )


def test_clusters_may_be_plain_ids_or_carry_labels_and_strategies_are_named() -> None:
    plan = parse_import(yaml.safe_load("""
clusters: [c0001, {id: c0002, labels: {ring: canary}}]
boundaries: [{id: team-a, clusters: [c0001, c0002], rolloutStrategy: careful}]
rolloutStrategies:
  - id: careful
    waves: [{name: canary, selector: {ring: canary}}, {name: rest, fraction: 1.0}]
policies:
  - {id: p, boundary: team-a, rolloutStrategy: careful, rule: {type: ForbidLatestTag}}
"""))
    assert plan.clusters == ("c0001", "c0002")
    assert plan.labels == {"c0001": {}, "c0002": {"ring": "canary"}}
    assert [s.id for s in plan.strategies] == ["careful"]
    assert plan.boundaries[0].rollout_strategy == "careful"
    assert plan.policies[0].rollout_strategy == "careful"


def test_every_section_is_optional() -> None:
    assert parse_import({}) == ImportPlan()
    assert parse_import({"clusters": None}) == ImportPlan()


def test_a_boundary_without_clusters_covers_none() -> None:
    plan = parse_import({"boundaries": [{"id": "empty"}]})
    assert plan.boundaries == (ImportedBoundary("empty", ()),)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, f"file: must be a mapping with {KEYS}, got an empty file"),
        ([1], f"file: must be a mapping with {KEYS}, got list"),
        ({"tenants": []}, f"file: unknown key(s) tenants; known: {KEYS}"),
        ({"clusters": {"id": "c1"}}, "clusters: must be a list, got dict"),
        ({"clusters": [5]}, "clusters[0]: must be a mapping with id, labels, got 5"),
        ({"clusters": [{"id": "c1", "labels": {"ring": "a b"}}]},
         "clusters[0] (id 'c1'): labels.ring: 'a b' is not a label value"),
        ({"rolloutStrategies": [{"id": "s", "waves": [{"name": "a", "fraction": 0.5}]}]},
         "rolloutStrategies[0] (id 's'): waves: the last fraction wave must reach 1.0"),
        ({"policies": [{"id": "p", "boundary": "b", "rule": {"type": "ForbidLatestTag"},
                        "rolloutStrategy": "Not-A-Name"}]},
         "policies[0] (id 'p'): rolloutStrategy: 'Not-A-Name' is not a DNS label"),
        ({"clusters": [{}]}, "clusters[0]: id: required"),
        ({"clusters": [{"id": 7}]}, "clusters[0] (id 7): id: must be a string, got 7"),
        (
            {"clusters": [{"id": "C_1"}]},
            "clusters[0] (id 'C_1'): id: 'C_1' is not a DNS label of at most 63 characters",
        ),
        (
            {"clusters": [{"id": "c1", "kubeconfig": "x"}]},
            "clusters[0] (id 'c1'): unknown field(s) kubeconfig; known: id, labels",
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


# --- the file itself: bounded, UTF-8, one shallow YAML document --------------------------

BOMB = "lol: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


def file_problem(data: bytes) -> str:
    with pytest.raises(ImportFileError) as caught:
        parse_file_bytes(data)
    [problem] = caught.value.problems
    assert "\n" not in str(caught.value)
    return problem


def test_the_example_file_parses_from_bytes() -> None:
    assert parse_file_bytes(GOOD.encode()) == parse_import(yaml.safe_load(GOOD))


def test_an_alias_bomb_is_refused_quickly() -> None:
    assert file_problem(BOMB.encode()).startswith(
        f"more than {YAML_MAX_NODES} values once YAML aliases are expanded at line "
    )


def test_aliases_within_the_limit_are_fine() -> None:
    doc = """
    clusters: [{id: c1}, {id: c2}]
    boundaries:
      - {id: team-a, clusters: &both [c1, c2]}
      - {id: team-b, clusters: *both}
    """
    plan = parse_file_bytes(textwrap.dedent(doc).encode())
    assert [b.clusters for b in plan.boundaries] == [("c1", "c2"), ("c1", "c2")]


def test_merge_keys_count_what_they_copy() -> None:
    doc = "a: &m0 {k0: 0, k1: 1, k2: 2, k3: 3}\n" + "".join(
        f"a{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 4)}], x{i}: {i}}}\n"
        for i in range(1, 12)
    )
    assert file_problem(doc.encode()).startswith(f"more than {YAML_MAX_NODES} values")


def test_a_recursive_alias_is_refused() -> None:
    assert file_problem(b"clusters: &a [*a]\n") == (
        "a YAML alias refers to a value that contains it at line 1, column 15"
    )


@pytest.mark.parametrize("opener", ["[", "{a: ", "- "])
def test_deep_nesting_is_refused(opener: str) -> None:
    closer = {"[": "]", "{a: ": "}", "- ": ""}[opener]
    text = opener * 100_000 + "x" + closer * 100_000
    if opener == "- ":  # block style: each level on its own line, indented
        text = "".join(f"{'  ' * i}-\n" for i in range(100)) + "  " * 100 + "x\n"
    assert file_problem(text.encode()).startswith(f"nested deeper than {YAML_MAX_DEPTH} levels at")


def test_nesting_up_to_the_limit_is_parsed() -> None:
    depth = YAML_MAX_DEPTH - 1  # the top-level mapping is one level
    problem = file_problem(("x: " + "[" * depth + "]" * depth).encode())
    assert problem.startswith("file: unknown key(s) x")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"clusters: [{id: c1}]\n\xff\xfe", "not UTF-8 text: byte 0xff at offset 21 cannot be "
                                            "decoded; save the file as UTF-8"),
        ("clusters: []".encode("utf-16"), "not UTF-8 text: byte 0xff at offset 0"),
        (b"clusters: []\n\x00\x01\x02\x03", "character #x0000 at line 2, column 1 is not "
                                            "allowed in YAML"),
        (b"\x7fELF\x02\x01\x01\x00\x00", "character #x007f at line 1, column 1"),
        (b"clusters: []\n---\nclusters: []\n", "more than one YAML document (the second "
                                              "starts at line 2, column 1); put everything in one"),
        (b"- {id: c1}\n", f"file: must be a mapping with {KEYS}, got list"),
        (b"just text\n", f"file: must be a mapping with {KEYS}, got str"),
        (b"", f"file: must be a mapping with {KEYS}, got an empty file"),
        (b"clusters: [{id: c1}\n", "not valid YAML at line 2, column 1: expected ',' or ']', "
                                   "but got '<stream end>'"),
        (b"a: !!python/object:os.system x\n", "not valid YAML at line 1, column 4: could not "
                                              "determine a constructor for the tag"),
        (b"clusters: [{id: 2001-13-45}]\n", "a value cannot be read: month must be in 1..12"),
        (b"clusters: [{id: 1" + b"0" * 5000 + b"}]\n", "a value cannot be read: Exceeds the "
                                                       "limit"),
        (b"clusters: [{id: 0x" + b"f" * 5000 + b"}]\n", "clusters[0] (id <20000-bit integer>): "
                                                        "id: must be a string"),
    ],
    ids=["latin-1", "utf-16", "nul", "binary", "two-documents", "list", "scalar", "empty",
         "unclosed", "python-tag", "bad-date", "long-int", "long-hex"],
)
def test_a_bad_file_gets_one_clear_problem(data: bytes, expected: str) -> None:
    assert file_problem(data).startswith(expected)


DUPLICATE_POLICIES = """\
clusters: [{id: c1}]
boundaries: [{id: b, clusters: [c1]}]
policies:
  - {id: p-first, boundary: b, rule: {type: ForbidLatestTag}}
policies:
  - {id: p-second, boundary: b, rule: {type: ForbidLatestTag}}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DUPLICATE_POLICIES, "duplicate key 'policies' at line 5 (first at line 3)"),
        ("policies:\n  - id: p\n    boundary: b\n    enabled: true\n    rule: {type: "
         "ForbidLatestTag}\n    enabled: false\n",
         "duplicate key 'enabled' at line 6 (first at line 4)"),
        ("policies:\n  - id: p\n    boundary: b\n    rule: {type: ForbidLatestTag}\n"
         "    rule: {type: RequiredLabels, labels: [team]}\n",
         "duplicate key 'rule' at line 5 (first at line 4)"),
        ("policies:\n  - {id: p, boundary: b, rule: {type: AllowedRegistries, registries: [a.io],"
         "\n      registries: [b.io]}}\n",
         "duplicate key 'registries' at line 3 (first at line 2)"),
        ("clusters: [{id: c1, id: c2}]\n", "duplicate key 'id' at line 1 (first at line 1)"),
        ("{1: a, 1.0: b}\n", "duplicate key 1.0 at line 1 (first at line 1)"),
    ],
    ids=["policies", "enabled", "rule", "rule-parameter", "flow", "equal-numbers"],
)
def test_a_key_given_twice_is_refused_with_both_lines(text: str, expected: str) -> None:
    """Issue 17, item 8: PyYAML keeps the last of two equal keys, so a second `policies:` list
    silently dropped the first and a repeated `enabled:` flipped a policy, exit 0."""
    assert file_problem(text.encode()) == f"{expected}; give each key once"


def test_a_merged_key_may_be_overridden() -> None:
    """A key brought in by a merge (`<<`) is a default the mapping may override (YAML's own
    rule): not a duplicate."""
    doc = b"""\
clusters: [{id: c1}]
boundaries: [{id: b, clusters: [c1]}]
policies:
  - <<: &defaults {boundary: b, enabled: false, rule: {type: ForbidLatestTag}}
    id: p
    enabled: true
"""
    plan = parse_file_bytes(doc)
    assert [(p.id, p.boundary, p.enabled) for p in plan.policies] == [("p", "b", True)]


class _CountingId(str):
    """A cluster id that counts the comparisons made with it."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        type(self).comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_boundary_of_80000_clusters_is_checked_in_linear_time() -> None:
    """Issue 17, item 13: the duplicate check of a boundary's cluster list was quadratic (a
    list lookup per id: 80,000 ids took 61-202 s; a 4 MiB file about 15 min). Counted, not
    timed: a linear check compares each id a bounded number of times, a quadratic one
    ~n^2/2 = 3.2e9 times."""
    ids = [_CountingId(f"c{i:06d}") for i in range(80_000)]
    doc = {"clusters": [{"id": c} for c in ids],
           "boundaries": [{"id": "all", "clusters": [*ids, _CountingId(ids[-1])]}]}
    _CountingId.comparisons = 0
    found = problems(doc)
    assert found == ["boundaries[0] (id 'all'): clusters[80000]: duplicate cluster 'c079999'"]
    assert _CountingId.comparisons <= 4 * len(ids)


def test_a_byte_order_mark_is_accepted() -> None:
    assert parse_file_bytes(b"\xef\xbb\xbfclusters: [{id: c1}]\n").clusters == ("c1",)


def test_long_values_are_quoted_shortened() -> None:
    data = {"policies": [{"id": "p" * 5000, "boundary": "b" * 5000, "enabled": "y" * 5000,
                          "rule": {"type": "T" * 5000, "x" * 5000: 1}}],
            "z" * 5000: 1}
    found = problems(data)
    assert len(found) == 5, found
    for problem in found:
        assert len(problem) <= 300, problem
        assert "…" in problem


def test_a_file_with_thousands_of_problems_lists_the_first_fifty() -> None:
    with pytest.raises(ImportFileError) as caught:
        parse_import({"clusters": [{"id": f"C{i}"} for i in range(10_000)]})
    assert len(caught.value.problems) == MAX_PROBLEMS_LISTED
    message = str(caught.value)
    assert message.startswith("file: rejected, nothing imported (10000 problems):")
    assert message.endswith(f"\n  ... and {10_000 - MAX_PROBLEMS_LISTED} more")


# --- policies in a file obey the same limits as a round ------------------------------------


def test_a_policy_over_a_limit_is_refused_as_a_round_would() -> None:
    registries = [f"r{i}.example.com" for i in range(65)]
    rule = {"type": "AllowedRegistries", "registries": registries}
    [problem] = problems({"policies": [{"id": "p", "boundary": "b", "rule": rule}]})
    round_reason = validate_policy(PolicyRow("p", "b", rule, True, 1))
    assert isinstance(round_reason, InvalidPolicy)
    assert problem == f"policies[0] (id 'p'): {round_reason.reason}"
    assert problem.startswith("policies[0] (id 'p'): rule.registries: 65 entries, at most 64")


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"type": "RequiredLabels", "labels": ["n" * 64]}, "rule.labels: 'nnn"),
        ({"type": "AllowedRegistries", "registries": ["x.io/"]}, "rule.registries: 'x.io/' ends"),
        ({"type": "AllowedRegistries", "registries": ["x.io team"]},
         "rule.registries: 'x.io team' contains whitespace"),
    ],
)
def test_policy_parameter_limits_apply_to_the_file(rule: Any, expected: str) -> None:
    [problem] = problems({"policies": [{"id": "p", "boundary": "b", "rule": rule}]})
    assert problem.startswith(f"policies[0] (id 'p'): {expected}")


# --- reading: the size limit is checked before anything is parsed (the reader: test_files) --


def test_a_file_over_the_limit_is_refused_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"clusters: []\n" * 1000)
    with pytest.raises(ImportFileError) as caught:
        load_file(path, max_bytes=100)
    assert str(caught.value) == (
        f"{path}: rejected, nothing imported: 13000 bytes, more than 100 bytes, the limit set "
        "by CONVERGERD_IMPORT_MAX_BYTES"
    )


def test_a_directory_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImportFileError, match=r"rejected, nothing imported: not a regular file"):
        load_file(tmp_path)
    with pytest.raises(ImportFileError, match=r"rejected, nothing imported: cannot read: No such"):
        load_file(tmp_path / "missing.yaml")


# --- property: no input escapes as anything but our own, short, error ----------------------

_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=200)
)
_KEYS = st.sampled_from([*TOP_LEVEL_KEYS, *POLICY_FIELDS, "type", "labels", "registries",
                         "plans"]) | st.text(max_size=30)
def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # Named, not a lambda: Hypothesis judges a multi-line lambda by its source text.
    return st.lists(children, max_size=10) | st.dictionaries(_KEYS, children, max_size=6)


def _small_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=5) | st.dictionaries(_KEYS, children, max_size=4)


_DOCS = st.recursive(_SCALARS, _containers, max_leaves=60)


def _short_problems_if_refused(parse: Callable[[], object]) -> None:
    """`parse()` returns, or raises `ImportFileError` with a few short one-line problems."""
    problems: list[str] = []
    try:
        parse()
    except ImportFileError as exc:
        problems = exc.problems
        assert problems
    assert len(problems) <= MAX_PROBLEMS_LISTED
    for problem in problems:
        assert 0 < len(problem) <= 300, problem
        assert "\n" not in problem


def _parsed_or_refused(data: bytes) -> None:
    _short_problems_if_refused(lambda: parse_file_bytes(data))


@given(st.binary(max_size=2000))
def test_any_bytes_parse_or_are_refused_with_short_problems(data: bytes) -> None:
    _parsed_or_refused(data)


@given(st.text(max_size=2000))
def test_any_text_parses_or_is_refused_with_short_problems(text: str) -> None:
    _parsed_or_refused(text.encode("utf-8", "surrogatepass"))


@given(_DOCS)
def test_any_document_parses_or_is_refused_with_short_problems(doc: Any) -> None:
    _parsed_or_refused(yaml.safe_dump(doc).encode())
    _parsed_or_refused(yaml.safe_dump(doc, default_flow_style=True).encode())


_ENTRY_VALUES = st.recursive(_SCALARS, _small_containers, max_leaves=10)


@given(st.dictionaries(st.sampled_from(TOP_LEVEL_KEYS), st.lists(
    st.dictionaries(st.sampled_from(POLICY_FIELDS), _ENTRY_VALUES, max_size=4), max_size=4)))
def test_any_entries_parse_or_are_refused_with_short_problems(doc: Any) -> None:
    _short_problems_if_refused(lambda: parse_import(doc))
