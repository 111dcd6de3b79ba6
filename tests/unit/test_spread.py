"""The pure parts of a save spread over the shard holders: who writes which cluster, what is
left over for the requester, and how what a peer wrote into the database is read back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convergerd.core.decode import MAX_MESSAGE_CHARS, MAX_REASON_CHARS
from convergerd.core.model import ClusterId
from convergerd.core.report import ClusterResult, FanoutResult
from convergerd.core.save import SaveAction, Work
from convergerd.core.shards import shard_of
from convergerd.core.spread import (
    Part,
    leftover,
    parse_payload,
    payload,
    result_of,
    split,
    work_item,
)

APPLY, REMOVE = SaveAction.APPLY, SaveAction.REMOVE
SHARDS = 4
CLUSTERS = [ClusterId(f"c{n:04d}") for n in range(1, 41)]


def apply(c: str, *, read: bool = False) -> Work:
    return Work(ClusterId(c), APPLY, read)


def ok(c: str, action: SaveAction = APPLY, result: FanoutResult = FanoutResult.CREATED,
       reason: str | None = None) -> ClusterResult:
    return ClusterResult(ClusterId(c), action, result, reason)


def test_split_gives_own_shards_here_others_to_their_live_holders_and_the_rest_here() -> None:
    work = [apply(c) for c in CLUSTERS] + [Work(CLUSTERS[0], REMOVE)]
    holders = ("a", "b", "", "gone")  # gone: holds shard 3, no membership Lease (a `once`)
    found = split(work, shards=SHARDS, identity="a", holders=holders, members={"a", "b"})

    def shard(w: Work) -> int:
        return shard_of(w.cluster, SHARDS)

    assert set(found.here) == {0}
    assert all(shard(w) == 0 for w in found.here[0])
    assert [(p.shard, p.holder) for p in found.parts] == [(1, "b")]
    assert all(shard(w) == 1 for w in found.parts[0].work)
    assert {shard(w) for w in found.unheld} == {2, 3}
    # Every piece of work exactly once.
    everything = [*found.here[0], *found.parts[0].work, *found.unheld]
    assert sorted(everything, key=repr) == sorted(work, key=repr)


def test_split_alone_asks_nobody() -> None:
    work = [apply(c) for c in CLUSTERS]
    found = split(work, shards=SHARDS, identity="a", holders=("a",) * SHARDS, members={"a"})
    assert found.parts == ()
    assert sum(len(ws) for ws in found.here.values()) == len(work)
    with pytest.raises(ValueError, match="3 holders for 4 shards"):
        split(work, shards=SHARDS, identity="a", holders=("a",) * 3, members={"a"})


PARTS = (Part(1, "b", (apply("c1"), apply("c2"), Work(ClusterId("c3"), REMOVE))),
         Part(2, "c", (apply("c4"),)))


@pytest.mark.parametrize(("done", "answered", "used", "left"), [
    # Nothing done in time: everything is left over.
    (set(), [ok("c1"), ok("c4")], [], ["c1", "c2", "c3", "c4"]),
    # A done part's answers are used; its unanswered cluster and the other part are left.
    ({1}, [ok("c1"), ok("c3", REMOVE, FanoutResult.REMOVED)], ["c1", "c3"], ["c2", "c4"]),
    # An answer for a cluster of a part not done, or of no part, is not used.
    ({1}, [ok("c4"), ok("c9")], [], ["c1", "c2", "c3", "c4"]),
    # An answer for another action is no answer for this one.
    ({1, 2}, [ok("c3"), ok("c4")], ["c4"], ["c1", "c2", "c3"]),
    # Refused by the peer's fence: the requester writes it; other failures are answers.
    ({1, 2}, [ok("c1", result=FanoutResult.FAILED, reason="fenced"),
              ok("c2", result=FanoutResult.FAILED, reason="timeout"), ok("c4")],
     ["c2", "c4"], ["c1", "c3"]),
    # Declined (done, no results): all of it left over at once.
    ({1, 2}, [], [], ["c1", "c2", "c3", "c4"]),
])
def test_leftover(done: set[int], answered: list[ClusterResult], used: list[str],
                  left: list[str]) -> None:
    got_used, got_left = leftover(PARTS, done, answered)
    assert [r.cluster for r in got_used] == used
    assert [w.cluster for w in got_left] == left


def test_a_cluster_answered_twice_is_used_once() -> None:
    used, left = leftover(PARTS[1:], {2}, [ok("c4"), ok("c4", result=FanoutResult.UPDATED)])
    assert used == [ok("c4")]
    assert left == []


@pytest.mark.parametrize("row", [
    ("c1", "apply", "removed", None, None),  # not a result an apply has
    ("c1", "remove", "created", None, None),
    ("c1", "delete", "removed", None, None),
    ("c1", "apply", "splendid", None, None),
    ("c1", "apply", None, None, None),
    (None, "apply", "created", None, None),
    ("c1", 7, "created", None, None),
    ("c1", "apply", 7, None, None),
])
def test_a_result_row_that_is_no_result_is_dropped(row: tuple[object, ...]) -> None:
    assert result_of(*row) is None


def test_a_result_rows_texts_are_cleaned_and_capped() -> None:
    found = result_of("c1", "apply", "failed", "bad\x00reason" + "r" * 500,
                      "line\nbreak\x1b[31m" + "e" * 5000)
    assert found is not None
    assert found.result is FanoutResult.FAILED
    assert found.reason is not None
    assert found.error is not None
    assert "\x00" not in found.reason
    assert len(found.reason) <= 128
    assert "\n" not in found.error
    assert "\x1b" not in found.error
    assert len(found.error) <= 500
    assert result_of("c1", "apply", "created", 5, None) == ok("c1")


def test_work_items_are_read_only_for_the_holders_shard() -> None:
    mine = next(c for c in CLUSTERS if shard_of(c, SHARDS) == 1)
    other = next(c for c in CLUSTERS if shard_of(c, SHARDS) != 1)
    assert work_item(mine, "apply", True, shard=1, shards=SHARDS) == apply(mine, read=True)
    assert work_item(mine, "remove", True, shard=1, shards=SHARDS) == Work(mine, REMOVE)
    for row in [(other, "apply", False), (mine, "drop", False), (mine, "apply", "yes"),
                ("Not A Label", "apply", False), (None, "apply", False),
                ("x" * 64, "apply", False)]:
        assert work_item(*row, shard=1, shards=SHARDS) is None


@pytest.mark.parametrize(("text", "parsed"), [
    (payload("part", 12), ("part", 12)),
    ("done 9", ("done", 9)),
    ("done 999999999999999999", ("done", 999_999_999_999_999_999)),
    ("done 0", None),
    ("done 1234567890123456789", None),  # beyond a bigint
    ("part 012", None),
    ("part  12", None),
    ("part 12\n", None),
    ("stop 12", None),
    ("part 1" + " " * 100, None),
    ("", None),
])
def test_payloads(text: str, parsed: tuple[str, int] | None) -> None:
    assert parse_payload(text) == parsed


# What a peer or the channel may hand over: any text (or not text at all), long ones included.
_ANY = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=300),
                 st.text(alphabet="0123456789", min_size=1, max_size=5000))


@given(st.text(max_size=300) | st.text(alphabet="part done0123456789", max_size=60)
       | st.just("part " + "9" * 5000))
def test_any_payload_decodes_to_a_known_kind_and_id_or_to_none(text: str) -> None:
    found = parse_payload(text)
    assert found is None or (found[0] in ("part", "done") and payload(*found) == text)


@given(_ANY, _ANY, _ANY, _ANY, _ANY)
def test_any_result_row_decodes_to_a_bounded_result_or_to_none(
    cluster: object, action: object, result: object, reason: object, error: object
) -> None:
    found = result_of(cluster, action, result, reason, error)
    if found is not None:
        assert found.action in (APPLY, REMOVE)
        assert len(found.reason or "") <= MAX_REASON_CHARS
        assert len(found.error or "") <= MAX_MESSAGE_CHARS


@given(_ANY, _ANY, _ANY)
def test_any_item_row_decodes_to_work_of_its_shard_or_to_none(
    cluster: object, action: object, read: object
) -> None:
    found = work_item(cluster, action, read, shard=1, shards=SHARDS)
    assert found is None or shard_of(found.cluster, SHARDS) == 1

