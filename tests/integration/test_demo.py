"""`streamtrain demo` end to end, headless, against the session's services: the real job's
processes under the demo's supervisor learn the click model online, a SIGKILLed trainer and a
SIGKILLed producer are restarted (the producer resuming after the records already in the topic),
the job is resized to 3 pserver shards while it trains (`--resize 45:3`), and nothing is left
running afterwards."""

from __future__ import annotations

import io
import os
import signal

import pytest
from rich.console import Console

from streamtrain.console.demo import run_demo
from streamtrain.runtime.supervisor import Supervisor, pid_alive

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_demo_learns_online_survives_a_killed_trainer_resizes_and_leaves_no_process(services, unique,
                                                                                    tmp_path) -> None:
    out = io.StringIO()
    killed: dict[str, int] = {}

    def kill_once(elapsed: float, supervisor: Supervisor) -> None:
        for name, at in (("trainer-0", 25), ("producer", 35)):
            child = supervisor.children[name]
            if name not in killed and elapsed >= at and child.pid is not None:
                killed[name] = child.pid
                os.kill(child.pid, signal.SIGKILL)

    summary = run_demo(services, Console(file=out, width=200), home=tmp_path, duration=75, headless=True,
                       job=unique("demo"), resizes=[(45, 3)], on_tick=kill_once)
    log = out.getvalue()

    assert set(killed) == {"trainer-0", "producer"}, log
    assert summary.restarts["trainer-0"] >= 1 and summary.restarts["producer"] >= 1, log
    starts = [line for line in (tmp_path / "demo" / summary.job / "logs" / "producer.log").read_text().splitlines()
              if "supervisor: starting" in line]
    assert len(starts) >= 2 and "--start 0" not in starts[1], starts  # resumed, not replayed
    assert summary.first_auc_s is not None and summary.first_auc_s < 50, log
    assert summary.auc is not None and summary.auc > 0.7, log
    assert summary.examples > 20_000, log  # ~100k on an idle 2-core machine
    assert summary.applied is not None and summary.applied > 15_000, log
    assert "resized from 2 to 3 shards" in log and "pserver-2 started" in log, log
    assert summary.restarts["pserver-2"] == 0, log
    assert len(summary.pids) >= 9  # producer, master, 3 pservers, 2 trainers, the two restarted
    assert summary.stray == [] and not [p for p in summary.pids if pid_alive(p)], log
    assert "demo summary" in log and "prequential AUC" in log
