"""The chaos harness's decisions (bench/chaos.py): its schedule, its recovery times, its ledger."""

from __future__ import annotations

import numpy as np

from bench.chaos import (
    _PENDING,
    _UNKNOWN,
    RECOVERING_S,
    Fault,
    Run,
    expected_counts,
    fault_log,
    first_at_or_above,
    holds_schedule,
    is_back,
    ledger,
    recovery,
    schedule,
    trailing_rates,
    under_schedule,
)
from streamtrain.schemas import ShardStats


def test_a_schedule_brings_up_every_kind_once_a_round_in_a_seeded_order() -> None:
    kinds = ("trainer", "shard", "kafka")
    faults = schedule(kinds, 9, seed=3)
    assert [sorted(faults[i:i + 3]) for i in range(0, 9, 3)] == [sorted(kinds)] * 3
    assert faults == schedule(kinds, 9, seed=3)
    assert len({tuple(schedule(kinds, 9, seed)) for seed in range(10)}) > 1


def test_trailing_rates_are_zero_until_a_window_has_passed() -> None:
    times = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    done = np.array([0.0, 10.0, 20.0, 20.0, 40.0])
    assert trailing_rates(times, done, 2.0).tolist() == [0.0, 0.0, 10.0, 5.0, 10.0]


def test_the_rate_is_back_at_the_end_of_the_first_window_after_the_fault_at_the_threshold() -> None:
    times = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    rates = np.array([9.0, 9.0, 1.0, 4.0, 6.0])
    assert first_at_or_above(times, rates, after=1.5, threshold=5.0, window_s=2.0) == 5.0
    assert first_at_or_above(times, rates, after=0.5, threshold=5.0, window_s=1.0) == 2.0
    assert first_at_or_above(times, rates, after=4.0, threshold=5.0, window_s=2.0) is None


def test_the_ledger_counts_examples_lost_and_applied_twice_per_shard_and_partition() -> None:
    want = expected_counts(5, "t", passes=2)
    assert want == {"t:0": 6, "t:1": 4}
    stats = [ShardStats(0, 7, True, 1.0, examples_by_partition={"t:0": 6, "t:1": 4}, dropped=3),
             ShardStats(1, 8, True, 1.0, examples_by_partition={"t:0": 5, "t:1": 5}, dropped=1)]
    assert ledger(stats, want) == {"lost": 1, "applied_twice": 1, "dropped_groups": 4, "bad": 0}
    assert ledger([stats[0], None], want)["lost"] == 10  # a shard that never wrote applied nothing


def test_recovery_counts_a_freeze_from_its_resume_and_a_kill_from_the_kill() -> None:
    applied = [(t, int(t * 100)) for t in np.arange(0.0, 20.0, 0.5)]
    run = Run("job", 0.0, 20.0, applied, [
        Fault("trainer", "t0", at=5.0, mark_kind="trainer", back_at=8.0),
        Fault("freeze trainer", "t1", at=6.0, mark_kind="trainer", resumed_at=9.0, back_at=9.5),
        Fault("shard", "0", at=7.0, mark_kind="shard"),
    ])
    out = recovery(run, reference_rate=100.0)
    assert out["trainer"]["back_s"]["p50"] == 3.0
    assert out["freeze trainer"]["back_s"]["p50"] == 0.5
    assert out["shard"]["never_back"] == 1 and out["shard"]["back_s"]["p50"] is None
    assert out["shard"]["rate_never"] == 0
    assert out["trainer"]["rate_s"]["p50"] == 2.0  # the rate never fell: one window after


def test_a_killed_shard_is_back_when_another_process_serves_and_wrote_its_stats_since() -> None:
    fault = Fault("shard", "0", at=100.0, pid=7, mark_kind="shard", resumed_at=100.0, before=_PENDING)
    assert not is_back(fault, ShardStats(0, 7, True, 101.0))  # the killed one's last words
    assert not is_back(fault, ShardStats(0, 8, False, 101.0))  # still replaying
    assert not is_back(fault, ShardStats(0, 8, True, 99.0))
    assert not is_back(fault, _UNKNOWN)
    assert is_back(fault, ShardStats(0, 8, True, 101.0))
    thawed = Fault("freeze shard", "0", at=90.0, pid=7, mark_kind="shard", resumed_at=100.0)
    assert is_back(thawed, ShardStats(0, 7, True, 101.0))


def test_a_trainer_is_back_once_a_push_made_after_its_mark_was_taken_is_published() -> None:
    fault = Fault("trainer", "t0", at=100.0, pid=7, mark_kind="trainer", resumed_at=100.0, before=_PENDING)
    assert not is_back(fault, 12)  # no mark taken yet: the successor has not started
    fault.before = 12
    assert not is_back(fault, 12) and not is_back(fault, _UNKNOWN)
    assert is_back(fault, 13)


def test_a_master_is_back_when_the_lock_is_held_anew() -> None:
    fault = Fault("master", "master", at=100.0, pid=7, mark_kind="master", resumed_at=100.0, before=41)
    assert not is_back(fault, 41) and not is_back(fault, None)
    assert is_back(fault, 57)


def test_the_fault_log_times_each_fault_from_the_run_start() -> None:
    run = Run("job", 1000.0, 20.0, [], [Fault("shard", "1", at=1005.0, back_at=1008.5, rate_at=1010.0),
                                       Fault("freeze master", "master", at=1010.0, resumed_at=1023.0)])
    assert fault_log(run) == [
        {"at_s": 5.0, "kind": "shard", "target": "1", "back_s": 3.5, "rate_s": 5.0},
        {"at_s": 10.0, "kind": "freeze master", "target": "master", "back_s": None, "rate_s": None}]


def test_a_shard_hit_holding_a_million_rows_or_more_is_timed_apart_too() -> None:
    applied = [(t, int(t * 100)) for t in np.arange(0.0, 20.0, 0.5)]
    run = Run("job", 0.0, 20.0, applied, [
        Fault("shard", "0", at=5.0, mark_kind="shard", back_at=7.0, rows=999_999),
        Fault("shard", "1", at=9.0, mark_kind="shard", back_at=12.0, rows=1_000_000),
        Fault("shard", "1", at=13.0, mark_kind="shard", back_at=14.0),  # rows unknown: Redis away
    ])
    out = recovery(run, reference_rate=100.0)
    assert out["shard"]["count"] == 3
    assert out["shard 1M+ rows"]["count"] == 1 and out["shard 1M+ rows"]["back_s"]["p50"] == 3.0
    assert fault_log(run)[1]["rows"] == 1_000_000 and "rows" not in fault_log(run)[2]


def test_the_rate_under_the_schedule_runs_from_the_first_fault_to_one_interval_after_the_last() -> None:
    applied = [(t, int(t * 100) if t < 10 else 1000 + int((t - 10) * 50)) for t in np.arange(0.0, 30.0, 0.5)]
    run = Run("job", 0.0, 30.0, applied, [Fault("trainer", "t0", at=10.0), Fault("shard", "0", at=16.0)])
    assert under_schedule(run, every_s=4.0) == {"seconds": 10.0, "examples_per_s": 50}
    assert under_schedule(Run("job", 0.0, 30.0, applied), every_s=4.0) is None
    ended = Run("job", 0.0, 12.0, applied[:25], [Fault("trainer", "t0", at=10.0), Fault("shard", "0", at=16.0)])
    assert under_schedule(ended, every_s=4.0)["seconds"] == 2.0  # the job finished before the schedule


def test_the_next_fault_waits_until_the_last_ones_target_is_back_or_long_past() -> None:
    back = Fault("trainer", "t0", at=100.0, mark_kind="trainer", back_at=102.0)
    restarting = Fault("kafka", "kafka", at=103.0)
    assert not holds_schedule([back], 104.0)
    assert holds_schedule([back, restarting], 104.0)
    assert not holds_schedule([back, restarting], 103.0 + RECOVERING_S)  # never back: not forever
