"""Read-your-writes: a trainer's own pushes, added to what it pulls until the shards publish them.

A push reaches the parameters a trainer pulls only after its commit, the shard's apply and the
shard's next publish. Training on parameters that miss its own last updates is what makes an
asynchronous trainer diverge from the sequential loop: a deep model under Adam lost 0.07 AUC
that way (bench/RESULTS.md). So a trainer keeps, per push group, an estimate of what the group
will change, and adds the groups a pull does not include yet to what the pull returns. Which
groups those are, the shards say: each publish round writes the newest step of every trainer
its values include (`RedisKeys.applied`), read in the same transaction as the values.

The estimate runs the job's own update rule on the group's gradients. Dense blocks keep a
local copy of the rule's state, advanced by this trainer's gradients only, so Adam's moments
are of the same scale as the shard's. Rows start from a fresh state for each group (the first
update of a row under that rule: for Adam, a step of `lr` in the gradient's direction):
keeping per-row state for millions of rows is the shard's job, and a row's own pending updates
are only the last few groups. Rules whose update depends on the value (FTRL) get an estimate
from zero; they are estimates either way, replaced by the published values a few milliseconds
later.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pserver.optimizers import UpdateRule

Block = tuple[str, int]


@dataclass
class _Group:
    step: int
    task_id: str
    rows: dict[str, tuple[np.ndarray, np.ndarray, int]] = field(default_factory=dict)  # part -> ids, change, shard
    blocks: dict[Block, tuple[np.ndarray, int]] = field(default_factory=dict)  # block -> change, shard


class OwnPushes:
    """The estimated changes of this trainer's pushes that the shards have not published."""

    def __init__(self, rule: UpdateRule, trainer_id: str, limit: int = 256) -> None:
        self.rule = rule
        self.trainer_id = trainer_id
        self.limit = limit  # groups kept at most: shards that stop publishing must not grow it
        self._groups: list[_Group] = []
        self._building: _Group | None = None
        self._published: dict[int, int] = {}  # shard -> newest own step its values include
        self._dense_state: dict[Block, tuple[dict[str, np.ndarray], np.ndarray]] = {}

    # -- a push ----------------------------------------------------------------------------
    def rows(self, table: str, ids: np.ndarray, grads: np.ndarray, shard: int) -> None:
        """A part of the group being pushed: gradients of distinct, sorted `ids` owned by `shard`."""
        if not len(ids):
            return
        values = np.zeros_like(grads)
        state = {name: np.zeros_like(grads) for name in self.rule.state_names}
        self.rule.apply(values, grads, state, np.zeros(len(ids), dtype=np.int64))
        self._group().rows[f"{table}\0{shard}"] = (ids, values, shard)

    def block(self, block: Block, grad: np.ndarray, shard: int) -> np.ndarray:
        """A dense block's gradient in the group being pushed; returns its estimated change."""
        grads = grad.reshape(1, -1)
        state, steps = self._dense_state.get(block) or (None, None)
        if state is None:
            state = {name: np.zeros_like(grads) for name in self.rule.state_names}
            steps = np.zeros(1, dtype=np.int64)
            self._dense_state[block] = (state, steps)
        change = np.zeros_like(grads)
        self.rule.apply(change, grads, state, steps)
        steps += 1
        change = change.reshape(-1)
        self._group().blocks[block] = (change, shard)
        return change

    def pushed(self, step: int, task_id: str) -> None:
        """The group being built went out as `step` of `task_id`."""
        group, self._building = self._building, None
        if group is None:
            return
        group.step, group.task_id = step, task_id
        self._groups.append(group)
        if len(self._groups) > self.limit:
            del self._groups[0]

    def _group(self) -> _Group:
        if self._building is None:
            self._building = _Group(-1, "")
        return self._building

    def forget(self, task_id: str) -> None:
        """The groups of an attempt given up: the shards may never apply them."""
        self._groups = [g for g in self._groups if g.task_id != task_id]
        self._building = None

    # -- a pull ----------------------------------------------------------------------------
    def published(self, applied: dict[int, dict[str, int]]) -> None:
        """What a pull read from `RedisKeys.applied`: drops the groups every shard has published."""
        for shard, steps in applied.items():
            self._published[shard] = max(self._published.get(shard, -1), steps.get(self.trainer_id, -1))
        if self._groups:
            done = min(self._published.values(), default=-1)
            self._groups = [g for g in self._groups if g.step > done]

    def first_step(self, applied: dict[int, dict[str, int]]) -> int:
        """A trainer that starts again under its old id goes on after its steps already applied."""
        return max((steps.get(self.trainer_id, -1) for steps in applied.values()), default=-1) + 1

    def _pending(self, group: _Group, shard: int, applied: dict[int, dict[str, int]]) -> bool:
        """Whether values read with `applied` miss `group`'s part on `shard`."""
        steps = applied.get(shard)
        return group.step > (self._published.get(shard, -1) if steps is None else steps.get(self.trainer_id, -1))

    def add_rows(self, table: str, ids: np.ndarray, values: np.ndarray, applied: dict[int, dict[str, int]]) -> None:
        """Add to the `values` of sorted, distinct `ids` that a pull read with `applied`, in
        place, what the groups they miss change."""
        if not len(ids):
            return
        prefix = f"{table}\0"
        for group in self._groups:
            for part, (g_ids, change, shard) in group.rows.items():
                if not part.startswith(prefix) or not self._pending(group, shard, applied):
                    continue
                at = np.searchsorted(ids, g_ids)
                hit = at < len(ids)
                hit[hit] = ids[at[hit]] == g_ids[hit]
                if hit.any():
                    values[at[hit]] += change[hit]

    def add_blocks(self, pulled: dict[Block, np.ndarray], applied: dict[int, dict[str, int]]
                   ) -> dict[Block, np.ndarray]:
        """The blocks a pull read with `applied` (absent: never trained, zero) with what the
        groups they miss change."""
        out = dict(pulled)
        for group in self._groups:
            for block, (change, shard) in group.blocks.items():
                if self._pending(group, shard, applied):
                    base = out.get(block)
                    out[block] = change.copy() if base is None else base + change
        return out

    @property
    def pending(self) -> int:
        """Groups some shard has not published yet."""
        return len(self._groups)
