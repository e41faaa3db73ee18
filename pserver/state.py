"""A shard's parameters in memory: sparse tables and dense blocks, the update rule, dedup.

`ShardState.apply(delta)` is the whole of "apply a gradient": admit it once by `(task_id,
seq)`, then run the rule over every sparse table and dense block it touches. What changed is
returned so the publisher writes only those rows and blocks to Redis.

A dense gradient computed on a block that has since taken other steps is damped by how many
(`staleness_damping`), unless the rule sets values from its state (FTRL: `is_absolute`), whose
next step would undo it. Every trainer computes on about the same dense layers, so with several
trainers each gradient arrives after the others' steps from about the same point, and each
full step overshoots: several trainers fall behind one process in AUC, most of it the dense
layers' (bench/RESULTS.md, "four trainers, and why they fell behind"). The rows are not damped:
trainers seldom step the same row at once, and in a simulation rows as stale cost a small
fraction of what the dense layers do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from streamtrain.params.averages import average_step
from streamtrain.params.optimizers import UpdateRule, is_absolute
from streamtrain.params.rows import RowTable
from streamtrain.pserver.dedup import Dedup
from streamtrain.schemas import GradientDelta, StreamtrainError, TaskRecord, partition_label


class BadDeltaError(StreamtrainError, ValueError):
    """A delta that decodes but cannot apply here (wrong row width, wrong block length)."""


@dataclass
class DenseBlock:
    values: np.ndarray  # (1, length) float32
    state: dict[str, np.ndarray]
    steps: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    # What is scored (params/averages.py); None: the values themselves (a block from a
    # checkpoint of before the average, until its next step).
    average: np.ndarray | None = None

    def served(self) -> np.ndarray:
        return self.values if self.average is None else self.average


@dataclass
class Changes:
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # table -> ids, sorted and distinct
    blocks: set[tuple[str, int]] = field(default_factory=set)
    # table -> the rows' values after the change, aligned with `rows` (an apply knows them:
    # its publish then need not look them up again); a table absent here is read from the state
    values: dict[str, np.ndarray] = field(default_factory=dict)


def staleness_damping(steps: int, base: int) -> float:
    """The share of the update rule's step that a dense gradient computed at block version
    `base` takes when the block has had `steps`: 1 / (1 + the steps it did not see)
    (staleness-aware asynchronous SGD, Zhang et al. 2016). A base ahead of the block (a shard
    rolled back under a trainer's feet) counts as none missed."""
    return 1.0 / (1 + max(0, steps - base))


class ShardState:
    def __init__(self, rule: UpdateRule, init_scale: float = 0.01, damp_stale: bool = True,
                 average_steps: int = 0) -> None:
        self.rule = rule
        self.init_scale = init_scale
        self.damp_stale = damp_stale
        self.average_steps = average_steps  # train.average_steps (params/averages.py)
        self._absolute = is_absolute(rule)  # FTRL: its next step sets the values from its state
        self.damped = 0  # dense steps applied at less than the full step, since this state was made
        self.tables: dict[str, RowTable] = {}
        self.dense: dict[tuple[str, int], DenseBlock] = {}
        self.dedup = Dedup()
        # Examples applied, for exactly-once accounting: per task until the task is folded
        # below the master's watermark, then per "topic:partition" (bounded memory).
        self.examples: Counter[str] = Counter()
        self.examples_folded: Counter[str] = Counter()

    def apply(self, delta: GradientDelta) -> Changes | None:
        """Apply a delta once; None if it was a duplicate (counted in `dedup.dropped`).

        Its parts apply in order, each one step of the update rule: a table or dense block in
        several parts takes several steps (a push of several mini-batches, each stepped as one
        process would step it, trainer/worker.py).

        Raises:
            BadDeltaError: the delta does not fit the parameters here; nothing was applied.
        """
        self.check(delta)
        if not self.dedup.admit(delta.task_id, delta.seq):
            return None
        changes = Changes()
        for part in delta.sparse:
            ids, grads = _distinct(part.ids, part.values)
            table = self._table(part.table, part.dim)
            values = table.update(table.rows_for(ids), grads, self.rule)
            seen = changes.rows.get(part.table)
            if seen is None:
                changes.rows[part.table], changes.values[part.table] = ids, values
            else:  # a push of several steps: each row's newest values
                changes.rows[part.table], changes.values[part.table] = newest(
                    [seen, ids], [changes.values[part.table], values])
        for piece in delta.dense:
            block = self._block(piece.param, piece.block, len(piece.values))
            grads = piece.values.reshape(1, -1).astype(np.float32, copy=False)
            damping = 1.0
            if self.damp_stale and not self._absolute:
                damping = staleness_damping(int(block.steps[0]), piece.base)
            if damping == 1.0:
                self.rule.apply(block.values, grads, block.state, block.steps)
            else:
                self.damped += 1
                # The rule's own step, scaled: for Adam, SGD and Adagrad the same as a smaller
                # learning rate, and any rule's state moves on as it would.
                before = block.values.copy()
                self.rule.apply(block.values, grads, block.state, block.steps)
                block.values -= before
                block.values *= np.float32(damping)
                block.values += before
            block.steps += 1
            if block.average is None:
                block.average = block.values.copy()
            else:
                average_step(block.average, block.values, int(block.steps[0]), self.average_steps)
            changes.blocks.add((piece.param, piece.block))
        self.examples[delta.task_id] += delta.examples
        return changes

    def fold(self, watermarks: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Forget per-task detail below the master's watermarks (see Dedup.fold for when)."""
        self.dedup.fold(watermarks)
        for task_id in list(self.examples):
            task = TaskRecord.parse_id(task_id)
            mark = watermarks.get((task.topic, task.partition))
            if mark is not None and (task.pass_no < mark[0] or
                                     (task.pass_no == mark[0] and task.start < mark[1])):
                self.examples_folded[partition_label(task.topic, task.partition)] += self.examples.pop(task_id)

    def examples_by_partition(self) -> dict[str, int]:
        totals = Counter(self.examples_folded)
        for task_id, n in self.examples.items():
            task = TaskRecord.parse_id(task_id)
            totals[partition_label(task.topic, task.partition)] += n
        return dict(totals)

    def check(self, delta: GradientDelta) -> None:
        """Raises BadDeltaError if the delta cannot apply here (checked before anything is)."""
        for part in delta.sparse:
            table = self.tables.get(part.table)
            if table is not None and table.dim != part.dim:
                raise BadDeltaError(f"table {part.table!r} has rows of {table.dim}, delta has {part.dim}")
        for piece in delta.dense:
            if piece.offset != 0:
                raise BadDeltaError(f"dense {piece.param}[{piece.block}]: partial blocks are not "
                                    f"supported (offset {piece.offset})")
            block = self.dense.get((piece.param, piece.block))
            if block is not None and block.values.shape[1] != len(piece.values):
                raise BadDeltaError(f"dense {piece.param}[{piece.block}] has {block.values.shape[1]} "
                                    f"values, delta has {len(piece.values)}")

    def _table(self, name: str, dim: int) -> RowTable:
        table = self.tables.get(name)
        if table is None:
            table = self.tables[name] = RowTable(name, dim, self.rule.state_names, self.init_scale)
        return table

    def _block(self, param: str, block: int, length: int) -> DenseBlock:
        found = self.dense.get((param, block))
        if found is None:
            # What training adds to the block, from zero: its initial value is the model's own,
            # which trainers add when they load it (trainer/params.py).
            found = self.dense[(param, block)] = DenseBlock(
                np.zeros((1, length), dtype=np.float32),
                {n: np.zeros((1, length), dtype=np.float32) for n in self.rule.state_names},
                average=np.zeros((1, length), dtype=np.float32))
        return found


def newest(ids: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows changed one batch after another (each batch's ids distinct): their ids sorted and
    distinct, with the values the last batch that changed each gave it."""
    if len(ids) == 1:
        return ids[0], values[0]
    later_first = np.concatenate(ids[::-1])
    distinct, first = np.unique(later_first, return_index=True)
    return distinct, np.concatenate(values[::-1]).take(first, axis=0)


def _distinct(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Trainers send each id once per delta; if one did not, its gradients are summed."""
    if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):
        # Strictly increasing, as a trainer sends them: distinct, known in one pass, where
        # np.unique's sort is a noticeable part of a shard's apply.
        return ids, grads.astype(np.float32, copy=False)
    unique, inverse = np.unique(ids, return_inverse=True)
    if len(unique) == len(ids):
        return ids, grads.astype(np.float32, copy=False)
    summed = np.zeros((len(unique), grads.shape[1]), dtype=np.float32)
    np.add.at(summed, inverse, grads)
    return unique, summed
