"""Trainers' CPUs: the share each gets of a machine, `--cpus` values, and pinning a process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from streamtrain.infra.cpus import available, parse, share
from streamtrain.local import trainer_args


@pytest.mark.parametrize("count, cpus, expected", [
    (2, (0, 1), [(0,), (1,)]),  # the e2e machine: a core each
    (4, (0, 1), [(0,), (1,), (0,), (1,)]),  # a multiple of the CPUs: dealt round-robin
    (3, (0, 1), [(0, 1)] * 3),  # no even share (two on one CPU, one on the other): every CPU
    (3, tuple(range(8)), [(0, 1, 2), (3, 4, 5), (6, 7)]),  # runs as even as they go
    (2, (2, 3, 6, 7), [(2, 3), (6, 7)]),  # the CPUs this process may use, not 0..n
    (1, (0, 1), [(0, 1)]),  # one trainer: every CPU
    (2, (5,), [(5,), (5,)]),  # one CPU: nothing to share
    (2, (), [(), ()]),  # a platform that cannot tell
])
def test_each_trainer_gets_its_share_and_every_cpu_is_someones(count, cpus, expected):
    shares = [share(i, count, cpus) for i in range(count)]
    assert shares == expected
    assert set().union(*shares) == set(cpus)
    if 1 < count <= len(cpus):  # cut into runs: no CPU twice, sizes a CPU apart at most
        assert sum(map(len, shares)) == len(cpus)
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_trainer_index_out_of_range_is_refused():
    with pytest.raises(ValueError, match="index 2 of 2"):
        share(2, 2, (0, 1))


def test_cpus_values_parse_and_bad_ones_are_named():
    assert parse("0") == (0,)
    assert parse("3,0-1, 1") == (0, 1, 3)
    for bad, part in (("a", "'a'"), ("1-", "'1-'"), ("3-1", "'3-1'"), ("", "''"), ("²", "'²'"),
                      ("0-99999999999", "'0-99999999999' is no CPU number")):
        with pytest.raises(ValueError, match=part):
            parse(bad)


def test_job_runs_trainers_on_their_shares_and_leaves_a_lone_trainer_unpinned():
    assert trainer_args("ctr", 1, 2, (0, 1)) == ["trainer", "--job", "ctr", "--id", "trainer-1", "--cpus", "1"]
    assert trainer_args("ctr", 0, 1, (0, 1)) == ["trainer", "--job", "ctr", "--id", "trainer-0"]
    assert trainer_args("ctr", 0, 2, (0, 1), "t0")[3:5] == ["--id", "t0"]


@pytest.mark.skipif(len(available()) < 2, reason="needs two CPUs to pin to one")
def test_pin_moves_the_threads_already_running_and_what_starts_later():
    """Linux sets a mask a thread at a time: a thread started before the pin must be moved
    too, and a child process inherits its creator's."""
    cpu = available()[-1]
    script = f"""
import os, subprocess, sys, threading
ready, done = threading.Event(), threading.Event()
seen = {{}}
def before():
    ready.set(); done.wait(); seen['before'] = os.sched_getaffinity(0)
t = threading.Thread(target=before); t.start(); ready.wait()
from streamtrain.infra.cpus import pin
pin([{cpu}])
done.set(); t.join()
child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],
                       capture_output=True, text=True, check=True).stdout.strip()
print(sorted(os.sched_getaffinity(0)), sorted(seen['before']), child)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=120).stdout.split()
    assert out == [f"[{cpu}]"] * 3


@pytest.mark.skipif(not available(), reason="no CPU affinity on this platform")
def test_a_cpu_this_process_may_not_use_is_refused_by_the_trainer_command():
    result = subprocess.run([sys.executable, "-m", "streamtrain", "trainer", "--job", "x", "--cpus", "4096"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--cpus: 4096: this process may run on CPUs" in result.stderr
    # The message names the value as given, brackets and all (the console reads markup).
    result = subprocess.run([sys.executable, "-m", "streamtrain", "trainer", "--job", "x", "--cpus", "[1]"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--cpus: '[1]' is not a CPU number or range" in result.stderr
