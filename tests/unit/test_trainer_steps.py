"""Where a trainer joins and when it goes on after a push in the gated modes
(`trainer.steps.joining_step`, `trainer.steps.next_step`)."""

from __future__ import annotations

from streamtrain.schemas import BarrierSteps
from streamtrain.schemas.config import SgdMode
from streamtrain.trainer.steps import joining_step, next_step

SYNC, BOUNDED = SgdMode.SYNC, SgdMode.BOUNDED


def shards(*trainers: dict[str, int], next_: int = 0) -> list[BarrierSteps]:
    return [BarrierSteps(next_, t) for t in trainers]


def test_sync_goes_on_once_every_shard_released_the_step() -> None:
    assert next_step(SYNC, 5, [BarrierSteps(6), BarrierSteps(5)], "a", 0) is None
    assert next_step(SYNC, 5, shards({}, {}, next_=6), "a", 0) == 6
    # A trainer that was away joins the barrier where it is.
    assert next_step(SYNC, 5, shards({}, {}, next_=9), "a", 0) == 9


def test_bounded_waits_for_its_own_step_at_every_shard_even_when_nobody_is_behind() -> None:
    """Rows get no estimate of a trainer's own unseen pushes: four trainers allowed two such
    pushes each lost 0.025 AUC against one process."""
    assert next_step(BOUNDED, 7, shards({"a": 7, "b": 7}, {"a": 6, "b": 7}), "a", 2) is None
    assert next_step(BOUNDED, 7, shards({"a": 7, "b": 7}, {"a": 7, "b": 7}), "a", 2) == 8


def test_bounded_waits_while_the_slowest_trainer_is_more_than_staleness_behind() -> None:
    assert next_step(BOUNDED, 7, shards({"a": 7, "b": 4}, {"a": 7, "b": 5}), "a", 2) is None
    assert next_step(BOUNDED, 7, shards({"a": 7, "b": 5}, {"a": 7, "b": 5}), "a", 2) == 8


def test_bounded_before_any_shard_knows_the_trainer_waits() -> None:
    assert next_step(BOUNDED, 0, shards({}, {}), "a", 2) is None
    assert next_step(BOUNDED, 0, shards({"a": 0}, {"a": 0}), "a", 2) == 1


def test_a_trainer_joins_where_the_barrier_is_and_at_0_in_a_job_with_no_steps_yet() -> None:
    assert joining_step(SYNC, [BarrierSteps(6), BarrierSteps(4)], "c") == 4
    assert joining_step(BOUNDED, shards({"a": 7, "b": 3}, {"a": 9, "b": 5}), "c") == 4
    assert joining_step(SYNC, [], "c") == 0 and joining_step(BOUNDED, [BarrierSteps(), BarrierSteps()], "c") == 0


def test_a_bounded_trainer_coming_back_joins_past_its_predecessors_steps() -> None:
    # b's predecessor reached 9 at one shard: b's steps up to 9 would read as visible at once
    assert joining_step(BOUNDED, shards({"a": 7, "b": 3}, {"a": 9, "b": 9}), "b") == 10
    assert joining_step(BOUNDED, shards({"a": 7, "b": 3}, {"a": 9, "b": 5}), "b") == 6
