"""The task queue's shared rules (jobstate/queue.py): claim order and retries."""

from __future__ import annotations

from dataclasses import replace

from streamtrain.jobstate import queue
from streamtrain.schemas import PartitionCursor, TaskRecord


def test_rounds_of_regroups_a_saved_queue_in_offset_order() -> None:
    saved = [TaskRecord.for_range("clicks", p, s, s + 10) for p, s in [(1, 20), (0, 10), (1, 0), (0, 0), (1, 10)]]
    assert [[(t.partition, t.start) for t in r] for r in queue.rounds_of(saved)] == [
        [(0, 0), (1, 0)], [(0, 10), (1, 10)], [(1, 20)]]
    assert queue.rounds_of([]) == []


def test_claims_take_the_oldest_transaction_first_and_its_tasks_round_by_round() -> None:
    ids = {name: TaskRecord.make_id("clicks", p, start) for name, (p, start) in
           {"a0": (0, 0), "a1": (0, 10), "b0": (1, 0), "b1": (1, 10), "a2": (0, 20), "b2": (1, 20)}.items()}
    # etcd lists one transaction's tasks in no particular order, here partition after partition.
    listed = [(7, ids["a0"]), (7, ids["a1"]), (7, ids["b0"]), (7, ids["b1"]), (9, ids["b2"]), (9, ids["a2"])]
    order = queue.claim_order(listed, truncated=False)
    assert [listed[i][1] for i in order] == [ids[n] for n in ("a0", "b0", "a1", "b1", "a2", "b2")]
    # Cut at the listing's limit, the newest revision may be partial: it waits.
    assert [listed[i][1] for i in queue.claim_order(listed, truncated=True)] == [
        ids[n] for n in ("a0", "b0", "a1", "b1")]
    assert queue.claim_order(listed[:4], truncated=True) == [0, 2, 1, 3]


def test_claim_order_puts_ids_it_cannot_read_last() -> None:
    assert queue.claim_order([(3, "not-a-task"), (3, TaskRecord.make_id("clicks", 0, 5))], False) == [1, 0]


def test_tasks_given_back_are_put_in_input_order_whatever_order_they_came_back_in() -> None:
    ids = [TaskRecord.make_id("clicks", 1, 90), TaskRecord.make_id("clicks", 0, 500), "not-a-task",
           TaskRecord.make_id("clicks", 0, 10), TaskRecord.make_id("clicks", 1, 20)]
    # Rounds as the slicer cuts them: each partition's oldest, then each one's next.
    assert queue.input_order(ids) == [3, 4, 1, 0, 2]


def test_a_failed_attempt_requeues_with_attempt_plus_one_until_max_attempts_then_fails_with_reason() -> None:
    task = TaskRecord.for_range("clicks", 0, 0, 10)
    state, task = queue.retry_or_fail(task, 3, "the loader died twice")
    assert (state, task.attempt, task.trainer_id) == ("todo", 1, None)
    state, task = queue.retry_or_fail(task, 3, "the loader died twice")
    assert (state, task.attempt) == ("todo", 2)
    state, task = queue.retry_or_fail(task, 3, "the loader died twice")
    assert state == "failed"
    assert task.reason == "the loader died twice (attempt 3 of 3)"


def test_a_task_whose_holder_was_lost_goes_back_with_its_attempt_unchanged_however_often() -> None:
    task = replace(TaskRecord.for_range("clicks", 0, 0, 10), attempt=2, trainer_id="t0", deadline=5.0)
    for _ in range(10):
        task = queue.requeue_lost(replace(task, trainer_id="t0"), "trainer t0 left")
    assert (task.attempt, task.trainer_id, task.deadline, task.reason) == (2, None, None, "trainer t0 left")


def test_a_task_is_folded_once_its_partitions_cursor_trained_past_its_end_or_pass() -> None:
    task = TaskRecord(TaskRecord.make_id("clicks", 0, 100, 1), "clicks", 0, 100, 200, pass_no=1)
    cursor = PartitionCursor("clicks", 0, next=400, trained=100, origin=0, pass_no=1)
    assert not queue.folded(None, task)
    assert not queue.folded(cursor, task)  # trained up to its start: not yet
    assert queue.folded(replace(cursor, trained=200), task)
    assert queue.folded(replace(cursor, trained=0, next=0, pass_no=2), task)  # a later pass
    assert not queue.folded(replace(cursor, trained=300, pass_no=0), task)  # its own pass is later
