"""Exactly-once admission of gradient deltas, and its bounded memory."""

from __future__ import annotations

from streamtrain.pserver.dedup import Dedup
from streamtrain.schemas import TaskRecord


def tid(start: int, pass_no: int = 0, partition: int = 0) -> str:
    return TaskRecord.make_id("clicks", partition, start, pass_no)


def test_a_rerun_task_is_applied_once_and_its_new_groups_continue() -> None:
    d = Dedup()
    assert [d.admit(tid(0), s) for s in (0, 1, 3)] == [True, True, True]  # shard got no delta for 2
    # The task timed out and re-ran from the start: what was applied is dropped, the rest applies.
    assert [d.admit(tid(0), s) for s in (0, 1, 3, 4, 5)] == [False, False, False, True, True]
    assert d.dropped == 3


def test_a_zombie_resuming_after_the_rerun_is_dropped() -> None:
    d = Dedup()
    for s in range(6):
        assert d.admit(tid(100), s)
    assert not any(d.admit(tid(100), s) for s in (4, 5))


def test_tasks_below_the_folded_watermark_are_dropped_and_forgotten() -> None:
    d = Dedup()
    for start in (0, 10, 20):
        d.admit(tid(start), 0)
    d.fold({("clicks", 0): (0, 20)})
    assert d.entries == 1
    assert not d.admit(tid(10), 1)  # a late delta of a completed task
    assert d.admit(tid(20), 1)


def test_a_later_pass_is_new_training_not_a_duplicate() -> None:
    d = Dedup()
    d.admit(tid(0), 0)
    d.fold({("clicks", 0): (0, 50)})
    assert d.admit(tid(0, pass_no=1), 0)
    assert not d.admit(tid(30, pass_no=0), 0)  # the old pass is over


def test_state_survives_a_checkpoint_round_trip() -> None:
    d = Dedup()
    d.admit(tid(0), 2)
    d.admit(tid(5, partition=3), 0)
    d.fold({("clicks", 1): (0, 7)})
    again = Dedup.from_json(d.to_json())
    assert again.to_json() == d.to_json()
    assert not again.admit(tid(0), 2) and again.admit(tid(0), 3)
