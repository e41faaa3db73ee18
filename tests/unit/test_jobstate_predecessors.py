"""When a successor may take a key without waiting out its holder's lease (jobstate/predecessors.py)."""

from __future__ import annotations

import os

from streamtrain.jobstate.predecessors import gone
from streamtrain.schemas import Holder

HERE = {"host": "node-1", "boot": "b-1", "pidns": "pid:[4026531836]"}


def holder(**kw) -> Holder:
    return Holder(**{"role": "pserver", "name": "0", "pid": 4242, **HERE, **kw})


def test_a_holder_of_this_machine_whose_pid_no_longer_runs_is_gone() -> None:
    assert gone(holder(), HERE, alive=lambda pid: False)


def test_a_holder_that_still_runs_or_may_is_waited_for() -> None:
    assert not gone(holder(), HERE, alive=lambda pid: True)  # frozen, or its pid reused
    assert not gone(holder(host="node-2"), HERE, alive=lambda pid: False)  # another machine
    assert not gone(holder(boot="b-0"), HERE, alive=lambda pid: False)  # before a reboot
    assert not gone(holder(pidns="pid:[4026532000]"), HERE, alive=lambda pid: False)  # another container
    assert not gone(Holder("pserver", "0", 4242, "node-1"), HERE, alive=lambda pid: False)  # wrote no boot
    assert not gone(holder(pid=os.getpid()), HERE, alive=lambda pid: False)  # this very process
    assert not gone(holder(boot=""), {**HERE, "boot": ""}, alive=lambda pid: False)
