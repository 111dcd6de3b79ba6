"""Rollouts against the simulator and a real PostgreSQL (issue 37, items 2-3): a save with a
three-wave strategy writes only its first wave; rounds keep every other cluster at the revision
it had and repair drift to that revision, not the newest; a transition makes the next wave due
(written at once); a newer save supersedes from where each cluster is; a deletion aborts;
`--now` skips the waves; retention keeps what a rollout refers to; a policy without a strategy
is saved exactly as before."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from convergerd.core.errors import Fenced
from convergerd.core.model import ClusterId
from convergerd.core.report import ApplyResult, FanoutResult, FanoutStatus
from convergerd.core.rollout import Due, State, assign, newly_due, parse_strategy
from convergerd.delivery.apply import Unfenced
from convergerd.delivery.fanout import UNDELIVERABLE, Saver
from convergerd.delivery.rollouts import RolloutGates
from convergerd.leader.elector import NoElection
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES
from convergerd.store.importer import ImportFileError
from convergerd.store.rollouts import TRANSITION_TIMEOUT_MAX_S, statement_timeout_ms
from convergerd.store.store import Store
from tests.integration.rounds_helpers import (
    Rounds,
    import_doc,
    objects,
    settings_for,
    sql,
    wait_for,
    writes,
)
from tests.integration.savedelete_helpers import HookedClusters, make_saver

MERGE_PATCH = "application/merge-patch+json"
N = 12
CLUSTERS = [f"c{i:04d}" for i in range(1, N + 1)]
CANARY = "c0001"
NAME = "policy-p-regs"
STRATEGY: dict[str, Any] = {
    "id": "careful",
    "waves": [{"name": "canary", "selector": {"ring": "canary"}},
              {"name": "half", "fraction": 0.5}, {"name": "rest", "fraction": 1.0}],
    "bakeSeconds": 0, "onHalt": "revert",
}
WAVES = assign(parse_strategy(STRATEGY),
               {ClusterId(c): {"ring": "canary"} if c == CANARY else {} for c in CLUSTERS})
HALF = sorted(c for c, w in WAVES.items() if w == 1)
REST = sorted(c for c, w in WAVES.items() if w == 2)


def doc(registry: str, *, strategy: str | None = "careful") -> dict[str, Any]:
    policy: dict[str, Any] = {"id": "p-regs", "boundary": "team-a",
                              "rule": {"type": "AllowedRegistries", "registries": [registry]}}
    if strategy is not None:
        policy["rolloutStrategy"] = strategy
    return {
        "clusters": [{"id": c, "labels": {"ring": "canary"}} if c == CANARY else c
                     for c in CLUSTERS],
        "boundaries": [{"id": "team-a", "clusters": CLUSTERS}],
        "rolloutStrategies": [STRATEGY],
        "policies": [policy],
    }


@pytest.fixture
async def twelve(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with Fleet(clusters=N, kubeconfig_path=tmp_path / "kubeconfig",
                     rng=random.Random(37), bookmark_interval_s=1.0) as f:
        yield f


@pytest.fixture
async def rounds(twelve: Fleet, database_url: str, store: Store) -> AsyncIterator[Rounds]:
    """Revision 1 of p-regs, without a strategy, delivered everywhere by a round."""
    assert HALF, WAVES  # the hash puts clusters in both fraction waves
    assert REST, WAVES
    await import_doc(database_url, doc("one.example.com", strategy=None))
    harness = Rounds(twelve, store, settings_for(twelve.kubeconfig_path, database_url))
    await harness.run()
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
def saver(rounds: Rounds, store: Store) -> Saver:
    return make_saver(rounds, store)


def revisions(sim: Fleet) -> dict[str, int | None]:
    """Each cluster's copy of p-regs: its revision (None: no copy)."""
    out: dict[str, int | None] = {}
    for c in CLUSTERS:
        found = objects(sim, c).get(NAME)
        out[c] = found["spec"]["revision"] if found else None
    return out


def expect(by_wave: dict[int, int | None]) -> dict[str, int | None]:
    return {c: by_wave[WAVES[ClusterId(c)]] for c in CLUSTERS}


async def events(database_url: str) -> list[str]:
    rows = await sql(database_url, "SELECT what FROM rollout_events ORDER BY at, rollout_id")
    return [r["what"] for r in rows]


async def advance(store: Store, saver: Saver, policy: str = "p-regs") -> None:
    """What the gate job does when a wave passes: the transition, then the newly due clusters
    written at once."""
    staged = await store.staged_rollout(policy)
    assert staged is not None
    before = staged.rollout
    after = await store.transition_rollout(
        before, dataclasses.replace(before, wave=before.wave + 1), by="test", what="advanced",
        remaining_s=lambda: 10.0)
    assert after is not None
    due = newly_due(before, after, staged.placements)
    assert due
    report = await saver.deliver_due(policy, list(due))
    assert report.status is FanoutStatus.OK, report


async def test_a_three_wave_rollout_keeps_each_cluster_at_its_due_revision(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)
    await import_doc(database_url, doc("two.example.com"))
    twelve.accounting.reset()

    report = await saver.save("p-regs")
    assert report.status is FanoutStatus.OK
    assert [r.cluster for r in report.results] == [CANARY]  # the canary's wave only
    assert report.rollout is not None
    assert report.rollout["started"]
    assert report.rollout["wave_name"] == "canary"
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})
    assert sum(writes(twelve, c) for c in CLUSTERS) == 1

    # Rounds keep the later waves at revision 1: nothing to write.
    twelve.accounting.reset()
    await rounds.run()
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})
    assert sum(writes(twelve, c) for c in CLUSTERS) == 0

    # Drift in a later wave is repaired to the due revision (1), not to the newest.
    edited, deleted = REST[0], HALF[0]
    twelve.store(edited).patch(
        POLICIES, None, NAME,
        json.dumps({"spec": {"rule": {"registries": ["evil.example.com"]}}}).encode(),
        content_type=MERGE_PATCH, manager="kubectl-edit", force=None)
    twelve.store(deleted).delete(POLICIES, None, NAME)
    await rounds.run()
    for cluster in (edited, deleted):
        spec = objects(twelve, cluster)[NAME]["spec"]
        assert (spec["revision"], spec["rule"]["registries"]) == (1, ["one.example.com"])
    assert objects(twelve, CANARY)[NAME]["spec"]["rule"]["registries"] == ["two.example.com"]

    # The gate job's transition to the next wave: its clusters get revision 2 at once.
    await advance(store, saver)
    assert revisions(twelve) == expect({0: 2, 1: 2, 2: 1})
    await rounds.run()
    assert revisions(twelve) == expect({0: 2, 1: 2, 2: 1})

    # A newer save supersedes from where each cluster is: the canary gets 3, the half keeps
    # 2, the rest keeps 1.
    await import_doc(database_url, doc("three.example.com"))
    third = await saver.save("p-regs")
    assert [r.cluster for r in third.results] == [CANARY]
    assert revisions(twelve) == expect({0: 3, 1: 2, 2: 1})
    await rounds.run()
    assert revisions(twelve) == expect({0: 3, 1: 2, 2: 1})
    states = await sql(database_url, "SELECT to_revision, state FROM rollouts ORDER BY id")
    assert [(r["to_revision"], r["state"]) for r in states] == [(2, "superseded"),
                                                                (3, "progressing")]
    await advance(store, saver)
    await advance(store, saver)
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)

    assert await events(database_url) == ["started", "advanced", "superseded", "started",
                                          "advanced", "advanced"]


async def test_a_repeated_save_follows_its_rollout_and_a_deletion_aborts_it(
    rounds: Rounds, twelve: Fleet, saver: Saver, database_url: str
) -> None:
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    again = await saver.save("p-regs", trigger="notify")  # the listener, after the API
    assert again.rollout is not None
    assert not again.rollout["started"]
    assert [(r.cluster, r.result.value) for r in again.results] == [(CANARY, "unchanged")]
    assert len(await sql(database_url, "SELECT id FROM rollouts")) == 1

    deleted = await saver.delete("p-regs")
    assert deleted.status is FanoutStatus.OK
    assert revisions(twelve) == dict.fromkeys(CLUSTERS)
    rows = await sql(database_url, "SELECT state, reason FROM rollouts")
    assert [(r["state"], r["reason"]) for r in rows] == [("aborted",
                                                          "the policy is being deleted")]


async def test_rollback_now_skips_the_waves(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})
    done = await store.rollback("p-regs", 1, actor="test (rollback to 1)")
    assert done.changed
    report = await saver.save("p-regs", now=True)
    assert report.rollout is None
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)
    rows = await sql(database_url, "SELECT to_revision, state FROM rollouts ORDER BY id")
    assert [(r["to_revision"], r["state"]) for r in rows] == [(2, "superseded"),
                                                              (3, "completed")]
    # The listener's save of the same revision finds it delivered: no rollout starts.
    again = await saver.save("p-regs", trigger="notify")
    assert again.rollout is not None
    assert again.rollout["state"] == "completed"
    await rounds.run()
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)


async def test_a_policy_without_a_strategy_goes_everywhere_and_ends_a_rollout(
    rounds: Rounds, twelve: Fleet, saver: Saver, database_url: str
) -> None:
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    await import_doc(database_url, doc("three.example.com", strategy=None))
    report = await saver.save("p-regs")
    assert report.rollout is None
    assert {r.cluster for r in report.results} == set(CLUSTERS)
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)
    rows = await sql(database_url, "SELECT state FROM rollouts")
    assert [r["state"] for r in rows] == ["superseded"]
    await rounds.run()
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 3)


async def test_a_round_before_the_save_writes_nothing_new(
    rounds: Rounds, twelve: Fleet, database_url: str
) -> None:
    """The new revision is stored and its save has not run yet (a round read it between):
    rounds do not deliver a revision its save has not staged."""
    await import_doc(database_url, doc("two.example.com"))
    report = await rounds.run()
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)
    assert all(o.desired == 0 for o in report.clusters)


async def test_a_round_that_read_the_wave_before_it_moved_on_sends_no_cluster_back(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    """The round read the canary's wave; the next wave was made due and written before the
    round listed a cluster of it: the round leaves that cluster at the new revision."""
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    clusters = HookedClusters(rounds.registry)
    clusters.hook(HALF[0], before_list=lambda: advance(store, saver))
    report = await rounds.run(clusters=clusters)
    assert revisions(twelve) == expect({0: 2, 1: 2, 2: 1})
    assert next(o for o in report.clusters if o.cluster == HALF[0]).superseded == 1


async def test_transitions_are_compare_and_set_under_the_fence(
    rounds: Rounds, saver: Saver, store: Store, database_url: str
) -> None:
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    staged = await store.staged_rollout("p-regs")
    assert staged is not None
    before = staged.rollout
    halted = dataclasses.replace(before, state=State.HALTED, reason="gate: denials 3 > 0")

    def fenced() -> float:
        raise Fenced("not the leader")

    with pytest.raises(Fenced):
        await store.transition_rollout(before, halted, by="gate", what="halted",
                                       remaining_s=fenced)
    assert (await store.rollout_of("p-regs")).state is State.PROGRESSING  # type: ignore[union-attr]
    first = await store.transition_rollout(before, halted, by="gate", what="halted",
                                           remaining_s=lambda: 5.0)
    assert first is not None
    assert (first.state, first.reason) == (State.HALTED, "gate: denials 3 > 0")
    # A second writer with the same view (a replica that lost the lease) changes nothing.
    assert await store.transition_rollout(before, halted, by="gate", what="halted",
                                          remaining_s=lambda: 5.0) is None
    assert await events(database_url) == ["started", "halted"]
    assert [r.id for r in await store.live_rollouts()] == [before.id]


async def test_a_reverted_wave_holds_and_retention_keeps_what_it_refers_to(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    staged = await store.staged_rollout("p-regs")
    assert staged is not None
    before = staged.rollout
    after = await store.transition_rollout(
        before, dataclasses.replace(before, state=State.REVERTED), by="gate", what="reverted",
        remaining_s=lambda: 5.0)
    assert after is not None
    due = newly_due(before, after, staged.placements)
    assert due == {ClusterId(CANARY): Due(1)}
    await saver.deliver_due("p-regs", list(due))
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)
    await rounds.run()
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)  # rounds keep the revert
    # Keep one revision per policy: revision 1 stays, the reverted rollout's clusters hold it.
    await store.prune_revisions(keep_last=1, max_age_days=0, batches=5)
    kept = await sql(database_url, "SELECT revision FROM policy_revisions "
                                   "WHERE policy_id = 'p-regs' ORDER BY revision")
    assert [r["revision"] for r in kept] == [1, 2]


async def test_an_unknown_strategy_is_refused_by_import_and_invalid_in_the_database(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    bad = doc("two.example.com", strategy="nope")
    with pytest.raises(ImportFileError, match=r"policies\[0\] \(id 'p-regs'\): "
                       r"rolloutStrategy: unknown strategy 'nope'"):
        await import_doc(database_url, bad)
    await sql(database_url, "UPDATE policies SET rollout_strategy = 'nope'")
    fleet = await store.load_fleet()
    assert [(p.id, p.reason) for p in fleet.invalid] == [
        ("p-regs", "rollout_strategy: unknown strategy 'nope'")]
    report = await saver.save("p-regs")
    assert report.status is FanoutStatus.INVALID
    assert report.error == "rollout_strategy: unknown strategy 'nope'"
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)


async def test_a_cluster_joining_mid_rollout_is_placed_by_its_labels(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    """The scope rule: a cluster that joins the policy's boundary during a rollout gets its wave
    from its labels now, and the rollout's previous revision until that wave comes."""
    await import_doc(database_url, {**doc("two.example.com"), "boundaries": [
        {"id": "team-a", "clusters": [c for c in CLUSTERS if c != REST[-1]]}]})
    await saver.save("p-regs")  # it left the scope: the save removed its copy
    assert revisions(twelve)[REST[-1]] is None
    await sql(database_url, "INSERT INTO boundary_clusters VALUES ('team-a', $1)", REST[-1])
    report = await rounds.run()
    joined = next(o for o in report.clusters if o.cluster == REST[-1])
    assert [(d.revision, d.result) for d in joined.deliveries] == [(1, ApplyResult.CREATED)]
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})


async def test_a_transition_under_an_open_fence_is_written_with_a_bounded_timeout(
    rounds: Rounds, saver: Saver, store: Store, database_url: str
) -> None:
    """A replica without leader election (its fence allows forever) and a command's writer
    call `transition_rollout` with the fence as it is: the statement timeout is capped."""
    await import_doc(database_url, doc("two.example.com"))
    await saver.save("p-regs")
    staged = await store.staged_rollout("p-regs")
    assert staged is not None
    before = staged.rollout
    paused = dataclasses.replace(before, state=State.PAUSED, reason="paused by test")
    written = await store.transition_rollout(
        before, paused, by="test", what="pause",
        remaining_s=NoElection(identity="test").fence().remaining_s)
    assert written is not None
    assert written.state is State.PAUSED
    resumed = await store.transition_rollout(
        written, dataclasses.replace(written, state=State.PROGRESSING), by="test",
        what="resume", remaining_s=Unfenced().remaining_s)
    assert resumed is not None
    assert resumed.state is State.PROGRESSING
    assert await events(database_url) == ["started", "pause", "resume"]
    cap_ms = int(TRANSITION_TIMEOUT_MAX_S * 1000)
    assert [statement_timeout_ms(s) for s in (math.inf, math.nan, 1e9, 2.5, 0.0001, 0.0)] == [
        cap_ms, cap_ms, cap_ms, 2500, 1, 1]


async def test_a_due_revision_that_cannot_be_delivered_is_left_and_no_copy_is_removed(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    """`deliver_due` after a revert: a cluster due a revision whose content cannot be
    delivered keeps what it holds (reported `skipped`); a cluster due no copy (a new policy
    sent back) has its copy removed."""
    new_policy = {"id": "p-new", "boundary": "team-a", "rolloutStrategy": "careful",
                  "rule": {"type": "AllowedRegistries", "registries": ["new.example.com"]}}
    two = doc("two.example.com")
    await import_doc(database_url, {**two, "policies": [*two["policies"], new_policy]})
    for policy in ("p-regs", "p-new"):
        saved = await saver.save(policy)
        assert saved.status is FanoutStatus.OK
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})
    assert sorted(c for c in CLUSTERS if "policy-p-new" in objects(twelve, c)) == [CANARY]
    # Revision 1 of p-regs is no longer kept (deleted by SQL): the canary's previous revision
    # cannot be delivered.
    await sql(database_url, "DELETE FROM policy_revisions "
                            "WHERE policy_id = 'p-regs' AND revision = 1")

    async def revert(policy: str) -> list[ClusterId]:
        staged = await store.staged_rollout(policy)
        assert staged is not None
        before = staged.rollout
        after = await store.transition_rollout(
            before, dataclasses.replace(before, state=State.REVERTED), by="gate",
            what="halt", remaining_s=lambda: 5.0)
        assert after is not None
        return list(newly_due(before, after, staged.placements))

    due = await revert("p-regs")
    assert due == [ClusterId(CANARY)]
    twelve.accounting.reset()
    report = await saver.deliver_due("p-regs", due)
    assert report.status is FanoutStatus.PARTIAL
    assert [(r.cluster, r.action.value, r.result, r.reason) for r in report.results] == [
        (CANARY, "apply", FanoutResult.SKIPPED, UNDELIVERABLE)]
    assert "revision 1 cannot be delivered" in (report.results[0].error or "")
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})  # left as it was, not removed
    assert writes(twelve, CANARY) == 0

    due = await revert("p-new")
    report = await saver.deliver_due("p-new", due)
    assert report.status is FanoutStatus.OK
    assert [(r.cluster, r.result) for r in report.results] == [(CANARY, FanoutResult.REMOVED)]
    assert all("policy-p-new" not in objects(twelve, c) for c in CLUSTERS)


async def test_a_revision_whose_save_never_ran_is_saved_by_the_gate_job(
    rounds: Rounds, twelve: Fleet, saver: Saver, store: Store, database_url: str
) -> None:
    """A revision written by SQL, as a writer outside convergerd writes one: its notification
    goes nowhere (no listener here, as when it is lost). Rounds keep every cluster at what it
    was due; the leader's gate job notices the revision has a strategy and no rollout and
    saves it: its rollout starts, its first wave is written, once even if two leaders do it."""
    await import_doc(database_url, doc("one.example.com"))  # the strategy named: no revision
    await saver.save("p-regs")  # revision 1 is out already: a completed row records it
    await sql(database_url, """UPDATE policies SET rule = '{"type": "AllowedRegistries",
              "registries": ["two.example.com"]}' WHERE id = 'p-regs'""")
    twelve.accounting.reset()
    await rounds.run()
    assert revisions(twelve) == dict.fromkeys(CLUSTERS, 1)  # not the newest, anywhere
    assert sum(writes(twelve, c) for c in CLUSTERS) == 0

    def gate_job(identity: str, unsaved_after_s: float) -> RolloutGates:
        return RolloutGates(store=store, state=rounds.state, saver=saver,
                            leader=NoElection(identity=identity), period_s=0.05,
                            identity=identity, unsaved_after_s=unsaved_after_s)

    # A revision written moments ago is left to its own save.
    assert await gate_job("leader", 60.0).start_unsaved() == []
    # Two gate jobs at once (an old leader's pass and the new one's): one rollout starts.
    first, second = gate_job("old-leader", 0.0), gate_job("new-leader", 0.0)
    reports = [r for done in await asyncio.gather(first.start_unsaved(),
                                                  second.start_unsaved()) for r in done]
    assert [r.policy for r in reports if r.rollout and r.rollout["started"]] == ["p-regs"]
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})
    rows = await sql(database_url, "SELECT to_revision, state FROM rollouts ORDER BY id")
    assert [(r["to_revision"], r["state"]) for r in rows] == [(1, "completed"),
                                                              (2, "progressing")]
    assert await first.start_unsaved() == []  # it has its rollout now
    await rounds.run()
    assert revisions(twelve) == expect({0: 2, 1: 1, 2: 1})  # rounds follow it

    # A new policy created by SQL with a strategy, its save never run: rounds write it
    # nowhere; the gate job's run (its loop, as the daemon runs it) starts it at the canary.
    await sql(database_url, """INSERT INTO policies (id, boundary_id, rule, rollout_strategy)
              VALUES ('p-new', 'team-a', '{"type": "AllowedRegistries",
              "registries": ["new.example.com"]}', 'careful')""")
    await rounds.run()
    assert all("policy-p-new" not in objects(twelve, c) for c in CLUSTERS)
    job = asyncio.create_task(gate_job("leader", 0.0).run())
    try:
        await wait_for(lambda: "policy-p-new" in objects(twelve, CANARY),
                       what="the gate job saved p-new")
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
    await rounds.run()
    assert sorted(c for c in CLUSTERS if "policy-p-new" in objects(twelve, c)) == [CANARY]
    rows = await sql(database_url, "SELECT e.by FROM rollout_events e JOIN rollouts r "
                                   "ON r.id = e.rollout_id WHERE r.policy_id = 'p-new'")
    assert [r["by"] for r in rows] == ["save (unsaved)"]
