"""Read-your-writes (trainer/own.py) and the background committer (trainer/committer.py),
without services: which of a trainer's own pushes a pull misses, what they add, and how
handed groups become transactions."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from pserver.optimizers import make_rule
from trainer.committer import Committer, Ended
from trainer.delivery import DeliveryError
from trainer.own import OwnPushes

ME = "t0"


def pushes(rule: str = "sgd") -> OwnPushes:
    return OwnPushes(make_rule(rule, lr=0.5), ME)


def push(own: OwnPushes, step: int, rows: dict[int, tuple[np.ndarray, np.ndarray]], block=None, task="task"):
    """A group of row gradients per shard ({shard: (ids, grads)}) and one dense block's gradient."""
    for shard, (ids, grads) in rows.items():
        own.rows("emb", ids, grads.astype(np.float32), shard)
    change = None if block is None else own.block(("fc", 0), block.astype(np.float32), 1)
    own.pushed(step, task)
    return change


def test_a_pull_gets_the_changes_of_the_own_pushes_its_shards_had_not_published() -> None:
    own = pushes()
    ones = np.ones((2, 2))
    push(own, 0, {0: (np.array([3, 5], dtype=np.uint64), ones)})
    push(own, 1, {0: (np.array([5], dtype=np.uint64), ones[:1]), 1: (np.array([8], dtype=np.uint64), ones[:1])})
    ids = np.array([1, 3, 5, 8], dtype=np.uint64)
    # Shard 0 has published step 0, shard 1 nothing of ours: step 1 is missing from both.
    applied = {0: {ME: 0, "other": 7}, 1: {}}
    values = np.zeros((4, 2), dtype=np.float32)
    own.add_rows("emb", ids, values, applied)
    assert values.tolist() == [[0, 0], [0, 0], [-0.5, -0.5], [-0.5, -0.5]]  # SGD at lr 0.5
    # Nothing published yet: both groups are missing, row 5 twice.
    values = np.zeros((4, 2), dtype=np.float32)
    own.add_rows("emb", ids, values, {0: {}, 1: {}})
    assert values[:, 0].tolist() == [0, -0.5, -1.0, -0.5]
    # Another table is not touched.
    other = np.zeros((4, 2), dtype=np.float32)
    own.add_rows("wide", ids, other, {0: {}, 1: {}})
    assert not other.any()


def test_groups_every_shard_published_are_dropped_and_a_restart_goes_on_after_them() -> None:
    own = pushes()
    for step in range(3):
        push(own, step, {0: (np.array([1], dtype=np.uint64), np.ones((1, 2)))})
    own.published({0: {ME: 1}, 1: {ME: 2}})
    assert own.pending == 1
    own.published({0: {ME: 0}})  # an older read never brings a published group back
    assert own.pending == 1
    own.published({0: {ME: 2}})
    assert own.pending == 0
    assert own.first_step({0: {ME: 4}, 1: {ME: 9, "t1": 30}}) == 10 and own.first_step({}) == 0


def test_dense_estimates_carry_the_rules_state_from_push_to_push() -> None:
    """Adam's first step is lr in the gradient's direction; the second, with a smaller
    gradient, is smaller: the moments are this trainer's own."""
    own = pushes("adam")
    first = push(own, 0, {}, block=np.array([1.0, -2.0]))
    second = push(own, 1, {}, block=np.array([0.1, -0.2]))
    assert np.allclose(first, [-0.5, 0.5], atol=1e-6)
    assert 0 < abs(second[0]) < 0.5 and np.sign(second).tolist() == [-1, 1]
    torch_param = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([torch_param], lr=0.5)
    for g in ([1.0, -2.0], [0.1, -0.2]):
        before = torch_param.detach().clone()
        torch_param.grad = torch.tensor(g)
        opt.step()
    assert np.allclose(second, (torch_param.detach() - before).numpy(), atol=1e-6)
    pulled = {("fc", 0): np.array([1.0, 1.0], dtype=np.float32)}
    out = own.add_blocks(pulled, {1: {ME: 0}})
    assert np.allclose(out[("fc", 0)], 1.0 + second) and np.array_equal(pulled[("fc", 0)], [1.0, 1.0])
    assert np.allclose(own.add_blocks({}, {1: {}})[("fc", 0)], first + second)  # never trained: from zero


def test_a_forgotten_task_adds_nothing() -> None:
    own = pushes()
    push(own, 0, {0: (np.array([1], dtype=np.uint64), np.ones((1, 2)))}, task="lost")
    push(own, 1, {0: (np.array([1], dtype=np.uint64), np.ones((1, 2)))}, task="kept")
    own.forget("lost")
    values = np.zeros((1, 2), dtype=np.float32)
    own.add_rows("emb", np.array([1], dtype=np.uint64), values, {0: {}})
    assert values.tolist() == [[-0.5, -0.5]]


# -------------------------------------------------------------------------- the committer
class FakeDelivery:
    def __init__(self) -> None:
        self.transactions: list[list] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = False

    def commit(self, messages) -> None:
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise DeliveryError("transaction failed: broker gone")
        self.transactions.append(list(messages))


class Task(str):
    """A claimed task as far as the committer looks: its id."""

    @property
    def task_id(self) -> str:
        return str(self)


class FakeTasks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def heartbeat(self, task):
        self.calls.append(("heartbeat", task))
        return task

    def complete(self, task):
        self.calls.append(("complete", task))

    def fail(self, task, reason):
        self.calls.append(("fail", task))


def committer() -> tuple[Committer, FakeDelivery, FakeTasks, list[Ended]]:
    delivery, tasks, ended = FakeDelivery(), FakeTasks(), []
    return Committer(delivery, tasks, ended.append), delivery, tasks, ended


def test_groups_handed_while_a_transaction_is_out_go_together_and_a_task_ends_after_its_groups() -> None:
    c, delivery, tasks, ended = committer()
    delivery.gate.clear()  # the first transaction is slow
    c.hand("a", [("g", b"1", None)])
    while not c._busy:
        pass
    c.hand("a", [("g", b"2", None)])
    c.hand("a", [("g", b"3", None)])
    c.end(Task("a"), [("metrics", b"m", None)], metrics=None)
    delivery.gate.set()
    c.close()
    assert delivery.transactions == [[("g", b"1", None)], [("g", b"2", None), ("g", b"3", None), ("metrics", b"m", None)]]
    assert tasks.calls == [("heartbeat", "a"), ("complete", "a")]
    assert [e.ending for e in ended] == ["done"]


def test_a_failed_transaction_fails_the_task_whose_groups_it_carried() -> None:
    c, delivery, tasks, ended = committer()
    delivery.fail_next = True
    c.hand("a", [("g", b"1", None)])
    c.wait()
    with pytest.raises(DeliveryError):
        c.hand("a", [("g", b"2", None)])
    # A task whose groups failed is never completed, even if its end gets queued.
    delivery.fail_next = True
    c.hand("b", [("g", b"1", None)])
    c.wait()
    c.end(Task("b"), [("metrics", b"m", None)], metrics=None)
    c.close()
    assert ("complete", "b") not in tasks.calls and ("fail", "b") in tasks.calls
    assert [e.ending for e in ended] == ["failed"]
