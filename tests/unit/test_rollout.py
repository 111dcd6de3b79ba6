"""Rollout strategies, waves and due revisions (`convergerd.core.rollout`): parsing names the
field and the value; a cluster's wave is stable and documented; each cluster is due what its
wave and the rollout's state say."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.model import BoundaryId, ClusterId, Enforcement, Policy, PolicyId, Rule
from convergerd.core.rollout import (
    IMPLICIT_REST,
    Due,
    Gates,
    OnHalt,
    Placement,
    Rollout,
    State,
    StrategyError,
    assign,
    cluster_hash,
    due,
    due_by_cluster,
    due_policies,
    due_revision,
    newly_due,
    parse_strategy,
    placements_for,
    strategy_doc,
    wave_of,
)

CAREFUL: dict[str, Any] = {
    "id": "careful",
    "waves": [{"name": "canary", "selector": {"ring": "canary"}},
              {"name": "half", "fraction": 0.5}, {"name": "rest", "fraction": 1.0}],
    "bakeSeconds": 600,
    "gates": {"maxNewViolations": 0, "maxDenials": 0, "maxErrorClusters": 0,
              "maxUnreachedShare": 0.1},
    "onHalt": "revert",
    "approval": ["rest"],
}

cluster_ids = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)


def test_the_spec_example_parses() -> None:
    s = parse_strategy(CAREFUL)
    assert [w.name for w in s.waves] == ["canary", "half", "rest"]
    assert s.waves[0].selector == {"ring": "canary"}
    assert s.waves[1].fraction == 0.5
    assert s.bake_s == 600.0
    assert s.gates == Gates(0, 0, None, 0, 0.1)
    assert s.on_halt is OnHalt.REVERT
    assert s.approval == frozenset({"rest"})
    assert parse_strategy(strategy_doc(s)) == s  # the stored snapshot reads back the same


def test_defaults_and_the_implicit_rest() -> None:
    s = parse_strategy({"id": "rings", "waves": [{"name": "canary",
                                                  "selector": {"ring": "canary"}}]})
    assert [w.name for w in s.waves] == ["canary", IMPLICIT_REST]
    assert s.waves[-1].fraction == 1.0
    assert s.on_halt is OnHalt.PAUSE
    assert s.bake_s == 300.0
    assert s.gates.max_unreached_share == 0.1


@pytest.mark.parametrize(("change", "message"), [
    ({"id": "Bad_Id"}, "id: 'Bad_Id' is not a DNS label"),
    ({"waves": []}, "waves: must be a non-empty list of waves, got []"),
    ({"waves": [{"name": "a", "fraction": 0.5, "selector": {"r": "x"}}]},
     "waves[0] (a): needs exactly one of selector and fraction, got both"),
    ({"waves": [{"name": "a"}]}, "waves[0] (a): needs exactly one of selector and fraction, "
                                 "got neither"),
    ({"waves": [{"name": "a", "fraction": 1.5}]}, "waves[0].fraction: must be above 0 and at "
                                                  "most 1, got 1.5"),
    ({"waves": [{"name": "a", "fraction": 0}]}, "waves[0].fraction: must be above 0"),
    ({"waves": [{"name": "a", "fraction": True}]}, "waves[0].fraction: must be a number, got "
                                                   "True"),
    ({"waves": [{"name": "a", "fraction": 0.6}, {"name": "b", "fraction": 0.5},
                {"name": "c", "fraction": 1.0}]},
     "waves[1].fraction: 0.5 is below the wave before's 0.6"),
    ({"waves": [{"name": "a", "fraction": 0.5}]}, "waves: the last fraction wave must reach "
                                                  "1.0 (every cluster no selector chose), got 0.5"),
    ({"waves": [{"name": "a", "fraction": 0.5}, {"name": "a", "fraction": 1.0}]},
     "waves[1].name: duplicate wave name 'a'"),
    ({"waves": [{"name": "a", "selector": {}}]}, "waves[0].selector: must name at least one"),
    ({"waves": [{"name": "a", "selector": {"ring": "not a value"}}]},
     "waves[0].selector.ring: 'not a value' is not a label value"),
    ({"waves": [{"name": "a", "selector": {"-bad": "x"}}]},
     "waves[0].selector: label key '-bad' is not a valid label key"),
    ({"waves": [{"name": "a", "fraction": 1.0, "wait": 3}]},
     "waves[0]: unknown field(s) wait; known: name, selector, fraction, warnFirst"),
    ({"onHalt": "stop"}, "onHalt: must be one of revert, pause, got 'stop'"),
    ({"approval": ["nope"]}, "approval[0]: no wave named 'nope'; the waves: canary, half, rest"),
    ({"bakeSeconds": -1}, "bakeSeconds: must be at least 0 and at most 604800, got -1"),
    ({"gates": {"maxDenials": -1}}, "gates.maxDenials: must be a whole number from 0 to "
                                    "1000000000, got -1"),
    ({"gates": {"maxUnreachedShare": 2}}, "gates.maxUnreachedShare: must be at least 0 and at "
                                          "most 1, got 2"),
    ({"gates": {"maxDenails": 1}}, "gates: unknown field(s) maxDenails"),
    ({"extra": 1}, "strategy: unknown field(s) extra"),
])
def test_errors_name_the_field_and_the_value(change: dict[str, Any], message: str) -> None:
    with pytest.raises(StrategyError) as caught:
        parse_strategy(CAREFUL | change)
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_hash_is_the_documented_one() -> None:
    import hashlib
    digest = hashlib.sha256(b"c0001").digest()
    assert cluster_hash("c0001") == int.from_bytes(digest[:8], "big") / 2**64
    assert 0 <= cluster_hash("c0001") < 1


def test_a_selector_wins_over_fractions_wherever_its_wave_is() -> None:
    s = parse_strategy({"id": "s", "waves": [
        {"name": "canary", "selector": {"ring": "canary"}}, {"name": "all", "fraction": 1.0},
        {"name": "critical", "selector": {"tier": "critical"}}]})
    assert wave_of(s, "c1", {"ring": "canary", "tier": "critical"}) == 0
    assert wave_of(s, "c1", {"tier": "critical"}) == 2
    assert wave_of(s, "c1", {"ring": "other"}) == 1


@given(st.sets(cluster_ids, min_size=1, max_size=60),
       st.lists(st.floats(0.01, 1.0), min_size=1, max_size=5))
def test_every_cluster_in_exactly_one_wave_and_fractions_cumulative(
        clusters: set[str], fractions: list[float]) -> None:
    cuts = [*sorted(fractions)[:-1], 1.0]
    s = parse_strategy({"id": "s", "waves": [{"name": f"w{i}", "fraction": f}
                                             for i, f in enumerate(cuts)]})
    waves = assign(s, {ClusterId(c): {} for c in clusters})
    assert set(waves) == clusters
    for cluster, wave in waves.items():
        assert 0 <= wave < len(cuts)
        # By the end of wave k, exactly the clusters whose hash is below its fraction.
        for k, cut in enumerate(cuts):
            assert (wave <= k) == (cluster_hash(cluster) < cut)


@given(st.sets(cluster_ids, min_size=1, max_size=60), st.floats(0.01, 0.99),
       st.text(alphabet="abcdefgh", min_size=1, max_size=8))
def test_the_same_clusters_are_early_for_every_policy_and_strategy(
        clusters: set[str], fraction: float, other_id: str) -> None:
    first = parse_strategy({"id": "first", "waves": [{"name": "early", "fraction": fraction},
                                                     {"name": "late", "fraction": 1.0}]})
    other = parse_strategy({"id": other_id, "waves": [
        {"name": "canary", "selector": {"ring": "canary"}},
        {"name": "soon", "fraction": fraction}, {"name": "later", "fraction": 1.0}]})
    unlabelled: dict[ClusterId, dict[str, str]] = {ClusterId(c): {} for c in clusters}
    early = {c for c, w in assign(first, unlabelled).items() if w == 0}
    assert early == {c for c, w in assign(other, unlabelled).items() if w == 1}
    # Adding or removing clusters never moves another one.
    some = dict(list(unlabelled.items())[: len(unlabelled) // 2])
    assert {c for c, w in assign(first, some).items() if w == 0} == early & set(some)


def test_fractions_are_close_to_their_share_over_many_clusters() -> None:
    s = parse_strategy(CAREFUL)
    waves = assign(s, {ClusterId(f"c{i:05d}"): {} for i in range(10_000)})
    half = sum(1 for w in waves.values() if w <= 1) / len(waves)
    assert 0.48 < half < 0.52


def _rollout(state: State, wave: int, **kw: Any) -> Rollout:
    return Rollout(id=1, policy=PolicyId("p"), to_revision=5, from_revision=4,
                   strategy=parse_strategy(CAREFUL), state=state, wave=wave, **kw)


@pytest.mark.parametrize(("state", "current", "cluster", "expected"), [
    (State.PROGRESSING, 1, 0, 5), (State.PROGRESSING, 1, 1, 5), (State.PROGRESSING, 1, 2, 4),
    (State.PAUSED, 1, 1, 5), (State.PAUSED, 1, 2, 4),
    (State.HALTED, 0, 0, 5), (State.HALTED, 0, 1, 4),
    (State.WAITING_APPROVAL, 2, 1, 5), (State.WAITING_APPROVAL, 2, 2, 4),
    (State.REVERTED, 1, 0, 5), (State.REVERTED, 1, 1, 4), (State.REVERTED, 1, 2, 4),
    (State.ABORTED, 2, 0, 4), (State.ABORTED, 2, 2, 4),
    (State.COMPLETED, 2, 2, 5),
])
def test_due_revision_table(state: State, current: int, cluster: int, expected: int) -> None:
    assert due_revision(_rollout(state, current), cluster, 4) == expected


def test_a_cluster_without_a_copy_gets_none_until_its_wave() -> None:
    r = _rollout(State.PROGRESSING, 0)
    assert due_revision(r, 1, None) is None
    assert due_revision(r, 0, None) == 5
    with pytest.raises(ValueError, match="superseded"):
        due_revision(_rollout(State.SUPERSEDED, 0), 0, 4)


def test_the_warn_step_is_the_current_wave_only() -> None:
    r = _rollout(State.PROGRESSING, 1, warn_step=True)
    assert due(r, Placement(0, 4)) == Due(5)
    assert due(r, Placement(1, 4)) == Due(5, warn=True)
    assert due(r, Placement(2, 4)) == Due(4)
    waiting = dataclasses.replace(r, state=State.WAITING_APPROVAL)
    assert due(waiting, Placement(1, 4)) == Due(4)


def test_newly_due_after_a_transition() -> None:
    placements = {ClusterId("a"): Placement(0, 4), ClusterId("b"): Placement(1, 4),
                  ClusterId("c"): Placement(2, None)}
    before = _rollout(State.PROGRESSING, 0)
    advanced = dataclasses.replace(before, wave=1)
    assert newly_due(before, advanced, placements) == {ClusterId("b"): Due(5)}
    reverted = dataclasses.replace(advanced, state=State.REVERTED)
    assert newly_due(advanced, reverted, placements) == {ClusterId("b"): Due(4)}
    done = dataclasses.replace(advanced, wave=2, state=State.COMPLETED)
    assert newly_due(advanced, done, placements) == {ClusterId("c"): Due(5)}
    aborted = dataclasses.replace(done, state=State.ABORTED)
    assert newly_due(done, aborted, placements) == {
        ClusterId("a"): Due(4), ClusterId("b"): Due(4), ClusterId("c"): Due(None)}
    with pytest.raises(ValueError, match="one rollout"):
        newly_due(before, dataclasses.replace(before, id=2), placements)


def test_placements_and_due_policies_share_objects() -> None:
    s = parse_strategy(CAREFUL)
    clusters = [ClusterId(f"c{i}") for i in range(50)]
    placements = placements_for(s, clusters, lambda c: {"ring": "canary"} if c == "c0" else {},
                                lambda c: 4)
    assert placements[ClusterId("c0")] == Placement(0, 4)
    assert len({id(p) for p in placements.values()}) <= 3
    old = Policy(PolicyId("p"), BoundaryId("b"), Rule("ForbidLatestTag"), True, 4)
    new = dataclasses.replace(old, revision=5)
    r = _rollout(State.PROGRESSING, 0, warn_step=True)
    got = due_policies(r, due_by_cluster(r, placements), {4: old, 5: new})
    canary = got[ClusterId("c0")]
    assert canary is not None
    assert canary.revision == 5
    assert canary.enforcement is Enforcement.WARN
    assert {p.revision for c, p in got.items() if c != "c0" and p is not None} == {4}
    assert due_policies(r, {ClusterId("x"): Due(None)}, {}) == {ClusterId("x"): None}
