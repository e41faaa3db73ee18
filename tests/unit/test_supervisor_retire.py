"""Retiring a supervised child (streamtrain/supervisor.py): it is not restarted once it exits,
and adding it again supervises it anew. The children are real `python -m streamtrain --help`
processes, which exit at once."""

from __future__ import annotations

import time

import pytest

from streamtrain.supervisor import Supervisor


def _poll_until(supervisor: Supervisor, done, timeout_s: float = 60.0) -> list[str]:
    events, deadline = [], time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, events
        events += supervisor.poll()
        time.sleep(0.05)
    return events


def test_a_retired_child_that_exits_is_not_restarted_and_can_be_added_again(tmp_path) -> None:
    supervisor = Supervisor({}, tmp_path, min_backoff_s=0.0)
    try:
        child = supervisor.add("pserver-2", ["--help"])
        supervisor.retire("pserver-2")
        events = _poll_until(supervisor, lambda: child.state == "retired")
        assert child.restarts == 0 and any("retired, not restarted" in e for e in events), events
        assert not supervisor.running("pserver-2")
        supervisor.add("other", ["--help"])
        with pytest.raises(ValueError, match="already supervised"):
            supervisor.add("other", ["--help"])
        again = supervisor.add("pserver-2", ["--help"])
        assert again is child and child.restarts == 1 and supervisor.running("pserver-2")
        _poll_until(supervisor, lambda: child.restarts >= 2)  # supervised again: restarted when it exits
    finally:
        supervisor.stop()


def test_a_child_retired_while_waiting_to_restart_is_not_started(tmp_path) -> None:
    supervisor = Supervisor({}, tmp_path, min_backoff_s=30.0)
    try:
        child = supervisor.add("pserver-1", ["--help"])
        _poll_until(supervisor, lambda: child.state == "restarting")
        supervisor.retire("pserver-1")
        supervisor.retire("nobody")
        assert child.state == "retired" and supervisor.poll() == [] and child.restarts == 0
    finally:
        supervisor.stop()
