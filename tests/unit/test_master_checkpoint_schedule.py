"""When the master takes a job-wide checkpoint (master/checkpoint_schedule.py `next_move`)."""

from __future__ import annotations

from streamtrain.master.checkpoint_schedule import PATIENCE_S, next_move


def move(now: float, *, since: float | None = None, asked: bool = False, busy: bool = False) -> str:
    return next_move(now, every_s=10, last_began=100, outstanding_since=since, asked=asked, busy=busy)


def test_one_begins_an_interval_after_the_last_began() -> None:
    assert move(109.9) == "wait"
    assert move(110.0) == "begin"


def test_one_asked_for_begins_at_once() -> None:
    assert move(100.5, asked=True) == "begin"


def test_none_begins_while_a_rollback_or_a_pause_is_under_way() -> None:
    assert move(500, busy=True) == "wait"


def test_one_asked_for_during_a_rollback_is_withdrawn() -> None:
    """The asker learns it at once rather than after its wait."""
    assert move(500, asked=True, busy=True) == "abandon"


def test_one_in_progress_when_a_rollback_begins_is_withdrawn() -> None:
    """Its record is of the timeline the rollback abandons."""
    assert move(1000.1, since=1000, busy=True) == "abandon"


def test_one_in_progress_is_checked_until_its_patience_runs_out() -> None:
    """Nothing is sliced meanwhile: a shard that cannot take it must not starve the trainers."""
    assert move(1000 + PATIENCE_S - 0.1, since=1000) == "check"
    assert move(1000 + PATIENCE_S, since=1000) == "abandon"
