"""Decoded examples → the tensors of a mini-batch: hashed sparse ids in bags per (example,
field), dense features, labels.

A sparse id is hashed with its field's name into `hash_buckets` rows (the same id in two
fields is two features), with the same splitmix64 as the shard map, so the hash is stable
across processes and restarts. Everything is numpy over many examples at once: decoders hand
over `Columns` of a whole chunk of records, the featurizer hashes them in one pass, and the
trainer cuts mini-batches out of the result by slicing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter, methodcaller

import numpy as np

from streamtrain.jobstate.sharding import mix64, name_salt
from streamtrain.schemas import Example

_SPARSE, _DENSE, _LABEL, _TIME = (attrgetter(a) for a in ("sparse", "dense", "label", "event_time_ms"))


@dataclass(frozen=True)
class Columns:
    """Examples column-wise, holding only what the job trains on (its sparse fields in the
    job's order and its dense width)."""

    sparse: tuple[tuple[np.ndarray, np.ndarray], ...]  # per field: (ids uint64, ids per example int64)
    dense: np.ndarray  # (n, dense_features) float32
    labels: np.ndarray  # (n,) float32
    event_time_ms: np.ndarray  # (n,) int64

    def __len__(self) -> int:
        return len(self.labels)

    @staticmethod
    def interleave(first: Columns, at: np.ndarray, second: Columns, second_at: np.ndarray) -> Columns:
        """One Columns of both, example i of `first` at position `at[i]` and so on (the
        positions of the two together are 0..n-1)."""
        order = np.argsort(np.concatenate([at, second_at]), kind="stable")
        sparse = []
        for (a_ids, a_counts), (b_ids, b_counts) in zip(first.sparse, second.sparse):
            ids, counts = np.concatenate([a_ids, b_ids]), np.concatenate([a_counts, b_counts])
            starts = (np.cumsum(counts) - counts)[order]
            counts = counts[order]
            # Each example's ids, in the new order: its start, plus 0..count-1.
            within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
            sparse.append((ids[np.repeat(starts, counts) + within], counts))
        return Columns(tuple(sparse), np.concatenate([first.dense, second.dense])[order],
                       np.concatenate([first.labels, second.labels])[order],
                       np.concatenate([first.event_time_ms, second.event_time_ms])[order])

    @classmethod
    def gather(cls, examples: Sequence, fields: Sequence[str], dense_features: int) -> Columns:
        """From objects with `sparse` (a mapping of field to ids), `dense`, `label` and
        `event_time_ms`, whose dense width is already checked.

        Raises:
            OverflowError: an id does not fit 64 bits (checked here, in C, not per id).
        """
        n = len(examples)
        maps = list(map(_SPARSE, examples))
        sparse = []
        for name in fields:
            lists = list(map(methodcaller("get", name, ()), maps))
            counts = np.fromiter(map(len, lists), dtype=np.int64, count=n)
            ids = np.fromiter(chain.from_iterable(lists), dtype=np.uint64, count=int(counts.sum()))
            sparse.append((ids, counts))
        dense = np.array(list(map(_DENSE, examples)), dtype=np.float64).reshape(n, dense_features)
        return cls(tuple(sparse), dense.astype(np.float32),
                   np.fromiter(map(_LABEL, examples), dtype=np.float64, count=n).astype(np.float32),
                   np.fromiter(map(_TIME, examples), dtype=np.int64, count=n))


@dataclass(frozen=True)
class Batch:
    """Featurized examples. Ids are example-major (an example's ids are contiguous, fields in
    order), so a run of examples is a slice."""

    ids: np.ndarray  # (n,) uint64 hashed feature ids, all fields together
    bags: np.ndarray  # (n,) int64: example * fields + field, the bag each id pools into
    dense: np.ndarray  # (B, D) float32
    labels: np.ndarray  # (B,) float32
    fields: int
    offsets: np.ndarray  # (B + 1,) int64: example i's ids are ids[offsets[i]:offsets[i + 1]]
    event_time_ms: np.ndarray  # (B,) int64
    # Known to hold one id per bag (a part of a batch that does), or None: not yet looked at.
    single: bool | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        return len(self.labels)

    def one_id_per_bag(self) -> bool:
        """Whether every (example, field) holds exactly one id, as single-valued categorical
        fields do: pooling is then a plain lookup (`pool` with no bags). Looked at once per
        decoded chunk: its mini-batches inherit the answer."""
        single = self.single
        if single is None:
            n = len(self.bags)
            single = n == self.size * self.fields and (
                n == 0 or (self.bags[0] == 0 and bool((np.diff(self.bags) == 1).all())))
            object.__setattr__(self, "single", single)
        return single

    def slice(self, start: int, stop: int) -> Batch:
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return Batch(self.ids[lo:hi], self.bags[lo:hi] - start * self.fields, self.dense[start:stop],
                     self.labels[start:stop], self.fields, self.offsets[start:stop + 1] - lo,
                     self.event_time_ms[start:stop], single=self.single or None)

    @staticmethod
    def concat(first: Batch, second: Batch) -> Batch:
        return Batch(np.concatenate([first.ids, second.ids]),
                     np.concatenate([first.bags, second.bags + first.size * first.fields]),
                     np.concatenate([first.dense, second.dense]), np.concatenate([first.labels, second.labels]),
                     first.fields, np.concatenate([first.offsets, second.offsets[1:] + first.offsets[-1]]),
                     np.concatenate([first.event_time_ms, second.event_time_ms]),
                     single=(first.single and second.single) or None)


class MiniBatches:
    """Cuts featurized chunks into mini-batches of exactly `size` examples in order; what is
    left of a chunk waits for the next, so the cut does not depend on where chunks begin."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._carry: Batch | None = None

    def feed(self, block: Batch) -> Iterator[Batch]:
        block.one_id_per_bag()  # once for the chunk, not for each of its mini-batches
        if self._carry is not None:
            block, self._carry = Batch.concat(self._carry, block), None
        full = block.size - block.size % self.size
        for start in range(0, full, self.size):
            yield block.slice(start, start + self.size)
        if full < block.size:
            self._carry = block.slice(full, block.size)

    def rest(self) -> Batch | None:
        """The last, short mini-batch, if any."""
        carry, self._carry = self._carry, None
        return carry


class Featurizer:
    def __init__(self, fields: Sequence[str], dense_features: int, hash_buckets: int) -> None:
        self.fields = tuple(fields)
        self.dense_features = dense_features
        self.buckets = np.uint64(hash_buckets)
        self._salts = np.array([name_salt(f) for f in self.fields], dtype=np.uint64)

    def batch(self, examples: Sequence[Example]) -> Batch:
        return self.featurize(Columns.gather(examples, self.fields, self.dense_features))

    def featurize(self, columns: Columns) -> Batch:
        n, nf = len(columns), len(self.fields)
        examples = np.arange(n, dtype=np.int64)
        ids = [c[0] for c in columns.sparse]
        examples_by_field = [np.repeat(examples, c[1]) for c in columns.sparse]
        fields_by_field = [np.full(len(c[0]), f, dtype=np.int64) for f, c in enumerate(columns.sparse)]
        raw = np.concatenate(ids) if ids else np.zeros(0, dtype=np.uint64)
        example_of = np.concatenate(examples_by_field) if ids else np.zeros(0, dtype=np.int64)
        field_of = np.concatenate(fields_by_field) if ids else np.zeros(0, dtype=np.int64)
        # Field-major in, example-major out; stable, so fields and ids keep their order.
        order = np.argsort(example_of, kind="stable")
        raw, example_of, field_of = raw[order], example_of[order], field_of[order]
        hashed = mix64(raw ^ self._salts[field_of]) % self.buckets
        per_example = sum((c[1] for c in columns.sparse), np.zeros(n, dtype=np.int64))
        offsets = np.concatenate([[0], np.cumsum(per_example)]).astype(np.int64)
        return Batch(hashed, example_of * nf + field_of, columns.dense, columns.labels, nf, offsets,
                     columns.event_time_ms)


def pool(rows, inverse, bags, batch_size: int, fields: int):
    """Sum the rows of each (example, field) bag: (unique ids, dim) -> (batch, fields, dim).

    `rows` holds one row per distinct id of the batch, `inverse` maps each id occurrence to
    its row, `bags` to its bag (torch tensors on one device), or is None when each bag holds
    exactly one id, in bag order (`Batch.one_id_per_bag`): then the sum is the lookup alone,
    a third of the forward and backward time of summing into zeros."""
    import torch

    dim = rows.shape[1]
    if bags is None:
        return rows[inverse].view(batch_size, fields, dim)
    return torch.zeros(batch_size * fields, dim, device=rows.device, dtype=rows.dtype) \
        .index_add(0, bags, rows[inverse]).view(batch_size, fields, dim)
