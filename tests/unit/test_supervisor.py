"""The supervisor (streamtrain/runtime/supervisor.py). Retiring a child: it is not restarted once it
exits, and adding it again supervises it anew. Warm starts (streamtrain/runtime/warm.py): a child is
forked from the fork server and runs the command with the child's log as its output and
its exit code; killed, it restarts at once; stopped, it ends.
The children are real `streamtrain` commands (`streamtrain.local.COMMAND`); the fork server
imports torch first, so the first start takes seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from streamtrain.local import COMMAND
from streamtrain.runtime.supervisor import Supervisor, pid_alive
from streamtrain.runtime.warm import Forked


def _poll_until(supervisor: Supervisor, done, timeout_s: float = 90.0) -> list[str]:
    events, deadline = [], time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, events
        events += supervisor.poll()
        time.sleep(0.05)
    return events


def test_a_retired_child_that_exits_is_not_restarted_and_can_be_added_again(tmp_path) -> None:
    supervisor = Supervisor(COMMAND, {}, tmp_path, min_backoff_s=0.0)
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
    supervisor = Supervisor(COMMAND, {}, tmp_path, min_backoff_s=30.0)
    try:
        child = supervisor.add("pserver-1", ["--help"])
        _poll_until(supervisor, lambda: child.state == "restarting")
        supervisor.retire("pserver-1")
        supervisor.retire("nobody")
        assert child.state == "retired" and supervisor.poll() == [] and child.restarts == 0
    finally:
        supervisor.stop()


def test_children_start_warm_and_run_the_command_into_the_childs_log(tmp_path) -> None:
    supervisor = Supervisor(COMMAND, {}, tmp_path, min_backoff_s=0.0)
    try:
        child = supervisor.add("trainer-0", ["--help"])
        assert isinstance(child.proc, Forked)
        events = _poll_until(supervisor, lambda: child.restarts >= 2)  # it ran and exited: restarted
        assert any("restart 1, warm" in e for e in events), events
        assert child.log_path.read_text().count("Usage:") >= 2  # each run's help, in the child's log
        assert [p.name for p in tmp_path.iterdir()] == ["trainer-0.log"]
        bad = supervisor.add("bad", ["--no-such-option"])
        _poll_until(supervisor, lambda: bad.last_exit is not None)
        assert bad.last_exit == 2  # the command's exit code, as a new interpreter's
    finally:
        supervisor.stop()


def test_a_warm_child_killed_from_outside_restarts_at_once_and_stops_with_the_supervisor(tmp_path) -> None:
    # A shard waiting for an etcd that is not there (its address from the environment given): it
    # runs until stopped.
    closed = {"STREAMTRAIN_ETCD": "127.0.0.1:1", "STREAMTRAIN_KAFKA": "127.0.0.1:1", "STREAMTRAIN_REDIS": "127.0.0.1:1"}
    supervisor = Supervisor(COMMAND, closed, tmp_path, min_backoff_s=30.0, grace_s=5.0)
    try:
        child = supervisor.add("shard-0", ["pserver", "--job", "nothing", "--index", "0"])
        _poll_until(supervisor, lambda: "waiting" in child.log_path.read_text())
        first = child.pid
        assert os.getpgid(first) == first  # its own process group, signalled as one
        os.kill(first, signal.SIGKILL)
        events = _poll_until(supervisor, lambda: child.restarts == 1)
        assert child.last_exit == -signal.SIGKILL and child.pid not in (None, first), events
        assert any("warm" in e for e in events), events
    finally:
        killed = supervisor.stop()
    assert not pid_alive(child.pids[-1]) and killed in ([], ["shard-0"])


def test_without_warm_starts_each_start_is_a_new_interpreter(tmp_path) -> None:
    supervisor = Supervisor(COMMAND, {}, tmp_path, min_backoff_s=30.0, warm=False)
    try:
        child = supervisor.add("master", ["--help"])
        assert isinstance(child.proc, subprocess.Popen)
        _poll_until(supervisor, lambda: child.state == "restarting")
        assert child.last_exit == 0 and "Usage:" in child.log_path.read_text()
    finally:
        supervisor.stop()


def _supervising(tmp_path, until: str, after: str = "", **popen) -> tuple[subprocess.Popen, int]:
    """A script that supervises a shard waiting for an etcd that is not there (it runs until
    stopped), looping `while not <until>`, then running `after`; started, with its child
    waiting. Returns the script's process and the child's pid."""
    script = tmp_path / "supervise.py"
    script.write_text(
        "import json, signal, time\n"
        "from pathlib import Path\n"
        "from streamtrain.local import COMMAND\n"
        "from streamtrain.runtime.supervisor import Supervisor\n"
        "stopping = []\n"
        "signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))\n"
        f"s = Supervisor(COMMAND, {{'STREAMTRAIN_ETCD': '127.0.0.1:1'}}, Path({str(tmp_path / 'logs')!r}),\n"
        "               grace_s=20)\n"
        "c = s.add('shard-0', ['pserver', '--job', 'nothing', '--index', '0'])\n"
        "print(c.proc.pid, flush=True)\n"
        f"while not {until}:\n"
        "    s.poll()\n"
        "    time.sleep(0.05)\n"
        f"{after}\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, cwd=tmp_path, text=True, **popen)
    child = int(parent.stdout.readline())
    log = tmp_path / "logs" / "shard-0.log"
    deadline = time.monotonic() + 90
    while "waiting" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, parent.poll()
        time.sleep(0.1)
    return parent, child


def test_a_supervisor_killed_leaves_no_child_and_its_main_module_is_not_run_again(tmp_path) -> None:
    # The script supervises at import, with no main guard: a child that imported its parent's
    # main module, as multiprocessing's would, would start another.
    parent, child = _supervising(tmp_path, until="False")
    try:
        assert (tmp_path / "logs" / "shard-0.log").read_text().count("supervisor: starting") == 1
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(child):  # the fork server ends with its supervisor, and the child with it
        assert time.monotonic() < deadline, "the child outlived its supervisor"
        time.sleep(0.1)


def test_a_sigterm_to_the_supervisors_process_group_is_the_supervisors_to_handle(tmp_path) -> None:
    # `kill %1` or a closing terminal signals the whole group: the fork server, the parent of
    # every child, must not die of it (its children would end at once, their exit codes
    # unread); the supervisor stops them in order.
    parent, child = _supervising(
        tmp_path, until="stopping",
        after="print(json.dumps({'events': s.poll(), 'killed': s.stop(), 'exit': c.last_exit}), flush=True)",
        start_new_session=True)
    try:
        os.killpg(parent.pid, signal.SIGTERM)
        said = json.loads(parent.stdout.readline())
        assert parent.wait(60) == 0
    finally:
        parent.kill()
    # Running until the supervisor stopped it: no exit seen before, and its own exit code then
    # (255 is what multiprocessing says of a child whose fork server is gone).
    assert said["events"] == [] and said["exit"] != 255, said
    assert not pid_alive(child)
