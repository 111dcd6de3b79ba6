"""Policy validation (docs/design.md, "Policies and validity") and which clusters each policy is
meant for."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.model import (
    POLICY_ID_MAX_LEN,
    REGISTRY_MAX_LEN,
    RULE_LIST_MAX_ENTRIES,
    RULE_TYPES,
    Boundary,
    BoundaryId,
    Cluster,
    ClusterId,
    Fleet,
    InvalidPolicy,
    Policy,
    PolicyId,
    PolicyRow,
    Rule,
    RuleError,
)
from convergerd.core.render import MAX_OBJECT_BYTES, check_object_size, object_size, validate_policy

FORBID_LATEST: dict[str, Any] = {"type": "ForbidLatestTag"}


def row(
    id: str = "p-latest",
    boundary: str = "team-a",
    rule: Any = FORBID_LATEST,
    *,
    enabled: bool = True,
    revision: int = 1,
) -> PolicyRow:
    return PolicyRow(
        id=id,
        boundary=boundary,
        rule=rule,
        enabled=enabled,
        revision=revision,
    )


def valid(r: PolicyRow) -> Policy:
    result = validate_policy(r)
    assert isinstance(result, Policy), result
    return result


def invalid(r: PolicyRow) -> InvalidPolicy:
    result = validate_policy(r)
    assert isinstance(result, InvalidPolicy), result
    return result


# --- policy ids: usable in object names (lowercase DNS label, at most 50 characters) ---------


@pytest.mark.parametrize(
    "policy_id",
    [
        "a",
        "0",
        "p-latest",
        "1st-policy",
        "a-b-c-9",
        "a" * POLICY_ID_MAX_LEN,
        "x" + "-" * (POLICY_ID_MAX_LEN - 2) + "y",
    ],
)
def test_valid_policy_id_is_accepted(policy_id: str) -> None:
    assert valid(row(id=policy_id)).id == policy_id


@pytest.mark.parametrize(
    "policy_id",
    [
        "",
        "A",
        "P-latest",
        "-a",
        "a-",
        "a_b",
        "a.b",
        "a b",
        " a",
        "é",
        "a" * (POLICY_ID_MAX_LEN + 1),
        "abc\n",  # a trailing newline must not slip past the pattern
    ],
)
def test_invalid_policy_id_is_reported_naming_the_id(policy_id: str) -> None:
    bad = invalid(row(id=policy_id))
    assert bad.id == policy_id
    assert bad.reason.startswith("id: ")
    assert repr(policy_id) in bad.reason


def test_too_long_id_says_the_limit() -> None:
    bad = invalid(row(id="a" * 51))
    assert "51 characters" in bad.reason
    assert "at most 50" in bad.reason


# --- boundary ids: used as a label value --------------------------------------------------


@pytest.mark.parametrize("boundary", ["team-a", "Team_A.1", "a", "a" * 63])
def test_valid_boundary_is_accepted(boundary: str) -> None:
    assert valid(row(boundary=boundary)).boundary == boundary


@pytest.mark.parametrize("boundary", ["", "-a", "a-", "a" * 64, "a/b", "team a", "team-a\n"])
def test_invalid_boundary_is_reported_naming_it(boundary: str) -> None:
    bad = invalid(row(boundary=boundary))
    assert bad.boundary == boundary
    assert bad.reason.startswith("boundary: ")
    assert repr(boundary) in bad.reason


# --- rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"type": "RequiredLabels", "labels": ["app", "app.kubernetes.io/name", "a_b.c-d"]},
            {"type": "RequiredLabels", "labels": ["app", "app.kubernetes.io/name", "a_b.c-d"]},
        ),
        (
            {
                "type": "AllowedRegistries",
                "registries": ["registry.example.com", "registry.example.com:5000/team/x",
                               "localhost:5000", "ghcr.io/org"],
            },
            {
                "type": "AllowedRegistries",
                "registries": ["registry.example.com", "registry.example.com:5000/team/x",
                               "localhost:5000", "ghcr.io/org"],
            },
        ),
        ({"type": "ForbidLatestTag"}, {"type": "ForbidLatestTag"}),
        (
            {"type": "AllowedComputePlans", "plans": ["small", "large"]},
            {"type": "AllowedComputePlans", "plans": ["small", "large"]},
        ),
    ],
)
def test_valid_rule_is_kept_exactly(raw: dict[str, Any], expected: dict[str, Any]) -> None:
    assert valid(row(rule=raw)).rule.as_dict() == expected


@pytest.mark.parametrize(
    ("raw", "field", "shown"),
    [
        # the rule itself
        (None, "rule", "None"),
        ("ForbidLatestTag", "rule", "'ForbidLatestTag'"),
        ([], "rule", "[]"),
        ({}, "rule.type", "None"),
        ({"type": "Nope"}, "rule.type", "'Nope'"),
        ({"type": "forbidlatesttag"}, "rule.type", "'forbidlatesttag'"),
        # RequiredLabels
        ({"type": "RequiredLabels"}, "rule.labels", "None"),
        ({"type": "RequiredLabels", "labels": []}, "rule.labels", "[]"),
        ({"type": "RequiredLabels", "labels": "app"}, "rule.labels", "'app'"),
        ({"type": "RequiredLabels", "labels": {"app": "x"}}, "rule.labels", "{'app': 'x'}"),
        ({"type": "RequiredLabels", "labels": [1]}, "rule.labels", "1"),
        ({"type": "RequiredLabels", "labels": [None]}, "rule.labels", "None"),
        ({"type": "RequiredLabels", "labels": [""]}, "rule.labels", "''"),
        ({"type": "RequiredLabels", "labels": ["app", "app"]}, "rule.labels", "['app', 'app']"),
        ({"type": "RequiredLabels", "labels": ["bad key"]}, "rule.labels", "'bad key'"),
        ({"type": "RequiredLabels", "labels": ["-app"]}, "rule.labels", "'-app'"),
        ({"type": "RequiredLabels", "labels": ["app-"]}, "rule.labels", "'app-'"),
        ({"type": "RequiredLabels", "labels": ["x" * 64]}, "rule.labels", "'" + "x" * 64),
        ({"type": "RequiredLabels", "labels": ["/app"]}, "rule.labels", "'/app'"),
        ({"type": "RequiredLabels", "labels": ["app/"]}, "rule.labels", "'app/'"),
        ({"type": "RequiredLabels", "labels": ["a/b/c"]}, "rule.labels", "'a/b/c'"),
        ({"type": "RequiredLabels", "labels": ["Example.com/app"]}, "rule.labels",
         "'Example.com/app'"),
        ({"type": "RequiredLabels", "labels": ["a..b/app"]}, "rule.labels", "'a..b/app'"),
        ({"type": "RequiredLabels", "labels": ["app\n"]}, "rule.labels", "'app\\n'"),
        ({"type": "RequiredLabels", "labels": ["app"], "extra": 1}, "rule", "extra"),
        ({"type": "RequiredLabels", "registries": ["x.io"]}, "rule", "registries"),
        # AllowedRegistries
        ({"type": "AllowedRegistries"}, "rule.registries", "None"),
        ({"type": "AllowedRegistries", "registries": []}, "rule.registries", "[]"),
        ({"type": "AllowedRegistries", "registries": "x.io"}, "rule.registries", "'x.io'"),
        ({"type": "AllowedRegistries", "registries": [3]}, "rule.registries", "3"),
        ({"type": "AllowedRegistries", "registries": ["x.io", "x.io"]}, "rule.registries",
         "duplicate"),
        ({"type": "AllowedRegistries", "registries": ["https://x"]}, "rule.registries",
         "'https://x'"),
        ({"type": "AllowedRegistries", "registries": ["x/"]}, "rule.registries", "'x/'"),
        ({"type": "AllowedRegistries", "registries": ["registry.example.com/"]},
         "rule.registries", "'registry.example.com/'"),
        ({"type": "AllowedRegistries", "registries": ["x.io//team"]}, "rule.registries",
         "'x.io//team'"),
        ({"type": "AllowedRegistries", "registries": ["x.io:port"]}, "rule.registries",
         "'x.io:port'"),
        ({"type": "AllowedRegistries", "registries": ["x.io\n"]}, "rule.registries",
         "'x.io\\n'"),
        ({"type": "AllowedRegistries", "registries": ["x.io"], "labels": ["a"]}, "rule",
         "labels"),
        # ForbidLatestTag takes no params
        ({"type": "ForbidLatestTag", "registries": ["x.io"]}, "rule", "registries"),
        ({"type": "ForbidLatestTag", "tags": ["latest"]}, "rule", "tags"),
        # AllowedComputePlans
        ({"type": "AllowedComputePlans"}, "rule.plans", "None"),
        ({"type": "AllowedComputePlans", "plans": []}, "rule.plans", "[]"),
        ({"type": "AllowedComputePlans", "plans": ["s", "s"]}, "rule.plans", "duplicate"),
        ({"type": "AllowedComputePlans", "plans": ["s"], "size": "xl"}, "rule", "size"),
    ],
)
def test_malformed_rule_is_invalid_with_a_reason_naming_field_and_value(
    raw: Any, field: str, shown: str
) -> None:
    bad = invalid(row(id="p-1", boundary="team-a", rule=raw, revision=7))
    assert (bad.id, bad.boundary, bad.revision) == ("p-1", "team-a", 7)
    assert bad.reason.startswith(field + ":") or bad.reason.startswith(field + " "), bad.reason
    assert shown in bad.reason


def test_unknown_type_lists_the_known_ones() -> None:
    bad = invalid(row(rule={"type": "Nope"}))
    for known in ("RequiredLabels", "AllowedRegistries", "ForbidLatestTag",
                  "AllowedComputePlans"):
        assert known in bad.reason


def test_rule_with_non_string_field_names_is_invalid_not_a_crash() -> None:
    # YAML import can hand over integer keys; the row must be reported, not crash the round.
    bad = invalid(row(rule={"type": "ForbidLatestTag", 1: "x", "b": 2}))
    assert "1" in bad.reason
    assert "b" in bad.reason


def test_params_are_frozen_against_later_edits_of_the_row() -> None:
    labels = ["app"]
    policy = valid(row(rule={"type": "RequiredLabels", "labels": labels}))
    labels.append("team")
    assert policy.rule.as_dict() == {"type": "RequiredLabels", "labels": ["app"]}


def test_enabled_and_revision_are_carried() -> None:
    policy = valid(row(enabled=False, revision=42))
    assert (policy.enabled, policy.revision) == (False, 42)


# --- which clusters a policy is meant for --------------------------------------------------


def policy(pid: str, boundary: str = "team-a", rule: Rule | None = None) -> Policy:
    return Policy(
        id=PolicyId(pid),
        boundary=BoundaryId(boundary),
        rule=rule or Rule("ForbidLatestTag"),
        enabled=True,
        revision=1,
    )


def fleet(
    clusters: list[str],
    boundaries: dict[str, list[str]],
    policies: list[Policy],
    invalid_rows: list[InvalidPolicy] | None = None,
) -> Fleet:
    return Fleet(
        clusters=[Cluster(ClusterId(c)) for c in clusters],
        boundaries={
            BoundaryId(b): Boundary(BoundaryId(b), frozenset(ClusterId(c) for c in cs))
            for b, cs in boundaries.items()
        },
        policies=policies,
        invalid=invalid_rows or [],
    )


def ids(by_cluster: dict[ClusterId, list[Policy]]) -> dict[str, list[str]]:
    return {c: sorted(p.id for p in ps) for c, ps in by_cluster.items()}


def test_each_policy_goes_to_every_cluster_of_its_boundary_only() -> None:
    f = fleet(
        ["c1", "c2", "c3"],
        {"team-a": ["c1", "c2"], "team-b": ["c3"]},
        [policy("pa", "team-a"), policy("pb", "team-b")],
    )
    assert ids(f.desired_by_cluster()) == {"c1": ["pa"], "c2": ["pa"], "c3": ["pb"]}


def test_allowed_compute_plans_is_valid_but_never_delivered() -> None:
    plans = valid(row(id="p-plans", rule={"type": "AllowedComputePlans", "plans": ["small"]}))
    f = fleet(["c1"], {"team-a": ["c1"]}, [plans, policy("p-latest")])
    assert ids(f.desired_by_cluster()) == {"c1": ["p-latest"]}


def test_invalid_policies_are_never_desired() -> None:
    bad = invalid(row(id="Bad"))
    f = fleet(["c1"], {"team-a": ["c1"]}, [policy("good")], [bad])
    assert ids(f.desired_by_cluster()) == {"c1": ["good"]}


def test_policy_of_an_unknown_boundary_goes_nowhere() -> None:
    f = fleet(["c1"], {"team-a": ["c1"]}, [policy("orphan", "team-gone"), policy("ok")])
    assert ids(f.desired_by_cluster()) == {"c1": ["ok"]}


def test_boundary_covering_an_unknown_cluster_is_ignored_there() -> None:
    f = fleet(["c1"], {"team-a": ["c1", "c-unknown"]}, [policy("pa")])
    assert ids(f.desired_by_cluster()) == {"c1": ["pa"]}


def test_every_known_cluster_appears_even_with_nothing_desired() -> None:
    # A cluster with nothing to hold is still visited (and reported) by a round.
    f = fleet(["c1", "c2"], {"team-a": ["c1"]}, [policy("pa")])
    assert ids(f.desired_by_cluster()) == {"c1": ["pa"], "c2": []}


def test_disabled_policy_is_still_delivered() -> None:
    # Disabled means "installed but not bound" (phase Inert), not "absent".
    off = valid(row(id="p-off", enabled=False))
    f = fleet(["c1"], {"team-a": ["c1"]}, [off])
    assert [p.enabled for p in f.desired_by_cluster()[ClusterId("c1")]] == [False]


# --- limits: what one row may put into every cluster of its boundary ------------------------


def test_a_rule_list_holds_at_most_64_entries() -> None:
    at_limit = [f"r{i}.example.com" for i in range(RULE_LIST_MAX_ENTRIES)]
    assert valid(row(rule={"type": "AllowedRegistries", "registries": at_limit}))
    over = [*at_limit, "one-more.example.com"]
    bad = invalid(row(rule={"type": "AllowedRegistries", "registries": over}))
    assert bad.reason.startswith("rule.registries: 65 entries, at most 64: ['r0.example.com'")
    assert len(bad.reason) <= 200


@pytest.mark.parametrize("key", ["labels", "plans"])
def test_every_list_parameter_is_limited(key: str) -> None:
    rule_type = {"labels": "RequiredLabels", "plans": "AllowedComputePlans"}[key]
    entries = [f"x{i}" for i in range(RULE_LIST_MAX_ENTRIES + 1)]
    bad = invalid(row(rule={"type": rule_type, key: entries}))
    assert bad.reason.startswith(f"rule.{key}: 65 entries, at most 64")


@pytest.mark.parametrize(
    "key",
    [
        "n" * 63,
        "p" * 253 + "/name",
        "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 61 + "/" + "n" * 63,
    ],
)
def test_label_keys_up_to_the_kubernetes_limits_are_valid(key: str) -> None:
    assert valid(row(rule={"type": "RequiredLabels", "labels": [key]}))


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("n" * 64, "has a name of 64 characters, at most 63"),
        ("p" * 254 + "/name", "has a prefix of 254 characters, at most 253"),
        ("p" * 253 + "/" + "n" * 64, "is 318 characters, at most 317"),
        ("Example.com/name", "has a prefix that is not a DNS subdomain"),
        ("bad key", "is not a valid label key"),
    ],
)
def test_label_key_over_a_limit_names_the_limit(key: str, reason: str) -> None:
    bad = invalid(row(rule={"type": "RequiredLabels", "labels": [key]}))
    assert bad.reason.startswith("rule.labels: '")
    assert reason in bad.reason


@pytest.mark.parametrize(
    ("prefix", "reason"),
    [
        ("r" * 254, "is 254 characters, at most 253"),
        ("registry.example.com/team a", "contains whitespace or control characters"),
        ("registry.example.com\tx", "contains whitespace or control characters"),
        ("registry.example.com\x00", "contains whitespace or control characters"),
        ("https://registry.example.com", "has a scheme"),
        ("registry.example.com/team/", "ends with '/'"),
        ("Registry.example.com", "is not a registry prefix like 'registry.example.com'"),
    ],
)
def test_registry_prefix_problems_are_named(prefix: str, reason: str) -> None:
    bad = invalid(row(rule={"type": "AllowedRegistries", "registries": [prefix]}))
    assert bad.reason.startswith("rule.registries: ")
    assert reason in bad.reason


def test_a_registry_prefix_of_253_characters_is_valid() -> None:
    prefix = "r" * 200 + ".example.com/" + "t" * 40
    assert len(prefix) == REGISTRY_MAX_LEN
    assert valid(row(rule={"type": "AllowedRegistries", "registries": [prefix]}))


def test_a_plan_name_is_limited_too() -> None:
    bad = invalid(row(rule={"type": "AllowedComputePlans", "plans": ["p" * 254]}))
    assert bad.reason.startswith("rule.plans: 'ppp")
    assert "254 characters, at most 253" in bad.reason


@pytest.mark.parametrize(
    "rule",
    [
        {"type": "AllowedRegistries", "registries": ["https://" + "x" * 100_000]},
        {"type": "RequiredLabels", "labels": ["k" * 100_000]},
        {"type": "RequiredLabels", "labels": ["k" * 100_000, "k" * 100_000]},
        {"type": "RequiredLabels", "labels": "k" * 100_000},
        {"type": "Nope" + "x" * 100_000},
        {"type": "ForbidLatestTag", "x" * 100_000: 1},
        "r" * 100_000,
    ],
    ids=["registry", "label", "duplicates", "not-a-list", "type", "field", "rule"],
)
def test_long_values_are_quoted_shortened(rule: Any) -> None:
    bad = invalid(row(rule=rule))
    assert len(bad.reason) <= 300, bad.reason
    assert "…" in bad.reason


def test_long_ids_are_quoted_shortened() -> None:
    assert len(invalid(row(id="p" * 100_000)).reason) <= 300
    assert len(invalid(row(boundary="b" * 100_000)).reason) <= 300


def test_the_largest_valid_policy_renders_well_under_the_object_limit() -> None:
    # The list and length limits keep every valid policy far below the object limit.
    labels = [f"{'p' * 239}{i:02d}.example.com/{'n' * 61}{i:02d}" for i in range(64)]
    largest = valid(row(id="p" * 50, boundary="b" * 63, revision=2**63 - 1,
                        rule={"type": "RequiredLabels", "labels": labels}))
    assert object_size(largest) < MAX_OBJECT_BYTES // 4


def test_a_policy_whose_object_is_too_large_is_refused_with_its_size() -> None:
    # Built directly: no row within the list limits reaches this size.
    huge = policy("p-huge", rule=Rule("RequiredLabels", {"labels": ("k" * 1000,) * 300}))
    with pytest.raises(RuleError, match=r"^rule: the Policy object would be \d+ bytes, at most "
                                        rf"{MAX_OBJECT_BYTES}"):
        check_object_size(huge)
    check_object_size(policy("p-small"))


def test_a_control_plane_rule_is_never_rendered_so_has_no_object_limit() -> None:
    plans = policy("p-plans", rule=Rule("AllowedComputePlans", {"plans": ("x" * 1000,) * 300}))
    check_object_size(plans)


# --- property: no input crashes the validator --------------------------------------------

def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # A named function: Hypothesis inspects a multi-line lambda's source and can misjudge it.
    return st.lists(children, max_size=80) | st.dictionaries(
        st.sampled_from(["type", "labels", "registries", "plans", "x"]) | st.text(max_size=20),
        children, max_size=6,
    )


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    _containers,
    max_leaves=200,
)
_RULES = st.one_of(
    _JSONISH,
    st.fixed_dictionaries(
        {"type": st.sampled_from(RULE_TYPES)},
        optional={
            "labels": st.lists(st.text(max_size=400) | _JSONISH, max_size=70),
            "registries": st.lists(st.text(max_size=400) | _JSONISH, max_size=70),
            "plans": st.lists(st.text(max_size=400), max_size=70),
        },
    ),
)


@given(policy_id=st.text(max_size=200), boundary=st.text(max_size=200), rule=_RULES)
def test_any_row_is_valid_or_invalid_with_a_short_reason(
    policy_id: str, boundary: str, rule: Any
) -> None:
    result = validate_policy(row(id=policy_id, boundary=boundary, rule=rule))
    if isinstance(result, InvalidPolicy):
        assert 0 < len(result.reason) <= 300, result.reason
    else:
        assert object_size(result) <= MAX_OBJECT_BYTES
