"""The sync step barrier: what it holds back, and what counts as applied."""

from __future__ import annotations

from streamtrain.pserver.barrier import StepBarrier
from streamtrain.schemas import GradientDelta, TaskRecord


def delta(trainer: str, step: int) -> GradientDelta:
    return GradientDelta(TaskRecord.make_id("clicks", 0, 0), step, trainer, 0, step, 1)


def test_a_step_waits_for_every_participant_and_what_waits_is_not_yet_applied() -> None:
    barrier = StepBarrier(sync=True, live={"a", "b"})
    assert len(barrier.offer(delta("a", 0), offset=10)) == 1  # b has sent nothing: not waited for
    assert len(barrier.offer(delta("b", 0), offset=11)) == 1  # a step already released
    assert barrier.next_step == 1 and barrier.applied_below(12) == 12
    assert barrier.offer(delta("a", 1), offset=12) == []  # b has not reached step 1
    # Consumed up to 14, but the delta at 12 still waits: only what is below it is applied.
    assert barrier.applied_below(14) == 12
    released = barrier.offer(delta("b", 1), offset=14)
    assert [d.trainer_id for d in released] == ["a", "b"] and barrier.applied_below(15) == 15


def test_without_sync_nothing_waits() -> None:
    barrier = StepBarrier(sync=False)
    assert [d.step for d in barrier.offer(delta("a", 5), offset=3)] == [5]
    assert barrier.applied_below(4) == 4 and barrier.waiting == 0
