"""Moving slots between shards: rows, dense blocks and their optimizer state go with their
slots; dedup and example counts come along from the cut."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.optimizers import Adagrad, Adam
from streamtrain.pserver.resharding import NotACutError, regroup
from streamtrain.pserver.state import ShardState
from streamtrain.schemas import DenseSlice, GradientDelta, SparseRows, TaskRecord

DIM = 3
RULE = Adagrad(lr=0.1)  # a per-row clock: a row's updates do not depend on how rows are sharded


def group(seq: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int, np.ndarray]]]:
    ids = np.unique(rng.integers(0, 400, size=60).astype(np.uint64))
    grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    dense = [("w", b, rng.standard_normal(4).astype(np.float32)) for b in range(5)]
    return ids, grads, dense


def apply(states: dict[int, ShardState], slot_map: SlotMap, seq: int, ids, grads, dense) -> None:
    """One push group as trainers send it: a delta to every shard, empty ones included."""
    task_id = TaskRecord.make_id("clicks", 0, 0)
    rows = slot_map.split_rows("emb", ids, grads)
    for shard, state in states.items():
        part = rows.get(shard)
        state.apply(GradientDelta(
            task_id, seq, "t", shard, seq, 10,
            dense=tuple(DenseSlice(p, b, 0, v) for p, b, v in dense if slot_map.shard_of_block(p, b) == shard),
            sparse=(SparseRows("emb", *part),) if part is not None else ()))


def trained(states: dict[int, ShardState], slot_map: SlotMap, groups, first_seq: int) -> None:
    for seq, (ids, grads, dense) in enumerate(groups, start=first_seq):
        apply(states, slot_map, seq, ids, grads, dense)


def every_row(states: dict[int, ShardState]) -> dict[int, tuple]:
    out = {}
    for state in states.values():
        table = state.tables["emb"]
        for i in range(table.size):
            out[int(table.ids[i])] = (table.values[i].tolist(), table.steps[i],
                                      [v[i].tolist() for v in table.state.values()])
    return out


def test_slots_move_with_their_rows_and_state_so_training_goes_on_as_if_unsharded() -> None:
    rng = np.random.default_rng(7)
    groups = [group(s, rng) for s in range(30)]
    alone = {0: ShardState(RULE, average_steps=4)}
    trained(alone, SlotMap.uniform(64, 1), groups, 0)
    two = SlotMap.uniform(64, 2)
    three = two.resized(3)
    back = three.resized(2)
    states = {s: ShardState(RULE, average_steps=4) for s in range(2)}
    trained(states, two, groups[:10], 0)
    states = regroup(states, two, three)  # grown by one shard
    assert sorted(states) == [0, 1, 2]
    trained(states, three, groups[10:20], 10)
    states = regroup(states, three, back)  # and shrunk back
    trained(states, back, groups[20:], 20)
    assert every_row(states) == every_row(alone)
    for key, block in alone[0].dense.items():
        (held,) = [s.dense[key] for s in states.values() if key in s.dense]
        assert np.array_equal(held.values, block.values) and held.steps[0] == block.steps[0]
        assert np.array_equal(held.served(), block.served())
    for shard, state in states.items():
        assert all(back.shard_of_rows("emb", state.tables["emb"].ids[:state.tables["emb"].size]) == shard)
        assert state.examples_by_partition() == {"clicks:0": 300}  # every group's examples, once


def test_a_group_applied_before_the_move_is_dropped_by_its_new_owner_too() -> None:
    rng = np.random.default_rng(1)
    groups = [group(s, rng) for s in range(4)]
    states = {s: ShardState(RULE) for s in range(2)}
    trained(states, SlotMap.uniform(64, 2), groups, 0)
    three = SlotMap.uniform(64, 2).resized(3)
    moved = regroup(states, SlotMap.uniform(64, 2), three)
    before = every_row(moved)
    trained(moved, three, groups[3:], 3)  # redone after the move
    assert every_row(moved) == before and all(s.dedup.dropped == 1 for s in moved.values())


def test_states_of_different_cuts_are_refused() -> None:
    rng = np.random.default_rng(2)
    groups = [group(s, rng) for s in range(3)]
    states = {s: ShardState(RULE) for s in range(2)}
    trained(states, SlotMap.uniform(64, 2), groups[:2], 0)
    apply({0: states[0]}, SlotMap.uniform(64, 2), 2, *groups[2])  # shard 1 has not applied it yet
    with pytest.raises(NotACutError, match="not of one cut"):
        regroup(states, SlotMap.uniform(64, 2), SlotMap.uniform(64, 3))


def test_a_cut_is_a_cut_however_far_each_shard_has_folded_its_ledger() -> None:
    """Shards fold their ledgers and example counts each on its own schedule: one folded and
    one not, at the same cut, are moved as one, and every new shard takes them folded."""
    rng = np.random.default_rng(4)
    groups = [group(s, rng) for s in range(4)]
    two = SlotMap.uniform(64, 2)
    states = {s: ShardState(RULE) for s in range(2)}
    trained(states, two, groups, 0)
    states[0].fold({("clicks", 0): (0, 1)})  # the master's watermark passed the task
    moved = regroup(states, two, two.resized(3))
    for state in moved.values():
        assert state.examples_folded == {"clicks:0": 40} and not state.examples
        assert state.dedup.marks() == {("clicks", 0): (0, 1)}
    with pytest.raises(ValueError, match="states of shards \\[0\\], but the old map has 2"):
        regroup({0: states[0]}, two, two.resized(3))  # shard 1's rows would be lost


def test_every_new_shard_has_every_table_at_the_newest_table_clock() -> None:
    """Adam's bias correction counts a table's applies on its shard: a shard that joins takes
    the newest, and has the table even where no row of it moves yet."""
    rng = np.random.default_rng(5)
    two = SlotMap.uniform(64, 2)
    states = {s: ShardState(Adam(lr=0.01)) for s in range(2)}
    trained(states, two, [group(s, rng) for s in range(6)], 0)
    states[1].tables["emb"].updates -= 1  # a push that brought shard 1 no row of the table
    moved = regroup(states, two, two.resized(3))
    assert [moved[s].tables["emb"].updates for s in range(3)] == [6, 6, 6]
