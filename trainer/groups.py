"""Training one push group a mini-batch at a time: pull the mini-batch's rows (and, every
`train.pull_every` mini-batches, the dense blocks) in one round trip, step the model, and
leave the gradients in the push being built.

The worker (worker.py) decides which task and which mini-batches; this module does the
arithmetic between a pull and a push and touches no broker, etcd or task state.
"""

from __future__ import annotations

import time
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from streamtrain.infra.metrics import TrainerMetrics
from streamtrain.jobstate.sharding import SlotMap
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.features import Batch, pool
from streamtrain.trainer.metrics import TaskMetrics
from streamtrain.trainer.own import OwnPushes, OwnRows, RowChange
from streamtrain.trainer.params import DenseLayout, GradientBuffer, ParamSync, RowLayout


def estimates_dense(config: JobConfig) -> bool:
    """Whether a step's dense change must be estimated: only if a later step may train before
    the shards publish it. Not when every step is pushed and pulled after this trainer's
    pushes are published (async with `max_in_flight` 0, or sync, `push_every` and
    `pull_every` 1), where the estimate would cost the trainer CPU for nothing. (A wait for
    them that times out then trains without their estimates.) "auto" may group, so it does."""
    train = config.train
    return not (train.push_every == 1 and train.pull_every == 1 and (
        train.sgd.holds_at_barrier or (train.sgd.limits_in_flight and train.max_in_flight == 0)))


def rows_in_flight(config: JobConfig) -> bool:
    """Whether a push's row changes are kept for later pulls: only if a later pull may miss
    them (async pushes left in flight)."""
    return config.train.sgd.limits_in_flight and config.train.max_in_flight > 0


class GroupTrainer:
    """Trains push groups of `model` against the parameters `sync` pulls; the gradients of each
    go to `buffer`, and `own` learns what this trainer changed (trainer/own.py)."""

    def __init__(self, config: JobConfig, model: torch.nn.Module, layout: DenseLayout, rows: RowLayout,
                 sync: ParamSync, buffer: GradientBuffer, own: OwnPushes, own_rows: OwnRows | None,
                 slot_map: SlotMap, device: torch.device, obs: TrainerMetrics) -> None:
        self.model, self.layout, self.rows = model, layout, rows
        self.sync, self.buffer, self.own, self.own_rows = sync, buffer, own, own_rows
        self.slot_map, self.device, self.obs = slot_map, device, obs
        self.pull_every = config.train.pull_every
        self.estimate_dense = estimates_dense(config)
        self.since_dense: int | None = None  # mini-batches since the dense blocks were pulled
        self._params = list(model.parameters())  # `Module.zero_grad` walks the modules every step

    def train(self, batches: list[Batch], metrics: TaskMetrics) -> None:
        """Train one push group, a mini-batch a step, each on the parameters pulled just before it.

        Every mini-batch pulls its rows and (every `train.pull_every` mini-batches) the dense
        blocks in one Redis transaction. The group's first pull comes after the wait for this
        trainer's pushes in flight: it trains on parameters that miss at most
        `train.max_in_flight` of its own pushes (none by default; their estimated changes are
        added, trainer/own.py) and what the others have not published. A later mini-batch of
        the group pulls again, so it trains on the other trainers' steps published meanwhile,
        with this group's earlier steps added as estimated (`OwnRows`, `OwnPushes.block`):
        the shards have not got them yet. The shards then apply the group's steps in order.
        Pulled once for the whole group, the later mini-batches would miss the others' steps
        of that time, which costs AUC (bench/RESULTS.md, "push groups that pull before every
        mini-batch"). Rows are not pulled a step ahead: rows missing one more own push cost a
        deep model AUC (bench/RESULTS.md, "From docs/trainer.md")."""
        layout = self.rows
        for batch in batches:
            unique, inverse = np.unique(batch.ids, return_inverse=True)
            values, owners = self._pull(unique, metrics)
            grads = self._step(batch, unique, inverse, values, owners, metrics)
            if self.own_rows is not None and layout.width:
                # Every step, the last too: a wait for the push that times out leaves it
                # pending, and a later pull must then add all of it, as it adds its dense blocks.
                change = self.own_rows.step(unique, grads)
                # `_pull` hashes every row's shard whenever the layout has a width.
                self.own.rows(RowChange(layout.name, unique, change, cast(np.ndarray, owners)))

    def given_up(self) -> None:
        """A task was given up: the model may hold estimates of its steps, which no shard will
        apply, so the next step pulls the dense blocks whatever `train.pull_every` says (a load
        writes the blocks estimates were added to, `DenseLayout.add`)."""
        self.since_dense = None

    def _pull(self, ids: np.ndarray, metrics: TaskMetrics) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows of sorted distinct `ids` (and each one's shard), and the dense blocks into
        the model when `train.pull_every` mini-batches have trained since their last pull."""
        started = time.perf_counter()
        layout = self.rows
        since = self.since_dense
        dense = since is None or since >= self.pull_every
        self.since_dense = 1 if dense or since is None else since + 1
        # Each row's shard, hashed once: the pull needs the shards' versions, the push splits by them.
        owners: np.ndarray | None = None
        request: dict[str, int] = {}
        shards: dict[str, np.ndarray] = {}
        if layout.width:
            owners = shards[layout.name] = self.slot_map.shard_of_rows(layout.name, ids)
            request[layout.name] = layout.width
        tables = self.sync.load(self.sync.send(request, ids, shards, dense=dense).result(), self.own)
        # The pull returns the rows of every table requested.
        values = tables[layout.name] if layout.width else np.zeros((len(ids), 0), np.float32)
        pulled = time.perf_counter()
        metrics.pull_s += pulled - started
        self.obs.pull_seconds.observe(pulled - started)
        return values, owners

    def _step(self, batch: Batch, unique: np.ndarray, inverse: np.ndarray, values: np.ndarray,
              owners: np.ndarray | None, metrics: TaskMetrics) -> np.ndarray:
        """One mini-batch on `values`, the rows of its distinct ids `unique`: its gradients go
        to the push being built, its dense changes (estimated) into the model at once; returns
        the rows' gradients."""
        started = time.perf_counter()
        layout = self.rows
        inverse_t = self._to(torch.from_numpy(inverse.astype(np.int64)))
        bags_t = None if batch.one_id_per_bag() else self._to(torch.from_numpy(batch.bags))
        rows = self._to(torch.from_numpy(values))
        rows.requires_grad_(True)
        pooled = layout.split(pool(rows, inverse_t, bags_t, batch.size, batch.fields))
        labels = self._to(torch.from_numpy(batch.labels))
        logits = self.model(pooled, self._to(torch.from_numpy(batch.dense)))
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        with torch.no_grad():
            scores = torch.sigmoid(logits).cpu().numpy()
        metrics.observe(batch.labels, scores, float(loss.item()) * batch.size)
        # The loss depends on `rows` (requires_grad) when the layout has a width: backward set the grad.
        grads = cast(torch.Tensor, rows.grad).cpu().numpy() if layout.width else np.zeros((len(unique), 0), np.float32)
        dense = self.layout.gradients()
        self.buffer.add_step(layout.name if layout.width else None, unique, grads, owners, dense, self.layout.bases)
        for param in self._params:
            param.grad = None
        if self.estimate_dense:  # the next step, pulled or not, sees this one's dense change
            self.layout.add({(param, block): self.own.block((param, block), grad,
                                                            self.buffer.shard_of_block(param, block))
                             for param, block, grad in dense})
        computed = time.perf_counter() - started
        metrics.compute_s += computed
        self.obs.compute_seconds.observe(computed)
        self.obs.examples.inc(batch.size)
        return grads

    def _to(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor
