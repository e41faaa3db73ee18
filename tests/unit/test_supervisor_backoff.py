"""The supervisor's restart policy (streamtrain/runtime/supervisor.py `restart_backoff`)."""

from __future__ import annotations

import pytest

from streamtrain.runtime.supervisor import restart_backoff

POLICY = {"min_s": 1.0, "max_s": 30.0, "healthy_after_s": 10.0}


def test_a_child_failing_by_itself_soon_after_starting_waits_longer_each_time() -> None:
    waits, wait = [], 0.0
    for _ in range(7):
        wait = restart_backoff(wait, 2.0, 1, **POLICY)
        waits.append(wait)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


@pytest.mark.parametrize("ran_s, returncode", [(0.5, -9), (3.0, -15), (600.0, -2), (0.1, -1)])
def test_a_child_killed_from_outside_restarts_at_once(ran_s, returncode) -> None:
    """Under repeated kills (a chaos test, the OOM killer) there is no wait at all."""
    assert restart_backoff(30.0, ran_s, returncode, **POLICY) == 0.0


@pytest.mark.parametrize("ran_s, returncode", [(10.0, 1), (600.0, 2), (20.0, -11)])
def test_a_child_that_ran_a_while_restarts_after_the_shortest_wait(ran_s, returncode) -> None:
    assert restart_backoff(30.0, ran_s, returncode, **POLICY) == 1.0


def test_a_crash_by_signal_soon_after_starting_is_its_own_failure() -> None:
    assert restart_backoff(4.0, 0.5, -11, **POLICY) == 8.0  # SIGSEGV
    assert restart_backoff(4.0, 0.5, -6, **POLICY) == 8.0  # SIGABRT
