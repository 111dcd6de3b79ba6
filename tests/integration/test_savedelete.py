"""Save and delete against the simulator and a real PostgreSQL: immediate fan-out, failures
recorded, scope narrowing, the mass-removal guard, deletion refused until every cluster removed
the policy, and the races between a round and a save or a delete."""

from __future__ import annotations

import pytest

from convergerd.core.report import FanoutResult, FanoutStatus
from convergerd.delivery.apply import Unfenced
from convergerd.delivery.fanout import Saver, fanout_env
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.sim.resources import POLICIES
from convergerd.status.metrics import FanoutMetrics, Metrics
from convergerd.status.probe import Answers
from convergerd.store.store import Store
from tests.integration.rounds_helpers import Rounds, objects, sql
from tests.integration.savedelete_helpers import HookedClusters, make_saver

C1, C2, C3 = "c0001", "c0002", "c0003"
REGS = "policy-p-regs"  # team-a: c0001, c0002, c0003


@pytest.fixture
def saver(rounds: Rounds, store: Store) -> Saver:
    return make_saver(rounds, store)


def results(report: object) -> dict[tuple[str, str], FanoutResult]:
    return {(r.cluster, r.action): r.result for r in report.results}  # type: ignore[attr-defined]


async def deliveries(database_url: str, policy: str) -> dict[str, tuple[int | None, str]]:
    rows = await sql(database_url, "SELECT cluster_id, delivered_revision, last_result "
                     "FROM deliveries WHERE policy_id = $1", policy)
    return {r["cluster_id"]: (r["delivered_revision"], r["last_result"]) for r in rows}


async def test_save_reaches_every_cluster_in_scope_at_once(
    fleet: Fleet, saver: Saver, database_url: str
) -> None:
    report = await saver.save("p-regs")
    assert report.status is FanoutStatus.OK
    assert results(report) == {(c, "apply"): FanoutResult.CREATED for c in (C1, C2, C3)}
    for c in (C1, C2, C3):
        assert REGS in objects(fleet, c)
    assert "policy-p-latest" not in objects(fleet, C1)  # only the saved policy
    assert await deliveries(database_url, "p-regs") == dict.fromkeys((C1, C2, C3), (1, "created"))
    again = await saver.save("p-regs")
    assert results(again) == {(c, "apply"): FanoutResult.UNCHANGED for c in (C1, C2, C3)}


async def test_save_with_a_cluster_down_succeeds_records_it_and_a_round_catches_up(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    fleet.set_faults(C2, Faults(down=True))
    report = await saver.save("p-regs")
    assert report.status is FanoutStatus.PARTIAL
    # Its retries outlast the patience, so the save answers without it (pending: its writes
    # go on) unless the healthy clusters' answers came after the retries ended (failed; a
    # loaded machine). Answering without a hung cluster, on fake time: test_fanout_hung.py.
    down = next(r for r in report.results if r.cluster == C2)
    assert down.result in (FanoutResult.PENDING, FanoutResult.FAILED)
    assert REGS in objects(fleet, C1)
    assert C2 not in await deliveries(database_url, "p-regs")
    await saver.drain()  # its retries end (the save's deadline at the latest): recorded
    recorded = await deliveries(database_url, "p-regs")
    assert recorded[C2] == (None, "failed")
    fleet.clear_faults(C2)
    await rounds.run()
    assert REGS in objects(fleet, C2)
    assert (await deliveries(database_url, "p-regs"))[C2][0] == 1


async def test_scope_narrowing_removes_from_the_dropped_cluster_only(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()
    await sql(database_url, "DELETE FROM boundary_clusters WHERE boundary_id = 'team-a' "
              "AND cluster_id = $1", C3)
    report = await saver.save("p-regs")
    assert results(report) == {(C1, "apply"): FanoutResult.UNCHANGED,
                               (C2, "apply"): FanoutResult.UNCHANGED,
                               (C3, "remove"): FanoutResult.REMOVED}
    assert REGS not in objects(fleet, C3)
    assert "policy-p-latest" in objects(fleet, C3)  # other policies stay
    assert REGS in objects(fleet, C1)
    assert REGS in objects(fleet, C2)
    assert set(await deliveries(database_url, "p-regs")) == {C1, C2}


async def test_an_empty_scope_read_removes_nothing(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()
    await sql(database_url, "DELETE FROM boundary_clusters WHERE boundary_id = 'team-a'")
    report = await saver.save("p-regs")
    assert results(report) == {(c, "remove"): FanoutResult.SKIPPED for c in (C1, C2, C3)}
    assert report.skipped_reason is not None
    assert "empty" in report.skipped_reason
    for c in (C1, C2, C3):
        assert REGS in objects(fleet, c)
    # Said explicitly, the removal happens.
    report = await saver.save("p-regs", allow_mass_removal=True)
    assert results(report) == {(c, "remove"): FanoutResult.REMOVED for c in (C1, C2, C3)}
    assert all(REGS not in objects(fleet, c) for c in (C1, C2, C3))


async def test_invalid_and_unknown_policies_write_nothing(
    fleet: Fleet, saver: Saver, database_url: str
) -> None:
    await sql(database_url, "UPDATE policies SET rule = '{\"type\": \"Nope\"}' WHERE id = $1",
              "p-regs")
    report = await saver.save("p-regs")
    assert report.status is FanoutStatus.INVALID
    assert report.error is not None
    assert "rule.type" in report.error
    assert (await saver.save("p-nope")).status is FanoutStatus.NOT_FOUND
    assert all(not objects(fleet, c) for c in (C1, C2, C3))


async def test_delete_removes_everywhere_then_from_the_database(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()
    report = await saver.delete("p-regs")
    assert report.status is FanoutStatus.OK
    assert results(report) == {(c, "remove"): FanoutResult.REMOVED for c in (C1, C2, C3)}
    assert all(REGS not in objects(fleet, c) for c in (C1, C2, C3))
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") == []
    assert (await saver.delete("p-regs")).status is FanoutStatus.NOT_FOUND


async def test_delete_with_a_cluster_down_is_refused_and_a_retry_completes(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()
    fleet.set_faults(C2, Faults(down=True))
    report = await saver.delete("p-regs")
    assert report.status is FanoutStatus.REFUSED
    assert [r.cluster for r in report.failed] == [C2]
    assert REGS not in objects(fleet, C1)
    [row] = await sql(database_url, "SELECT deleted_at FROM policies WHERE id = 'p-regs'")
    assert row["deleted_at"] is not None  # kept, marked
    # A round meanwhile does not re-create it where it was removed.
    await rounds.run()
    assert REGS not in objects(fleet, C1)
    assert (await saver.save("p-regs")).status is FanoutStatus.DELETING
    fleet.clear_faults(C2)
    report = await saver.delete("p-regs")
    assert report.status is FanoutStatus.OK
    assert all(REGS not in objects(fleet, c) for c in (C1, C2, C3))
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") == []


async def test_fanout_metrics_count_saves_and_deletes(
    fleet: Fleet, rounds: Rounds, store: Store
) -> None:
    metrics = FanoutMetrics()
    saver = make_saver(rounds, store, metrics=metrics)
    await saver.save("p-regs")
    fleet.set_faults(C2, Faults(down=True))
    await saver.delete("p-regs")
    text = _render(metrics)
    assert 'convergerd_saves_total{result="ok",trigger="api"} 1.0' in text
    assert 'convergerd_deletes_total{result="refused"} 1.0' in text
    assert 'convergerd_fanout_duration_seconds_count{operation="save"} 1.0' in text
    assert "p-regs" not in text  # no per-policy label


def _render(metrics: FanoutMetrics) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()


# --- races: a round and a save or a delete ------------------------------------------------


async def save_revision_2(database_url: str, saver: Saver) -> None:
    """p-regs disabled (revision 2) and saved everywhere."""
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")
    assert (await saver.save("p-regs")).status is FanoutStatus.OK


async def save_revision_3(database_url: str, saver: Saver) -> None:
    """p-regs edited to revision 3 and saved everywhere (the racing save of these tests)."""
    await sql(database_url, "UPDATE policies SET rule = $1::jsonb WHERE id = 'p-regs'",
              '{"type": "AllowedRegistries", "registries": ["newer.example.com"]}')
    assert (await saver.save("p-regs")).status is FanoutStatus.OK


async def test_a_save_between_a_rounds_list_and_its_apply_is_not_reverted(
    fleet: Fleet, rounds: Rounds, saver: Saver, store: Store, database_url: str
) -> None:
    await rounds.run()  # revision 1 everywhere
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")  # rev 2

    clusters = HookedClusters(rounds.registry)
    # The round has read revision 2 and listed.
    clusters.hook(C1, after_list=lambda: save_revision_3(database_url, saver))
    metrics = Metrics(state=rounds.state)
    report = await rounds.run(clusters=clusters)
    metrics.observe_round(report)  # the counters, as the round loop does
    c1 = next(c for c in report.clusters if c.cluster == C1)
    assert c1.superseded == 1
    assert c1.failed == 0
    assert objects(fleet, C1)[REGS]["spec"]["revision"] == 3
    assert objects(fleet, C2)[REGS]["spec"]["revision"] == 3  # the save reached it too
    # Superseded is not a failure: not in the failed applies.
    assert b'convergerd_applies_total{cluster="c0001",result="failed"} 0.0' in metrics.render()
    # The round's older record does not overwrite the save's.
    assert (await deliveries(database_url, "p-regs"))[C1][0] == 3


async def test_a_save_between_a_rounds_read_and_its_list_is_not_reverted(
    fleet: Fleet, rounds: Rounds, saver: Saver, store: Store, database_url: str
) -> None:
    await rounds.run()  # revision 1 everywhere

    clusters = HookedClusters(rounds.registry)
    # The round has read revision 1; the save lands before it lists c0001 (a save during a
    # round at fleet scale: every cluster the round has not listed yet).
    clusters.hook(C1, before_list=lambda: save_revision_2(database_url, saver))
    report = await rounds.run(clusters=clusters)
    c1 = next(c for c in report.clusters if c.cluster == C1)
    assert c1.superseded == 1
    assert c1.failed == 0
    assert objects(fleet, C1)[REGS]["spec"]["revision"] == 2
    assert (await deliveries(database_url, "p-regs"))[C1][0] == 2


async def test_a_save_between_a_rounds_check_and_its_create_is_repaired(
    fleet: Fleet, rounds: Rounds, saver: Saver, store: Store, database_url: str
) -> None:
    clusters = HookedClusters(rounds.registry)
    # c0003 holds two policies; the hook runs before its first create lands.
    clusters.hook(C3, before_apply=lambda: save_revision_2(database_url, saver))
    report = await rounds.run(clusters=clusters)
    assert next(c for c in report.clusters if c.cluster == C3).failed == 0
    assert objects(fleet, C3)[REGS]["spec"]["revision"] == 2
    assert objects(fleet, C3)[REGS]["spec"]["enabled"] is False


@pytest.mark.parametrize("when", ["after_list", "before_apply"])
async def test_a_round_concurrent_with_a_delete_does_not_recreate_the_policy(  # noqa: PLR0917
    fleet: Fleet, rounds: Rounds, saver: Saver, store: Store, database_url: str, when: str
) -> None:
    if when == "after_list":
        await rounds.run()  # installed; then drifted, so the round will write it
        fleet.store(C1).delete(POLICIES, None, REGS)
        await rounds.run()
        await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")

    async def delete_it() -> None:
        assert (await saver.delete("p-regs")).status is FanoutStatus.OK

    clusters = HookedClusters(rounds.registry)
    clusters.hook(C1, **{when: delete_it})
    report = await rounds.run(clusters=clusters)
    c1 = next(c for c in report.clusters if c.cluster == C1)
    assert c1.failed == 0
    assert c1.error is None
    assert all(REGS not in objects(fleet, c) for c in (C1, C2, C3))
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") == []



# --- a save writes a new revision at once; reading first only where it may be needless ------


def requests(fleet: Fleet, verb: str) -> dict[str, int]:
    return {c: fleet.accounting.counts(c)[verb] for c in (C1, C2, C3)}


async def test_a_save_of_a_new_revision_writes_each_cluster_with_one_request(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()  # revision 1 everywhere, recorded
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")  # rev 2
    fleet.accounting.reset()
    report = await saver.save("p-regs")
    assert results(report) == {(c, "apply"): FanoutResult.UPDATED for c in (C1, C2, C3)}
    assert requests(fleet, "get") == dict.fromkeys((C1, C2, C3), 0)  # no read first
    assert requests(fleet, "patch") == dict.fromkeys((C1, C2, C3), 1)
    assert all(objects(fleet, c)[REGS]["spec"]["revision"] == 2 for c in (C1, C2, C3))
    # Saved again unchanged: the records say revision 2 is there, so each cluster is read,
    # found unchanged, and not written.
    fleet.accounting.reset()
    again = await saver.save("p-regs")
    assert results(again) == {(c, "apply"): FanoutResult.UNCHANGED for c in (C1, C2, C3)}
    assert requests(fleet, "patch") == dict.fromkeys((C1, C2, C3), 0)


async def test_a_save_overtaken_during_its_fan_out_leaves_the_newest_revision(
    fleet: Fleet, rounds: Rounds, saver: Saver, store: Store, database_url: str
) -> None:
    await saver.save("p-regs")  # revision 1 everywhere, recorded
    await sql(database_url, "UPDATE policies SET enabled = false WHERE id = 'p-regs'")  # rev 2

    clusters = HookedClusters(rounds.registry)
    # Revision 3 is saved everywhere between this save's read of revision 2 and its write to
    # c0001, which lands over it.
    clusters.hook(C1, before_apply=lambda: save_revision_3(database_url, saver))
    hooked = Saver(store=store, guard_share=0.5, env=lambda: fanout_env(
        rounds.settings, clusters, Unfenced(), rounds.metrics))  # type: ignore[arg-type]
    report = await hooked.save("p-regs")
    assert report.status is FanoutStatus.OK
    assert report.revision == 3  # the newest revision was saved, reading every cluster first
    assert results(report) == {(C1, "apply"): FanoutResult.UPDATED,
                               (C2, "apply"): FanoutResult.UNCHANGED,
                               (C3, "apply"): FanoutResult.UNCHANGED}
    for c in (C1, C2, C3):
        assert objects(fleet, c)[REGS]["spec"]["revision"] == 3
    recorded = await deliveries(database_url, "p-regs")
    assert {c: revision for c, (revision, _result) in recorded.items()} == dict.fromkeys(
        (C1, C2, C3), 3)


async def test_the_prober_is_told_which_clusters_a_save_is_about_to_reach(
    rounds: Rounds, store: Store
) -> None:
    """While a save fans out, the prober leaves its clusters to it (their answers tell what a
    probe would); the others, and every cluster once the save answered, are probed as ever."""
    answers = Answers(rounds.metrics)
    clusters = HookedClusters(rounds.registry)
    saver = Saver(store=store, env=lambda: fanout_env(
        rounds.settings, clusters,  # type: ignore[arg-type]  # HookedApi has a save's calls
        Unfenced(), rounds.metrics, expected=answers), guard_share=0.5)
    seen: dict[str, bool] = {}

    async def look() -> None:
        seen.update({c: answers.expected_within(c, 60.0) for c in (C1, C2, C3, "c0004")})

    clusters.hook(C1, before_apply=look)
    await saver.save("p-regs")
    assert seen == {C1: True, C2: True, C3: True, "c0004": False}
    assert not any(answers.expected_within(c, 60.0) for c in (C1, C2, C3))
