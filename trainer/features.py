"""Examples → the tensors of a mini-batch: hashed sparse ids in bags per (example, field),
dense features, labels.

A sparse id is hashed with its field's name into `hash_buckets` rows (the same id in two
fields is two features), with the same splitmix64 as the shard map, so the hash is stable
across processes and restarts. Everything is numpy over the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pserver.sharding import mix64, name_salt
from schemas import Example


class FeatureError(ValueError):
    """An example that does not fit the job's declared features (dead-lettered)."""


@dataclass(frozen=True)
class Batch:
    ids: np.ndarray  # (n,) uint64 hashed feature ids, all fields together
    bags: np.ndarray  # (n,) int64: example * fields + field, the bag each id pools into
    dense: np.ndarray  # (B, D) float32
    labels: np.ndarray  # (B,) float32
    fields: int

    @property
    def size(self) -> int:
        return len(self.labels)


class Featurizer:
    def __init__(self, fields: Sequence[str], dense_features: int, hash_buckets: int) -> None:
        self.fields = tuple(fields)
        self.dense_features = dense_features
        self.buckets = np.uint64(hash_buckets)
        self._salts = np.array([name_salt(f) for f in self.fields], dtype=np.uint64)

    def check(self, example: Example) -> None:
        """Raises FeatureError if the example cannot be batched (its dense width is wrong)."""
        if len(example.dense) != self.dense_features:
            raise FeatureError(f"{len(example.dense)} dense features, the job declares {self.dense_features}")
        if not 0.0 <= example.label <= 1.0:
            raise FeatureError(f"label {example.label!r} is outside [0, 1] (a click probability)")

    def batch(self, examples: Sequence[Example]) -> Batch:
        raw, field_of, example_of = [], [], []
        for e, example in enumerate(examples):
            for f, name in enumerate(self.fields):
                ids = example.sparse.get(name, ())
                raw.extend(ids)
                field_of.extend([f] * len(ids))
                example_of.extend([e] * len(ids))
        field_index = np.asarray(field_of, dtype=np.int64)
        hashed = mix64(np.asarray(raw, dtype=np.uint64) ^ self._salts[field_index]) % self.buckets
        dense = np.asarray([e.dense for e in examples], dtype=np.float32).reshape(len(examples), self.dense_features)
        return Batch(hashed, np.asarray(example_of, dtype=np.int64) * len(self.fields) + field_index,
                     dense, np.asarray([e.label for e in examples], dtype=np.float32), len(self.fields))


def pool(rows, inverse, bags, batch_size: int, fields: int):
    """Sum the rows of each (example, field) bag: (unique ids, dim) -> (batch, fields, dim).

    `rows` holds one row per distinct id of the batch, `inverse` maps each id occurrence to
    its row, `bags` to its bag (torch tensors on one device)."""
    import torch

    dim = rows.shape[1]
    return torch.zeros(batch_size * fields, dim, device=rows.device, dtype=rows.dtype) \
        .index_add(0, bags, rows[inverse]).view(batch_size, fields, dim)
