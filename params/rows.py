"""Sparse embedding rows of one shard: a vectorised id → row index map, the rows themselves,
the update rule's lazy per-row state, and a deterministic initialiser.

Everything is numpy over whole batches: the shard must apply millions of rows a second, so no
Python loop runs per row. Rows are created on first touch with values drawn from the id alone
(same id, same initial row, in any process, after any restart).
"""

from __future__ import annotations

import functools

import numpy as np

from streamtrain.jobstate.sharding import mix64, name_salt
from streamtrain.params.optimizers import UpdateRule, clock_of, in_place

_EMPTY = np.uint64(0)  # slot marker in `_keys`; real ids are stored as id + 1 (see _slot_key)


# Ids below this are found by one array read (hashed feature ids are below
# `model.hash_buckets`, so usually all of them); larger ones by probing.
DIRECT_IDS = 1 << 24


class IdIndex:
    """Id → row for a whole batch of ids at once.

    Ids below `DIRECT_IDS` map through one array of a slot per possible id (`_direct`, row + 1,
    0 when absent): one vectorised read, an order of magnitude cheaper than probing. It costs 4
    bytes per possible id, but only the pages written are ever mapped, so at most 4 bytes
    times the largest id below `DIRECT_IDS` (16 MB at 4M hash buckets). Other ids go to open
    addressing with linear probing over numpy arrays, each probe step one vectorised pass
    over the keys still unresolved."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        capacity = 1 << max(4, int(capacity - 1).bit_length())
        self._keys = np.zeros(capacity, dtype=np.uint64)
        self._rows = np.zeros(capacity, dtype=np.int64)
        self._direct = np.zeros(DIRECT_IDS, dtype=np.int32)  # calloc'd: mapped page by page as written
        self.size = 0
        self._probed = 0  # ids in the probing part

    @property
    def capacity(self) -> int:
        return len(self._keys)

    @staticmethod
    def _slot_key(ids: np.ndarray) -> np.ndarray:
        # id + 1 so that 0 can mark an empty slot; the one id that wraps (2**64 - 1) to 0 is
        # refused by `insert`.
        with np.errstate(over="ignore"):
            return ids.astype(np.uint64) + np.uint64(1)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row index per id, -1 where absent."""
        direct = ids < DIRECT_IDS
        if direct.all():
            return self._direct[ids].astype(np.int64) - 1
        out = np.empty(len(ids), dtype=np.int64)
        out[direct] = self._direct[ids[direct]].astype(np.int64) - 1
        out[~direct] = self._probe(ids[~direct])
        return out

    def _probe(self, ids: np.ndarray) -> np.ndarray:
        keys = self._slot_key(ids)
        mask = np.uint64(self.capacity - 1)
        pos = mix64(keys) & mask
        out = np.full(len(keys), -1, dtype=np.int64)
        todo = np.arange(len(keys))
        while len(todo):
            found = self._keys[pos]
            hit = found == keys[todo]
            out[todo[hit]] = self._rows[pos[hit]]
            more = ~hit & (found != _EMPTY)
            todo, pos = todo[more], (pos[more] + np.uint64(1)) & mask
        return out

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ids known to be absent and distinct, mapping them to `rows`."""
        if len(ids) == 0:
            return
        direct = ids < DIRECT_IDS
        if direct.all():
            self.size += len(ids)
            self._direct[ids] = rows + 1
            return
        if np.any(ids == np.uint64(2**64 - 1)):
            raise ValueError("row id 2**64 - 1 is reserved")
        self.size += len(ids)
        self._direct[ids[direct]] = rows[direct] + 1
        ids, rows = ids[~direct], rows[~direct]
        if (self._probed + len(ids)) * 2 > self.capacity:
            self._grow(self._probed + len(ids))
        self._place(self._slot_key(ids), rows.astype(np.int64))
        self._probed += len(ids)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        mask = np.uint64(self.capacity - 1)
        pos = mix64(keys) & mask
        while len(keys):
            free = self._keys[pos] == _EMPTY
            # Several new keys may probe the same free slot in one pass: the first one wins it,
            # the others keep probing.
            _, first = np.unique(pos[free], return_index=True)
            winners = np.flatnonzero(free)[first]
            self._keys[pos[winners]] = keys[winners]
            self._rows[pos[winners]] = rows[winners]
            placed = np.zeros(len(keys), dtype=bool)
            placed[winners] = True
            keys, rows = keys[~placed], rows[~placed]
            pos = (pos[~placed] + np.uint64(1)) & mask

    def _grow(self, needed: int) -> None:
        used = self._keys != _EMPTY
        keys, rows = self._keys[used], self._rows[used]
        capacity = 1 << int(needed * 2 - 1).bit_length()
        self._keys = np.zeros(capacity, dtype=np.uint64)
        self._rows = np.zeros(capacity, dtype=np.int64)
        self._place(keys, rows)


def distinct(ids: np.ndarray) -> np.ndarray:
    """The distinct values of `ids`, sorted: `np.unique(ids)`, by a sort. NumPy 2.4's plain
    `np.unique` of integers hashes, which on ids is many times slower than sorting, from a
    flush's tens of thousands of ids to a restarted shard's millions (bench/RESULTS.md,
    "Figures moved from the code and the docs")."""
    ids = np.sort(ids)
    keep = np.empty(len(ids), dtype=bool)
    keep[:1] = True
    np.not_equal(ids[1:], ids[:-1], out=keep[1:])
    return ids[keep]


def initial_rows(table: str, ids: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """Uniform in [-scale, scale), a pure function of (table, id, column): the top 24 bits
    (exact in float32) of splitmix64 of `(id ^ salt(table)) * dim + column`, scaled in
    float32 (one compiled pass, params/kernels.py)."""
    out = np.empty((len(ids), dim), dtype=np.float32)
    _kernels().initial_rows(np.asarray(ids, dtype=np.uint64), name_salt(table), float(scale), out)
    return out


@functools.cache
def _kernels():
    from streamtrain.params import kernels  # numba: imported at first use (docs/dependencies.md)
    return kernels


class RowTable:
    """One embedding table's rows on this shard, with per-row optimizer state."""

    def __init__(self, name: str, dim: int, state_names: tuple[str, ...], init_scale: float = 0.01,
                 capacity: int = 1 << 16) -> None:
        self.name = name
        self.dim = dim
        self.init_scale = init_scale
        self.index = IdIndex(capacity * 2)
        self.ids = np.zeros(capacity, dtype=np.uint64)
        self.values = np.zeros((capacity, dim), dtype=np.float32)
        self.steps = np.zeros(capacity, dtype=np.int64)
        self.updates = 0  # applies to the table: the "table" clock (params/optimizers.py)
        # Update rules start from zero state and set their own start values on a row's first
        # update (steps == 0), see params/optimizers.py.
        self.state = {n: np.zeros((capacity, dim), dtype=np.float32) for n in state_names}
        self.size = 0

    def rows_for(self, ids: np.ndarray) -> np.ndarray:
        """Row indexes for distinct ids, creating the missing rows (deterministically)."""
        rows = self.index.lookup(ids)
        missing = rows < 0
        if missing.any():
            new_ids = ids[missing]
            start = self.size
            self._reserve(start + len(new_ids))
            stop = start + len(new_ids)
            new_rows = np.arange(start, stop, dtype=np.int64)
            self.ids[start:stop] = new_ids  # slices, not the rows' indexes: a copy, not a scatter
            if self.init_scale:  # else they stay the zeros they were allocated as
                self.values[start:stop] = initial_rows(self.name, new_ids, self.dim, self.init_scale)
            self.index.insert(new_ids, new_rows)
            self.size += len(new_ids)
            rows[missing] = new_rows
        return rows

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """A copy of the values of `rows` (one np.take over a row view: no 2-d fancy indexing)."""
        return np.take(row_view(self.values), rows).view(np.float32).reshape(len(rows), self.dim)

    def update(self, rows: np.ndarray, grads: np.ndarray, rule: UpdateRule) -> np.ndarray:
        """One step of `rule` on distinct table rows; returns their new values (a copy).

        A rule with `apply_at` (every built-in) updates the rows where they are, in one
        compiled pass. Any other is handed gathered copies, scattered back afterwards through
        one-item-per-row views (np.take / np.put copy whole rows at once, where 2-d fancy
        indexing is slow, docs/optimizers.md).
        """
        n, dim = len(rows), self.dim
        if grads.shape != (n, dim) or grads.dtype != np.float32:
            raise ValueError(f"table {self.name!r}: gradients must be float32 ({n}, {dim}), got "
                             f"{grads.dtype} {grads.shape}")
        steps = np.take(self.steps, rows)
        clock = steps if clock_of(rule) == "row" else np.full(n, self.updates, dtype=np.int64)
        apply_at = in_place(rule)
        if apply_at is not None:
            values = np.empty((n, dim), dtype=np.float32)
            apply_at(self.values, self.state, rows, grads, clock, values)
        else:
            values = np.take(row_view(self.values), rows).view(np.float32).reshape(n, dim)
            state = {name: np.take(row_view(arr), rows).view(np.float32).reshape(n, dim)
                     for name, arr in self.state.items()}
            rule.apply(values, grads, state, clock)
            np.put(row_view(self.values), rows, row_view(values))
            for name, arr in self.state.items():
                np.put(row_view(arr), rows, row_view(state[name]))
        np.put(self.steps, rows, steps + 1)
        self.updates += 1
        return values

    def _reserve(self, needed: int) -> None:
        capacity = len(self.ids)
        if needed <= capacity:
            return
        grown = max(needed, capacity * 2)
        self.ids = _grow(self.ids, grown)
        self.values = _grow(self.values, grown)
        self.steps = _grow(self.steps, grown)
        self.state = {n: _grow(a, grown) for n, a in self.state.items()}


_ROW_TYPES: dict[int, np.dtype] = {}  # by row size: making the dtype costs as much as the view


def row_view(table: np.ndarray) -> np.ndarray:
    """A C-contiguous (rows, dim) array as a 1-d array of opaque rows (one void item per row)."""
    size = table.shape[1] * table.itemsize
    row = _ROW_TYPES.get(size)
    if row is None:
        row = _ROW_TYPES[size] = np.dtype((np.void, size))
    return table.view(row).reshape(len(table))


def _grow(array: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
    out[: len(array)] = array
    return out
