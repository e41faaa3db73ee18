"""`streamtrain demo` end to end, headless, against the session's services: the real job's
processes under the demo's supervisor learn the click model online, a SIGKILLed trainer is
restarted, and nothing is left running afterwards."""

from __future__ import annotations

import io
import os
import signal

import pytest
from rich.console import Console

from streamtrain.demo import run_demo
from streamtrain.supervisor import Supervisor, pid_alive

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_demo_learns_online_survives_a_killed_trainer_and_leaves_no_process(services, unique, tmp_path) -> None:
    out = io.StringIO()
    killed: list[int] = []

    def kill_a_trainer_once(elapsed: float, supervisor: Supervisor) -> None:
        child = supervisor.children["trainer-0"]
        if not killed and elapsed >= 25 and child.pid is not None:
            killed.append(child.pid)
            os.kill(child.pid, signal.SIGKILL)

    summary = run_demo(services, Console(file=out, width=200), home=tmp_path, duration=65, headless=True,
                       job=unique("demo"), on_tick=kill_a_trainer_once)
    log = out.getvalue()

    assert killed, log
    assert summary.restarts["trainer-0"] >= 1, log
    assert summary.first_auc_s is not None and summary.first_auc_s < 40, log
    assert summary.auc is not None and summary.auc > 0.7, log
    assert summary.examples > 40_000, log
    assert summary.applied is not None and summary.applied > 30_000, log
    assert len(summary.pids) >= 7  # producer, master, 2 pservers, 2 trainers, the restarted trainer
    assert summary.stray == [] and not [p for p in summary.pids if pid_alive(p)], log
    assert "demo summary" in log and "prequential AUC" in log
