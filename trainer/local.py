"""The same model trained in one process on examples in memory: no Kafka, etcd or Redis.

The reference the distributed run is measured against (tests compare holdout AUC, bench/
compares throughput): same featurizer, same model, same deterministic initial values, and
torch.optim's version of the job's update rule (the pservers' rules equal torch.optim's; for
Adam the tables are under torch.optim.SparseAdam, whose bias correction counts the table's
steps as a shard's does, and the dense layers under Adam). It scores as a job does: the dense
layers averaged over their last steps as a shard averages them (`train.average_steps`,
params/averages.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamtrain.params.averages import average_step
from streamtrain.params.rows import initial_rows
from streamtrain.schemas import Example
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.decoders import ChunkDecoder
from streamtrain.trainer.features import Batch, Featurizer, MiniBatches, pool
from streamtrain.trainer.models import build_model, model_spec, use_torch_threads
from streamtrain.trainer.params import INIT_SCALE, DenseLayout, RowLayout

_OPTIMIZERS = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}
_SPARSE = {"adam": torch.optim.SparseAdam}  # where torch's rule takes no sparse gradients


class LocalTrainer:
    def __init__(self, config: JobConfig) -> None:
        use_torch_threads(config)
        spec = model_spec(config)
        self.featurizer = Featurizer(spec.fields, spec.dense_features, config.model.hash_buckets)
        self.decoder = ChunkDecoder(config.input, spec.fields, spec.dense_features)
        self.model = build_model(config)
        DenseLayout(self.model).load({})
        # The model's tables as the shards store them (one row per id, RowLayout), from the
        # same deterministic initial values.
        self.rows = RowLayout.of(self.model.tables)
        self.tables = nn.ParameterList([nn.Parameter(torch.from_numpy(initial_rows(
            self.rows.name, np.arange(config.model.hash_buckets, dtype=np.uint64), self.rows.width, INIT_SCALE)))]
            if self.rows.width else [])
        rule = _OPTIMIZERS.get(config.pservers.optimizer)
        if rule is None:
            raise ValueError(f"no torch.optim reference for optimizer {config.pservers.optimizer!r}")
        lr = config.train.learning_rate
        sparse_rule = _SPARSE.get(config.pservers.optimizer)
        if sparse_rule is None:
            self.optimizers = [rule([*self.model.parameters(), *self.tables.parameters()], lr=lr)]
        else:
            self.optimizers = [rule(self.model.parameters(), lr=lr), sparse_rule(self.tables.parameters(), lr=lr)]
        self.batch_size = config.model.batch_size
        self.average_steps = config.train.average_steps
        self.steps = 0
        self.averages = [p.detach().clone() for p in self.model.parameters()]  # what is scored

    def _forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.from_numpy(batch.ids.astype(np.int64))
        bags = None if batch.one_id_per_bag() else torch.from_numpy(batch.bags)
        every = torch.arange(len(ids))
        # Sparse gradients: the optimizer touches only the rows of the batch, as a shard does
        # (a dense gradient would update all hash_buckets rows every step).
        rows = F.embedding(ids, self.tables[0], sparse=True) if self.rows.width else torch.zeros(len(ids), 0)
        pooled = self.rows.split(pool(rows, every, bags, batch.size, batch.fields))
        return self.model(pooled, torch.from_numpy(batch.dense)), torch.from_numpy(batch.labels)

    def train(self, examples: Sequence[Example]) -> None:
        for i in range(0, len(examples), self.batch_size):
            self._step(self.featurizer.batch(examples[i:i + self.batch_size]))

    def train_records(self, values: Sequence[bytes], chunk: int = 2048) -> None:
        """The same, from the records' bytes, decoded and cut as a trainer does (bad records
        are skipped)."""
        batches = MiniBatches(self.batch_size)
        for i in range(0, len(values), chunk):
            decoded = self.decoder.decode(values[i:i + chunk])
            if len(decoded.columns):
                for batch in batches.feed(self.featurizer.featurize(decoded.columns)):
                    self._step(batch)
        last = batches.rest()
        if last is not None:
            self._step(last)

    def _step(self, batch: Batch) -> None:
        logits, labels = self._forward(batch)
        for optimizer in self.optimizers:
            optimizer.zero_grad()
        F.binary_cross_entropy_with_logits(logits, labels).backward()
        for optimizer in self.optimizers:
            optimizer.step()
        self.steps += 1
        with torch.no_grad():
            for average, p in zip(self.averages, self.model.parameters()):
                average_step(average.numpy(), p.detach().numpy(), self.steps, self.average_steps)

    @torch.no_grad()
    def score(self, examples: Sequence[Example]) -> np.ndarray:
        trained = [p.clone() for p in self.model.parameters()]
        for p, average in zip(self.model.parameters(), self.averages):
            p.copy_(average)
        try:
            logits, _ = self._forward(self.featurizer.batch(examples))
        finally:
            for p, values in zip(self.model.parameters(), trained):
                p.copy_(values)
        return torch.sigmoid(logits).numpy()
