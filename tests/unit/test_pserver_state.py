"""Applying gradient deltas to a shard's parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamtrain.params.averages import average_weight
from streamtrain.params.optimizers import FTRL, Adagrad, Adam
from streamtrain.params.rows import initial_rows
from streamtrain.pserver.state import BadDeltaError, ShardState, newest, staleness_damping
from streamtrain.schemas import DenseSlice, GradientDelta, SparseRows, TaskRecord
from streamtrain.schemas.gradient import UNKNOWN_BASE


def delta(seq: int, ids, grads, task_start: int = 0, dense=()) -> GradientDelta:
    return GradientDelta(task_id=TaskRecord.make_id("clicks", 0, task_start), seq=seq, trainer_id="t",
                         shard=0, step=seq, examples=10,
                         sparse=(SparseRows("user", np.array(ids, dtype=np.uint64),
                                            np.array(grads, dtype=np.float32)),),
                         dense=dense)


def reference_adagrad(p: np.ndarray, grads: list[np.ndarray], lr: float) -> np.ndarray:
    acc = np.zeros_like(p, dtype=np.float64)
    p = p.astype(np.float64)
    for g in grads:
        acc += g.astype(np.float64) ** 2
        p -= lr * g / (np.sqrt(acc) + 1e-10)
    return p


def test_rows_follow_the_rule_from_their_deterministic_initial_values() -> None:
    state = ShardState(Adagrad(lr=0.1))
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(5)]
    for seq, g in enumerate(grads):
        state.apply(delta(seq, [5, 9, 2], g))
    start = initial_rows("user", np.array([5, 9, 2], dtype=np.uint64), 4, 0.01)
    expected = reference_adagrad(start, grads, 0.1)
    table = state.tables["user"]
    got = table.values[table.rows_for(np.array([5, 9, 2], dtype=np.uint64))]
    assert np.allclose(got, expected, atol=1e-6)


def test_adam_rows_are_bias_corrected_by_the_tables_steps_as_sparse_adam_does() -> None:
    # Rows touched at different steps: a row first touched at step k takes SparseAdam's
    # step k + 1 (about 3 lr), not a first step of its own (lr). Per-row correction cost a
    # production-like workload 0.0035 AUC in one process (bench/RESULTS.md).
    state = ShardState(Adam(lr=0.01))
    everything = np.arange(6, dtype=np.uint64)
    table = torch.nn.Parameter(torch.from_numpy(initial_rows("user", everything, 4, 0.01)))
    reference = torch.optim.SparseAdam([table], lr=0.01)
    rng = np.random.default_rng(3)
    touched = [[0, 1], [1, 2], [0, 3], [5], [1, 4, 5], [3]]
    for seq, ids in enumerate(touched):
        grads = rng.standard_normal((len(ids), 4)).astype(np.float32)
        state.apply(delta(seq, ids, grads))
        reference.zero_grad()
        table.grad = torch.sparse_coo_tensor(torch.tensor([ids]), torch.from_numpy(grads), table.shape)
        reference.step()
    rows = state.tables["user"]
    got = rows.values[rows.rows_for(everything)]
    assert rows.updates == len(touched)
    assert np.allclose(got, table.detach().numpy(), atol=1e-6)


def test_a_delta_of_several_steps_applies_them_in_order_as_separate_deltas_would() -> None:
    # A push of several mini-batches: each part is a step of the rule (Adam's moments and
    # table clock advance per part), and the changes name every row of every part.
    rng = np.random.default_rng(5)
    steps = [([1, 2], rng.standard_normal((2, 4))), ([2, 3], rng.standard_normal((2, 4)))]
    dense = [DenseSlice("fc", 0, 0, rng.standard_normal(3).astype(np.float32)) for _ in steps]
    one, apart = ShardState(Adam(lr=0.01)), ShardState(Adam(lr=0.01))
    together = GradientDelta(task_id=TaskRecord.make_id("clicks", 0, 0), seq=0, trainer_id="t", shard=0, step=0,
                             examples=20, dense=tuple(dense),
                             sparse=tuple(SparseRows("user", np.array(i, dtype=np.uint64), g.astype(np.float32))
                                          for i, g in steps))
    changes = one.apply(together)
    for seq, ((ids, grads), piece) in enumerate(zip(steps, dense)):
        apart.apply(delta(seq, ids, grads, dense=(piece,)))
    assert list(changes.rows["user"]) == [1, 2, 3] and changes.blocks == {("fc", 0)}
    ids = np.array([1, 2, 3], dtype=np.uint64)
    for state in (one, apart):
        assert state.tables["user"].updates == 2 and state.dense[("fc", 0)].steps[0] == 2
    np.testing.assert_array_equal(one.tables["user"].values[one.tables["user"].rows_for(ids)],
                                  apart.tables["user"].values[apart.tables["user"].rows_for(ids)])
    np.testing.assert_array_equal(one.dense[("fc", 0)].values, apart.dense[("fc", 0)].values)


def test_duplicate_delta_is_dropped_and_counted_once() -> None:
    state = ShardState(Adagrad(lr=0.1))
    assert state.apply(delta(0, [1], [[1.0, 1.0]])) is not None
    before = state.tables["user"].values.copy()
    assert state.apply(delta(0, [1], [[1.0, 1.0]])) is None
    assert np.array_equal(before, state.tables["user"].values)
    assert state.dedup.dropped == 1
    assert state.examples[TaskRecord.make_id("clicks", 0, 0)] == 10


def test_repeated_ids_in_one_delta_are_summed() -> None:
    a, b = ShardState(Adagrad(lr=0.1)), ShardState(Adagrad(lr=0.1))
    a.apply(delta(0, [7, 7], [[1.0], [2.0]]))
    b.apply(delta(0, [7], [[3.0]]))
    assert np.array_equal(a.tables["user"].values[:1], b.tables["user"].values[:1])


def test_dense_blocks_update_and_report_changes() -> None:
    state = ShardState(Adagrad(lr=0.1))
    piece = DenseSlice("fc.weight", 0, 0, np.ones(6, dtype=np.float32))
    changes = state.apply(delta(0, [1], [[0.0]], dense=(piece,)))
    assert changes.blocks == {("fc.weight", 0)} and np.array_equal(changes.rows["user"], [1])
    assert state.dense[("fc.weight", 0)].steps[0] == 1
    # What training added, from zero (the model's own initial value is the trainers' to add):
    # Adagrad's first step is -lr * g / |g|.
    np.testing.assert_allclose(state.dense[("fc.weight", 0)].values, np.full((1, 6), -0.1), rtol=1e-5)


def test_a_delta_with_the_wrong_row_width_is_refused_without_side_effects() -> None:
    state = ShardState(Adagrad(lr=0.1))
    state.apply(delta(0, [1], [[1.0, 2.0]]))
    with pytest.raises(BadDeltaError, match="rows of 2"):
        state.apply(delta(1, [1], [[1.0, 2.0, 3.0]]))
    assert state.apply(delta(1, [1], [[1.0, 2.0]])) is not None  # seq 1 was not consumed


def test_an_apply_reports_each_changed_rows_newest_values() -> None:
    """The publisher sends these values instead of looking the rows up again."""
    state = ShardState(Adam(lr=0.01))
    rng = np.random.default_rng(5)
    parts = tuple(SparseRows("user", np.array(ids, dtype=np.uint64),
                             rng.standard_normal((len(ids), 4)).astype(np.float32))
                  for ids in ([1, 4, 7], [4, 9], [1, 2]))  # a push of three steps
    changes = state.apply(GradientDelta(task_id=TaskRecord.make_id("clicks", 0, 0), seq=0, trainer_id="t",
                                        shard=0, step=0, examples=30, sparse=parts))
    table = state.tables["user"]
    assert changes.rows["user"].tolist() == [1, 2, 4, 7, 9]
    np.testing.assert_array_equal(changes.values["user"], table.gather(table.rows_for(changes.rows["user"])))


def test_newest_keeps_the_last_value_each_id_was_given() -> None:
    ids, values = newest([np.array([3, 5], dtype=np.uint64), np.array([1, 5], dtype=np.uint64),
                          np.array([3], dtype=np.uint64)],
                         [np.array([[30.0], [50.0]]), np.array([[10.0], [51.0]]), np.array([[31.0]])])
    assert ids.tolist() == [1, 3, 5] and values[:, 0].tolist() == [10.0, 31.0, 51.0]


@pytest.mark.parametrize(("steps", "base", "share"),
                         [(0, 0, 1.0), (5, 5, 1.0), (5, 2, 0.25), (3, 9, 1.0), (10**6, UNKNOWN_BASE, 1.0)])
def test_staleness_damping_is_one_over_one_plus_the_steps_not_seen(steps, base, share) -> None:
    assert staleness_damping(steps, base) == share


def dense_delta(seq: int, trainer: str, grad: np.ndarray, base: int) -> GradientDelta:
    return GradientDelta(task_id=TaskRecord.make_id("clicks", 0, 0), seq=seq, trainer_id=trainer, shard=0, step=seq,
                         examples=1, dense=(DenseSlice("fc", 0, 0, grad, base=base),))


def test_a_dense_gradient_that_missed_steps_takes_that_share_of_the_rules_step() -> None:
    """Two trainers computed on the block at version 0; the second's gradient arrives after the
    first's step: it moves the block by half of Adam's step, and Adam's state moves on in
    full (the same moments and clock as undamped)."""
    rng = np.random.default_rng(11)
    first, second = (rng.standard_normal(3).astype(np.float32) for _ in range(2))
    damped, full = ShardState(Adam(lr=0.01)), ShardState(Adam(lr=0.01), damp_stale=False)
    for state in (damped, full):
        state.apply(dense_delta(0, "a", first, base=0))
    after_first = damped.dense[("fc", 0)].values.copy()
    np.testing.assert_array_equal(after_first, full.dense[("fc", 0)].values)
    for state in (damped, full):
        state.apply(dense_delta(1, "b", second, base=0))
    full_step = full.dense[("fc", 0)].values - after_first
    np.testing.assert_allclose(damped.dense[("fc", 0)].values - after_first, full_step / 2, rtol=1e-5)
    for name in Adam.state_names:
        np.testing.assert_array_equal(damped.dense[("fc", 0)].state[name], full.dense[("fc", 0)].state[name])
    assert damped.dense[("fc", 0)].steps[0] == 2


def test_one_trainers_steps_at_their_bases_are_never_damped() -> None:
    """A trainer alone, its gradients computed on every step before them (the bases its
    pulls and estimates give), trains exactly as the rule does."""
    rng = np.random.default_rng(12)
    grads = [rng.standard_normal(3).astype(np.float32) for _ in range(4)]
    damped, full = ShardState(Adam(lr=0.01)), ShardState(Adam(lr=0.01), damp_stale=False)
    for seq, grad in enumerate(grads):
        damped.apply(dense_delta(seq, "a", grad, base=seq))
        full.apply(dense_delta(seq, "a", grad, base=0))
    np.testing.assert_array_equal(damped.dense[("fc", 0)].values, full.dense[("fc", 0)].values)


def test_a_rule_that_sets_values_from_its_state_is_never_damped() -> None:
    """FTRL's next step sets the block from (z, n): a damped step would only be undone there."""
    rng = np.random.default_rng(13)
    grads = [rng.standard_normal(3).astype(np.float32) for _ in range(3)]
    damped, full = ShardState(FTRL(alpha=0.1)), ShardState(FTRL(alpha=0.1), damp_stale=False)
    for seq, grad in enumerate(grads):
        for state in (damped, full):
            state.apply(dense_delta(seq, "ab"[seq % 2], grad, base=0))
    np.testing.assert_array_equal(damped.dense[("fc", 0)].values, full.dense[("fc", 0)].values)
    assert damped.damped == 0


def test_a_block_serves_the_moving_average_of_its_values_and_trains_on_the_values() -> None:
    """The average starts where the values do (zero: what training adds) and follows every
    step, damped ones too; the values, and so training, are as without it."""
    rng = np.random.default_rng(14)
    grads = [rng.standard_normal(3).astype(np.float32) for _ in range(6)]
    averaged, plain = ShardState(Adam(lr=0.01), average_steps=3), ShardState(Adam(lr=0.01))
    expected = np.zeros((1, 3), dtype=np.float32)
    for seq, grad in enumerate(grads):
        for state in (averaged, plain):
            state.apply(dense_delta(seq, "ab"[seq % 2], grad, base=seq // 2))
        expected += (averaged.dense[("fc", 0)].values - expected) * average_weight(seq + 1, 3)
    block = averaged.dense[("fc", 0)]
    np.testing.assert_array_equal(block.values, plain.dense[("fc", 0)].values)
    np.testing.assert_allclose(block.served(), expected, rtol=1e-5)
    assert not np.allclose(block.served(), block.values)
    np.testing.assert_array_equal(plain.dense[("fc", 0)].served(), plain.dense[("fc", 0)].values)
