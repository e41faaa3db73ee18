"""Scoring examples with the parameters served in Redis (the newest rows, and the dense
blocks' averages over recent steps, `train.average_steps`): online inference, `streamtrain
predict`, and the holdout evaluation of tests and the demo."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import redis
import torch

from streamtrain.jobstate.sharding import SlotMap
from streamtrain.params.paramstore import ParamClient
from streamtrain.schemas import Example
from streamtrain.schemas.config import JobConfig
from streamtrain.trainer.features import Featurizer, pool
from streamtrain.trainer.models import build_model, model_spec
from streamtrain.trainer.params import DenseLayout, ParamSync, RowLayout


class Scorer:
    def __init__(self, config: JobConfig, client: redis.Redis, slot_map: SlotMap) -> None:
        spec = model_spec(config)
        self.featurizer = Featurizer(spec.fields, spec.dense_features, config.model.hash_buckets)
        self.model = build_model(config).eval()
        self.rows = RowLayout.of(self.model.tables)
        # The dense layers as served: averaged over recent steps (train.average_steps).
        self.sync = ParamSync(ParamClient(client, config.name, slot_map, served=True), DenseLayout(self.model),
                              wait_s=10)

    @torch.no_grad()
    def score(self, examples: Sequence[Example], batch_size: int = 4096) -> np.ndarray:
        """Click probabilities; parameters are pulled fresh for every call."""
        self.sync.pull_dense()
        out = []
        for i in range(0, len(examples), batch_size):
            batch = self.featurizer.batch(examples[i:i + batch_size])
            unique, inverse = np.unique(batch.ids, return_inverse=True)
            inverse_t = torch.from_numpy(inverse.astype(np.int64))
            bags_t = None if batch.one_id_per_bag() else torch.from_numpy(batch.bags)
            rows = self.rows
            values = (torch.from_numpy(self.sync.pull_rows(rows.name, unique, rows.width)) if rows.width
                      else torch.zeros(len(unique), 0))
            pooled = rows.split(pool(values, inverse_t, bags_t, batch.size, batch.fields))
            out.append(torch.sigmoid(self.model(pooled, torch.from_numpy(batch.dense))).numpy())
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
