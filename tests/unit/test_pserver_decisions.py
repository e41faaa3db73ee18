"""A shard's decisions on the control plane's requests (pserver/decisions.py)."""

from __future__ import annotations

from streamtrain.pserver.decisions import (
    SERVICE_AWAY_S,
    Schedule,
    checkpoint_to_take,
    fold_ready,
    own_checkpoint_at,
    rolled_back_id,
)
from streamtrain.schemas import CheckpointRequest

OLD, MID, NEW = "00000000000000000100", "00000000000000000200", "00000000000000000300"


def take(request: CheckpointRequest, taken=(), kept=(), registered=False) -> str | None:
    return checkpoint_to_take(request, taken=set(taken), kept=list(kept), registered=registered)


def test_a_request_for_a_new_checkpoint_is_taken() -> None:
    assert take(CheckpointRequest(NEW, "n1"), kept=[OLD, MID]) == NEW


def test_an_ask_of_the_master_is_not_a_request_to_the_shards() -> None:
    assert take(CheckpointRequest(ask="n1")) is None


def test_a_checkpoint_is_taken_once_even_across_a_restart() -> None:
    assert take(CheckpointRequest(NEW), taken=[NEW]) is None
    assert take(CheckpointRequest(NEW), registered=True) is None  # a restarted shard finds it registered


def test_one_older_than_all_kept_was_taken_and_pruned_since() -> None:
    assert take(CheckpointRequest(OLD), kept=[MID, NEW]) is None


def test_the_rolled_back_state_sorts_after_its_target_whatever_the_clock_says() -> None:
    assert rolled_back_id(MID, NEW) == NEW
    assert rolled_back_id(NEW, MID) == "00000000000000000301"  # this host's clock is behind
    assert rolled_back_id("manual-1", MID) == MID


def test_the_ledger_folds_only_once_everything_before_the_log_end_read_is_applied() -> None:
    assert not fold_ready(None, 100)  # no watermarks read yet
    assert not fold_ready(100, 99)  # a delta before the end still held (the sync barrier)
    assert fold_ready(100, 100) and fold_ready(100, 140)


def test_a_shards_own_checkpoint_waits_for_the_masters_requests_and_retries_soon() -> None:
    assert own_checkpoint_at(100.0, 60.0, "taken") == 160.0
    assert own_checkpoint_at(100.0, 60.0, "requested") == 190.0  # only when a request is late
    assert own_checkpoint_at(100.0, 60.0, "failed") == 100.0 + SERVICE_AWAY_S


def test_housekeeping_is_due_at_once_the_other_steps_after_their_interval() -> None:
    schedule = Schedule.starting(100.0, fold_every_s=2.0, housekeeping_every_s=1.0, checkpoint_every_s=60.0)
    assert schedule.due(100.0) == ["housekeeping"]
    schedule.done("housekeeping", 100.0, ok=True)
    assert schedule.due(100.5) == []
    assert schedule.due(102.0) == ["fold", "housekeeping"]
    assert schedule.due(160.0) == ["fold", "housekeeping", "checkpoint"]


def test_a_failed_step_is_tried_again_at_its_next_turn_a_checkpoint_soon() -> None:
    schedule = Schedule.starting(0.0, fold_every_s=2.0, housekeeping_every_s=1.0, checkpoint_every_s=60.0)
    schedule.done("fold", 2.0, ok=False)
    schedule.done("checkpoint", 60.0, ok=False)
    assert (schedule.next_fold, schedule.next_checkpoint) == (4.0, 60.0 + SERVICE_AWAY_S)
    schedule.done("checkpoint", 61.0, ok=True)
    assert schedule.next_checkpoint == 121.0


def test_a_request_taken_puts_the_shards_own_checkpoint_off_by_half_an_interval() -> None:
    schedule = Schedule.starting(0.0, fold_every_s=2.0, housekeeping_every_s=1.0, checkpoint_every_s=60.0)
    schedule.requested(50.0)
    assert schedule.due(100.0) == ["fold", "housekeeping"] and schedule.due(140.0)[-1] == "checkpoint"
