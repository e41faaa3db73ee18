"""The supervisor (streamtrain/supervisor.py). Retiring a child: it is not restarted once it
exits, and adding it again supervises it anew. The warm spares (streamtrain/spare.py): a restart
becomes one and runs the command with the child's log as its output; a spare that dies unused
ends the spares; stopping kills the waiting ones; when the next one is due. The children are real `python -m streamtrain
--help` processes, which exit at once; a spare imports torch first, so its tests take seconds."""

from __future__ import annotations

import time

import pytest

from streamtrain.supervisor import Supervisor, pid_alive, spare_due


def _poll_until(supervisor: Supervisor, done, timeout_s: float = 90.0) -> list[str]:
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


def test_a_restart_becomes_the_spare_which_runs_the_command_into_the_childs_log(tmp_path) -> None:
    supervisor = Supervisor({}, tmp_path, min_backoff_s=0.0, spare_after_s=0.0)
    try:
        child = supervisor.add("trainer-0", ["--help"])
        events = _poll_until(supervisor, lambda: supervisor.spares_used >= 1)
        spare_pid = child.pids[-1]
        assert any("the spare" in e for e in events), events
        _poll_until(supervisor, lambda: child.pids[-1] != spare_pid)  # it ran and exited: restarted again
        # The first run and the spare's each printed the command's help into the child's log,
        # the only file in the log directory.
        assert child.log_path.read_text().count("Usage:") >= 2
        assert [p.name for p in tmp_path.iterdir()] == ["trainer-0.log"]
    finally:
        supervisor.stop()


def test_a_spare_that_dies_unused_ends_the_spares_and_stop_kills_the_waiting_ones(tmp_path) -> None:
    supervisor = Supervisor({}, tmp_path, min_backoff_s=30.0, spare_after_s=0.0, spares=2)
    try:
        supervisor.add("master", ["--help"])
        _poll_until(supervisor, lambda: len(supervisor._spares) == 2)
        survivor = supervisor._spares[1].proc
        supervisor._spares[0].proc.kill()
        events = _poll_until(supervisor, lambda: supervisor.spare_after_s is None)
        assert any("no more spares" in e for e in events), events
        assert supervisor._spares == [] and supervisor.poll() == [] and survivor.poll() is not None
    finally:
        supervisor.stop()
    other = Supervisor({}, tmp_path / "other", spare_after_s=0.0, spares=2)
    other.add("master", ["--help"])
    _poll_until(other, lambda: len(other._spares) == 2)
    pids = [spare.proc.pid for spare in other._spares]
    other.stop()
    assert not any(pid_alive(pid) for pid in pids)


def test_a_spare_is_due_when_fewer_wait_and_no_interpreter_began_importing_lately() -> None:
    assert spare_due(now=10.0, importing_since=5.0, waiting=0, wanted=2, after_s=5.0)
    assert spare_due(now=10.0, importing_since=5.0, waiting=1, wanted=2, after_s=5.0)
    assert not spare_due(now=10.0, importing_since=5.0, waiting=2, wanted=2, after_s=5.0)  # enough
    assert not spare_due(now=9.9, importing_since=5.0, waiting=0, wanted=2, after_s=5.0)  # one imports
    assert not spare_due(now=10.0, importing_since=5.0, waiting=0, wanted=0, after_s=0.0)  # none wanted
