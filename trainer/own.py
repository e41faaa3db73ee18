"""Read-your-writes: a trainer's own pushes, added to the dense layers it pulls until the shards
publish them.

A push reaches the parameters a trainer pulls only after its commit, the shard's apply and the
shard's next publish. Training on dense layers that miss its own last updates is what makes an
asynchronous trainer diverge from the sequential loop, a deep model under Adam the most
(bench/RESULTS.md, "Figures moved from the code and the docs"). So a trainer keeps, per push,
an estimate of what the push will change in each dense block, and adds the pushes a pull does
not include yet to what the pull returns. Which pushes those are, the shards say: each publish
round writes the newest step of every trainer its values include (`RedisKeys.applied`), read
in the same transaction as the values. The trainer also uses them to bound its pushes in
flight (trainer/steps.py `InFlight`).

The estimate runs the job's own update rule on the push's gradients, with a local copy of the
rule's state per block advanced by this trainer's gradients only, so Adam's moments are of the
same scale as the shard's. Rows are estimated the same way (`OwnRows`, a local state per row)
when a later step may train before the shards publish a push: within a push group
(`train.push_every` > 1) and after pushes left in flight (`train.max_in_flight` > 0); a pull's
rows then get the changes of the pushes it misses, as its dense blocks do (`add_rows`), and,
within a push group, of the group's earlier steps, which no shard has yet. A
fresh state per estimate would be wrong for the rows that matter most (for Adagrad it is `lr` a
coordinate, far more than a row the shard has updated often takes); without row estimates a
push or two in flight cost a deep model several times the AUC they cost with them
(bench/RESULTS.md, "From docs/trainer.md"). By default a trainer waits for its pushes to be
published before the next push group's first pull (`train.max_in_flight` 0): only the steps
of the group being made are estimated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamtrain.params.optimizers import UpdateRule
from streamtrain.params.rows import RowTable

Block = tuple[str, int]


@dataclass(frozen=True)
class RowChange:
    """One step's estimated change of distinct rows of a table, and each row's shard."""

    table: str
    ids: np.ndarray
    change: np.ndarray
    shards: np.ndarray


@dataclass
class _Push:
    step: int
    task_id: str
    blocks: dict[Block, tuple[np.ndarray, int, int]] = field(default_factory=dict)  # block -> change, shard, steps
    rows: list[RowChange] = field(default_factory=list)


def clock_floor(now_s: float) -> int:
    """A first step above every step a predecessor under the same id can have used:
    milliseconds since the epoch. A trainer pushes far less often than once a millisecond, so
    a process started later begins above every step of one started earlier."""
    return int(now_s * 1000)


class OwnPushes:
    """This trainer's pushes the shards have not published, and the one being made, with their
    estimated changes."""

    def __init__(self, rule: UpdateRule, trainer_id: str, shards: int, limit: int = 256) -> None:
        self.rule = rule
        self.trainer_id = trainer_id
        self.shards = shards
        self.limit = limit  # pushes kept at most: shards that stop publishing must not grow it
        self._pushes: list[_Push] = []
        self._building: dict[Block, tuple[np.ndarray, int, int]] = {}
        self._building_rows: list[RowChange] = []
        # shard -> newest own step its values include; every shard, so that a pull that read
        # only some of them never counts a push as published by the others
        self._published: dict[int, int] = {shard: -1 for shard in range(shards)}
        self._dense_state: dict[Block, tuple[dict[str, np.ndarray], np.ndarray]] = {}

    # -- a push ----------------------------------------------------------------------------
    def block(self, block: Block, grad: np.ndarray, shard: int) -> np.ndarray:
        """A dense block's gradient of one step (mini-batch) of the push being made; returns
        the step's estimated change. A push of several steps changes the block by their sum."""
        grads = grad.reshape(1, -1)
        held = self._dense_state.get(block)
        if held is None:
            held = self._dense_state[block] = ({name: np.zeros_like(grads) for name in self.rule.state_names},
                                               np.zeros(1, dtype=np.int64))
        state, steps = held
        change = np.zeros_like(grads)
        self.rule.apply(change, grads, state, steps)
        steps += 1
        change = change.reshape(-1)
        before = self._building.get(block)
        self._building[block] = (change, shard, 1) if before is None else (before[0] + change, shard, before[2] + 1)
        return change

    def rows(self, change: RowChange) -> None:
        """A step's estimated change of rows (`OwnRows.step`), part of the push being made."""
        self._building_rows.append(change)

    def pushed(self, step: int, task_id: str) -> None:
        """The push being made went out as `step` of `task_id`."""
        self._pushes.append(_Push(step, task_id, self._building, self._building_rows))
        self._building, self._building_rows = {}, []
        if len(self._pushes) > self.limit:
            del self._pushes[0]

    def forget(self, task_id: str) -> None:
        """The pushes of an attempt given up: the shards may never apply them."""
        self._pushes = [p for p in self._pushes if p.task_id != task_id]
        self._building, self._building_rows = {}, []

    # -- a pull ----------------------------------------------------------------------------
    def published(self, applied: dict[int, dict[str, int]]) -> None:
        """What a pull read from `RedisKeys.applied`: drops the pushes every shard has published."""
        for shard, steps in applied.items():
            self._published[shard] = max(self._published.get(shard, -1), steps.get(self.trainer_id, -1))
        if self._pushes:
            done = min(self._published.values())
            self._pushes = [p for p in self._pushes if p.step > done]

    def first_step(self, applied: dict[int, dict[str, int]], floor: int = 0) -> int:
        """A trainer that starts again under its old id goes on after its steps already applied,
        and at `floor` at least (`clock_floor`): a Redis restarted empty no longer says which
        steps its shards applied, while they still remember the newest. Below it, every push
        would read as published at once, so pulls would miss the trainer's own changes until
        it passed its predecessor's step, minutes later."""
        return max(max((steps.get(self.trainer_id, -1) for steps in applied.values()), default=-1) + 1, floor)

    def _pending(self, push: _Push, shard: int, applied: dict[int, dict[str, int]]) -> bool:
        """Whether values read with `applied` miss `push`'s part on `shard`."""
        steps = applied.get(shard)
        return push.step > (self._published.get(shard, -1) if steps is None else steps.get(self.trainer_id, -1))

    def add_blocks(self, pulled: dict[Block, np.ndarray], applied: dict[int, dict[str, int]]
                   ) -> dict[Block, np.ndarray]:
        """The blocks a pull read with `applied` (absent: never trained, zero) with what the
        pushes they miss and the push being made change."""
        out = dict(pulled)
        for push in self._pushes:
            for block, (change, shard, _) in push.blocks.items():
                if self._pending(push, shard, applied):
                    out[block] = _plus(out.get(block), change)
        for block, (change, _, _) in self._building.items():  # not pushed yet: no pull has it
            out[block] = _plus(out.get(block), change)
        return out

    def steps_added(self, applied: dict[int, dict[str, int]]) -> dict[Block, int]:
        """How many of this trainer's steps `add_blocks` adds to each block a pull read with
        `applied`: what a gradient computed on the sum counts as seen besides the block's
        version (`DenseSlice.base`)."""
        out: dict[Block, int] = {}
        for push in self._pushes:
            for block, (_, shard, steps) in push.blocks.items():
                if self._pending(push, shard, applied):
                    out[block] = out.get(block, 0) + steps
        for block, (_, _, steps) in self._building.items():
            out[block] = out.get(block, 0) + steps
        return out

    def add_rows(self, table: str, ids: np.ndarray, values: np.ndarray, applied: dict[int, dict[str, int]]
                 ) -> np.ndarray:
        """`values`, the rows of `table` a pull read with `applied` for sorted distinct `ids`,
        with what the pushes they miss and the push being made change (in place; returned)."""
        for push in self._pushes:
            if not push.rows:
                continue
            pending = np.array([self._pending(push, shard, applied) for shard in range(self.shards)])
            if pending.any():
                _add_rows(table, ids, values, push.rows, pending)
        if self._building_rows:  # not pushed yet: no pull has them
            _add_rows(table, ids, values, self._building_rows, np.ones(self.shards, dtype=bool))
        return values

    @property
    def pending(self) -> int:
        """Pushes some shard has not published yet."""
        return len(self._pushes)

    def in_flight(self, through: int) -> int:
        """Pushes up to step `through` some shard has not published yet."""
        return sum(1 for p in self._pushes if p.step <= through)

    def lagging(self, after: int, through: int, allowed: int) -> list[int]:
        """The shards to wait for until at most `allowed` of the pushes of steps in
        (`after`, `through`] are unpublished: those that have not published the newest push
        that must be."""
        steps = [p.step for p in self._pushes if after < p.step <= through]
        if len(steps) <= allowed:
            return []
        target = steps[len(steps) - allowed - 1]
        return [shard for shard, done in self._published.items() if done < target]


def _plus(base: np.ndarray | None, change: np.ndarray) -> np.ndarray:
    return change.copy() if base is None else base + change


def _add_rows(table: str, ids: np.ndarray, values: np.ndarray, steps: list[RowChange], pending: np.ndarray) -> None:
    """Adds to `values` (the rows of sorted distinct `ids`) the changes of `steps` to rows of
    `table` on the shards `pending` marks."""
    for step in steps:
        if step.table != table:
            continue
        at = np.searchsorted(ids, step.ids)
        hit = at < len(ids)
        hit[hit] = ids[at[hit]] == step.ids[hit]
        hit &= pending[step.shards]
        values[at[hit]] += step.change[hit]


class OwnRows:
    """Estimates of what this trainer's own steps change in its rows, for the later mini-batches
    of the same push (`train.push_every` > 1), which train before the shards have the push.

    The job's update rule runs on this trainer's gradients with a local copy of the rule's
    state per row, advanced by this trainer's steps only, as `OwnPushes` does for the dense
    blocks: Adam's moments and Adagrad's sums then have the scale of the shard's (a fresh
    state per step would give `lr` a coordinate, far more than Adagrad moves a row it has
    updated often). It costs a row of the model's width per state array, plus the row itself,
    for every id this trainer has trained, up to `max_bytes` of them: a table that outgrows
    them starts again empty, as the replica does, so a stream of ever new ids cannot grow a
    trainer without bound. The rows trained again after that are estimated from a fresh state
    for a while."""

    def __init__(self, rule: UpdateRule, width: int, max_bytes: int = 256 << 20) -> None:
        self.rule = rule
        self.width = width
        # Rows whose values and rule state fit `max_bytes`, counted as the replica counts.
        self.max_rows = max(1, max_bytes // (4 * max(width, 1) * (1 + len(rule.state_names))))
        self.restarts = 0
        self._table = self._empty()

    def _empty(self) -> RowTable:
        # Values start at zero and hold the sum of the estimated changes; a rule that sets rows
        # absolutely (FTRL's w(z, n)) is read as the difference it makes.
        return RowTable("own", self.width, self.rule.state_names, init_scale=0.0)

    @property
    def size(self) -> int:
        """Rows held."""
        return self._table.size

    def step(self, ids: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """One step's gradients of distinct `ids`; returns its estimated change of each row."""
        if self._table.size > self.max_rows:  # over by one step's new rows at most
            self._table = self._empty()
            self.restarts += 1
        rows = self._table.rows_for(ids)
        before = self._table.gather(rows)
        return self._table.update(rows, grads, self.rule) - before
