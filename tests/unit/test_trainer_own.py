"""Read-your-writes (trainer/own.py) and the background committer (trainer/committer.py),
without services: which of a trainer's own pushes a pull misses, what they add, and how
handed pushes become commits."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from streamtrain.params.optimizers import make_rule
from streamtrain.trainer.committer import Committer, Ended
from streamtrain.trainer.delivery import DeliveryError
from streamtrain.trainer.own import OwnPushes, OwnRows, RowChange, clock_floor
from streamtrain.trainer.steps import InFlight

ME = "t0"


def pushes(rule: str = "sgd") -> OwnPushes:
    return OwnPushes(make_rule(rule, lr=0.5), ME, shards=2)


def push(own: OwnPushes, step: int, blocks: dict[int, np.ndarray] | None = None, task="task"):
    """A push with a gradient for block ("fc", shard) on each shard ({shard: grad}); returns the
    estimated changes."""
    changes = {shard: own.block(("fc", shard), grad.astype(np.float32), shard)
               for shard, grad in (blocks or {}).items()}
    own.pushed(step, task)
    return changes


def test_a_pull_gets_the_dense_changes_of_the_own_pushes_its_shards_had_not_published() -> None:
    own = pushes()
    ones = np.ones(2)
    push(own, 0, {0: ones, 1: ones})
    push(own, 1, {0: ones})
    # Shard 0 has published step 0, shard 1 nothing of ours.
    applied = {0: {ME: 0, "other": 7}, 1: {}}
    out = own.add_blocks({("fc", 0): np.zeros(2, np.float32)}, applied)
    assert out[("fc", 0)].tolist() == [-0.5, -0.5]  # step 1 only: SGD at lr 0.5
    assert out[("fc", 1)].tolist() == [-0.5, -0.5]  # never published, never pulled: from zero
    # Nothing published: both pushes are missing from block 0.
    assert own.add_blocks({}, {0: {}, 1: {}})[("fc", 0)].tolist() == [-1.0, -1.0]


def test_the_steps_added_to_a_pull_are_counted_per_block() -> None:
    """What a gradient computed on a pull plus the estimates counts as seen besides the blocks'
    versions (`DenseSlice.base`): the steps of each pending push, and of the push being made."""
    own = pushes()
    ones = np.ones(2)
    push(own, 0, {0: ones, 1: ones})
    push(own, 1, {0: ones})
    own.block(("fc", 0), ones.astype(np.float32), 0)  # the push being made: a step so far
    own.block(("fc", 0), ones.astype(np.float32), 0)  # ... and another
    assert own.steps_added({0: {ME: 0}, 1: {}}) == {("fc", 0): 3, ("fc", 1): 1}
    assert own.steps_added({0: {ME: 1}, 1: {ME: 1}}) == {("fc", 0): 2}


def test_a_pull_gets_the_row_changes_of_the_own_pushes_their_shard_had_not_published() -> None:
    own = pushes()
    change = np.array([[1.0], [2.0], [4.0]], dtype=np.float32)
    # Step 0 changed ids 3 (shard 0), 5 and 9 (shard 1); step 1 changed id 3 again.
    own.rows(RowChange("emb", np.array([3, 5, 9], dtype=np.uint64), change, np.array([0, 1, 1])))
    own.pushed(0, "task")
    own.rows(RowChange("emb", np.array([3], dtype=np.uint64), change[:1] * 10, np.array([0])))
    own.pushed(1, "task")
    ids = np.array([1, 3, 9], dtype=np.uint64)  # the pull's rows: 5 not among them, 1 never pushed
    # Shard 0 has published step 0, shard 1 nothing of ours.
    out = own.add_rows("emb", ids, np.zeros((3, 1), np.float32), {0: {ME: 0}, 1: {}})
    assert out[:, 0].tolist() == [0.0, 10.0, 4.0]
    assert own.add_rows("other", ids, np.zeros((3, 1), np.float32), {0: {}, 1: {}}).sum() == 0
    own.published({0: {ME: 1}, 1: {ME: 1}})
    assert own.add_rows("emb", ids, np.zeros((3, 1), np.float32), {0: {ME: 1}, 1: {ME: 1}}).sum() == 0


def test_a_pull_within_a_push_group_gets_the_group_s_earlier_steps_whatever_the_shards_published() -> None:
    """The later mini-batches of a push group pull again (trainer/groups.py): the steps before
    them are not pushed yet, so no shard can have them, whatever `applied` says."""
    own = pushes()
    own.block(("fc", 0), np.ones(2, np.float32), 0)  # the group's first step, not pushed
    own.rows(RowChange("emb", np.array([3, 9], dtype=np.uint64), np.array([[1.0], [4.0]], np.float32),
                       np.array([0, 1])))
    everything = {0: {ME: 99}, 1: {ME: 99}}
    assert own.add_blocks({("fc", 0): np.ones(2, np.float32)}, everything)[("fc", 0)].tolist() == [0.5, 0.5]
    ids = np.array([1, 3, 9], dtype=np.uint64)
    assert own.add_rows("emb", ids, np.zeros((3, 1), np.float32), everything)[:, 0].tolist() == [0.0, 1.0, 4.0]
    own.pushed(100, "task")  # pushed as step 100: missing only until the shards publish it
    assert own.add_blocks({("fc", 0): np.ones(2, np.float32)}, everything)[("fc", 0)].tolist() == [0.5, 0.5]
    published = {0: {ME: 100}, 1: {ME: 100}}
    assert own.add_blocks({("fc", 0): np.ones(2, np.float32)}, published)[("fc", 0)].tolist() == [1.0, 1.0]
    assert own.add_rows("emb", ids, np.zeros((3, 1), np.float32), published).sum() == 0


def test_pushes_every_shard_published_are_dropped_and_a_restart_goes_on_after_them() -> None:
    own = pushes()
    for step in range(3):
        push(own, step)  # a push without dense blocks is still a push in flight
    assert own.pending == 3
    own.published({0: {ME: 1}, 1: {ME: 2}})
    assert own.pending == 1
    own.published({0: {ME: 0}})  # an older read never brings a published push back
    assert own.pending == 1
    own.published({0: {ME: 2}})
    assert own.pending == 0
    assert own.first_step({0: {ME: 4}, 1: {ME: 9, "t1": 30}}) == 10 and own.first_step({}) == 0


def test_a_restart_begins_above_its_predecessors_steps_when_redis_forgot_them() -> None:
    own = pushes()
    started = clock_floor(1_800_000_000.0)
    # The predecessor pushed every 10 ms for an hour before Redis restarted empty.
    predecessor_last = clock_floor(1_800_000_000.0 - 3600) + 3600 * 100
    assert own.first_step({}, started) == started > predecessor_last
    assert own.first_step({0: {ME: started + 5}}, started) == started + 6


def test_a_push_of_several_steps_adds_up_their_dense_changes() -> None:
    own = pushes()
    ones = np.ones(2, np.float32)
    own.block(("fc", 0), ones, 0)
    own.block(("fc", 0), ones, 0)  # a second mini-batch of the same push
    own.pushed(0, "task")
    assert own.add_blocks({}, {0: {}, 1: {}})[("fc", 0)].tolist() == [-1.0, -1.0]


@pytest.mark.parametrize("rule", ["adagrad", "adam", "ftrl"])
def test_row_estimates_step_each_rows_own_state_as_a_shard_would(rule) -> None:
    """What `OwnRows` says a step changes is what the shard's rule does to a row that only
    this trainer updates: its state carries over from step to step, per row."""
    from streamtrain.pserver.state import ShardState
    from streamtrain.schemas import GradientDelta, SparseRows, TaskRecord
    make = (lambda: make_rule(rule, alpha=0.1)) if rule == "ftrl" else (lambda: make_rule(rule, lr=0.1))
    own, shard = OwnRows(make(), 3), ShardState(make(), init_scale=0.0)
    rng = np.random.default_rng(0)
    for seq, ids in enumerate([[1, 2], [2], [1, 2, 5], [2]]):
        ids = np.array(ids, dtype=np.uint64)
        grads = rng.standard_normal((len(ids), 3)).astype(np.float32)
        table = shard.tables.get("t")
        before = np.zeros((len(ids), 3), np.float32) if table is None else table.gather(table.rows_for(ids))
        shard.apply(GradientDelta(TaskRecord.make_id("c", 0, 0), seq, ME, 0, seq, 1,
                                  sparse=(SparseRows("t", ids, grads),)))
        table = shard.tables["t"]
        np.testing.assert_allclose(own.step(ids, grads), table.gather(table.rows_for(ids)) - before, atol=1e-6)


def test_dense_estimates_carry_the_rules_state_from_push_to_push() -> None:
    """Adam's first step is lr in the gradient's direction; the second, with a smaller
    gradient, is smaller: the moments are this trainer's own."""
    own = pushes("adam")
    first = push(own, 0, {1: np.array([1.0, -2.0])})[1]
    second = push(own, 1, {1: np.array([0.1, -0.2])})[1]
    assert np.allclose(first, [-0.5, 0.5], atol=1e-6)
    assert 0 < abs(second[0]) < 0.5 and np.sign(second).tolist() == [-1, 1]
    torch_param = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([torch_param], lr=0.5)
    for g in ([1.0, -2.0], [0.1, -0.2]):
        before = torch_param.detach().clone()
        torch_param.grad = torch.tensor(g)
        opt.step()
    assert np.allclose(second, (torch_param.detach() - before).numpy(), atol=1e-6)
    pulled = {("fc", 1): np.array([1.0, 1.0], dtype=np.float32)}
    out = own.add_blocks(pulled, {1: {ME: 0}})
    assert np.allclose(out[("fc", 1)], 1.0 + second) and np.array_equal(pulled[("fc", 1)], [1.0, 1.0])
    assert np.allclose(own.add_blocks({}, {1: {}})[("fc", 1)], first + second)  # never trained: from zero


def test_a_forgotten_task_adds_nothing() -> None:
    own = pushes()
    push(own, 0, {0: np.ones(2)}, task="lost")
    push(own, 1, {0: np.ones(2)}, task="kept")
    own.forget("lost")
    assert own.add_blocks({}, {0: {}})[("fc", 0)].tolist() == [-0.5, -0.5]
    assert own.pending == 1


# -------------------------------------------------------------------------- the committer
class FakeDelivery:
    def __init__(self) -> None:
        self.commits: list[list] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next: DeliveryError | None = None

    def commit(self, messages) -> None:
        self.gate.wait(10)
        if self.fail_next:
            error, self.fail_next = self.fail_next, None
            raise error
        self.commits.append(list(messages))


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

    def release(self, task, behind=False):
        self.calls.append(("release" if not behind else "release behind", task))


def committer() -> tuple[Committer, FakeDelivery, FakeTasks, list[Ended]]:
    delivery, tasks, ended = FakeDelivery(), FakeTasks(), []
    return Committer(delivery, tasks, ended.append), delivery, tasks, ended


def test_pushes_handed_while_a_commit_is_out_go_together_and_a_task_ends_after_its_pushes() -> None:
    c, delivery, tasks, ended = committer()
    delivery.gate.clear()  # the first commit is slow
    c.hand("a")
    while not c._busy:
        pass
    c.hand("a")
    c.hand("a")
    c.end(Task("a"), [("metrics", b"m", None)], metrics=None)
    delivery.gate.set()
    c.close()
    assert delivery.commits == [[], [("metrics", b"m", None)]]  # pushes 2 and 3 went with the end
    assert tasks.calls == [("heartbeat", "a"), ("complete", "a")]
    assert [e.ending for e in ended] == ["done"]


def test_a_failed_commit_gives_back_or_fails_the_task_whose_pushes_it_covered() -> None:
    c, delivery, tasks, ended = committer()
    delivery.fail_next = DeliveryError("2 messages unacknowledged after 30 s")
    c.hand("a")
    c.wait()
    with pytest.raises(DeliveryError):
        c.hand("a")
    # A task whose groups failed is never completed, even if its end gets queued; with the
    # broker away it is given back (no attempt counted), refused it is failed.
    delivery.fail_next = DeliveryError("2 messages unacknowledged after 30 s")
    c.hand("b")
    c.wait()
    c.end(Task("b"), [("metrics", b"m", None)], metrics=None)
    c.wait()
    delivery.fail_next = DeliveryError("a message to metrics was refused: too large", refused=True)
    c.end(Task("c"), [("metrics", b"m", None)], metrics=None)
    c.close()
    assert ("complete", "b") not in tasks.calls and ("release behind", "b") in tasks.calls
    assert ("complete", "c") not in tasks.calls and ("fail", "c") in tasks.calls
    assert [e.ending for e in ended] == ["released", "failed"]


def test_in_flight_waits_until_at_most_the_limit_of_own_pushes_is_unpublished() -> None:
    own = pushes()
    for step in range(4):
        push(own, step, {0: np.ones(2)})
    assert (own.in_flight(3), own.in_flight(1)) == (4, 2)
    # The shards publish one more of our steps at each round waited for.
    published = iter(range(4))
    reads = []

    def read_applied(timeout_s: float):
        step = next(published)
        reads.append(step)
        return {0: {ME: step, "other": 99}, 1: {ME: step}}

    window = InFlight(1, read_applied, ME, max_wait_s=5.0)
    window.wait(own, 3)
    assert reads == [0, 1, 2] and own.in_flight(3) == 1  # step 3 may stay in flight
    window = InFlight(0, lambda timeout_s: {0: {ME: 3}, 1: {ME: 3}}, ME, max_wait_s=5.0)
    window.wait(own, 3)
    assert own.in_flight(3) == 0


def test_in_flight_stops_waiting_when_the_commit_failed_or_the_cap_passes() -> None:
    own = pushes()
    push(own, 0)
    push(own, 1)
    never = InFlight(1, lambda timeout_s: {}, ME, max_wait_s=0.05)
    never.wait(own, 1)  # returns after the cap, with a warning
    assert never.waited_s >= 0.05 and own.in_flight(1) == 2

    def failed():
        raise DeliveryError("commit failed")

    with pytest.raises(DeliveryError):
        InFlight(1, lambda timeout_s: {}, ME, max_wait_s=5.0).wait(own, 1, failed)
    # After a timeout those pushes are not waited for again: a shard that is down costs one wait.
    push(own, 2)
    began = time.monotonic()
    never.wait(own, 2)
    assert time.monotonic() - began < 0.05 and own.in_flight(2) == 3


def test_a_push_counts_as_published_only_once_every_shard_has_published_it() -> None:
    own = pushes()
    push(own, 0)
    own.published({0: {ME: 0}})  # a pull that read shard 0 only
    assert own.pending == 1
    own.published({1: {ME: 0}})
    assert own.pending == 0


def test_a_task_whose_last_commit_failed_can_be_tried_again_by_the_same_trainer() -> None:
    c, delivery, tasks, ended = committer()
    c.hand("a")
    # The flush at its end finds a push unacknowledged.
    delivery.fail_next = DeliveryError("1 messages unacknowledged after 30 s")
    c.end(Task("a"), [("metrics", b"m", None)], metrics=None)
    c.wait()
    assert [e.ending for e in ended] == ["released"]
    c.hand("a")  # the next attempt's first push: not failed by the last one's error
    c.end(Task("a"), [("metrics", b"m", None)], metrics=None)
    c.close()
    assert [e.ending for e in ended] == ["released", "done"]


def test_the_shards_lagging_are_those_that_have_not_published_the_newest_push_that_must_be() -> None:
    own = pushes()
    for step in range(4):
        push(own, step)
    assert own.lagging(-1, 3, allowed=0) == [0, 1]
    own.published({0: {ME: 3}, 1: {ME: 1}})
    assert own.lagging(-1, 3, allowed=0) == [1]
    assert own.lagging(-1, 3, allowed=2) == []  # steps 2 and 3 may stay in flight
    assert own.lagging(2, 3, allowed=0) == [1]  # pushes up to 2 are not waited for
    own.published({1: {ME: 3}})
    assert own.lagging(-1, 3, allowed=0) == []


def test_own_rows_start_again_empty_past_their_bytes() -> None:
    """A stream of ever new ids must not grow a trainer without bound: past `max_bytes` of
    values and state the estimates start again from a fresh state."""
    own = OwnRows(make_rule("adam", lr=0.01), 2, max_bytes=4 * 2 * 3 * 10)  # 10 rows of Adam
    assert own.max_rows == 10
    ids, small = np.arange(6, dtype=np.uint64), np.full((6, 2), 0.1, np.float32)
    first = own.step(ids, np.ones((6, 2), np.float32))
    assert np.allclose(first, -0.01)  # Adam's first step: lr a coordinate
    later = own.step(ids, small)
    assert own.size == 6 and not np.allclose(later, -0.01)  # the state remembers the first
    own.step(np.arange(6, 12, dtype=np.uint64), small)
    assert own.size == 12 and own.restarts == 0  # over by one step's new rows at most
    assert np.allclose(own.step(ids, small), -0.01)  # from a fresh state again
    assert own.restarts == 1 and own.size == 6
