"""bench/resize_pause.py's measure: the longest time between two tasks finishing."""

from __future__ import annotations

from bench.resize_pause import longest_gap


def test_the_longest_gap_is_of_consecutive_finishes_overlapping_the_window() -> None:
    times = [0.0, 0.5, 1.0, 5.0, 5.2, 9.0, 9.1]
    assert longest_gap(times, 4.0, 4.5) == 4.0  # 1.0 -> 5.0 spans the window
    assert abs(longest_gap(times, 5.1, 5.1) - 0.2) < 1e-9
    assert longest_gap(times, 0.0, 10.0) == 4.0
    assert longest_gap([], 0.0, 1.0) == 0.0
