"""The master's pure decisions: cutting, folding, requeueing, passes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.master import plan
from streamtrain.schemas import PartitionCursor, TaskRecord


def live(next_: int = 0, trained: int = 0) -> PartitionCursor:
    return PartitionCursor("clicks", 0, next_, trained, 0)


def test_cut_makes_full_tasks_and_holds_the_partial_head_until_linger_is_due() -> None:
    tasks, cursor = plan.cut(live(), end=2500, max_records=1000, linger_due=False, budget=10)
    assert [(t.start, t.end) for t in tasks] == [(0, 1000), (1000, 2000)]
    assert cursor.next == 2000
    tasks, cursor = plan.cut(cursor, end=2500, max_records=1000, linger_due=True, budget=10)
    assert [(t.start, t.end) for t in tasks] == [(2000, 2500)]
    assert cursor.next == 2500


def test_cut_respects_the_budget_so_a_backlog_stays_in_kafka() -> None:
    tasks, cursor = plan.cut(live(), end=10_000, max_records=100, linger_due=True, budget=3)
    assert len(tasks) == 3 and cursor.next == 300


def test_bounded_input_cuts_its_last_partial_task_without_lingering_and_never_passes_stop() -> None:
    bounded = PartitionCursor.fresh("clicks", 2, origin=10, stop=2510)
    tasks, cursor = plan.cut(bounded, end=9_999, max_records=1000, linger_due=False, budget=10)
    assert [(t.start, t.end) for t in tasks] == [(10, 1010), (1010, 2010), (2010, 2510)]
    assert cursor.next == 2510
    assert plan.cut(cursor, end=9_999, max_records=1000, linger_due=True, budget=10)[0] == []


def test_cut_rounds_interleave_partitions_so_claims_follow_arrival_not_partition() -> None:
    heads = [plan.Head(PartitionCursor("clicks", p, 0, 0, 0), end=3000, linger_due=False)
             for p in (0, 1)]
    rounds, moved = plan.cut_rounds(heads, max_records=1000, budget=10)
    assert [[(t.partition, t.start) for t in r] for r in rounds] == [
        [(0, 0), (1, 0)], [(0, 1000), (1, 1000)], [(0, 2000), (1, 2000)]]
    assert [c.next for c in moved] == [3000, 3000]


def test_cut_rounds_share_the_budget_and_serve_the_partition_furthest_behind_first() -> None:
    heads = [plan.Head(PartitionCursor("clicks", 0, 0, 0, 0), end=2000, linger_due=True),
             plan.Head(PartitionCursor("clicks", 1, 0, 0, 0), end=5000, linger_due=True)]
    rounds, moved = plan.cut_rounds(heads, max_records=1000, budget=3)
    assert [[(t.partition, t.start) for t in r] for r in rounds] == [[(1, 0), (0, 0)], [(1, 1000)]]
    assert [c.next for c in moved] == [1000, 2000]
    # One task of room, as when a trainer has just finished one: the one further behind.
    rounds, _ = plan.cut_rounds([plan.Head(c, h.end, True) for c, h in zip(moved, heads)], 1000, 1)
    assert [(t.partition, t.start) for r in rounds for t in r] == [(1, 2000)]


def test_cut_rounds_with_nothing_to_cut_or_no_budget_leave_the_cursors() -> None:
    head = plan.Head(live(), end=500, linger_due=False)
    assert plan.cut_rounds([head], max_records=1000, budget=5) == ([], [head.cursor])
    assert plan.cut_rounds([plan.Head(live(), 5000, True)], 1000, 0) == ([], [live()])


@settings(max_examples=200, deadline=None)
@given(ends=st.lists(st.integers(0, 5000), min_size=1, max_size=6), budget=st.integers(0, 40),
       linger=st.booleans())
def test_cut_rounds_cut_what_cut_would_per_partition_within_the_budget(ends, budget, linger) -> None:
    heads = [plan.Head(PartitionCursor("clicks", p, 0, 0, 0), end, linger) for p, end in enumerate(ends)]
    rounds, moved = plan.cut_rounds(heads, max_records=700, budget=budget)
    cut = [t for r in rounds for t in r]
    assert len(cut) <= budget and all(r for r in rounds)
    for head, cursor in zip(heads, moved):
        mine = [t for t in cut if t.partition == head.cursor.partition]
        alone, _ = plan.cut(head.cursor, head.end, 700, linger, len(mine))
        assert mine == alone and cursor.next == (mine[-1].end if mine else 0)
        # A partition's k-th task is in round k: rounds never skip one.
        assert [k for k, r in enumerate(rounds) for t in r if t in mine] == list(range(len(mine)))
    if len(cut) < budget:
        assert all(len(plan.cut(c, h.end, 700, linger, 1)[0]) == 0 for c, h in zip(moved, heads))


@settings(max_examples=200, deadline=None)
@given(ends=st.lists(st.integers(0, 3000), min_size=1, max_size=5), max_ops=st.integers(2, 12))
def test_transactions_keep_the_order_fit_max_ops_and_carry_the_cursor_over_their_tasks(ends, max_ops) -> None:
    heads = [plan.Head(PartitionCursor("clicks", p, 0, 0, 0), end, True) for p, end in enumerate(ends)]
    tasks = [t for r in plan.cut_rounds(heads, max_records=100, budget=200)[0] for t in r]
    txns = plan.transactions(tasks, max_ops)
    assert [t for batch, _ in txns for t in batch] == tasks and all(batch for batch, _ in txns)
    for (batch, cursors), after in zip(txns, [b[0] for b, _ in txns[1:]] + [None]):
        assert len(batch) + len(cursors) <= max_ops
        # As full as it can be: the next task, with its cursor if it is new, would not fit.
        if after is not None:
            assert len(batch) + 1 + len(cursors | {(after.topic, after.partition): 0}) > max_ops
        assert cursors == {(t.topic, t.partition): max(u.end for u in batch if u.partition == t.partition)
                           for t in batch}


def test_transactions_need_room_for_a_task_and_its_cursor() -> None:
    tasks = plan.cut(live(), end=300, max_records=100, linger_due=False, budget=10)[0]
    assert plan.transactions(tasks, 2) == [([t], {("clicks", 0): t.end}) for t in tasks]
    assert plan.transactions([], 2) == []
    with pytest.raises(ValueError):
        plan.transactions(tasks, 1)


def test_task_ids_carry_the_pass_from_the_second_pass_on() -> None:
    second = PartitionCursor("clicks", 0, 0, 0, 0, stop=5, pass_no=1)
    tasks, _ = plan.cut(second, end=5, max_records=10, linger_due=False, budget=1)
    assert tasks[0].task_id == "clicks:0:00000000000000000000:1"


def test_fold_advances_over_contiguous_resolved_tasks_and_stops_at_a_gap() -> None:
    done = [TaskRecord.for_range("clicks", 0, s, s + 10) for s in (0, 10, 30)]
    cursor, folded = plan.fold(live(next_=40), done)
    assert cursor.trained == 20
    assert [t.start for t in folded] == [0, 10]


def test_fold_ignores_other_passes_and_ranges_below_the_watermark() -> None:
    cursor = live(next_=40, trained=20)
    stale = [TaskRecord.for_range("clicks", 0, 0, 10), TaskRecord.for_range("clicks", 0, 20, 30, pass_no=1)]
    assert plan.fold(cursor, stale) == (cursor, [])


def test_fold_limit_bounds_the_transaction() -> None:
    done = [TaskRecord.for_range("clicks", 0, s, s + 1) for s in range(500)]
    cursor, folded = plan.fold(live(next_=500), done, limit=119)
    assert len(folded) == 119 and cursor.trained == 119


def test_next_pass_waits_for_every_partition_and_open_task_then_restarts_at_origin() -> None:
    a = PartitionCursor("t", 0, 100, 100, 0, stop=100)
    b = PartitionCursor("t", 1, 50, 40, 0, stop=50)
    assert plan.next_pass([a, b], 3, open_passes=set()) == ("running", [])
    b = PartitionCursor("t", 1, 50, 50, 0, stop=50)
    assert plan.next_pass([a, b], 3, open_passes={0}) == ("running", [])
    decision, moved = plan.next_pass([a, b], 3, open_passes={1})
    assert decision == "advance"
    assert [(c.next, c.trained, c.pass_no) for c in moved] == [(0, 0, 1), (0, 0, 1)]


def test_next_pass_is_idempotent_after_a_partial_advance_and_finishes_after_the_last_pass() -> None:
    moved_already = PartitionCursor("t", 0, 30, 10, 0, stop=100, pass_no=1)
    left_behind = PartitionCursor("t", 1, 50, 50, 0, stop=50, pass_no=0)
    decision, moved = plan.next_pass([moved_already, left_behind], 3, open_passes={1})
    assert decision == "advance" and [c.partition for c in moved] == [1]
    last = [PartitionCursor("t", 0, 100, 100, 0, stop=100, pass_no=2)]
    assert plan.next_pass(last, 3, open_passes=set()) == ("finished", [])


def test_live_stream_never_changes_pass() -> None:
    assert plan.next_pass([live(10, 10)], 3, open_passes=set()) == ("running", [])


@settings(max_examples=200, deadline=None)
@given(
    appends=st.lists(st.integers(0, 500), min_size=1, max_size=30),
    max_records=st.integers(1, 120),
    budget=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_cut_and_fold_cover_every_offset_exactly_once(appends, max_records, budget, seed) -> None:
    rng = random.Random(seed)
    cursor, end, outstanding, covered = live(), 0, [], []
    for grow in appends:
        end += grow
        tasks, cursor = plan.cut(cursor, end, max_records, rng.random() < 0.5, budget)
        outstanding.extend(tasks)
        covered.extend((t.start, t.end) for t in tasks)
        rng.shuffle(outstanding)
        finished, outstanding = outstanding[: len(outstanding) // 2], outstanding[len(outstanding) // 2:]
        cursor, folded = plan.fold(cursor, finished + outstanding[:0])
        outstanding.extend(t for t in finished if t not in folded)
    while cursor.next < end:
        tasks, cursor = plan.cut(cursor, end, max_records, True, budget)
        outstanding.extend(tasks)
        covered.extend((t.start, t.end) for t in tasks)
    cursor, _ = plan.fold(cursor, outstanding)
    assert cursor.trained == end
    covered.sort()
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
    assert (covered[0][0] if covered else 0) == 0 and (covered[-1][1] if covered else 0) == end
    assert all(0 < e - s <= max_records for s, e in covered)


def test_a_task_goes_back_at_once_when_its_trainer_left_else_after_its_timeout() -> None:
    from dataclasses import replace

    task = replace(TaskRecord.for_range("t", 0, 0, 10), trainer_id="t1")
    left = "trainer t1 left (its membership lease ended)"
    assert plan.why_requeue(task, {"t1": 100.0}, 90.0, timed_out=False, timeout_s=30) == left
    assert plan.why_requeue(task, {"t1": 100.0}, 105.0, timed_out=False, timeout_s=30) is None  # it heartbeats
    assert plan.why_requeue(task, {"t2": 100.0}, 90.0, timed_out=False, timeout_s=30) is None
    assert plan.why_requeue(task, {}, 0.0, timed_out=True, timeout_s=30) == "timed out after 30 s on trainer t1"


@pytest.mark.parametrize("mapped, refused", [
    (None, False),  # a new job: the file's layout becomes its map
    (SlotMap.uniform(256, 2), False),
    (SlotMap.uniform(256, 3), True),  # a shard that would own nothing, or slots owned by none
    (SlotMap.uniform(128, 2), True),  # every parameter rehashed
    (SlotMap.uniform(256, 2).resized(3), False),  # resized since: the map's count is the job's
    (SlotMap.uniform(256, 1).resized(3).resized(4), False),
    (SlotMap.uniform(128, 2).resized(3), True),  # the slots never change
])
def test_a_master_leads_only_with_the_shards_and_slots_of_the_jobs_slot_map(mapped, refused) -> None:
    reason = plan.layout_refused("j", slots=256, shards=2, mapped=mapped)
    assert (reason is not None) is refused
    if refused:
        assert (f"pservers.count = {mapped.shards} and pservers.slots = {mapped.slots}" in reason
                and "'j'" in reason and "streamtrain resize --pservers 2" in reason)
