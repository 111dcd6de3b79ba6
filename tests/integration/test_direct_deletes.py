"""Rows deleted directly in the database (module-policies or an admin writes the tables): a
policy, cluster or boundary whose policies are installed in clusters is refused with an error
that says how to delete it, so no Policy object is left enforcing with no record of where. The
guarded deletion (the API's) still deletes the row once every cluster removed the policy."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import pytest

from convergerd.core.report import FanoutStatus
from convergerd.delivery.fanout import Saver
from convergerd.sim.faults import Faults
from convergerd.sim.fleet import Fleet
from convergerd.store.store import Store
from tests.integration.rounds_helpers import Rounds, objects, sql
from tests.integration.savedelete_helpers import make_saver

C1, C2, C3 = "c0001", "c0002", "c0003"
REGS = "policy-p-regs"  # team-a: c0001, c0002, c0003


@pytest.fixture
def saver(rounds: Rounds, store: Store) -> Saver:
    return make_saver(rounds, store)


async def holders(database_url: str, policy: str) -> set[str]:
    rows = await sql(database_url, "SELECT cluster_id FROM deliveries WHERE policy_id = $1",
                     policy)
    return {r["cluster_id"] for r in rows}


async def test_a_direct_policy_delete_is_refused_with_how_to_delete_it(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()
    with pytest.raises(asyncpg.RestrictViolationError) as refused:
        await sql(database_url, "DELETE FROM policies WHERE id = 'p-regs'")
    message = str(refused.value)
    assert message.startswith("policy p-regs is installed on 3 cluster(s) "
                              "(c0001, c0002, c0003)")
    assert "`convergerd policy delete p-regs` (DELETE /v1/policies/p-regs)" in message
    # Nothing changed: still installed, still tracked, still delivered by rounds.
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") != []
    assert await holders(database_url, "p-regs") == {C1, C2, C3}
    assert all(REGS in objects(fleet, c) for c in (C1, C2, C3))
    # The same goes for a rename (the old object would be left behind) and for TRUNCATE.
    with pytest.raises(asyncpg.RestrictViolationError):
        await sql(database_url, "UPDATE policies SET id = 'p-other' WHERE id = 'p-regs'")
    # (A plain TRUNCATE is refused before the guard by the exceptions' foreign key; with
    # CASCADE it reaches the guard, which names the way.)
    with pytest.raises(asyncpg.FeatureNotSupportedError, match="foreign key"):
        await sql(database_url, "TRUNCATE policies")
    with pytest.raises(asyncpg.RestrictViolationError, match="TRUNCATE policies"):
        await sql(database_url, "TRUNCATE policies CASCADE")

    # The guarded deletion removes it everywhere, then the row passes.
    assert (await saver.delete("p-regs")).status is FanoutStatus.OK
    assert all(REGS not in objects(fleet, c) for c in (C1, C2, C3))
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") == []


async def test_a_refused_deletion_keeps_the_row_until_every_cluster_removed_it(
    fleet: Fleet, rounds: Rounds, saver: Saver, database_url: str
) -> None:
    await rounds.run()
    fleet.set_faults(C2, Faults(down=True))
    assert (await saver.delete("p-regs")).status is FanoutStatus.REFUSED
    assert await holders(database_url, "p-regs") == {C2}
    with pytest.raises(asyncpg.RestrictViolationError, match=r"on 1 cluster\(s\) \(c0002\)"):
        await sql(database_url, "DELETE FROM policies WHERE id = 'p-regs'")
    fleet.clear_faults(C2)
    assert (await saver.delete("p-regs")).status is FanoutStatus.OK
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") == []


async def test_a_policy_installed_nowhere_is_deleted_directly(
    rounds: Rounds, database_url: str
) -> None:
    # Before any round nothing is delivered: the row is the policy's only trace.
    await sql(database_url, "DELETE FROM policies WHERE id = 'p-regs'")
    assert await sql(database_url, "SELECT id FROM policies WHERE id = 'p-regs'") == []


async def test_clusters_and_boundaries_holding_policies_are_refused(
    fleet: Fleet, rounds: Rounds, database_url: str
) -> None:
    await rounds.run()
    with pytest.raises(asyncpg.RestrictViolationError) as refused:
        await sql(database_url, "DELETE FROM clusters WHERE id = $1", C3)
    assert str(refused.value).startswith(
        "cluster c0003 holds 2 policies convergerd delivered (p-latest, p-regs)")
    assert "DELETE FROM deliveries WHERE cluster_id = 'c0003'" in (refused.value.hint or "")
    with pytest.raises(asyncpg.RestrictViolationError) as refused:
        await sql(database_url, "DELETE FROM boundaries WHERE id = 'team-a'")
    assert str(refused.value).startswith(
        "boundary team-a has policies installed in clusters (p-latest, p-regs)")
    assert await sql(database_url, "SELECT id FROM clusters WHERE id = $1", C3) != []
    assert "policy-p-regs" in objects(fleet, C3)

    # A cluster that is gone for good: its records are forgotten on purpose, then it goes.
    await sql(database_url, "DELETE FROM deliveries WHERE cluster_id = $1", C3)
    await sql(database_url, "DELETE FROM clusters WHERE id = $1", C3)
    assert await sql(database_url, "SELECT id FROM clusters WHERE id = $1", C3) == []


class RecordedMeanwhile(Store):
    """The real store, but just before a deletion finishes a delivery of the policy to c0009 is
    recorded (what a round that listed c0009 meanwhile would record)."""

    async def finish_deletion(self, policy_id: str, removed_from: Sequence[str]) -> bool:
        async with self._acquire() as conn:
            await conn.execute(
                "INSERT INTO deliveries (policy_id, cluster_id, last_result) "
                "VALUES ($1, 'c0009', 'failed')", policy_id)
        return await super().finish_deletion(policy_id, removed_from)


async def test_a_holder_recorded_during_the_deletion_keeps_the_row(
    fleet: Fleet, rounds: Rounds, database_url: str
) -> None:
    await rounds.run()
    store = await RecordedMeanwhile.connect(database_url)
    try:
        report = await make_saver(rounds, store).delete("p-regs")
    finally:
        await store.close()
    assert report.status is FanoutStatus.REFUSED
    assert report.error is not None
    assert "policy p-regs is installed on 1 cluster(s) (c0009)" in report.error
    assert all(REGS not in objects(fleet, c) for c in (C1, C2, C3))
    # Kept and marked, holding only where it may still be; a retry goes there.
    [row] = await sql(database_url, "SELECT deleted_at FROM policies WHERE id = 'p-regs'")
    assert row["deleted_at"] is not None
    assert await holders(database_url, "p-regs") == {"c0009"}
